"""Serdes turn the table's stored bytes into the objects callers want; the table stores bytes."""

from __future__ import annotations

import json
from typing import Any, Protocol, runtime_checkable

from statesnap.errors import ConfigError


@runtime_checkable
class Serde(Protocol):
    """Pairs of pure functions; ``deserialize(serialize(x)) == x``."""

    def serialize(self, obj: Any) -> bytes: ...

    def deserialize(self, data: bytes) -> Any: ...


class BytesSerde:
    """The default: keys and values are the raw Kafka bytes."""

    def serialize(self, obj: Any) -> bytes:
        if isinstance(obj, bytes | bytearray | memoryview):
            return bytes(obj)
        raise TypeError(f"BytesSerde needs bytes, got {type(obj).__name__}")

    def deserialize(self, data: bytes) -> Any:
        return data


class StringSerde:
    """UTF-8 text."""

    def __init__(self, encoding: str = "utf-8") -> None:
        self.encoding = encoding

    def serialize(self, obj: Any) -> bytes:
        return str(obj).encode(self.encoding)

    def deserialize(self, data: bytes) -> Any:
        return data.decode(self.encoding)


class JsonSerde:
    """JSON documents; serialization is canonical (sorted keys) so equal objects give equal bytes."""

    def serialize(self, obj: Any) -> bytes:
        return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()

    def deserialize(self, data: bytes) -> Any:
        return json.loads(data)


_NAMED: dict[str, type[BytesSerde | StringSerde | JsonSerde]] = {
    "bytes": BytesSerde,
    "string": StringSerde,
    "str": StringSerde,
    "json": JsonSerde,
}


def resolve_serde(serde: Serde | str | None) -> Serde:
    """A serde instance from an instance, a name (``bytes``, ``string``, ``json``) or None."""
    if serde is None:
        return BytesSerde()
    if isinstance(serde, str):
        try:
            return _NAMED[serde.lower()]()
        except KeyError as e:
            raise ConfigError(f"unknown serde {serde!r}; known: {sorted(_NAMED)}") from e
    if isinstance(serde, Serde):
        return serde
    raise ConfigError(f"not a serde: {serde!r}")
