"""Java Kafka-client settings (Spark's ``kafka.*`` options) as librdkafka properties.

A Spark job carries settings written for the Java client: ``sasl.jaas.config``, JKS or PEM
truststores, deserializers. librdkafka spells most of them the same, some differently, and some
cannot exist there. :func:`translate` maps each one — translated, accepted and ignored (with a
log line saying why), or refused with a line saying what to write instead — and
:func:`check_client_config` lets librdkafka itself check the result, so nothing reaches the
first task that librdkafka would reject. Values of secret settings never appear in an error.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException

from statesnap.errors import ConfigError, KafkaConfigError
from statesnap.kafka.config import CLIENT_LOGGER, is_secret

__all__ = [
    "IGNORED",
    "JAVA_REFUSED",
    "RENAMED",
    "SOURCE_OWNED",
    "SPARK_REFUSED",
    "check_client_config",
    "store_kind",
    "translate",
]

log = logging.getLogger(__name__)

#: Refused by Spark's own Kafka source; the same words here.
SPARK_REFUSED = {
    "key.deserializer": "Kafka option 'key.deserializer' is not supported as keys are deserialized as byte "
    "arrays with ByteArrayDeserializer. Use DataFrame operations to explicitly deserialize the keys.",
    "value.deserializer": "Kafka option 'value.deserializer' is not supported as values are deserialized as "
    "byte arrays with ByteArrayDeserializer. Use DataFrame operations to explicitly deserialize the values.",
    "key.serializer": "Kafka option 'key.serializer' is not supported as keys are serialized with "
    "ByteArraySerializer.",
    "value.serializer": "Kafka option 'value.serializer' is not supported as values are serialized with "
    "ByteArraySerializer.",
    "enable.auto.commit": "Kafka option 'enable.auto.commit' is not supported",
    "interceptor.classes": "Kafka option 'interceptor.classes' is not supported",
    "auto.offset.reset": "Kafka option 'auto.offset.reset' is not supported. Instead set the source option "
    "'startingOffsets' to 'earliest' or 'latest' to specify where to start.",
}
#: Properties the source sets itself: exact range reads depend on them.
SOURCE_OWNED = frozenset({"enable.partition.eof", "enable.auto.offset.store", "group.instance.id"})
#: Java names librdkafka spells differently (same meaning).
RENAMED = {
    "fetch.max.wait.ms": "fetch.wait.max.ms",
    "receive.buffer.bytes": "socket.receive.buffer.bytes",
    "send.buffer.bytes": "socket.send.buffer.bytes",
    "ssl.truststore.certificates": "ssl.ca.pem",
    "ssl.keystore.key": "ssl.key.pem",
    "ssl.keystore.certificate.chain": "ssl.certificate.pem",
}
#: Java-only settings that change nothing about what is read here: accepted, logged, dropped.
IGNORED = {
    "max.poll.records": "librdkafka has no poll batch size; tasks read in batches of their own",
    "default.api.timeout.ms": "use metadataTimeoutMs / kafkaConsumer.pollTimeoutMs",
    "partition.assignment.strategy": "partitions are assigned by the source, without a consumer group",
    "exclude.internal.topics": "subscribePattern never matches Kafka's internal topics",
    "ssl.protocol": "librdkafka negotiates the TLS version with OpenSSL (TLS 1.2 and later)",
    "ssl.enabled.protocols": "librdkafka negotiates the TLS version with OpenSSL (TLS 1.2 and later)",
    "ssl.keymanager.algorithm": "a JVM security-provider setting",
    "ssl.trustmanager.algorithm": "a JVM security-provider setting",
    "ssl.secure.random.implementation": "a JVM security-provider setting",
    "metric.reporters": "a JVM metrics setting",
    "metrics.num.samples": "a JVM metrics setting",
    "metrics.sample.window.ms": "a JVM metrics setting",
    "metrics.recording.level": "a JVM metrics setting",
    "auto.include.jmx.reporter": "a JVM metrics setting",
}
_JAVA_CLASSES = "Java classes cannot run inside librdkafka"
#: Java-only settings that would change security or payloads: refused, saying what to use.
JAVA_REFUSED = {
    "sasl.login.callback.handler.class": f"{_JAVA_CLASSES}; for OAUTHBEARER/OIDC set "
    "kafka.sasl.oauthbearer.method=oidc and "
    "kafka.sasl.oauthbearer.client.id/client.secret/token.endpoint.url",
    "sasl.client.callback.handler.class": f"{_JAVA_CLASSES}; use kafka.sasl.username/kafka.sasl.password",
    "sasl.login.class": f"{_JAVA_CLASSES}; set the mechanism's librdkafka properties instead",
    "security.providers": f"{_JAVA_CLASSES}; librdkafka uses OpenSSL",
    "ssl.engine.factory.class": f"{_JAVA_CLASSES}; librdkafka uses OpenSSL",
}
_LOGIN_MODULE = re.compile(r"^\s*([\w.$]+)\s+(required|requisite|sufficient|optional)\b(.*?);?\s*$", re.S)
_JAAS_OPTION = re.compile(r'([\w.]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^\s;]+)')


def translate(java: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``(librdkafka properties, origin)``: *origin* maps each librdkafka property back to the
    ``kafka.*`` option it came from, so later errors name what the user wrote."""
    props = {str(k): str(v) for k, v in java.items()}
    out: dict[str, str] = {}
    origin: dict[str, str] = {}
    for name in list(props):
        lower = name.lower()
        if lower in SPARK_REFUSED:
            raise ConfigError(f"option kafka.{name}: {SPARK_REFUSED[lower]}")
        if lower in SOURCE_OWNED:
            raise ConfigError(
                f"option kafka.{name} is not supported: the source sets it itself "
                "(use startingOffsets/endingOffsets to choose where to read)"
            )
        if lower in JAVA_REFUSED:
            raise ConfigError(f"option kafka.{name} is not supported: {JAVA_REFUSED[lower]}")
        if lower in IGNORED:
            log.info("option kafka.%s is ignored: %s", name, IGNORED[lower])
            props.pop(name)
    if "sasl.jaas.config" in props:
        for prop, value in _jaas(props.pop("sasl.jaas.config"), props.get("sasl.mechanism")).items():
            out[prop], origin[prop] = value, "sasl.jaas.config"
    out_stores, store_origin = _stores(props)
    out.update(out_stores)
    origin.update(store_origin)
    for name, value in props.items():
        target = RENAMED.get(name.lower(), name)
        # Java's empty value disables host-name checks; librdkafka says "none".
        empty_check = name.lower() == "ssl.endpoint.identification.algorithm" and not value.strip()
        out[target] = (
            "none" if empty_check else value
        )  # an explicit librdkafka setting wins over one derived from JAAS
        origin[target] = name
    return out, origin


