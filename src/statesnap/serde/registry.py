"""Schema-registry serdes: Avro, Protobuf and JSON Schema values framed the Confluent way (magic
byte, schema id, payload), through confluent-kafka's own serializers and deserializers.

``pip install 'statesnap[schema-registry]'`` brings what they import (fastavro, protobuf, jsonschema,
authlib, cachetools). A table reads: by default a serde never registers a schema
(``auto.register.schemas=False``); it serializes keys for lookups with the schema you give, which
must already be registered, or with the subject's latest version when you give none. Subjects
follow the topic name strategy (``<topic>-key`` / ``<topic>-value``) unless ``conf`` says otherwise.

Serdes pickle by configuration (registry URL and settings, schema, topic), never by live clients:
the client and codecs are built on first use, in the process that uses them.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import urlsplit

from statesnap.errors import (
    ConfigError,
    DeserializationError,
    SchemaRegistryError,
    SerdeError,
    SerializationError,
)
from statesnap.redaction import redact_url, register_secret, register_url_secrets

__all__ = [
    "INSTALL_HINT",
    "REGISTRY_SERDES",
    "AvroSerde",
    "Codec",
    "JsonSchemaSerde",
    "ProtobufSerde",
    "RegistrySerde",
    "SchemaRegistry",
]

#: Registry client settings whose values are secrets: never shown in reprs, logs or errors.
_SECRET_MARKERS = ("password", "secret", "user.info", "token", "key.password")

#: confluent-kafka's extras, named in the error when one is missing.
INSTALL_HINT = "pip install 'statesnap[schema-registry]'"

Codec = Callable[[Any, Any], Any]


def _redact_url(url: str) -> str:
    """*url* (a comma-separated list) without userinfo: the registry client accepts credentials
    in the URL, and a password holding '/' would end ``urlsplit``'s host early and show."""
    return ",".join(redact_url(one.strip()) for one in url.split(","))


@dataclass(frozen=True, slots=True)
class SchemaRegistry:
    """Where the schema registry is and how to reach it.

    ``config`` holds confluent-kafka ``SchemaRegistryClient`` settings besides ``url``:
    ``basic.auth.user.info``, ``bearer.auth.*``, ``ssl.ca.location``, ``ssl.certificate.location``,
    ``ssl.key.location``, ``timeout``, ``max.retries``, … Secret values never appear in its repr.
    """

    url: str
    config: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url.strip():
            raise ConfigError("schema registry url is empty")
        for one in self.url.split(","):
            split = urlsplit(one.strip())
            if split.scheme not in ("http", "https") or not split.hostname:
                raise ConfigError(
                    f"schema registry url must be http(s)://host[:port], got {_redact_url(one.strip())!r}"
                )
        if "url" in self.config:
            raise ConfigError("give the schema registry url as `url`, not inside its config")
        object.__setattr__(self, "config", dict(self.config))
        # So that the client's own errors and logs, which may quote them, are masked.
        register_url_secrets(self.url)
        for key, value in self.config.items():
            if any(m in key.lower() for m in _SECRET_MARKERS):
                register_secret(value)

    @classmethod
    def of(
        cls, spec: SchemaRegistry | str | Mapping[str, Any], config: Mapping[str, Any] | None = None
    ) -> SchemaRegistry:
        """From an instance, a URL (plus *config*), or a confluent-style dict with a ``url`` key."""
        if isinstance(spec, SchemaRegistry):
            return spec if not config else cls(spec.url, {**spec.config, **config})
        if isinstance(spec, str):
            return cls(spec, dict(config or {}))
        if isinstance(spec, Mapping):
            rest = {k: v for k, v in spec.items() if k != "url"}
            if "url" not in spec:
                raise ConfigError("schema registry settings need a `url`")
            return cls(str(spec["url"]), {**rest, **(config or {})})
        raise ConfigError(f"not schema registry settings: {type(spec).__name__}")

    @property
    def safe_url(self) -> str:
        """The URL without credentials, for messages."""
        return _redact_url(self.url)

    def __repr__(self) -> str:
        shown = {
            k: ("***" if any(m in k.lower() for m in _SECRET_MARKERS) else v) for k, v in self.config.items()
        }
        return f"SchemaRegistry(url={self.safe_url!r}, config={shown!r})"

    def client(self) -> Any:
        """A new ``confluent_kafka.schema_registry.SchemaRegistryClient`` for these settings."""
        try:
            _import_registry_quietly()
            from confluent_kafka.schema_registry import SchemaRegistryClient
        except ImportError as e:  # authlib, cachetools, … are extras of confluent-kafka
            raise ConfigError(f"schema-registry serdes need extra packages ({e.name}): {INSTALL_HINT}") from e
        try:
            return SchemaRegistryClient({"url": self.url, **self.config})
        except (ValueError, TypeError) as e:
            # Messages name settings, not their values; the URL is never echoed.
            raise ConfigError(f"schema registry {self.safe_url}: {_no_url(str(e), self.url)}") from e


