"""Parsing the ``statesnap-kafka`` source's options: Spark's names, precedence rules and words.

The values they become live in :mod:`statesnap.spark.options`; this module holds the rules
(exactly one subscription strategy, ``*Timestamp`` over ``*OffsetsByTimestamp`` over ``*Offsets``,
the batch and streaming limits, Java-client settings translated and checked by librdkafka), so a
job that switches between this source and Spark's ``kafka`` format meets the same errors in the
same words. Any option it does not know is refused, with the documented name it is closest to.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from typing import Any, Literal

from statesnap.durations import parse_duration
from statesnap.errors import ConfigError
from statesnap.spark.java_settings import check_client_config, translate
from statesnap.spark.options import (
    EARLIEST,
    LATEST,
    SECRET_CONFIG_OPTION,
    TP,
    KafkaSourceOptions,
    OffsetSpec,
    PartitionOffsets,
    Subscription,
    Timestamps,
)

__all__ = [
    "CANONICAL",
    "KNOWN_OPTIONS",
    "OPTION_NAMES",
    "parse_offsets",
    "parse_options",
    "parse_subscription",
    "unknown_option",
]

#: Every source option this source knows, as documented (Spark's spelling), beside ``kafka.*``.
#: Spark hands a Python data source its options with lower-cased names, so errors name an
#: option by this spelling, never by the lower-cased one.
OPTION_NAMES = (
    "subscribe",
    "subscribePattern",
    "assign",
    "startingOffsets",
    "endingOffsets",
    "startingTimestamp",
    "endingTimestamp",
    "startingOffsetsByTimestamp",
    "endingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy",
    "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "minPartitions",
    "maxRecordsPerPartition",
    "failOnDataLoss",
    "includeHeaders",
    "groupIdPrefix",
    "fetchOffset.numRetries",
    "fetchOffset.retryIntervalMs",
    "kafkaConsumer.pollTimeoutMs",
    "metadataTimeoutMs",
    "kafkaConfig.secret",
    "path",
)
#: Lower-cased name → documented spelling.
CANONICAL = {name.lower(): name for name in OPTION_NAMES}
#: Every source option this source knows (lower case), beside ``kafka.*``.
KNOWN_OPTIONS = frozenset(CANONICAL)
_REFUSED = {
    "topic": "it names the topic a Kafka *sink* writes to; to read, use subscribe",
}
_STRATEGIES = ("assign", "subscribe", "subscribePattern")


def parse_options(
    options: Mapping[str, Any], *, streaming: bool | None, check_client: bool = True
) -> KafkaSourceOptions:
    """Validate the options Spark hands the source (keys are case-insensitive).

    Streaming reads default ``startingOffsets`` to ``latest`` and refuse ending offsets; batch
    reads default to ``earliest`` … ``latest`` and refuse a ``latest`` start, all as Spark's
    Kafka source does; ``streaming=None`` (``load()``, before Spark says which) checks neither.
    *check_client* lets librdkafka check the client settings (no request is sent).
    """
    opts = {str(k).lower(): str(v) for k, v in options.items() if v is not None}
    original = {str(k).lower(): str(k) for k in options}
    java: dict[str, str] = {}
    for key, value in opts.items():
        if key.startswith("kafka."):
            prop = original[key][len("kafka.") :]
            if prop.lower() != "bootstrap.servers":
                java[prop] = value
        elif key in _REFUSED:
            raise ConfigError(f"option {original[key]} is not supported: {_REFUSED[key]}")
        elif key not in KNOWN_OPTIONS:
            raise ConfigError(unknown_option(original[key]))
    java.update(_secret_config(opts))
    kafka_config, origin = translate(java)

    servers = opts.get("kafka.bootstrap.servers", "").strip()
    if not servers:
        raise ConfigError("Option 'kafka.bootstrap.servers' must be specified for configuring Kafka consumer")
    subscription = parse_subscription(opts)
    topic = subscription.topics[0] if len(subscription.topics) == 1 else subscription.describe()

    if streaming is True:
        for name in ("endingOffsets", "endingOffsetsByTimestamp", "endingTimestamp"):
            if name.lower() in opts:
                raise ConfigError(f"option {name} is only for batch reads, not streaming ones")
    starting = _offset_limit(opts, "starting", subscription, default="latest" if streaming else "earliest")
    ending = _offset_limit(opts, "ending", subscription, default="latest")
    if streaming is False:
        _check_batch_limits(starting, ending)
    strategy = opts.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise ConfigError(
            f"option startingOffsetsByTimestampStrategy must be error or latest, got {strategy!r}"
        )
    min_per_trigger = _positive_int(opts, "minOffsetsPerTrigger")
    max_per_trigger = _positive_int(opts, "maxOffsetsPerTrigger")
    if min_per_trigger and max_per_trigger and min_per_trigger > max_per_trigger:
        raise ConfigError(
            f"option minOffsetsPerTrigger ({min_per_trigger}) is higher than maxOffsetsPerTrigger "
            f"({max_per_trigger})"
        )
    parsed = KafkaSourceOptions(
        bootstrap_servers=servers,
        topic=topic,
        kafka_config=kafka_config,
        starting=starting,
        ending=ending,
        max_offsets_per_trigger=max_per_trigger,
        min_partitions=_positive_int(opts, "minPartitions"),
        max_records_per_partition=_positive_int(opts, "maxRecordsPerPartition"),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", default=True),
        poll_timeout_ms=_positive_int(opts, "kafkaConsumer.pollTimeoutMs") or 120_000,
        metadata_timeout_ms=_positive_int(opts, "metadataTimeoutMs") or 15_000,
        subscription=subscription,
        include_headers=_bool(opts, "includeHeaders", default=False),
        min_offsets_per_trigger=min_per_trigger,
        max_trigger_delay_ms=_duration_ms(opts, "maxTriggerDelay", default=15 * 60_000),
        starting_timestamp_strategy="latest" if strategy == "latest" else "error",
        fetch_retries=_positive_int(opts, "fetchOffset.numRetries", minimum=0) or 1,
        fetch_retry_interval_ms=_positive_int(opts, "fetchOffset.retryIntervalMs", minimum=0) or 0,
        group_id_prefix=opts.get("groupidprefix") or None,
    )
    if check_client:
        check_client_config(servers, kafka_config, origin)
    return parsed


def unknown_option(name: str) -> str:
    """The one line for an option this source does not know, suggesting the documented name it
    is closest to (Spark passes *name* lower-cased: "startingoffset" → ``startingOffsets``)."""
    close = difflib.get_close_matches(name.lower(), list(CANONICAL), n=1, cutoff=0.75)
    hint = (
        f"did you mean {CANONICAL[close[0]]}?"
        if close
        else "Kafka client settings need the 'kafka.' prefix (docs/spark-kafka-source.md lists the options)"
    )
    # Spark lower-cases option names before the source sees them: say so, or the user looks
    # for a "startingoffset" they never wrote.
    note = " (Spark passes option names lower-cased)" if name == name.lower() and close else ""
    return (
        f"option {name}{note} is not an option of the statesnap-kafka source nor of Spark's kafka "
        f"source: {hint}"
    )


def _secret_config(opts: Mapping[str, str]) -> dict[str, str]:
    raw = opts.get(SECRET_CONFIG_OPTION.lower())
    if raw is None:
        return {}
    try:
        hidden = json.loads(raw)
    except json.JSONDecodeError:
        hidden = None
    if not isinstance(hidden, dict):
        raise ConfigError(
            f"option {SECRET_CONFIG_OPTION} must be a JSON object of Kafka client properties "
            "(its content is not shown)"
        )
    return {str(k): str(v) for k, v in hidden.items() if str(k) != "bootstrap.servers"}


def parse_subscription(opts: Mapping[str, str]) -> Subscription:
    """Exactly one of ``assign``, ``subscribe``, ``subscribePattern`` (Spark's rule and words)."""
    given = [name for name in _STRATEGIES if name.lower() in opts]
    if len(given) != 1:
        which = "One" if not given else "Only one"
        verb = "must" if not given else "can"
        raise ConfigError(
            f"{which} of the following options {verb} be specified for Kafka source: {', '.join(_STRATEGIES)}"
        )
    name = given[0]
    value = opts[name.lower()].strip()
    if name == "subscribe":
        topics = tuple(dict.fromkeys(t.strip() for t in value.split(",") if t.strip()))
        if not topics:
            raise ConfigError(f"option subscribe names no topic (value {value!r})")
        return Subscription("subscribe", topics)
    if name == "subscribePattern":
        if not value:
            raise ConfigError("option subscribePattern is empty")
        try:
            re.compile(value)
        except re.error as e:
            raise ConfigError(f"option subscribePattern: {value!r} is not a valid regex ({e})") from e
        return Subscription("subscribePattern", pattern=value)
    try:
        obj = json.loads(value)
    except json.JSONDecodeError as e:
        raise ConfigError(f'option assign must be JSON like {{"topicA":[0,1]}}, got {value!r}') from e
    if not isinstance(obj, dict) or not obj:
        raise ConfigError(f'option assign must be a JSON object like {{"topicA":[0,1]}}, got {value!r}')
    assigned: list[TP] = []
    for topic, parts in obj.items():
        if not isinstance(parts, list) or not all(_is_partition(p) for p in parts):
            raise ConfigError(
                f"option assign: the partitions of {topic!r} must be a list of partition numbers"
            )
        assigned.extend((str(topic), int(p)) for p in parts)
    return Subscription(
        "assign", tuple(dict.fromkeys(t for t, _p in assigned)), assigned=tuple(sorted(set(assigned)))
    )


def _offset_limit(opts: Mapping[str, str], side: str, sub: Subscription, *, default: str) -> OffsetSpec:
    """Spark's precedence: ``*Timestamp`` over ``*OffsetsByTimestamp`` over ``*Offsets``."""
    every_name, by_ts_name, offsets_name = f"{side}Timestamp", f"{side}OffsetsByTimestamp", f"{side}Offsets"
    if every_name.lower() in opts:
        raw = opts[every_name.lower()].strip()
        if not _is_int(raw) or int(raw) < 0:
            raise ConfigError(f"option {every_name} must be a timestamp in epoch milliseconds, got {raw!r}")
        return Timestamps(every_name, every=int(raw))
    if by_ts_name.lower() in opts:
        per = _partition_json(opts[by_ts_name.lower()], by_ts_name, sub)
        for (t, p), ts in per.items():
            if ts < 0:
                raise ConfigError(f"option {by_ts_name}: timestamp {ts} of {t}[{p}] must be >= 0")
        return Timestamps(by_ts_name, per_partition=per)
    return parse_offsets(opts.get(offsets_name.lower(), default), offsets_name, sub)


def parse_offsets(
    text: str, option: str, sub: Subscription | str, *, allow_earliest: bool = True
) -> OffsetSpec:
    """``earliest``, ``latest`` or Spark's ``{"topic":{"0":5,"1":-2}}`` (-2 earliest, -1 latest).

    For a single-topic subscription a bare ``{"0":5}`` map is accepted too.
    """
    if isinstance(sub, str):
        sub = Subscription("subscribe", (sub,))
    value = text.strip()
    if value.lower() in ("latest", "earliest"):
        if value.lower() == "earliest" and not allow_earliest:
            raise ConfigError(f"option {option} cannot be 'earliest'")
        return "latest" if value.lower() == "latest" else "earliest"
    offsets = _partition_json(value, option, sub)
    for (t, p), off in offsets.items():
        if off < EARLIEST:
            raise ConfigError(
                f"option {option}: offset {off} of {t}[{p}] must be an integer >= 0, "
                "-1 (latest) or -2 (earliest)"
            )
        if off == EARLIEST and not allow_earliest:
            raise ConfigError(f"option {option}: -2 (earliest) is not allowed for {t}[{p}]")
    return PartitionOffsets(offsets)


def _partition_json(value: str, option: str, sub: Subscription) -> dict[TP, int]:
    example = f'{{"{(sub.topics or ("topicA",))[0]}":{{"0":23,"1":-2}}}}'
    try:
        obj = json.loads(value)
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"option {option} must be 'earliest', 'latest' or JSON like {example}, got {value!r} ({e.msg})"
        ) from e
    if not isinstance(obj, dict):
        raise ConfigError(f"option {option} must be a JSON object like {example}, got {value!r}")
    if obj and all(_is_int(str(k)) for k in obj):
        if len(sub.topics) != 1 or sub.kind == "subscribePattern":
            raise ConfigError(f"option {option} must name the topic of each partition, like {example}")
        obj = {sub.topics[0]: obj}
    out: dict[TP, int] = {}
    for topic, parts in obj.items():
        if not sub.matches(str(topic)):
            raise ConfigError(f"option {option} names topic {topic!r}, which {sub.kind} does not read")
        if not isinstance(parts, dict):
            raise ConfigError(f"option {option}: the partitions of {topic!r} must be a JSON object")
        for p, off in parts.items():
            if not _is_partition(p):
                raise ConfigError(f"option {option}: {p!r} is not a partition number")
            if not isinstance(off, int) or isinstance(off, bool):
                raise ConfigError(
                    f"option {option}: the value for {topic}[{p}] must be an integer, got {off!r}"
                )
            if sub.kind == "assign" and (str(topic), int(p)) not in sub.assigned:
                raise ConfigError(f"option {option}: {topic}[{p}] is not among the assigned partitions")
            out[(str(topic), int(p))] = off
    return out


