"""Keeping secrets out of logs and error messages.

The README promises that passwords, tokens and keys never reach stderr. Secrets come in by three
doors: librdkafka properties (``sasl.password``), blob-store URLs and options
(``?aws_secret_access_key=``, ``https://user:pass@host``), and third-party debug logs (botocore
prints request headers, ``x-amz-security-token`` included). So:

- :func:`redact_url` masks a URL's whole userinfo (``s3://KEY:SECRET@bucket`` →
  ``s3://***@bucket``: the user part is often a key id, and a password holding ``@`` or ``/``
  splits where a parser does not expect) and the values of secret-looking query keys; every
  error that names a URL uses it.
- :func:`scrub` masks secrets in free text: known secret values (see :func:`register_secret`),
  ``key=value`` / ``key: value`` / ``'header': b'value'`` pairs whose key looks secret, the
  userinfo of every ``scheme://…@`` URL (broker lists and endpoint URLs included).
- :func:`register_url_secrets` remembers the userinfo of URLs given as settings, and
  :func:`unparsable` the value of a setting that failed to parse (it may be a secret pasted in
  the wrong place): from then on both are masked wherever the registry applies.
- :class:`SecretFilter` applies :func:`scrub` to log records; :func:`install_log_redaction` puts it
  where every record of statesnap, botocore, boto3, s3transfer and urllib3 passes, whatever
  handlers the application configures.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit, urlunsplit

__all__ = [
    "MASK",
    "REDACTED_LOGGERS",
    "SECRET_MARKERS",
    "SecretFilter",
    "install_log_redaction",
    "install_record_redaction",
    "is_secret",
    "mask_userinfo",
    "redact_url",
    "register_secret",
    "register_secrets",
    "register_url_secrets",
    "scrub",
    "scrub_record",
    "unparsable",
    "userinfo_of",
]

MASK = "***"

#: Substrings of a property, option, header or query-parameter name that mark its value as secret.
SECRET_MARKERS = (
    "password",
    "passwd",
    "secret",
    "jaas",
    "token",
    "key.pem",
    "private",
    "credential",
    "oauthbearer.config",
    "signature",
    "authorization",
    "user.info",  # the schema registry's basic.auth.user.info is "user:password"
    "access_key",
    "accesskey",
    "api_key",
    "apikey",
    "cookie",
    "customer-key",
)

#: Loggers whose records are scrubbed (each with its children).
REDACTED_LOGGERS = ("statesnap", "botocore", "boto3", "s3transfer", "urllib3")

#: Secrets shorter than this are not scrubbed by value: masking every "a" would mangle logs.
_MIN_SECRET_LEN = 4


def is_secret(name: str) -> bool:
    """Whether a setting, option, header or query key of this name carries a secret value."""
    lowered = name.lower()
    return any(marker in lowered for marker in SECRET_MARKERS)


# --- known secret values -----------------------------------------------------------------------

_known: set[str] = set()
_known_lock = threading.Lock()
_known_pattern: re.Pattern[str] | None = None


def register_secret(value: Any) -> None:
    """Remember a secret value so :func:`scrub` masks it wherever it appears (headers, tracebacks).

    Called for the values of secret-looking Kafka properties and blob-store options when they
    are configured; the values never leave this process.
    """
    global _known_pattern  # noqa: PLW0603 - one registry per process, read by the log filter
    if not isinstance(value, str | bytes):
        return
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    text = text.strip()
    if len(text) < _MIN_SECRET_LEN:
        return
    with _known_lock:
        if text in _known:
            return
        _known.add(text)
        # Longest first, so a secret that contains another is masked whole.
        alternatives = sorted(_known | {quote(s, safe="") for s in _known}, key=len, reverse=True)
        _known_pattern = re.compile("|".join(re.escape(s) for s in alternatives))


def register_secrets(config: dict[str, Any] | Iterable[tuple[str, Any]]) -> None:
    """Register the values of every secret-looking key of *config*."""
    items = config.items() if isinstance(config, dict) else config
    for key, value in items:
        if is_secret(str(key)):
            register_secret(value)


# --- text and URLs -----------------------------------------------------------------------------

# Every pattern starts at a token boundary and matches the key greedily, checking it afterwards:
# linear in the text, even for megabytes of base64 in a debug log.
# 'x-amz-security-token': b'...'  or  "Authorization": "..."  (dict reprs in debug logs)
_QUOTED_PAIR = re.compile(
    r"""(?P<q>['"])(?P<key>[\w.\-]{1,100})(?P=q)(?P<sep>\s*:\s*)(?P<b>b?)(?P<vq>['"])(?P<val>.*?)(?<!\\)(?P=vq)"""
)
# key=value, key: value, key="quoted value" (properties, query strings, JAAS, canonical requests)
_PLAIN_PAIR = re.compile(
    r"""(?<![\w.\-])(?P<key>[\w.\-]+)(?P<sep>\s*[=:]\s*)(?P<val>"[^"]*"|'[^']*'|[^\s,;&'"})\]]+)"""
)
# scheme://userinfo@host. The user part stops at '/', '?', '#' (so "https://host/a@b" keeps its
# host); after a ':' the password runs to the last '@' before whitespace, a quote or the next
# "://" (the next URL of a broker list), since pasted passwords hold '/' (AWS secret keys do)
# and '@'. Stopping at "://" keeps the scans from overlapping: linear even in "a://:a://:…@".
_URL_USERINFO = re.compile(
    r"(?<![A-Za-z0-9+.\-])(?P<pre>[A-Za-z][A-Za-z0-9+.\-]*://)"
    r"(?P<info>[^\s/?#@:'\"<>]{0,1024}(?::(?:(?!://)[^\s'\"<>]){0,1024})?)"
    r"(?P<at>@)"
)


def scrub(text: str) -> str:
    """*text* with every secret the patterns or the registry can find replaced by ``***``."""
    if not text:
        return text
    pattern = _known_pattern
    if pattern is not None:
        text = pattern.sub(MASK, text)
    text = mask_userinfo(text)

    def quoted(m: re.Match[str]) -> str:
        if not is_secret(m["key"]):
            return m.group(0)
        return f"{m['q']}{m['key']}{m['q']}{m['sep']}{m['b']}{m['vq']}{MASK}{m['vq']}"

    def plain(m: re.Match[str]) -> str:
        if not is_secret(m["key"]) or m["val"] in {MASK, f'"{MASK}"', f"'{MASK}'"}:
            return m.group(0)
        return f"{m['key']}{m['sep']}{MASK}"

    text = _QUOTED_PAIR.sub(quoted, text)
    return _PLAIN_PAIR.sub(plain, text)


def mask_userinfo(text: str) -> str:
    """*text* with the userinfo of every ``scheme://userinfo@`` URL in it replaced by ``***``."""
    if "@" not in text:
        return text
    return _URL_USERINFO.sub(
        lambda m: f"{m['pre']}{MASK}{m['at']}" if m["info"] != MASK else m.group(0), text
    )


def redact_url(url: str) -> str:
    """A URL safe to show: its userinfo and the values of secret-looking query keys masked.

    The whole userinfo goes, not just the password: in ``s3://KEY:SECRET@bucket`` the user is an
    access key id. Query values that are URLs (``?endpoint_url=http://u:p@host``) lose theirs.
    Anything that does not parse as a URL is scrubbed as text instead.
    """
    try:
        # The pattern first: urlsplit ends the host at the first '/', inside a password.
        parts = urlsplit(mask_userinfo(url))
        netloc = parts.netloc
        if "@" in netloc:
            netloc = f"{MASK}@{netloc.rpartition('@')[2]}"
        query = parts.query
        if query:
            pairs = parse_qsl(query, keep_blank_values=True)
            query = "&".join(
                f"{quote(k, safe='')}={MASK if is_secret(k) else quote(mask_userinfo(v), safe='/:*@')}"
                for k, v in pairs
            )
        safe = urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        safe = url
    return scrub(safe)


def userinfo_of(text: str) -> list[str]:
    """The userinfo of every ``scheme://userinfo@`` URL in *text* (a URL, a broker list)."""
    return [m["info"] for m in _URL_USERINFO.finditer(text) if m["info"] and m["info"] != MASK]


def register_url_secrets(text: str) -> None:
    """Remember the userinfo (and its password) of every URL in *text* as secrets, raw and
    percent-decoded, so a library that echoes the URL later (botocore's "Could not connect to
    the endpoint URL") is masked by value, even where the pattern cannot see a URL."""
    for info in userinfo_of(text):
        for form in {info, unquote(info)}:
            register_secret(form)
            password = form.partition(":")[2]
            if password:
                register_secret(password)


def unparsable(name: str, value: Any, expected: str) -> str:
    """The message for a setting whose value failed to parse, without the value.

    A value in the wrong place is often a secret pasted there (a password typed where a timeout
    goes), so it is never echoed, and it is registered as a secret: if a library prints it
    later anyway, the log filter masks it.
    """
    register_secret(value)
    return f"{name}: {expected} (the value is not shown)"


# --- logging -----------------------------------------------------------------------------------


class SecretFilter(logging.Filter):
    """Rewrites a record's message (and traceback text) with :func:`scrub`; never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        scrub_record(record)
        return True


def scrub_record(record: logging.LogRecord) -> None:
    if getattr(record, "_statesnap_scrubbed", False):
        return
    try:
        message = record.getMessage()
    except Exception:  # a broken %-format is logging's to report, not ours
        return
    clean = scrub(message)
    if clean != message:
        record.msg = clean
        record.args = ()
    if record.exc_info and not record.exc_text:
        record.exc_text = scrub(logging.Formatter().formatException(record.exc_info))
    elif record.exc_text:
        record.exc_text = scrub(record.exc_text)
    if record.stack_info:
        record.stack_info = scrub(record.stack_info)
    record._statesnap_scrubbed = True


_install_lock = threading.Lock()
_factory_installed = False
_FILTER = SecretFilter("statesnap.redaction")


def _wants_scrub(name: str) -> bool:
    return any(name == n or name.startswith(f"{n}.") for n in REDACTED_LOGGERS)


def install_record_redaction() -> None:
    """Scrub every record of the redacted loggers as it is created, whatever the handlers.

    A filter on a logger only sees records logged on that very logger, not its children
    (``botocore.endpoint``), so the scrub hooks the record factory, chaining the one installed
    before. Cheap: records below a logger's level are never created. Idempotent.
    """
    global _factory_installed  # noqa: PLW0603 - the factory is process-wide by design
    with _install_lock:
        if _factory_installed:
            return
        previous: Callable[..., logging.LogRecord] = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            if _wants_scrub(record.name):
                scrub_record(record)
            return record

        logging.setLogRecordFactory(factory)
        _factory_installed = True


def install_log_redaction(*handlers: logging.Handler) -> None:
    """What the CLI calls after configuring logging: the record hook plus a :class:`SecretFilter`
    on *handlers* and on every handler of the root logger (records of any logger that reach
    them are scrubbed, even if someone replaces the record factory later)."""
    install_record_redaction()
    for handler in (*handlers, *logging.getLogger().handlers):
        if _FILTER not in handler.filters:
            handler.addFilter(_FILTER)
