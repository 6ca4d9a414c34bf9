"""Client settings: bootstrap servers plus arbitrary librdkafka properties, secrets kept out of logs."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from statesnap.errors import ConfigError, KafkaConfigError
from statesnap.redaction import (
    install_record_redaction,
    is_secret,
    register_secret,
    register_secrets,
    register_url_secrets,
)

__all__ = [
    "CLIENT_LOGGER",
    "ENV_PREFIX",
    "SCHEMA_REGISTRY_PREFIX",
    "KafkaSettings",
    "check_sasl_mechanism",
    "config_from_env",
    "is_secret",
    "parse_properties",
    "redact",
]

ENV_PREFIX = "STATESNAP_KAFKA_"
#: librdkafka's own log lines (connection failures, retries) go to this logger instead of stderr.
CLIENT_LOGGER = logging.getLogger("statesnap.librdkafka")
#: What a librdkafka property name looks like; anything else is a typo (or a value in the wrong
#: place) and is refused without being echoed.
_PROPERTY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")

# Secrets of every client setting are masked in statesnap's (and botocore's) log records.
install_record_redaction()


#: Where the schema registry's settings sit among the client properties, as in Kafka Streams',
#: Connect's and Confluent's properties files: ``schema.registry.url``,
#: ``schema.registry.basic.auth.user.info``, …
SCHEMA_REGISTRY_PREFIX = "schema.registry."


#: Properties librdkafka applies to consumers only; a producer or admin client given one logs
#: "is a consumer property and will be ignored" at every start (``group.instance.id``, which
#: exactly-once groups want, among them). One ``kafka_config`` serves every client statesnap
#: makes, so each gets the part it uses (checked against librdkafka in tests/unit).
CONSUMER_ONLY = frozenset(
    {
        "group.id", "group.instance.id", "partition.assignment.strategy", "session.timeout.ms",
        "heartbeat.interval.ms", "group.protocol", "group.protocol.type", "group.remote.assignor",
        "coordinator.query.interval.ms", "max.poll.interval.ms", "enable.auto.commit",
        "auto.commit.interval.ms", "enable.auto.offset.store", "queued.min.messages",
        "queued.max.messages.kbytes", "fetch.wait.max.ms", "fetch.message.max.bytes",
        "max.partition.fetch.bytes", "fetch.max.bytes", "fetch.min.bytes", "fetch.error.backoff.ms",
        "isolation.level", "enable.partition.eof", "check.crcs", "auto.offset.reset",
    }
)  # fmt: skip
#: Properties librdkafka applies to producers only (a consumer given one logs as above).
PRODUCER_ONLY = frozenset(
    {
        "transactional.id", "transaction.timeout.ms", "enable.idempotence", "enable.gapless.guarantee",
        "queue.buffering.max.messages", "queue.buffering.max.kbytes", "queue.buffering.max.ms",
        "linger.ms", "message.send.max.retries", "retries", "compression.codec", "compression.type",
        "compression.level", "batch.num.messages", "batch.size", "delivery.report.only.error",
        "sticky.partitioning.linger.ms", "request.required.acks", "acks", "request.timeout.ms",
        "message.timeout.ms", "delivery.timeout.ms", "partitioner",
    }
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class KafkaSettings:
    """How to reach the cluster. ``config`` holds any librdkafka property (TLS, SASL, …); the
    ``schema.registry.*`` properties among the ones given are taken out into
    :attr:`schema_registry` (librdkafka refuses names it does not know), so one properties file
    configures both, as it does for Kafka Streams."""

    bootstrap_servers: str
    config: Mapping[str, Any] = field(default_factory=dict)
    #: How long to wait for the first answer from the cluster before calling it unreachable.
    timeout: float = 15.0
    #: The schema registry client's settings (``url``, ``basic.auth.user.info``, …) from the
    #: ``schema.registry.*`` properties of *config*; None when there are none.
    schema_registry: Mapping[str, Any] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        registry = {
            key.removeprefix(SCHEMA_REGISTRY_PREFIX): value
            for key, value in self.config.items()
            if key.startswith(SCHEMA_REGISTRY_PREFIX)
        }
        if registry:
            config = {k: v for k, v in self.config.items() if not k.startswith(SCHEMA_REGISTRY_PREFIX)}
            object.__setattr__(self, "config", config)
            object.__setattr__(self, "schema_registry", registry)
            register_secrets(registry)
            if isinstance(registry.get("url"), str):  # a URL may carry user:password@
                register_url_secrets(registry["url"])
        if not self.bootstrap_servers or not str(self.bootstrap_servers).strip():
            raise ConfigError(
                "bootstrap servers are required (--bootstrap-servers / STATESNAP_BOOTSTRAP_SERVERS)"
            )
        _refuse_credentials_in(str(self.bootstrap_servers))
        if isinstance(self.config.get("bootstrap.servers"), str):  # the user's config wins
            _refuse_credentials_in(self.config["bootstrap.servers"])
        # So that librdkafka or a traceback echoing one of them is masked in the logs.
        register_secrets(dict(self.config))
        check_sasl_mechanism(self.config)

    def client_config(self, **overrides: Any) -> dict[str, Any]:
        """librdkafka settings: ours, then the user's ``config`` (theirs win), then *overrides*."""
        return self._config(self.config, overrides)

    def consumer_config(self, **overrides: Any) -> dict[str, Any]:
        """:meth:`client_config` for a consumer: the user's producer-only properties left out."""
        return self._config({k: v for k, v in self.config.items() if k not in PRODUCER_ONLY}, overrides)

    def producer_config(self, **overrides: Any) -> dict[str, Any]:
        """:meth:`client_config` for a producer or an admin client (librdkafka makes admin
        clients producers): the user's consumer-only properties left out."""
        return self._config({k: v for k, v in self.config.items() if k not in CONSUMER_ONLY}, overrides)

    def _config(self, users: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "client.id": "statesnap",
            "logger": CLIENT_LOGGER,
        }
        conf.update(users)
        conf.update(overrides)
        return conf

    def __repr__(self) -> str:
        return f"KafkaSettings(bootstrap_servers={self.bootstrap_servers!r}, config={redact(self.config)!r})"


