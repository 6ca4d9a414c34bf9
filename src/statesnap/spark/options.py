"""Options of the ``statesnap-kafka`` source, parsed and validated once, before any I/O.

The names follow Spark's own Kafka source (``kafka.bootstrap.servers``, ``subscribe``,
``startingOffsets``, ``endingOffsets``, ``maxOffsetsPerTrigger``, ``minPartitions``,
``maxRecordsPerPartition``, ``failOnDataLoss``, ``kafkaConsumer.pollTimeoutMs``), so a job can
switch between this source and Spark's ``kafka`` format by changing only the format name. Every
other ``kafka.*`` option is handed to librdkafka unchanged (TLS, SASL, …). A malformed option is a
:class:`~statesnap.errors.ConfigError` that names the option.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from statesnap.errors import ConfigError
from statesnap.kafka.config import KafkaSettings, redact

#: Spark's JSON offsets use these sentinels per partition.
EARLIEST = -2
LATEST = -1

OffsetSpec = Literal["earliest", "latest"] | dict[int, int]

#: librdkafka properties the source owns: setting them would break exactly-once range reads.
_RESERVED_KAFKA = frozenset(
    {"enable.auto.commit", "auto.offset.reset", "enable.partition.eof", "group.instance.id"}
)
_UNSUPPORTED = {
    "assign": "use subscribe with one topic",
    "subscribepattern": "use subscribe with one topic",
    "includeheaders": "headers are not read by this source",
    "startingtimestamp": "the dev broker's offsets_for_times is broken; use startingOffsets",
    "startingoffsetsbytimestamp": "use startingOffsets",
    "endingtimestamp": "use endingOffsets",
    "endingoffsetsbytimestamp": "use endingOffsets",
}
_KNOWN = frozenset(
    {
        "subscribe",
        "startingoffsets",
        "endingoffsets",
        "maxoffsetspertrigger",
        "minpartitions",
        "maxrecordsperpartition",
        "failondataloss",
        "kafkaconsumer.polltimeoutms",
        "metadatatimeoutms",
        "path",
        "kafkaconfig.secret",
    }
)
#: A JSON object of librdkafka properties, merged over the ``kafka.*`` options. Spark redacts
#: option keys matching ``spark.redaction.regex`` (``secret``, ``password``, …) in plans, the UI
#: and logs; under this key *every* property stays hidden (``sasl.jaas.config`` would not).
SECRET_CONFIG_OPTION = "kafkaConfig.secret"


@dataclass(frozen=True, slots=True)
class KafkaSourceOptions:
    """Everything a reader needs, picklable so it travels to executors with the reader."""

    bootstrap_servers: str
    topic: str
    kafka_config: Mapping[str, str] = field(default_factory=dict)
    starting: OffsetSpec = "earliest"
    ending: OffsetSpec = "latest"
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    fail_on_data_loss: bool = True
    #: How long a task waits for records its range promises before calling the broker lost.
    poll_timeout_ms: int = 120_000
    #: How long metadata and end-offset discovery wait for the cluster.
    metadata_timeout_ms: int = 15_000

    def settings(self) -> KafkaSettings:
        """Client settings; ``kafka_config`` carries the user's librdkafka properties."""
        return KafkaSettings(self.bootstrap_servers, dict(self.kafka_config), self.metadata_timeout_ms / 1000)

    @property
    def read_committed(self) -> bool:
        return str(self.kafka_config.get("isolation.level", "")).lower() == "read_committed"

    def __repr__(self) -> str:
        return (
            f"KafkaSourceOptions(bootstrap_servers={self.bootstrap_servers!r}, topic={self.topic!r}, "
            f"kafka_config={redact(self.kafka_config)!r}, starting={self.starting!r}, "
            f"ending={self.ending!r})"
        )