#: The one warning :func:`_import_registry_quietly` silences: authlib (a dependency of
#: confluent-kafka's registry client) warns on import that its ``httpx`` integration is
#: deprecated, which users of statesnap can do nothing about.
_AUTHLIB_HTTPX_WARNING = r"The httpx module is deprecated"
_import_lock = threading.Lock()


def _import_registry_quietly() -> None:
    """Import confluent-kafka's registry client without authlib's ``AuthlibDeprecationWarning``.

    Narrow on purpose: only that message, only during this import (Python caches the module, so
    later imports are silent anyway). ``authlib.deprecate`` is imported first, outside the guard,
    because on import it puts an ``always`` filter for its warnings at the front of the global
    filter list, which would shadow ours, and must keep doing so for authlib's other warnings.
    """
    with _import_lock:
        with contextlib.suppress(ImportError):  # reported by the import below, with the hint
            importlib.import_module("authlib.deprecate")  # its filter goes in before ours
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_AUTHLIB_HTTPX_WARNING, category=DeprecationWarning)
            import confluent_kafka.schema_registry  # noqa: F401


def _no_url(message: str, url: str) -> str:
    return message.replace(url, _redact_url(url))


class RegistrySerde:
    """Base of the schema-registry serdes: one subject (``<topic>-key`` or ``<topic>-value`` by
    default), confluent-kafka's serializer and deserializer built lazily, errors translated to
    :class:`~statesnap.errors.SerdeError` subclasses with the cause chained."""

    #: The schema type this serde handles, as the registry names it.
    kind: ClassVar[str] = ""
    #: Serializer settings a reader wants: never register schemas.
    _SERIALIZER_DEFAULTS: ClassVar[dict[str, Any]] = {
        "auto.register.schemas": False,
        "subject.name.strategy.type": "TOPIC",
    }
    _DESERIALIZER_DEFAULTS: ClassVar[dict[str, Any]] = {"subject.name.strategy.type": "TOPIC"}

    def __init__(
        self,
        registry: SchemaRegistry | str | Mapping[str, Any],
        *,
        topic: str,
        is_key: bool = False,
        conf: Mapping[str, Any] | None = None,
        deserializer_conf: Mapping[str, Any] | None = None,
    ) -> None:
        """
        Args:
            registry: the registry (settings, a URL, or a dict with ``url``).
            topic: the topic whose subjects hold the schemas.
            is_key: whether this serde converts keys (subject ``<topic>-key``) or values.
            conf: serializer settings (e.g. ``{"auto.register.schemas": True}`` for a producer,
                ``use.latest.version``, ``subject.name.strategy.type``).
            deserializer_conf: deserializer settings.
        """
        if not topic:
            raise ConfigError(f"{self.kind.lower()} serde needs the topic (its subjects are named after it)")
        self.registry = SchemaRegistry.of(registry)
        self.topic = topic
        self.is_key = is_key
        self.conf = {**self._SERIALIZER_DEFAULTS, **dict(conf or {})}
        self.deserializer_conf = {**self._DESERIALIZER_DEFAULTS, **dict(deserializer_conf or {})}
        self._lock = threading.Lock()
        self._codecs: tuple[Codec, Codec, Any] | None = None

    def __repr__(self) -> str:
        field_name = "key" if self.is_key else "value"
        return f"{type(self).__name__}(topic={self.topic!r}, field={field_name}, registry={self.registry!r})"

    # --- pickling by configuration ------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_lock", None)
        state["_codecs"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # --- the codecs ---------------------------------------------------------------------------

    def _make(self, client: Any) -> tuple[Codec, Codec]:
        """(serializer, deserializer) for *client*; subclasses build confluent-kafka's."""
        raise NotImplementedError

    def _ensure(self) -> tuple[Codec, Codec, Any]:
        codecs = self._codecs
        if codecs is None:
            with self._lock:
                if self._codecs is None:
                    try:
                        from confluent_kafka.serialization import MessageField, SerializationContext
                    except ImportError as e:  # pragma: no cover - confluent-kafka is a dependency
                        raise ConfigError(
                            f"schema-registry serdes need confluent-kafka: {INSTALL_HINT}"
                        ) from e
                    client = self.registry.client()
                    try:
                        ser, de = self._make(client)
                    except ImportError as e:
                        raise ConfigError(
                            f"{self.kind.lower()} serde needs extra packages ({e.name}): {INSTALL_HINT}"
                        ) from e
                    except (ValueError, TypeError) as e:
                        raise ConfigError(f"{self.kind.lower()} serde for topic {self.topic!r}: {e}") from e
                    ctx = SerializationContext(
                        self.topic, MessageField.KEY if self.is_key else MessageField.VALUE
                    )
                    self._codecs = (ser, de, ctx)
                codecs = self._codecs
        return codecs

    @property
    def subject(self) -> str:
        """The subject under the default (topic name) strategy."""
        return f"{self.topic}-{'key' if self.is_key else 'value'}"

    def serialize(self, obj: Any) -> bytes:
        ser, _de, ctx = self._ensure()
        try:
            data = ser(obj, ctx)
        except SerdeError:
            raise
        except Exception as e:
            raise self._translate(e, SerializationError, "cannot serialize") from e
        if not isinstance(data, bytes):
            raise SerializationError(f"{self.kind} serializer returned {type(data).__name__}, not bytes")
        return data

    def deserialize(self, data: bytes) -> Any:
        _ser, de, ctx = self._ensure()
        try:
            return de(bytes(data), ctx)
        except SerdeError:
            raise
        except Exception as e:
            raise self._translate(e, DeserializationError, "cannot deserialize") from e

    def _translate(self, e: Exception, kind: type[SerdeError], what: str) -> SerdeError:
        """One typed error for a failure inside confluent-kafka: the registry's own refusals and
        unreachable registries become :class:`SchemaRegistryError` unless they concern the data
        (an unknown schema id is the data's fault: the bytes name a schema the registry lacks)."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError as RegistryRefusal

        where = f"{self.kind} {'key' if self.is_key else 'value'} of topic {self.topic!r}"
        reg = self.registry.safe_url
        if isinstance(e, RegistryRefusal):
            detail = f"{e.error_message} (HTTP {e.http_status_code}, code {e.error_code})"
            if kind is DeserializationError and e.http_status_code == 404:
                return DeserializationError(f"{what} {where}: schema registry {reg} answered: {detail}")
            return SchemaRegistryError(f"{what} {where}: schema registry {reg} answered: {detail}")
        if _is_transport_error(e):
            return SchemaRegistryError(
                f"{what} {where}: cannot reach schema registry {reg}: {type(e).__name__}"
            )
        return kind(f"{what} {where}: {_no_url(str(e), self.registry.url) or type(e).__name__}")


def _is_transport_error(e: BaseException) -> bool:
    """An HTTP transport failure of httpx or httpx2 (whichever the registry client uses)."""
    return any(
        cls.__name__ in ("TransportError", "TimeoutException", "NetworkError", "ConnectError")
        and cls.__module__.split(".")[0] in ("httpx", "httpx2")
        for cls in type(e).__mro__
    )


class AvroSerde(RegistrySerde):
    """Avro values (records as dicts).

    ``schema`` is the writer schema for :meth:`serialize` (Avro JSON text); without it the subject's
    latest registered version is used. Deserialization always uses the writer's schema by the id in
    the bytes (``reader_schema`` to project onto another).
    """

    kind = "AVRO"

    def __init__(
        self,
        registry: SchemaRegistry | str | Mapping[str, Any],
        *,
        topic: str,
        is_key: bool = False,
        schema: str | None = None,
        reader_schema: str | None = None,
        conf: Mapping[str, Any] | None = None,
        deserializer_conf: Mapping[str, Any] | None = None,
    ) -> None:
        if schema is None:
            conf = {"use.latest.version": True, **dict(conf or {})}
        super().__init__(registry, topic=topic, is_key=is_key, conf=conf, deserializer_conf=deserializer_conf)
        self.schema = schema
        self.reader_schema = reader_schema

    def _make(self, client: Any) -> tuple[Codec, Codec]:
        from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer

        ser = AvroSerializer(client, self.schema, conf=self.conf)
        de = AvroDeserializer(client, self.reader_schema, conf=self.deserializer_conf)
        return ser, de


class JsonSchemaSerde(RegistrySerde):
    """JSON Schema values (JSON documents, validated against the schema on both sides).

    ``schema`` is the writer schema for :meth:`serialize` (JSON Schema text); without it the
    subject's latest registered version is used.
    """

    kind = "JSON"

    def __init__(
        self,
        registry: SchemaRegistry | str | Mapping[str, Any],
        *,
        topic: str,
        is_key: bool = False,
        schema: str | None = None,
        conf: Mapping[str, Any] | None = None,
        deserializer_conf: Mapping[str, Any] | None = None,
    ) -> None:
        if schema is None:
            conf = {"use.latest.version": True, **dict(conf or {})}
        super().__init__(registry, topic=topic, is_key=is_key, conf=conf, deserializer_conf=deserializer_conf)
        self.schema = schema

    def _make(self, client: Any) -> tuple[Codec, Codec]:
        from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer

        ser = JSONSerializer(self.schema, client, conf=self.conf)
        de = JSONDeserializer(None, schema_registry_client=client, conf=self.deserializer_conf)
        return ser, de


class ProtobufSerde(RegistrySerde):
    """Protobuf values as instances of *message_type* (a generated message class): confluent-kafka
    needs the class on both sides; the registry supplies the writer's schema id and references."""

    kind = "PROTOBUF"

    def __init__(
        self,
        registry: SchemaRegistry | str | Mapping[str, Any],
        *,
        topic: str,
        message_type: type[Any] | None,
        is_key: bool = False,
        conf: Mapping[str, Any] | None = None,
        deserializer_conf: Mapping[str, Any] | None = None,
    ) -> None:
        if message_type is None or not hasattr(message_type, "DESCRIPTOR"):
            raise ConfigError(
                "protobuf serde needs message_type=<generated protobuf message class>, "
                f"got {message_type!r}: build ProtobufSerde(registry, topic=..., message_type=MyMessage)"
            )
        super().__init__(registry, topic=topic, is_key=is_key, conf=conf, deserializer_conf=deserializer_conf)
        self.message_type = message_type

    def _make(self, client: Any) -> tuple[Codec, Codec]:
        from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer

        ser = ProtobufSerializer(self.message_type, client, conf=self.conf)
        de = ProtobufDeserializer(
            self.message_type, conf=self.deserializer_conf, schema_registry_client=client
        )
        return ser, de


#: Serde names that need a schema registry, and their classes.
REGISTRY_SERDES: dict[str, type[RegistrySerde]] = {
    "avro": AvroSerde,
    "json_schema": JsonSchemaSerde,
    "jsonschema": JsonSchemaSerde,
    "protobuf": ProtobufSerde,
}