def _refuse_credentials_in(bootstrap_servers: str) -> None:
    """Refuse ``user:password@host:9092`` (or ``SASL_SSL://user:password@host``) in the broker
    list, without echoing it: librdkafka has no userinfo in ``bootstrap.servers`` (it would look
    up a host named after the user), and the list is named in every connection error. The
    credentials are remembered as secrets first, so nothing that saw the list prints them."""
    entries = [e.strip() for e in bootstrap_servers.split(",")]
    carrying = [e for e in entries if "@" in e]
    if not carrying:
        return
    for entry in carrying:
        info = entry.rpartition("@")[0]
        info = info.split("://", 1)[1] if "://" in info else info
        register_secret(info)
        register_secret(info.partition(":")[2])
    register_url_secrets(bootstrap_servers)
    raise ConfigError(
        f"bootstrap servers entry {entries.index(carrying[0]) + 1} carries credentials (user:password@, "
        "not shown): give host:port only, and the credentials as sasl.username / sasl.password "
        "(--kafka-config, a properties file or STATESNAP_KAFKA_SASL_USERNAME / _PASSWORD)"
    )


#: librdkafka's ``security.protocol`` values that authenticate with SASL.
_SASL_PROTOCOLS = frozenset({"SASL_SSL", "SASL_PLAINTEXT"})


def check_sasl_mechanism(config: Mapping[str, Any], *, prefix: str = "") -> None:
    """Refuse SASL without ``sasl.mechanism``, naming the property to set.

    librdkafka then assumes GSSAPI (Kerberos), and the confluent-kafka wheels are built without it:
    the client's creation fails with "No provider for SASL mechanism GSSAPI: recompile librdkafka
    with libsasl2 or openssl support", which sends the operator to rebuild a library when one
    setting is missing. Kerberos users name ``GSSAPI`` too. *prefix* is how the caller's options
    spell the properties (the Spark source's ``kafka.``)."""
    protocol = str(config.get("security.protocol", "")).strip().upper()
    if protocol not in _SASL_PROTOCOLS:
        return
    # ``sasl.mechanisms`` is librdkafka's older name of the same property.
    if any(str(config.get(name) or "").strip() for name in ("sasl.mechanism", "sasl.mechanisms")):
        return
    raise KafkaConfigError(
        f"{prefix}security.protocol={protocol} without {prefix}sasl.mechanism: set {prefix}sasl.mechanism "
        "(e.g. SCRAM-SHA-512 or PLAIN; GSSAPI for Kerberos) to the mechanism the listener accepts",
        "sasl.mechanism",
    )


