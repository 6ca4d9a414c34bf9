"""Reading JSON that anyone with write access to the store may have written.

Manifests, snapshot records, the descriptor, the high-water mark and the Spark journal are small
JSON documents a restore trusts. Python's ``json`` turns hostile ones into the wrong exceptions
(``ValueError`` on a 5,000-digit number, ``RecursionError`` on deep nesting) or into values that
crash later (``1e300`` as an offset, ``"5"`` as a generation). Everything here raises
:class:`~statesnap.errors.CorruptCheckpointError` instead, naming the document and the field, so
callers skip the checkpoint and fall back to the next older one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from statesnap.errors import CorruptCheckpointError

__all__ = [
    "MAX_INT64",
    "MAX_PARTITION",
    "as_int",
    "as_map",
    "as_optional_int",
    "as_partition",
    "as_str",
    "load_json",
]

#: Offsets, generations, rows and sizes are Kafka/Arrow int64s: anything larger is not a value
#: a writer produced, and would overflow librdkafka's offsets later.
MAX_INT64 = 2**63 - 1
#: Kafka partitions are int32.
MAX_PARTITION = 2**31 - 1
#: Digits of the longest int64; longer number literals are refused before Python converts them.
_MAX_DIGITS = 20
#: Nesting deeper than any statesnap document (a manifest nests 5 levels) is refused.
MAX_DEPTH = 64
#: Larger documents are refused without parsing (a manifest of 100 k files is ~20 MB).
MAX_BYTES = 256 * 1024 * 1024


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_DIGITS:
        raise ValueError(f"number with {len(text)} digits")
    return int(text)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _depth(data: bytes) -> int:
    """Deepest bracket nesting outside strings, found without recursion."""
    depth = top = 0
    in_string = escaped = False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            top = max(top, depth)
            if top > MAX_DEPTH:
                return top
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return top


def load_json(data: bytes, *, source: str) -> Any:
    """Parse *data*; any malformed, oversized or too deeply nested document is corrupt."""
    if len(data) > MAX_BYTES:
        raise CorruptCheckpointError(f"{source}: {len(data):,} bytes, larger than any statesnap document")
    if _depth(data) > MAX_DEPTH:
        raise CorruptCheckpointError(f"{source}: nested more than {MAX_DEPTH} levels deep")
    try:
        return json.loads(data, parse_int=_parse_int, parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CorruptCheckpointError(f"{source}: not valid JSON ({_short(e)})") from e


def as_int(value: Any, what: str, *, lo: int = 0, hi: int = MAX_INT64) -> int:
    """*value* as an integer in ``[lo, hi]``; a string, float, bool or null is refused."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise CorruptCheckpointError(f"{what} is {_describe(value)}, not an integer")
    if not lo <= value <= hi:
        raise CorruptCheckpointError(f"{what} is {value}, outside [{lo}, {hi}]")
    return value


def as_partition(value: Any) -> int:
    """A partition number, written as a JSON key (a string of digits) or value (an integer)."""
    if isinstance(value, str):
        if not (value.isascii() and value.isdigit() and len(value) <= 10):
            raise CorruptCheckpointError(f"partition {value[:40]!r} is not a partition number")
        value = int(value)
    return as_int(value, "a partition number", hi=MAX_PARTITION)


def as_optional_int(value: Any, what: str, *, lo: int = 0, hi: int = MAX_INT64) -> int | None:
    return None if value is None else as_int(value, what, lo=lo, hi=hi)


def as_str(value: Any, what: str, *, max_len: int = 4096) -> str:
    if not isinstance(value, str):
        raise CorruptCheckpointError(f"{what} is {_describe(value)}, not a string")
    if len(value) > max_len:
        raise CorruptCheckpointError(f"{what} is a string of {len(value):,} characters")
    return value


def as_map(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise CorruptCheckpointError(f"{what} is {_describe(value)}, not a JSON object")
    return value


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, str):
        return f"the string {value[:40]!r}" + ("…" if len(value) > 40 else "")
    if isinstance(value, bool | int | float):
        text = repr(value)
        return text if len(text) <= 40 else f"a number of {len(text)} characters"
    return f"a JSON {'array' if isinstance(value, list) else type(value).__name__}"


def _short(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return text if len(text) <= 120 else text[:117] + "…"
