"""Redaction of URLs (issue 22): the whole userinfo of any URL is masked, in URLs and in free text,
and what statesnap prints of third-party libraries stays quiet and secret-free.

Before: ``redact_url`` kept the user part (an AWS access key id in ``s3://KEY:SECRET@bucket``),
and ``scrub`` missed token-only userinfo (``http://TOKEN@host``), passwords holding ``/`` or ``@``,
and URLs inside query values.
"""

from __future__ import annotations

import subprocess
import sys
import time
from urllib.parse import quote

import pytest

from statesnap.redaction import (
    mask_userinfo,
    redact_url,
    register_url_secrets,
    scrub,
    unparsable,
    userinfo_of,
)

KEY_ID = "AKIAREDACTION7Q9ZPL"
SECRET = "wJalrXUtnREDACT/K7MDENG+bPxRfiCY"
TOKEN = "tokenREDACT-8c1f0e"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"s3://{KEY_ID}:{SECRET}@bucket/p", "s3://***@bucket/p"),
        (f"s3://{KEY_ID}@bucket/p", "s3://***@bucket/p"),
        (f"s3://{KEY_ID}:{quote(SECRET, safe='')}@bucket/p", "s3://***@bucket/p"),
        (f"s3://{KEY_ID}:p@{SECRET}@bucket/p", "s3://***@bucket/p"),
        (f"https://{KEY_ID}:{SECRET}@host:8443/x?region=eu", "https://***@host:8443/x?region=eu"),
        (f"http://{TOKEN}@127.0.0.1:9000", "http://***@127.0.0.1:9000"),
        (
            f"s3://b/p?endpoint_url=http://{KEY_ID}:{quote(SECRET, safe='')}@h:9"
            f"&aws_secret_access_key={SECRET}",
            "s3://b/p?endpoint_url=http://***@h:9&aws_secret_access_key=***",
        ),
    ],
)
def test_redact_url_masks_the_whole_userinfo(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    for piece in (KEY_ID, TOKEN, SECRET, quote(SECRET, safe=""), *SECRET.split("/"), *SECRET.split("+")):
        assert piece not in redact_url(url)
        assert piece not in scrub(url)


def test_broker_lists_keep_their_hosts() -> None:
    brokers = f"SASL_SSL://u:{SECRET}@b1:9093,PLAINTEXT://{KEY_ID}@b2:9092,b3:9092"
    assert scrub(brokers) == "SASL_SSL://***@b1:9093,PLAINTEXT://***@b2:9092,b3:9092"
    assert userinfo_of(brokers) == [f"u:{SECRET}", KEY_ID]


@pytest.mark.parametrize(
    "text",
    [
        "https://host/path/user@example.com",  # an '@' in the path is not userinfo
        "mail alice@example.com about s3://bucket/a@b",
        "restored orders from s3://bucket/prefix: 100 keys",
        "s3://***@bucket",  # already masked
    ],
)
def test_text_without_userinfo_is_kept(text: str) -> None:
    assert mask_userinfo(text) == text


def test_a_port_then_an_at_sign_masks_too_much_never_too_little() -> None:
    """``host:8080/a@b`` reads as ``user:password@`` with a '/' in the password (AWS secret keys
    hold '/'): the pattern cannot tell, and masking a port and path beats showing a secret."""
    assert mask_userinfo("https://host:8080/users/alice@example.com") == "https://***@example.com"


def test_endpoint_errors_of_botocore_are_masked() -> None:
    """The message botocore printed, with the endpoint's userinfo, as the issue quoted it."""
    line = f'Could not connect to the endpoint URL: "http://user:{SECRET}@127.0.0.1:1/b"'
    assert scrub(line) == 'Could not connect to the endpoint URL: "http://***@127.0.0.1:1/b"'


def test_registered_url_secrets_are_masked_outside_urls() -> None:
    """A library that splits the URL and prints the parts (``Invalid bucket name "KEY:SECRET@b"``)
    no longer shows a URL the pattern can see; the registry still masks the values."""
    secret = "RegisteredUrlPass-5e2d"
    register_url_secrets(f"s3://keyid-91ab:{quote(secret, safe='')}@bucket/p")
    assert secret not in scrub(f'Invalid bucket name "keyid-91ab:{secret}@bucket"')


def test_unparsable_values_are_not_echoed_and_are_masked_afterwards() -> None:
    value = "PastedSecretValue-33f1"
    message = unparsable("S3 option connect_timeout", value, "must be seconds > 0")
    assert value not in message
    assert message == "S3 option connect_timeout: must be seconds > 0 (the value is not shown)"
    assert scrub(f"float() failed on {value!r}") == "float() failed on '***'"


def test_scrub_stays_linear_on_hostile_text() -> None:
    started = time.monotonic()
    for text in ("a://:" * 200_000 + "@", "a://x:" + "y" * 1_000_000 + "@", "a://x:" + "@" * 1_000_000):
        scrub(text)
    assert time.monotonic() - started < 3.0


def test_the_schema_registry_client_imports_without_authlibs_deprecation_warning() -> None:
    """Every schema-registry table printed authlib's ``AuthlibDeprecationWarning`` (its httpx
    integration) on stderr; statesnap silences exactly that one, and only around its import:
    another authlib deprecation still shows. A fresh interpreter, as a user's process starts."""
    code = (
        "from statesnap.serde.registry import SchemaRegistry\n"
        "SchemaRegistry('http://127.0.0.1:1').client()\n"
        "from authlib.deprecate import deprecate\n"
        "deprecate('another authlib deprecation')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "httpx module is deprecated" not in result.stderr
    assert "another authlib deprecation" in result.stderr  # not hidden globally


def test_schema_registry_urls_with_a_slash_in_the_password_are_masked() -> None:
    """``https://user:pa/ss@registry`` split at the '/': the registry's own redaction saw no
    userinfo and every message showed the URL whole."""
    from statesnap.errors import ConfigError
    from statesnap.serde.registry import SchemaRegistry

    reg = SchemaRegistry(f"https://{KEY_ID}:{SECRET}@registry:8081,http://u:{TOKEN}@r2:8081")
    assert reg.safe_url == "https://***@registry:8081,http://***@r2:8081"
    for piece in (KEY_ID, TOKEN, *SECRET.split("/")):
        assert piece not in repr(reg)
    with pytest.raises(ConfigError) as info:
        SchemaRegistry(f"ftp://{KEY_ID}:{SECRET}@registry")
    for piece in (KEY_ID, *SECRET.split("/")):
        assert piece not in str(info.value)


def test_log_records_lose_the_userinfo_of_any_url() -> None:
    """Records of botocore, urllib3 and statesnap pass the record hook: a token-only userinfo and a
    broker list's userinfo (both shown whole before) are masked, whatever handler prints them."""
    import io
    import logging

    from statesnap.redaction import install_record_redaction

    install_record_redaction()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    for name in ("botocore.endpoint", "urllib3.connectionpool", "statesnap.kafka"):
        log = logging.getLogger(name)
        log.addHandler(handler)
        level = log.level
        log.setLevel(logging.DEBUG)
        try:
            log.debug("Starting new HTTP connection (1): http://%s@127.0.0.1:9000", TOKEN)
            log.warning("brokers SASL_SSL://u:%s@b1:9093,PLAINTEXT://%s@b2:9092", SECRET, KEY_ID)
        finally:
            log.removeHandler(handler)
            log.setLevel(level)
    out = stream.getvalue()
    for piece in (TOKEN, KEY_ID, *SECRET.split("/")):
        assert piece not in out
    assert "b1:9093" in out
    assert "b2:9092" in out
