"""The built-in serdes: raw bytes, text and canonical JSON.

Decoding failures raise :class:`~statesnap.errors.DeserializationError` with the cause chained, so
a caller (``Table.get``) can add the key, partition and offset and re-raise one typed error. Error
messages never quote the value: it may hold personal data or secrets.
"""

from __future__ import annotations

import json
import re
from typing import Any, Protocol, runtime_checkable

import orjson

from statesnap.errors import DeserializationError, SerializationError

__all__ = ["BytesSerde", "JsonSerde", "Serde", "StringSerde"]


@runtime_checkable
class Serde(Protocol):
    """Pairs of pure functions; ``deserialize(serialize(x)) == x``.

    ``deserialize`` raises :class:`~statesnap.errors.DeserializationError` (a ``ValueError``) for
    bytes it cannot decode; custom serdes may raise anything, the table wraps it.
    """

    def serialize(self, obj: Any) -> bytes: ...

    def deserialize(self, data: bytes) -> Any: ...


#: Digits of the shortest integer orjson may read as a float (2**63 has 19), and a run of them.
_LONG_NUMBER = 19
_DIGITS = re.compile(rb"[0-9]{19}")

#: Why no serde encodes None: Kafka's null (no key, a tombstone) is not a value of any type.
_NONE = (
    "cannot encode None: a null key or value has no bytes (records without a key are skipped, a "
    "None value is a tombstone); give a real key or value"
)


class BytesSerde:
    """The default: keys and values are the raw Kafka bytes."""

    def serialize(self, obj: Any) -> bytes:
        if type(obj) is bytes:  # the common case, without a copy
            return obj
        if isinstance(obj, bytes | bytearray | memoryview):
            return bytes(obj)
        raise TypeError(f"BytesSerde needs bytes, got {type(obj).__name__}")

    def deserialize(self, data: bytes) -> Any:
        return data


class StringSerde:
    """Text in one encoding (UTF-8 by default)."""

    def __init__(self, encoding: str = "utf-8") -> None:
        self.encoding = encoding

    def serialize(self, obj: Any) -> bytes:
        if obj is None:  # str(None) would make a null key one row with the text key "None"
            raise SerializationError(_NONE)
        return str(obj).encode(self.encoding)

    def deserialize(self, data: bytes) -> Any:
        try:
            return data.decode(self.encoding)
        except UnicodeDecodeError as e:
            raise DeserializationError(
                f"not valid {self.encoding} text: byte {e.start} of {len(data)} cannot be decoded"
            ) from e


class JsonSerde:
    """JSON documents; serialization is canonical (sorted keys) so equal objects give equal bytes.
    ``None`` is the document ``null``, a value (a record whose bytes are ``null`` is no tombstone).

    Hot paths (processors read and write a store value per record): decoding goes through orjson
    (about 10x faster) and falls back to the standard library for what orjson refuses but JSON
    allows (NaN, integers past 64 bits, lone surrogates), so both give the same objects; an int
    encodes as its decimal digits, exactly what ``json.dumps`` writes.
    """

    def serialize(self, obj: Any) -> bytes:
        if type(obj) is int:
            return str(obj).encode()
        try:
            return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
        except (TypeError, ValueError) as e:
            raise SerializationError(f"cannot encode {type(obj).__name__} as JSON: {e}") from e

    def deserialize(self, data: bytes) -> Any:
        # orjson turns an integer past 64 bits into a float without a word: 19+ digits in a row
        # (only ever in such numbers, or in strings) go to the standard library, which is exact.
        if len(data) < _LONG_NUMBER or _DIGITS.search(data) is None:
            try:
                return orjson.loads(data)
            except orjson.JSONDecodeError:
                pass
        try:
            return json.loads(data)
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
            raise DeserializationError(f"not valid JSON ({e}; {len(data)} bytes)") from e
