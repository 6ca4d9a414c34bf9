"""Creating confluent-kafka clients, with librdkafka's configuration errors made typed.

librdkafka checks its settings when a client is created and raises ``cimpl.KafkaException``
(``No such configuration property``, ``Invalid value``, ``sasl.username and sasl.password must be
set``). Every client statesnap creates goes through here, so a typo in ``--kafka-config`` is a
one-line :class:`~statesnap.errors.KafkaConfigError` naming the property, never a traceback and
never a secret value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from statesnap.errors import KafkaConfigError
from statesnap.kafka.config import KafkaSettings
from statesnap.redaction import is_secret, scrub

__all__ = ["config_error", "new_admin", "new_consumer", "new_producer"]

_UNKNOWN = re.compile(r'No such configuration property: "(?P<prop>[^"]*)"')
_INVALID = re.compile(r'Invalid value (?:"(?P<value>.*)" )?for configuration property "(?P<prop>[^"]*)"')
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
_FAILED = re.compile(r"Failed to create [a-z ]+?: ")


def config_error(e: BaseException, conf: Mapping[str, Any]) -> KafkaConfigError:
    """Translate librdkafka's complaint about *conf* into a message that names the property.

    Values are shown only for properties that are not secret; whatever else librdkafka says is
    scrubbed of every secret value in *conf*.
    """
    err = e.args[0] if isinstance(e, KafkaException) and e.args else e
    text = err.str() if hasattr(err, "str") else str(err)
    m = _UNKNOWN.search(text)
    if m:
        prop = m["prop"]
        # A "name" with spaces is likely a value typed in the wrong place: do not echo it.
        named = _NAME.fullmatch(prop) is not None
        shown = repr(prop) if named else "(name not shown)"
        return KafkaConfigError(
            f"unknown Kafka client property {shown}; see librdkafka's CONFIGURATION.md",
            prop if named else None,
        )
    m = _INVALID.search(text)
    if m:
        prop = m["prop"]
        value = conf.get(prop)
        shown = f" {str(value)!r}" if value is not None and not is_secret(prop) else ""
        return KafkaConfigError(f"invalid value{shown} for Kafka client property {prop!r}", prop)
    detail = _FAILED.sub("", text)
    for key, value in conf.items():
        if is_secret(str(key)) and isinstance(value, str) and value:
            detail = detail.replace(value, "***")
    prop = next((k for k in conf if isinstance(k, str) and k in detail), None)
    return KafkaConfigError(f"invalid Kafka client settings: {scrub(detail)}", prop)


def _create(kind: type[Any], conf: dict[str, Any]) -> Any:
    # ``from None``: librdkafka's own message may quote a value, and a chained cause is printed
    # with any traceback; the typed error carries everything that is safe to show.
    try:
        return kind(conf)
    except KafkaException as e:
        raise config_error(e, conf) from None
    except (TypeError, ValueError) as e:
        # confluent-kafka's own type checks (e.g. a value of an unsupported type).
        raise KafkaConfigError(f"invalid Kafka client settings: {scrub(str(e))}") from None


def new_consumer(settings: KafkaSettings, **overrides: Any) -> Any:
    """A ``Consumer`` on *settings*; :class:`KafkaConfigError` for settings librdkafka refuses."""
    return _create(Consumer, settings.client_config(**overrides))


def new_producer(settings: KafkaSettings, **overrides: Any) -> Any:
    """A ``Producer`` on *settings*; :class:`KafkaConfigError` for settings librdkafka refuses."""
    return _create(Producer, settings.client_config(**overrides))


def new_admin(settings: KafkaSettings, **overrides: Any) -> Any:
    """An ``AdminClient`` on *settings*; :class:`KafkaConfigError` for settings librdkafka refuses."""
    return _create(AdminClient, settings.client_config(**overrides))