def _refuse_in_batch(
    spec: OffsetSpec, option: str, bound: Literal["latest", "earliest"], words: tuple[str, str]
) -> None:
    """One side of a batch read may not be *bound*, as a whole or for one partition; *words* are
    how Spark names the side in each of the two errors."""
    sentinel = LATEST if bound == "latest" else EARLIEST
    if spec == bound:
        raise ConfigError(f"option {option}: {words[0]} can't be {bound} for batch queries on Kafka")
    if isinstance(spec, PartitionOffsets):
        for (t, p), off in sorted(spec.offsets.items()):
            if off == sentinel:
                raise ConfigError(
                    f"option {option}: {words[1]} for {t}-{p} can't be {bound} for batch queries on Kafka"
                )


def _check_batch_limits(starting: OffsetSpec, ending: OffsetSpec) -> None:
    """Spark's batch rules: no ``latest`` start, no ``earliest`` end (its words)."""
    _refuse_in_batch(starting, "startingOffsets", "latest", ("starting offset", "startingOffsets"))
    _refuse_in_batch(ending, "endingOffsets", "earliest", ("ending offset", "ending offset"))
    if isinstance(ending, PartitionOffsets) and isinstance(starting, PartitionOffsets):
        for tp, start in starting.offsets.items():
            end = ending.offsets.get(tp)
            if end is not None and start >= 0 and end >= 0 and start > end:
                raise ConfigError(
                    f"option endingOffsets: {tp[0]}[{tp[1]}] ends at {end}, before startingOffsets ({start})"
                )


