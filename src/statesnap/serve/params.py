"""Parsing of the API's query parameters that FastAPI cannot check by type: ``min_offsets``.

Everything malformed answers 400 with a one-line reason, never 422 or 500: a number too large for
Kafka (5000 digits included: nothing here converts a string longer than an in-range number),
``1e400``, ``Infinity``, ``NaN`` and JSON nested too deeply included.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_OFFSET", "MAX_PARTITION", "USAGE", "ParameterError", "parse_min_offsets"]

#: Kafka partitions are int32, offsets int64.
MAX_PARTITION = 2**31 - 1
MAX_OFFSET = 2**63 - 1

USAGE = 'min_offsets is partition → offset, as JSON {"0": 123} or as 0:123,1:45'


class ParameterError(ValueError):
    """A malformed query parameter; the message says which and why (answered as 400)."""


class _NotAnIntegerError(ValueError):
    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


#: What a query may echo back of a bad value: enough to recognise it, never a 5000-digit wall.
_SHOWN = 40


def _shown(text: str) -> str:
    return repr(text if len(text) <= _SHOWN else f"{text[:_SHOWN]}… ({len(text)} characters)")


@dataclass(frozen=True, slots=True)
class _Oversized:
    """A JSON integer too long to be an offset, kept as its length: ``int()`` of more than 4300
    digits raises ValueError (CPython's guard against quadratic conversion), which answered 500."""

    digits: int


def _json_int(text: str) -> int | _Oversized:
    """``parse_int`` hook: converts only what can be in range (19 digits fit an int64)."""
    digits = text.lstrip("-").lstrip("0")
    return _Oversized(len(digits)) if len(digits) > _MAX_DIGITS else int(text)


def _reject_number(text: str) -> Any:
    """``parse_float`` / ``parse_constant`` hook: floats, ``Infinity`` and ``NaN`` are not offsets."""
    raise _NotAnIntegerError(text)


#: No offset or partition has more significant digits than this; longer ones are out of range
#: without being converted.
_MAX_DIGITS = len(str(MAX_OFFSET))


def _integer(value: object, what: str, maximum: int) -> int:
    """*value* as an integer in ``[0, maximum]``; only ASCII digits (``int()`` also takes ``٣``),
    and never an ``int()`` of a string longer than an in-range number can be."""
    if isinstance(value, bool):
        raise ParameterError(f"{USAGE}: {what} must be an integer, got {json.dumps(value)}")
    if isinstance(value, _Oversized):
        raise ParameterError(f"{USAGE}: {what} ({value.digits} digits) is out of range [0, {maximum}]")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        digits = value.strip().lstrip("0") or "0"
        if len(digits) > _MAX_DIGITS:
            raise ParameterError(f"{USAGE}: {what} ({len(digits)} digits) is out of range [0, {maximum}]")
        number = int(digits)
    else:
        shown = _shown(value) if isinstance(value, str) else _shown(json.dumps(value))
        raise ParameterError(f"{USAGE}: {what} must be a non-negative integer, got {shown}")
    if not 0 <= number <= maximum:
        raise ParameterError(f"{USAGE}: {what} {number} is out of range [0, {maximum}]")
    return number


def parse_min_offsets(text: str) -> dict[int, int]:
    """``{"0": 123, "3": 9}`` (JSON, needs ``curl -g`` or URL-encoding) or ``0:123,3:9``.

    Offsets are of records the caller wrote (from a delivery report): the answer waits until each is
    applied. Raises :class:`ParameterError` for anything else.
    """
    text = text.strip()
    pairs: Iterable[tuple[object, object]]
    if text.startswith("{"):
        try:
            parsed = json.loads(
                text, parse_int=_json_int, parse_float=_reject_number, parse_constant=_reject_number
            )
        except _NotAnIntegerError as e:
            raise ParameterError(f"{USAGE}: offsets must be integers, got {_shown(e.text)}") from None
        except ValueError as e:
            raise ParameterError(f"{USAGE}: not valid JSON ({e})") from None
        except RecursionError:  # '{"a":{"a":…' nested deeper than the parser's stack
            raise ParameterError(f"{USAGE}: not a flat JSON object (nested too deeply)") from None
        if not isinstance(parsed, dict):
            raise ParameterError(f"{USAGE}: not a JSON object")
        pairs = parsed.items()
    elif text.startswith(("[", '"')) or (text and ":" not in text):
        raise ParameterError(f"{USAGE}: got {_shown(text)}")
    else:
        listed: list[tuple[object, object]] = []
        for item in filter(None, (part.strip() for part in text.split(","))):
            p_text, sep, o_text = item.partition(":")
            if not sep:
                raise ParameterError(f"{USAGE}: {_shown(item)} is not partition:offset")
            listed.append((p_text, o_text))
        pairs = listed
    out: dict[int, int] = {}
    for p, o in pairs:
        partition = _integer(p, "partition", MAX_PARTITION)
        out[partition] = _integer(o, f"offset of partition {partition}", MAX_OFFSET)
    return out
