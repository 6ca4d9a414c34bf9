"""Client settings: bootstrap servers plus arbitrary librdkafka properties, secrets kept out of logs."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from statesnap.errors import ConfigError

ENV_PREFIX = "STATESNAP_KAFKA_"
#: librdkafka's own log lines (connection failures, retries) go to this logger instead of stderr.
CLIENT_LOGGER = logging.getLogger("statesnap.librdkafka")
_SECRET_MARKERS = (
    "password",
    "secret",
    "jaas",
    "token",
    "key.pem",
    "private",
    "credential",
    "oauthbearer.config",
)


@dataclass(frozen=True, slots=True)
class KafkaSettings:
    """How to reach the cluster. ``config`` holds any librdkafka property (TLS, SASL, …)."""

    bootstrap_servers: str
    config: Mapping[str, Any] = field(default_factory=dict)
    #: How long to wait for the first answer from the cluster before calling it unreachable.
    timeout: float = 15.0

    def __post_init__(self) -> None:
        if not self.bootstrap_servers or not str(self.bootstrap_servers).strip():
            raise ConfigError(
                "bootstrap servers are required (--bootstrap-servers / STATESNAP_BOOTSTRAP_SERVERS)"
            )

    def client_config(self, **overrides: Any) -> dict[str, Any]:
        """librdkafka settings: ours, then the user's ``config`` (theirs win), then *overrides*."""
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "client.id": "statesnap",
            "logger": CLIENT_LOGGER,
        }
        conf.update(self.config)
        conf.update(overrides)
        return conf

    def __repr__(self) -> str:
        return f"KafkaSettings(bootstrap_servers={self.bootstrap_servers!r}, config={redact(self.config)!r})"


def is_secret(name: str) -> bool:
    lowered = name.lower()
    return any(marker in lowered for marker in _SECRET_MARKERS)


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
    """``KEY=VALUE`` pairs and Java-style properties files, later entries winning."""
    out: dict[str, str] = {}
    for path in files:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ConfigError(f"cannot read Kafka properties file {path}: {e.strerror}") from e
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith(("#", "!")):
                continue
            key, sep, value = line.partition("=")
            if not sep:
                raise ConfigError(f"{path}: expected KEY=VALUE, got {line!r}")
            out[key.strip()] = value.strip()
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--kafka-config expects KEY=VALUE, got {pair!r}")
        out[key.strip()] = value
    return out
