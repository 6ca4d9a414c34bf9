"""Parsing of the API's query parameters that FastAPI cannot check by type: ``min_offsets``.

Everything malformed answers 400 with the reason, never 422 or 500: a number too large for Kafka,
``1e400``, ``Infinity`` and ``NaN`` included.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

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


def _reject_number(text: str) -> Any:
    """``parse_float`` / ``parse_constant`` hook: floats, ``Infinity`` and ``NaN`` are not offsets."""
    raise _NotAnIntegerError(text)


def _integer(value: object, what: str, maximum: int) -> int:
    if isinstance(value, bool):
        raise ParameterError(f"{USAGE}: {what} must be an integer, got {json.dumps(value)}")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and value.strip().isdecimal():
        number = int(value.strip())
    else:
        shown = value if isinstance(value, str) else json.dumps(value)
        raise ParameterError(f"{USAGE}: {what} must be a non-negative integer, got {shown!r}")
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
            parsed = json.loads(text, parse_float=_reject_number, parse_constant=_reject_number)
        except _NotAnIntegerError as e:
            raise ParameterError(f"{USAGE}: offsets must be integers, got {e.text}") from None
        except ValueError as e:
            raise ParameterError(f"{USAGE}: not valid JSON ({e})") from None
        if not isinstance(parsed, dict):
            raise ParameterError(f"{USAGE}: not a JSON object")
        pairs = parsed.items()
    elif text.startswith(("[", '"')) or (text and ":" not in text):
        raise ParameterError(f"{USAGE}: got {text[:40]!r}")
    else:
        listed: list[tuple[object, object]] = []
        for item in filter(None, (part.strip() for part in text.split(","))):
            p_text, sep, o_text = item.partition(":")
            if not sep:
                raise ParameterError(f"{USAGE}: {item[:40]!r} is not partition:offset")
            listed.append((p_text, o_text))
        pairs = listed
    out: dict[int, int] = {}
    for p, o in pairs:
        partition = _integer(p, "partition", MAX_PARTITION)
        out[partition] = _integer(o, f"offset of partition {partition}", MAX_OFFSET)
    return out