def _is_int(text: str) -> bool:
    return text.lstrip("-").isdigit()


def _is_partition(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value >= 0
    return isinstance(value, str) and value.isdigit()


def _positive_int(opts: Mapping[str, str], name: str, *, minimum: int = 1) -> int | None:
    raw = opts.get(name.lower())
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ConfigError(f"option {name} must be {kind}, got {raw!r}")
    return value


def _duration_ms(opts: Mapping[str, str], name: str, *, default: int) -> int:
    """Spark's "time with units" (``15m``, ``30s``, ``500ms``); a bare number is milliseconds."""
    raw = opts.get(name.lower())
    if raw is None:
        return default
    text = raw.strip().lower()
    try:
        if text.isdigit():  # Spark reads a bare number as milliseconds
            return int(text)
        return round(parse_duration(text.replace("min", "m")).total_seconds() * 1000)
    except (ConfigError, ValueError) as e:
        raise ConfigError(f"option {name} must be a duration such as 15m, 30s or 500ms, got {raw!r}") from e


def _bool(opts: Mapping[str, str], name: str, *, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    if raw.lower() in {"true", "1", "yes"}:
        return True
    if raw.lower() in {"false", "0", "no"}:
        return False
    raise ConfigError(f"option {name} must be true or false, got {raw!r}")