def redact(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy safe to log or print: secret-looking properties are masked."""
    return {k: ("***" if is_secret(k) else v) for k, v in config.items()}


def config_from_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``STATESNAP_KAFKA_SASL_MECHANISM=PLAIN`` → ``{"sasl.mechanism": "PLAIN"}``.

    Read once at the CLI boundary, never at import time.
    """
    env = os.environ if environ is None else environ
    return {
        k[len(ENV_PREFIX) :].lower().replace("_", "."): v
        for k, v in env.items()
        if k.startswith(ENV_PREFIX) and len(k) > len(ENV_PREFIX)
    }


def parse_properties(
    pairs: list[str] | tuple[str, ...] = (), files: list[str] | tuple[str, ...] = ()
) -> dict[str, str]:
    """``KEY=VALUE`` pairs and Java-style properties files, later entries winning.

    Files follow ``java.util.Properties``: ``key=value``, ``key: value`` and ``key value`` lines,
    ``#``/``!`` comments, a trailing backslash continues a line. Errors name the entry and, when
    it looks like one, the property, but never a value: a malformed line may hold a password.
    """
    out: dict[str, str] = {}
    for path in files:
        try:
            text = Path(path).read_text()
        except (OSError, UnicodeDecodeError) as e:
            reason = e.strerror if isinstance(e, OSError) else "not UTF-8 text"
            raise ConfigError(f"cannot read Kafka properties file {path}: {reason}") from e
        for lineno, line in _logical_lines(text):
            key, value = _split_property(line)
            where = f"Kafka properties file {path}, line {lineno}"
            out[_checked_name(key, where)] = value
    for n, pair in enumerate(pairs, 1):
        key, sep, value = pair.partition("=")
        where = f"--kafka-config entry {n}"
        if not sep:
            head = _split_property(pair.strip())[0]
            # Name the would-be key only when something follows it: a lone word may be a secret.
            hint = f" ({head!r})" if head != pair.strip() and _PROPERTY_NAME.fullmatch(head) else ""
            _register_unparsable(pair, head)
            raise ConfigError(f"{where}{hint} is not KEY=VALUE (the value is not shown)")
        out[_checked_name(key.strip(), where)] = value
    return out


def _register_unparsable(entry: str, head: str) -> None:
    """An entry that failed to parse may be a pasted secret: mask it (and what follows its would-be
    key) wherever secrets are masked, in case a later log line quotes it."""
    register_secret(entry)
    register_secret(entry.strip()[len(head) :].lstrip(" \t:="))


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Non-comment lines with continuations joined, each with the number of its first line."""
    out: list[tuple[int, str]] = []
    pending: str | None = None
    start = 0
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.lstrip()
        if pending is None:
            if not line or line.startswith(("#", "!")):
                continue
            start, pending = lineno, ""
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2:
            pending += line[:-1]
            continue
        out.append((start, (pending + line).strip()))
        pending = None
    if pending is not None:
        out.append((start, pending.strip()))
    return out


def _split_property(line: str) -> tuple[str, str]:
    """Java's rule: the key ends at the first unescaped ``=``, ``:`` or whitespace."""
    m = re.match(r"((?:[^\\=:\s]|\\.)*)\s*[=:]?\s*(.*)", line, re.DOTALL)
    assert m is not None  # the pattern matches every string
    return m.group(1).replace("\\", ""), m.group(2)


def _checked_name(key: str, where: str) -> str:
    if not key:
        raise ConfigError(f"{where}: empty property name (expected KEY=VALUE)")
    if not _PROPERTY_NAME.fullmatch(key):
        register_secret(key)
        raise ConfigError(
            f"{where}: not a librdkafka property name (letters, digits, '.', '_', '-'; "
            "the entry is not shown in case it holds a secret)"
        )
    return key
