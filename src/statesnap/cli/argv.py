"""Secrets on the command line: what a usage error may never echo.

``--kafka-config KEY=VALUE`` (and ``--storage-option``, ``--to-storage-option``, ``--spark-conf``)
carries passwords, and the shell splits what the operator meant as one argument:
``--kafka-config sasl.password SECRET`` (the ``=`` forgotten) leaves ``SECRET`` as an extra
argument, an unquoted JAAS string leaves ``password=…;`` as one. click's usage errors quote extra
arguments and bad values as given, and a positional argument may swallow such a piece and show it
in the command's own error. So, before click parses anything, :func:`scan` reads the arguments:

- an entry of those options without ``=`` is refused at once, in one line that shows neither it
  nor anything after it (:func:`malformed_message`): it may be the secret itself, the key's value
  may follow it, and which argument is which cannot be known;
- a JAAS configuration (``sasl.jaas.config``, ends with ``;``) cut short is refused the same way;
- the value of an entry whose key looks secret, and every argument after it up to the next
  ``--option``, are *hidden*: :meth:`ArgvSecrets.hide` masks them in any error the CLI prints
  (usage errors, a typed error naming a positional argument that swallowed a piece, inside a URL
  or path too), and says why. A legitimate argument there (``--storage-option secret_key=… ./ckpt``)
  is masked in errors as well: which one is a split secret cannot be known, and a masked path
  costs less than a shown secret.

Other secrets in a message (``password=…`` anywhere) are :func:`~statesnap.redaction.scrub`'s.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import quote

from statesnap.redaction import MASK, is_secret, scrub

__all__ = ["PAIR_OPTIONS", "ArgvSecrets", "malformed_message", "scan"]

#: Options whose values are ``KEY=VALUE`` entries that may carry secrets.
PAIR_OPTIONS = ("--kafka-config", "--storage-option", "--to-storage-option", "--spark-conf")

#: Hidden arguments shorter than this are masked only as whole words (see ArgvSecrets.hide).
WHOLE_WORDS_BELOW = 4

#: Keys whose value is a JAAS configuration: one or more entries, each ending with ``;``.
_JAAS_KEYS = frozenset({"sasl.jaas.config"})


@dataclass(frozen=True, slots=True)
class Malformed:
    """An entry of a pair option the CLI refuses before parsing: where, and what is wrong."""

    option: str
    entry: int
    problem: str


@dataclass(frozen=True, slots=True)
class ArgvSecrets:
    """What :func:`scan` found: the first malformed entry (if any) and the arguments never shown."""

    malformed: Malformed | None = None
    #: Arguments that are (or may be pieces of) a secret value, each with the option it followed.
    hidden: tuple[tuple[str, str], ...] = ()

    def hide(self, text: str) -> str:
        """*text* scrubbed, with every hidden argument in it masked, and a note saying why once
        something was. An argument of :data:`WHOLE_WORDS_BELOW` characters or more is masked
        wherever it appears (a positional argument that swallowed it shows inside a URL or a
        path); a shorter one only as a whole word (masking every ``u`` would mangle the line)."""
        clean = scrub(text)
        masked = None
        # Longest first, so an argument that contains another is masked whole.
        for token, option in sorted(self.hidden, key=lambda h: len(h[0]), reverse=True):
            if not token.strip():
                continue
            forms = {token, quote(token, safe="/:")}
            for form in sorted(forms, key=len, reverse=True):
                body = re.escape(form)
                if len(token) < WHOLE_WORDS_BELOW:
                    body = rf"(?<![^\s(\[,'\"]){body}(?![^\s)\],'\"])"
                clean, n = re.subn(body, MASK, clean)
                if n and masked is None:
                    masked = option
        if masked is not None:
            clean += (
                f" (arguments after a secret {masked} value are not shown, in case the shell split the "
                f"value: quote a KEY=VALUE that holds spaces as one argument, as in {masked} "
                "'KEY=VALUE WITH SPACES')"
            )
        return clean


def malformed_message(found: Malformed) -> str:
    return f"{found.option} takes KEY=VALUE: entry {found.entry} {found.problem}"


def scan(args: Sequence[str]) -> ArgvSecrets:
    """Read the command line's pair options (every command's, wherever they stand) for entries
    the CLI must refuse unseen and arguments it must never show."""
    hidden: list[tuple[str, str]] = []
    counts: dict[str, int] = {}
    malformed: Malformed | None = None
    i, n = 0, len(args)
    while i < n:
        token = args[i]
        if token == "--":
            break
        option, value, width = _pair_at(args, i)
        if option is None:
            i += 1
            continue
        counts[option] = counts.get(option, 0) + 1
        if value is None:  # the option ends the line: click says it needs a value
            break
        key, sep, rest = value.partition("=")
        problem = None
        if not sep or not key.strip():
            problem = "has no '=' (the value was not shown; give KEY=VALUE as one argument)"
        elif key.strip() in _JAAS_KEYS and not rest.rstrip().endswith(";"):
            problem = (
                f"{key.strip()} is cut short: a JAAS configuration ends with ';' (the value was not "
                "shown; quote the whole KEY=VALUE as one argument)"
            )
        secret = problem is not None or is_secret(key)
        if secret:
            hidden.append((value, option))
            j = i + width
            while j < n and not args[j].startswith("--"):
                hidden.append((args[j], option))
                j += 1
        if problem is not None and malformed is None:
            malformed = Malformed(option, counts[option], problem)
        i += width
    return ArgvSecrets(malformed, tuple(hidden))


def _pair_at(args: Sequence[str], i: int) -> tuple[str | None, str | None, int]:
    """(option, its value, arguments it spans) if a pair option stands at *i*."""
    token = args[i]
    for option in PAIR_OPTIONS:
        if token == option:
            return option, (args[i + 1] if i + 1 < len(args) else None), 2
        if token.startswith(f"{option}="):
            return option, token[len(option) + 1 :], 1
    return None, None, 1
