"""Serdes turn the table's stored bytes into the objects callers want; the table stores bytes.

Built in: ``bytes`` (default), ``string``, ``json``. With a schema registry: ``avro``,
``json_schema`` and ``protobuf`` (:mod:`statesnap.serde.registry`). Any object with
``serialize(obj) -> bytes`` and ``deserialize(bytes) -> obj`` is a serde too.

Bytes a serde cannot decode raise :class:`~statesnap.errors.DeserializationError` with the cause
chained; the table adds key, partition and offset.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from statesnap.errors import ConfigError
from statesnap.serde.basic import BytesSerde, JsonSerde, Serde, StringSerde
from statesnap.serde.registry import (
    REGISTRY_SERDES,
    AvroSerde,
    JsonSchemaSerde,
    ProtobufSerde,
    RegistrySerde,
    SchemaRegistry,
)

__all__ = [
    "AvroSerde",
    "BytesSerde",
    "JsonSchemaSerde",
    "JsonSerde",
    "ProtobufSerde",
    "RegistrySerde",
    "SchemaRegistry",
    "Serde",
    "StringSerde",
    "resolve_serde",
]

_NAMED: dict[str, type[BytesSerde | StringSerde | JsonSerde]] = {
    "bytes": BytesSerde,
    "string": StringSerde,
    "str": StringSerde,
    "json": JsonSerde,
}


def resolve_serde(
    serde: Serde | str | None,
    *,
    schema_registry: SchemaRegistry | str | Mapping[str, Any] | None = None,
    topic: str | None = None,
    is_key: bool = False,
) -> Serde:
    """A serde instance from an instance, a name, or None (raw bytes).

    Names: ``bytes``, ``string``, ``json``; with *schema_registry* (settings, a URL, or a dict with
    ``url`` and client settings) and *topic* also ``avro`` and ``json_schema``, which read the
    writer's schema from the registry and serialize with the subject's latest version (they never
    register schemas). ``protobuf`` needs the generated message class, so build
    ``ProtobufSerde(registry, topic=..., message_type=...)`` and pass the instance.
    *is_key* picks the ``<topic>-key`` subject instead of ``<topic>-value``.
    """
    if serde is None:
        return BytesSerde()
    if isinstance(serde, str):
        name = serde.lower()
        if name in _NAMED:
            return _NAMED[name]()
        if name in REGISTRY_SERDES:
            if schema_registry is None:
                raise ConfigError(
                    f"serde {serde!r} needs a schema registry: set schema.registry.url in kafka_config"
                )
            if topic is None:
                raise ConfigError(f"serde {serde!r} needs the topic its subjects are named after")
            cls = REGISTRY_SERDES[name]
            if cls is ProtobufSerde:
                raise ConfigError(
                    "serde 'protobuf' needs the generated message class: pass "
                    "ProtobufSerde(schema_registry_url, topic=…, message_type=MyMessage) as the serde"
                )
            return cls(SchemaRegistry.of(schema_registry), topic=topic, is_key=is_key)
        known = sorted({*_NAMED, *REGISTRY_SERDES})
        raise ConfigError(f"unknown serde {serde!r}; known: {known}")
    if isinstance(serde, Serde):
        return serde
    raise ConfigError(f"not a serde: {serde!r}")