def _jaas(text: str, mechanism: str | None) -> dict[str, str]:
    """PLAIN and SCRAM login modules → ``sasl.username``/``sasl.password`` (+ mechanism)."""
    match = _LOGIN_MODULE.match(text)
    if match is None:
        raise ConfigError(
            "option kafka.sasl.jaas.config is not of the form '<LoginModule> required key=\"value\" …;' "
            "(its content is not shown)"
        )
    module = match.group(1)
    options = {k: _unquote(v) for k, v in _JAAS_OPTION.findall(match.group(3))}
    short = module.rsplit(".", 1)[-1]
    if short == "OAuthBearerLoginModule":
        raise ConfigError(
            "option kafka.sasl.jaas.config: OAuthBearerLoginModule is a Java login; for OIDC set "
            "kafka.sasl.mechanism=OAUTHBEARER, kafka.sasl.oauthbearer.method=oidc and "
            "kafka.sasl.oauthbearer.client.id/client.secret/token.endpoint.url"
        )
    if short == "Krb5LoginModule":
        raise ConfigError(
            "option kafka.sasl.jaas.config: for Kerberos (GSSAPI) set kafka.sasl.kerberos.keytab, "
            "kafka.sasl.kerberos.principal and kafka.sasl.kerberos.service.name instead"
        )
    if short not in ("PlainLoginModule", "ScramLoginModule"):
        raise ConfigError(
            f"option kafka.sasl.jaas.config: login module {module} has no librdkafka equivalent; "
            "PlainLoginModule and ScramLoginModule are translated"
        )
    missing = [k for k in ("username", "password") if k not in options]
    if missing:
        raise ConfigError(f"option kafka.sasl.jaas.config: {short} needs {' and '.join(missing)}")
    out = {"sasl.username": options["username"], "sasl.password": options["password"]}
    if mechanism is None:
        if short == "ScramLoginModule":
            raise ConfigError(
                "option kafka.sasl.jaas.config uses ScramLoginModule: set kafka.sasl.mechanism to "
                "SCRAM-SHA-256 or SCRAM-SHA-512"
            )
        out["sasl.mechanism"] = "PLAIN"
    return out


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return re.sub(r"\\(.)", r"\1", value[1:-1])
    return value