def parse_options(options: Mapping[str, Any], *, streaming: bool) -> KafkaSourceOptions:
    """Validate the options Spark hands the source (keys are case-insensitive).

    Streaming reads default ``startingOffsets`` to ``latest`` and reject ``endingOffsets``, as
    Spark's Kafka source does; batch reads default to ``earliest`` … ``latest``.
    """
    opts = {str(k).lower(): str(v) for k, v in options.items() if v is not None}
    original = {str(k).lower(): str(k) for k in options}
    kafka_config: dict[str, str] = {}
    for key, value in opts.items():
        if key.startswith("kafka."):
            prop = original[key][len("kafka.") :]
            if prop.lower() == "bootstrap.servers":
                continue
            if prop.lower() in _RESERVED_KAFKA:
                raise ConfigError(
                    f"option kafka.{prop} is not supported: the source sets it itself "
                    "(use startingOffsets/endingOffsets to choose where to read)"
                )
            kafka_config[prop] = value
        elif key in _UNSUPPORTED:
            raise ConfigError(f"option {original[key]} is not supported: {_UNSUPPORTED[key]}")
        elif key not in _KNOWN:
            raise ConfigError(
                f"unknown option {original[key]!r} for the statesnap-kafka source; "
                "librdkafka properties need the 'kafka.' prefix"
            )

    if SECRET_CONFIG_OPTION.lower() in opts:
        try:
            hidden = json.loads(opts[SECRET_CONFIG_OPTION.lower()])
        except json.JSONDecodeError:
            hidden = None
        if not isinstance(hidden, dict):
            raise ConfigError(
                f"option {SECRET_CONFIG_OPTION} must be a JSON object of librdkafka "
                "properties (its content is not shown)"
            )
        for prop, value in hidden.items():
            if str(prop).lower() in _RESERVED_KAFKA:
                raise ConfigError(f"option {SECRET_CONFIG_OPTION}: property {prop} is not supported")
            kafka_config[str(prop)] = str(value)

    servers = opts.get("kafka.bootstrap.servers", "").strip()
    if not servers:
        raise ConfigError("option kafka.bootstrap.servers is required (host:port[,host:port])")
    topic = opts.get("subscribe", "").strip()
    if not topic:
        raise ConfigError("option subscribe is required: the topic to read")
    if "," in topic:
        raise ConfigError(f"option subscribe names several topics ({topic!r}); give exactly one")

    starting = parse_offsets(
        opts.get("startingoffsets", "latest" if streaming else "earliest"),
        "startingOffsets",
        topic,
        allow_earliest=True,
    )
    if streaming and "endingoffsets" in opts:
        raise ConfigError("option endingOffsets is only for batch reads, not streaming ones")
    ending = parse_offsets(opts.get("endingoffsets", "latest"), "endingOffsets", topic, allow_earliest=False)
    return KafkaSourceOptions(
        bootstrap_servers=servers,
        topic=topic,
        kafka_config=kafka_config,
        starting=starting,
        ending=ending,
        max_offsets_per_trigger=_positive_int(opts, "maxOffsetsPerTrigger"),
        min_partitions=_positive_int(opts, "minPartitions"),
        max_records_per_partition=_positive_int(opts, "maxRecordsPerPartition"),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", default=True),
        poll_timeout_ms=_positive_int(opts, "kafkaConsumer.pollTimeoutMs") or 120_000,
        metadata_timeout_ms=_positive_int(opts, "metadataTimeoutMs") or 15_000,
    )


def parse_offsets(text: str, option: str, topic: str, *, allow_earliest: bool) -> OffsetSpec:
    """``earliest``, ``latest``, Spark's ``{"topic":{"0":5}}`` or a bare ``{"0":5}`` map.

    Per partition, ``-2`` means earliest and ``-1`` latest, as in Spark.
    """
    value = text.strip()
    if value.lower() == "latest":
        return "latest"
    if value.lower() == "earliest":
        if not allow_earliest:
            raise ConfigError(f"option {option} cannot be 'earliest'")
        return "earliest"
    try:
        obj = json.loads(value)
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"option {option} must be 'earliest', 'latest' or JSON like "
            f'{{"{topic}":{{"0":23,"1":-2}}}}, got {value!r} ({e.msg})'
        ) from e
    if not isinstance(obj, dict):
        raise ConfigError(f"option {option} must be a JSON object, got {value!r}")
    if obj and all(isinstance(k, str) and _is_int(k) for k in obj):
        per_partition: Any = obj
    else:
        if set(obj) != {topic}:
            raise ConfigError(
                f"option {option} names topic(s) {sorted(map(str, obj))}, but subscribe is {topic!r}"
            )
        per_partition = obj[topic]
    if not isinstance(per_partition, dict):
        raise ConfigError(f"option {option}: the partitions of {topic!r} must be a JSON object")
    out: dict[int, int] = {}
    for p, off in per_partition.items():
        if not _is_int(str(p)) or int(p) < 0:
            raise ConfigError(f"option {option}: {p!r} is not a partition number")
        if not isinstance(off, int) or isinstance(off, bool) or off < EARLIEST:
            raise ConfigError(
                f"option {option}: offset {off!r} of partition {p} must be an integer >= 0, "
                "-1 (latest) or -2 (earliest)"
            )
        if off == EARLIEST and not allow_earliest:
            raise ConfigError(f"option {option}: -2 (earliest) is not allowed for partition {p}")
        out[int(p)] = off
    return out


def offsets_json(topic: str, offsets: Mapping[int, int]) -> str:
    """Spark's JSON offsets format for *topic*, for ``startingOffsets``/``endingOffsets``."""
    return json.dumps({topic: {str(p): int(o) for p, o in sorted(offsets.items())}})


def source_options(
    bootstrap_servers: str,
    topic: str,
    kafka_config: Mapping[str, Any] | None = None,
    **extra: Any,
) -> dict[str, str]:
    """Option dict for ``spark.read.format("statesnap-kafka").options(**...)``; the librdkafka
    properties travel under :data:`SECRET_CONFIG_OPTION`, so Spark never shows them."""
    out = {"kafka.bootstrap.servers": bootstrap_servers, "subscribe": topic}
    hidden = {k: str(v) for k, v in (kafka_config or {}).items() if k != "bootstrap.servers"}
    if hidden:
        out[SECRET_CONFIG_OPTION] = json.dumps(hidden)
    out.update({k: str(v) for k, v in extra.items() if v is not None})
    return out


def _is_int(text: str) -> bool:
    return text.lstrip("-").isdigit()


def _positive_int(opts: Mapping[str, str], name: str) -> int | None:
    raw = opts.get(name.lower())
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError as e:
        raise ConfigError(f"option {name} must be a positive integer, got {raw!r}") from e
    if value < 1:
        raise ConfigError(f"option {name} must be a positive integer, got {raw!r}")
    return value


def _bool(opts: Mapping[str, str], name: str, *, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    if raw.lower() in {"true", "1", "yes"}:
        return True
    if raw.lower() in {"false", "0", "no"}:
        return False
    raise ConfigError(f"option {name} must be true or false, got {raw!r}")
