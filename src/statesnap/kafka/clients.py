"""Creating confluent-kafka clients, with librdkafka's configuration errors made typed.

librdkafka checks its settings when a client is created and raises ``cimpl.KafkaException``
(``No such configuration property``, ``Invalid value``, ``sasl.username and sasl.password must be
set``). Every client statesnap creates goes through here, so a typo in ``--kafka-config`` is a
one-line :class:`~statesnap.errors.KafkaConfigError` naming the property, never a traceback and
never a secret value.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from statesnap.errors import KafkaConfigError
from statesnap.kafka.config import KafkaSettings
from statesnap.redaction import is_secret, scrub

__all__ = [
    "ConnectionErrors",
    "config_error",
    "new_admin",
    "new_consumer",
    "new_producer",
    "new_watched_admin",
]

_UNKNOWN = re.compile(r'No such configuration property: "(?P<prop>[^"]*)"')
_INVALID = re.compile(r'Invalid value (?:"(?P<value>.*)" )?for configuration property "(?P<prop>[^"]*)"')
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
_FAILED = re.compile(r"Failed to create [a-z ]+?: ")


def config_error(e: BaseException, conf: Mapping[str, Any]) -> KafkaConfigError:
    """Translate librdkafka's complaint about *conf* into a message that names the property.

    A refused value is never shown (it may be a secret in the wrong place); whatever else
    librdkafka says is scrubbed of every secret value in *conf*.
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
        # Never the value, whatever the property: one that fails to parse may be a secret pasted
        # in the wrong place (``fetch.wait.max.ms=<password>``).
        prop = m["prop"]
        return KafkaConfigError(f"invalid value for Kafka client property {prop!r}", prop)
    detail = _FAILED.sub("", text)
    for key, value in conf.items():
        if is_secret(str(key)) and isinstance(value, str) and value:
            detail = detail.replace(value, "***")
    prop = next((k for k in conf if isinstance(k, str) and k in detail), None)
    return KafkaConfigError(f"invalid Kafka client settings: {scrub(detail)}", prop)


#: librdkafka error codes that mean "a broker answered, but not in the way this client speaks".
_AUTHENTICATION = -169  # RD_KAFKA_RESP_ERR__AUTHENTICATION: SASL handshake or credentials
_SSL = -181  # RD_KAFKA_RESP_ERR__SSL: TLS handshake or certificate
_TRANSPORT = -195  # RD_KAFKA_RESP_ERR__TRANSPORT: the connection failed or was closed
_ALL_BROKERS_DOWN = -187  # RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN
_TLS_SETTINGS = ("SSL", "SASL_SSL")


class ConnectionErrors:
    """What librdkafka said about one client's connections — its errors (``error_cb``) and its
    connection-failure log lines (``logger``) — turned into a one-line hint when the client gives
    up: a TLS or SASL mismatch with the listener otherwise surfaces only as "no broker answered
    within N s". Both callbacks are served by ``poll()`` on the caller's thread; the lock is for a
    reader on another thread. Every log line still reaches the logger the client had.
    """

    def __init__(
        self,
        conf: Mapping[str, Any],
        chained: Callable[[Any], None] | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self._conf = conf
        self._chained = chained
        self._logger = logger
        self._lock = threading.Lock()
        self._code: int | None = None
        self._text = ""

    def __call__(self, err: Any) -> None:
        """``error_cb``."""
        code, text = int(err.code()), str(err.str())
        # "1/1 brokers are down" says nothing a specific error did not say already.
        if "brokers are down" not in text or self._code is None:
            with self._lock:
                self._code, self._text = code, text
        if self._chained is not None:
            self._chained(err)

    def log(self, level: int, msg: str, *args: Any) -> None:
        """``logger``: a connection closed during the first request (``APIVERSION_QUERY``) is
        logged, not reported as an error — a plaintext client hanging up on a TLS listener."""
        text = msg % args if args else msg
        if "APIVERSION_QUERY" in text or "ApiVersion" in text:
            with self._lock:
                if self._code in (None, _TRANSPORT, _ALL_BROKERS_DOWN):
                    self._code, self._text = _TRANSPORT, text
        if self._logger is not None:
            self._logger.log(level, msg, *args)

    def hint(self) -> str:
        """``"; <what librdkafka saw> — <what to check>"``, or ``""`` when nothing points at the
        client's security settings (then the address or the network is the likelier cause)."""
        with self._lock:
            code, text = self._code, self._text
        protocol = str(self._conf.get("security.protocol", "PLAINTEXT")).upper()
        check = f"is security.protocol right for this listener? (it is {protocol})"
        detail = _scrub_conf(_short(text), self._conf)
        if code == _AUTHENTICATION or "SASL" in text:
            return f"; authentication failed: {detail} — {check}; then sasl.mechanism and the credentials"
        if "APIVERSION_QUERY" in text or "ApiVersion" in text:
            return f"; the broker hung up on the first request — {check}"
        if code == _SSL or "SSL" in text or "TLS" in text:
            return f"; TLS handshake failed: {detail} — {check}"
        if protocol in _TLS_SETTINGS:
            # A TLS client against a plaintext listener sends its ClientHello and waits: the
            # broker reads it as a request that never completes, and nothing is logged (Tansu).
            return f"; no answer to the TLS handshake — {check}"
        return ""


def _short(text: str) -> str:
    """librdkafka's message without its ``sasl_ssl://host:port/bootstrap:`` prefix and timing."""
    text = re.sub(r"^[a-z_]+://\S+?: ", "", text)
    return re.sub(r" \(after \d+ms in state [A-Z_]+\)$", "", text)


def _scrub_conf(text: str, conf: Mapping[str, Any]) -> str:
    for key, value in conf.items():
        if is_secret(str(key)) and isinstance(value, str) and value:
            text = text.replace(value, "***")
    return scrub(text)


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
    return _create(Consumer, settings.consumer_config(**overrides))


def new_producer(settings: KafkaSettings, **overrides: Any) -> Any:
    """A ``Producer`` on *settings*; :class:`KafkaConfigError` for settings librdkafka refuses."""
    return _create(Producer, settings.producer_config(**overrides))


def new_admin(settings: KafkaSettings, **overrides: Any) -> Any:
    """An ``AdminClient`` on *settings*; :class:`KafkaConfigError` for settings librdkafka refuses."""
    return _create(AdminClient, settings.producer_config(**overrides))


def new_watched_admin(settings: KafkaSettings, **overrides: Any) -> tuple[Any, ConnectionErrors]:
    """``new_admin`` plus the :class:`ConnectionErrors` its ``error_cb`` records (a user's own
    ``error_cb`` still gets every error)."""
    conf = settings.producer_config(**overrides)
    errors = ConnectionErrors(conf, conf.get("error_cb"), conf.get("logger"))
    conf["error_cb"] = errors
    conf["logger"] = errors
    return _create(AdminClient, conf), errors