def _stores(props: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """Truststores and keystores: PEM truststores and PKCS#12 keystores translate; JKS cannot."""
    out: dict[str, str] = {}
    origin: dict[str, str] = {}
    trust_type = props.pop("ssl.truststore.type", None)
    props.pop("ssl.truststore.password", None)  # only JKS/PKCS#12 truststores have one
    location = props.pop("ssl.truststore.location", None)
    if location is not None:
        kind = store_kind(location, trust_type, "ssl.truststore.location")
        if kind != "PEM":
            raise ConfigError(
                f"option kafka.ssl.truststore.location: {location} is a {kind} truststore, which librdkafka "
                f"cannot read; write its certificates as PEM (keytool -list -rfc -keystore {location} "
                "> ca.pem) and point kafka.ssl.truststore.location (or kafka.ssl.ca.location) at that file"
            )
        out["ssl.ca.location"], origin["ssl.ca.location"] = location, "ssl.truststore.location"
    key_type = props.pop("ssl.keystore.type", None)
    location = props.get("ssl.keystore.location")
    if location is not None:
        kind = store_kind(location, key_type, "ssl.keystore.location")
        if kind == "JKS":
            raise ConfigError(
                f"option kafka.ssl.keystore.location: {location} is a JKS keystore, which librdkafka cannot "
                f"read; convert it (keytool -importkeystore -srckeystore {location} -destkeystore client.p12 "
                "-deststoretype PKCS12) and point kafka.ssl.keystore.location at the .p12 file"
            )
        if kind == "PEM":
            raise ConfigError(
                f"option kafka.ssl.keystore.location: {location} is a PEM keystore; set "
                "kafka.ssl.certificate.location and kafka.ssl.key.location to its certificate and key"
            )
    return out, origin


def store_kind(location: str, declared: str | None, option: str) -> str:
    """``PEM``, ``JKS`` or ``PKCS12``, from the file's first bytes (the driver needs to read it too:
    Spark's driver runs a Kafka client with the same settings)."""
    try:
        with Path(location).open("rb") as f:
            head = f.read(4096)
    except OSError as e:
        raise ConfigError(
            f"option kafka.{option}: cannot read {location} on the driver ({e.strerror})"
        ) from e
    if b"-----BEGIN" in head:
        return "PEM"
    if head[:4] in (b"\xfe\xed\xfe\xed", b"\xce\xce\xce\xce"):
        return "JKS"
    if head[:1] == b"\x30":
        return "PKCS12"
    return (declared or "JKS").upper()


_PROPERTY = re.compile(r'"([A-Za-z0-9_.\-]+)"|`([A-Za-z0-9_.\-]+)`|([a-z]+(?:\.[a-z0-9]+)+) failed')


def check_client_config(
    bootstrap_servers: str, config: Mapping[str, str], origin: Mapping[str, str] | None = None
) -> None:
    """Let librdkafka build a consumer from *config* — without bootstrap servers, so it connects
    nowhere — and close it: unknown properties, bad values and unreadable certificate files fail
    here, in one line that names the ``kafka.*`` option and never shows a secret value.
    (*bootstrap_servers* is checked when the source first talks to the cluster.)"""
    conf = {"group.id": "statesnap-config-check", "logger": CLIENT_LOGGER, **dict(config)}
    conf.pop("bootstrap.servers", None)
    try:
        consumer = Consumer(conf)
    except KafkaException as e:
        message, prop = _explain(e, config, origin or {})
        raise KafkaConfigError(message, prop) from None
    consumer.close()


def _explain(
    e: KafkaException, config: Mapping[str, str], origin: Mapping[str, str]
) -> tuple[str, str | None]:
    err: Any = e.args[0] if e.args else None
    text = str(err.str()) if hasattr(err, "str") else str(e)
    text = text.removeprefix("Failed to create consumer: ").replace("\n", " ")
    for name, value in config.items():
        if is_secret(name) and value:
            text = text.replace(str(value), "***")
    prop = next((p for m in _PROPERTY.finditer(text) for p in m.groups() if p and p in config), None)
    if prop is None:
        return f"Kafka client settings (kafka.* options) refused by librdkafka: {text}", None
    option = origin.get(prop, prop)
    if "No such configuration property" in text:
        return (
            f"option kafka.{option} is not a setting librdkafka knows (see docs/spark-kafka-source.md for "
            "the Java settings that are translated)"
        ), option
    return f"option kafka.{option}: librdkafka refuses it: {text}", option
