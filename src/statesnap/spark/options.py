"""Options of the ``statesnap-kafka`` source as values: what a reader needs, picklable.

:func:`~statesnap.spark.option_parsing.parse_options` makes them from the options Spark hands the
source, once, at ``load()``; :func:`source_options` writes them for a driver's own read. The names
and meanings are those of Spark's own Kafka source (``subscribe``/``subscribePattern``/
``assign``, ``startingOffsets``/``endingOffsets`` and their timestamp variants,
``maxOffsetsPerTrigger``/``minOffsetsPerTrigger``/``maxTriggerDelay``, ``failOnDataLoss``,
``includeHeaders``, ``minPartitions``, ``groupIdPrefix``, ``fetchOffset.*``,
``kafkaConsumer.pollTimeoutMs``), so a job switches between this source and Spark's ``kafka``
format by changing only the format name. ``kafka.*`` options are Java-client settings: they are
translated to librdkafka (:mod:`statesnap.spark.java_settings`) and checked by librdkafka when
parsed, so a setting that cannot work fails at ``load()`` with one line naming it, never at the
first task. docs/spark-kafka-source.md maps every option.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from statesnap.kafka.config import KafkaSettings, redact

__all__ = [
    "EARLIEST",
    "INTERNAL_TOPICS",
    "LATEST",
    "SECRET_CONFIG_OPTION",
    "TP",
    "KafkaSourceOptions",
    "OffsetSpec",
    "PartitionOffsets",
    "Subscription",
    "Timestamps",
    "offsets_json",
    "source_options",
]

#: Spark's JSON offsets use these sentinels per partition.
EARLIEST = -2
LATEST = -1

#: A Kafka partition of a topic.
TP = tuple[str, int]

#: A JSON object of librdkafka properties, merged over the ``kafka.*`` options. Spark redacts
#: option keys matching ``spark.redaction.regex`` (``secret``, ``password``, …) in plans, the UI
#: and logs; under this key *every* property stays hidden (``sasl.jaas.config`` would not).
SECRET_CONFIG_OPTION = "kafkaConfig.secret"

#: Kafka's internal topics, which a Java consumer's pattern subscription never matches.
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})


@dataclass(frozen=True, slots=True)
class Subscription:
    """What to read: Spark's ``subscribe``, ``subscribePattern`` or ``assign`` strategy."""

    kind: Literal["subscribe", "subscribePattern", "assign"]
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assigned: tuple[TP, ...] = ()

    @property
    def option(self) -> str:
        """The option to name in errors about the subscription."""
        return self.kind

    def matches(self, topic: str) -> bool:
        if self.kind == "subscribePattern":
            return topic not in INTERNAL_TOPICS and re.fullmatch(self.pattern or "", topic) is not None
        if self.kind == "assign":
            return any(t == topic for t, _p in self.assigned)
        return topic in self.topics

    def describe(self) -> str:
        if self.kind == "subscribePattern":
            return f"pattern {self.pattern!r}"
        if self.kind == "assign":
            return f"partitions {sorted(self.assigned)}"
        return ",".join(self.topics)


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    """Spark's JSON offsets per topic and partition; -2 means earliest, -1 latest."""

    offsets: Mapping[TP, int]


@dataclass(frozen=True, slots=True)
class Timestamps:
    """``*Timestamp`` (one timestamp for every partition) or ``*OffsetsByTimestamp`` (JSON per
    partition), in epoch milliseconds; resolved with Kafka's ListOffsets-by-timestamp."""

    option: str
    every: int | None = None
    per_partition: Mapping[TP, int] = field(default_factory=dict)


#: Where a read starts or ends. A plain ``{partition: offset}`` dict means partitions of ``topic``.
OffsetSpec = Literal["earliest", "latest"] | PartitionOffsets | Timestamps | dict[int, int]


@dataclass(frozen=True, slots=True)
class KafkaSourceOptions:
    """Everything a reader needs, picklable so it travels to executors with the reader.

    ``kafka_config`` holds librdkafka properties (already translated from Java names).
    ``topic`` is the topic of a single-topic subscription (and names the read in logs
    otherwise); ``subscription`` defaults to ``subscribe=topic``.
    """

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
    subscription: Subscription | None = None
    include_headers: bool = False
    min_offsets_per_trigger: int | None = None
    #: ``maxTriggerDelay``: a trigger below ``minOffsetsPerTrigger`` fires anyway after this long.
    max_trigger_delay_ms: int = 15 * 60_000
    #: ``startingOffsetsByTimestampStrategy``: no record at/after the timestamp → fail or latest.
    starting_timestamp_strategy: Literal["error", "latest"] = "error"
    #: ``fetchOffset.numRetries`` attempts (Spark's count) for every offset/metadata request.
    fetch_retries: int = 3
    fetch_retry_interval_ms: int = 10
    group_id_prefix: str | None = None

    def __post_init__(self) -> None:
        if self.subscription is None:
            object.__setattr__(self, "subscription", Subscription("subscribe", (self.topic,)))
        for name in ("starting", "ending"):
            spec = getattr(self, name)
            if isinstance(spec, dict):  # {partition: offset} of the single topic
                object.__setattr__(
                    self, name, PartitionOffsets({(self.topic, int(p)): int(o) for p, o in spec.items()})
                )

    @property
    def strategy(self) -> Subscription:
        assert self.subscription is not None  # set by __post_init__
        return self.subscription

    def settings(self) -> KafkaSettings:
        """Client settings; ``kafka_config`` carries the user's librdkafka properties."""
        return KafkaSettings(self.bootstrap_servers, dict(self.kafka_config), self.metadata_timeout_ms / 1000)

    @property
    def read_committed(self) -> bool:
        return str(self.kafka_config.get("isolation.level", "")).lower() == "read_committed"

    def __repr__(self) -> str:
        return (
            f"KafkaSourceOptions(bootstrap_servers={self.bootstrap_servers!r}, "
            f"subscription={self.strategy.describe()!r}, kafka_config={redact(self.kafka_config)!r}, "
            f"starting={self.starting!r}, ending={self.ending!r})"
        )


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
