"""Human durations (``90s``, ``5m``, ``1h``, ``12h``, ``2d``) used by every interval option."""

from __future__ import annotations

import math
import re
from datetime import timedelta

from statesnap.errors import InvalidDurationError

__all__ = ["format_duration", "parse_duration"]

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PATTERN = re.compile(r"^\s*(?P<num>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>ms|s|m|h|d|w)?\s*$")
#: What looks like a try at a duration ("5 min", "-1h", "1,5hrs", "inf"), short: echoed in the error.
_ATTEMPT = re.compile(r"^\s*(?:[-+]?[0-9.][0-9A-Za-z .,]{0,14}|[A-Za-z][0-9A-Za-z]{0,4})\s*$")


def _shown(text: str) -> str:
    """*text* as an error shows it: quoted where it looks like a try at a duration, else only
    described. A value that is no duration at all may be something pasted into the wrong
    option (a password, a token): an error message must never print it."""
    if _ATTEMPT.match(text):
        return repr(text)
    return f"of {len(text)} characters (not shown: it does not start like a duration)"


def parse_duration(text: str | float | timedelta) -> timedelta:
    """Parse ``90s``/``5m``/``1h``/``12h``/``2d`` (a bare number means seconds).

    Raises :class:`InvalidDurationError` for anything negative or unparsable, naming the text if
    it looks like a try at a duration (a value that does not might be a secret in the wrong place).
    """
    if isinstance(text, timedelta):
        if text < timedelta(0):
            raise InvalidDurationError(f"duration must not be negative: {text}")
        return text
    if isinstance(text, int | float) and not isinstance(text, bool):
        if text < 0:
            raise InvalidDurationError(f"duration must not be negative: {text}")
        return _seconds(float(text), text)
    if not isinstance(text, str):
        raise InvalidDurationError(f"not a duration: {text!r}")
    if text.strip().startswith("-"):
        raise InvalidDurationError(f"duration must not be negative: {_shown(text)}")
    match = _PATTERN.match(text)
    if match is None:
        raise InvalidDurationError(
            f"cannot parse duration {_shown(text)}; use a number with a unit such as 90s, 5m, 1h, 12h, 2d"
        )
    return _seconds(float(match["num"]) * _UNITS[match["unit"] or "s"], text)


def _seconds(seconds: float, source: object) -> timedelta:
    if not math.isfinite(seconds):
        raise InvalidDurationError(f"duration must be finite: {source!r}")
    try:
        return timedelta(seconds=seconds)
    except OverflowError as e:
        raise InvalidDurationError(f"duration too large: {source!r}") from e


def format_duration(value: timedelta) -> str:
    """The shortest exact spelling of *value* in the units :func:`parse_duration` reads."""
    micros = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    if micros == 0:
        return "0s"
    for unit in ("w", "d", "h", "m", "s", "ms"):
        size = round(_UNITS[unit] * 1_000_000)
        if micros >= size and micros % size == 0:
            return f"{micros // size}{unit}"
    return f"{micros / 1_000_000:.6f}s"
