"""Where a read starts and ends, as Spark's Kafka source decides it — pure logic over offsets.

Everything here works against :class:`OffsetSource` (the :class:`~statesnap.spark.kafka_io.
OffsetOracle` on a real cluster, a precise fake in unit tests), so the rules are tested apart
from any broker:

- ``earliest``/``latest``/JSON offsets (-2 earliest, -1 latest) and timestamps (Kafka's
  ListOffsets by timestamp: the first offset whose timestamp is >= the given one; none → fail or
  latest for a start, latest for an end), in Spark's precedence;
- ``failOnDataLoss``: offsets below the log start, partitions that are gone, offsets beyond a
  partition's end (the topic was recreated) fail the query with :class:`DataLossError`, or are
  logged and read from the earliest available offset;
- ``maxOffsetsPerTrigger`` shares a trigger's offsets in proportion to each partition's lag;
  ``minOffsetsPerTrigger``/``maxTriggerDelay`` hold a trigger back until enough is there.

Streaming offsets are Spark's JSON, ``{"topic": {"0": 42}}`` (next offset to read); the
single-topic ``{"0": 42}`` of earlier versions is still read.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from statesnap.errors import ConfigError, DataLossError
from statesnap.spark.options import (
    EARLIEST,
    LATEST,
    TP,
    KafkaSourceOptions,
    OffsetSpec,
    PartitionOffsets,
    Timestamps,
)

__all__ = [
    "OffsetSource",
    "TriggerGate",
    "continue_from",
    "decode_offsets",
    "encode_offsets",
    "initial_offsets",
    "plan_batch",
    "rate_limit",
    "report_data_loss",
    "resolve",
]

log = logging.getLogger(__name__)

_K = TypeVar("_K", bound=Hashable)


class OffsetSource(Protocol):
    """What planning asks the cluster (see :class:`~statesnap.spark.kafka_io.OffsetOracle`)."""

    def topic_partitions(self, *, missing_ok: bool = False) -> tuple[TP, ...]: ...

    def earliest_of(self, tps: Sequence[TP]) -> dict[TP, int]: ...

    def latest_of(self, tps: Sequence[TP]) -> dict[TP, int]: ...

    def offsets_for_times(self, wanted: Mapping[TP, int]) -> dict[TP, int | None]: ...


def _name(tp: TP) -> str:
    return f"{tp[0]}[{tp[1]}]"


def report_data_loss(message: str, *, fail: bool) -> None:
    """Spark's ``reportDataLoss``: fail the query, or log and go on from what is still there."""
    if fail:
        raise DataLossError(
            f"{message} (failOnDataLoss=true; set failOnDataLoss=false to continue from the "
            "earliest available offsets)"
        )
    log.warning("%s; continuing from the earliest available offsets (failOnDataLoss=false)", message)


def resolve(
    spec: OffsetSpec,
    option: str,
    tps: Sequence[TP],
    earliest: Mapping[TP, int],
    latest: Mapping[TP, int],
    for_times: Callable[[Mapping[TP, int]], Mapping[TP, int | None]],
    *,
    default: str,
    opts: KafkaSourceOptions,
    is_start: bool,
) -> dict[TP, int]:
    """Concrete offsets for *spec* on the partitions *tps*, checked against the log.

    Partitions a JSON spec does not name take *default* (Spark requires every partition to be
    named; this source is lenient there).
    """
    fallback = earliest if default == "earliest" else latest
    if spec == "earliest":
        return {tp: earliest[tp] for tp in tps}
    if spec == "latest":
        return {tp: latest[tp] for tp in tps}
    if isinstance(spec, Timestamps):
        return _by_timestamp(spec, tps, earliest, latest, fallback, for_times, opts, is_start=is_start)
    assert isinstance(spec, PartitionOffsets)
    unknown = sorted(set(spec.offsets) - set(tps))
    if unknown:
        raise ConfigError(f"option {option}: {', '.join(map(_name, unknown))} do not exist")
    out = {}
    for tp in tps:
        off = spec.offsets.get(tp, EARLIEST if default == "earliest" else LATEST)
        if off == EARLIEST:
            off = earliest[tp]
        elif off == LATEST:
            off = latest[tp]
        elif off > latest[tp]:
            raise ConfigError(
                f"option {option}: offset {off} of {_name(tp)} is beyond the end of the partition "
                f"({latest[tp]})"
            )
        elif off < earliest[tp]:
            report_data_loss(
                f"option {option}: offset {off} of {_name(tp)} was deleted "
                f"(the log starts at {earliest[tp]})",
                fail=opts.fail_on_data_loss,
            )
            off = earliest[tp]
        out[tp] = off
    return out


def _by_timestamp(
    spec: Timestamps,
    tps: Sequence[TP],
    earliest: Mapping[TP, int],
    latest: Mapping[TP, int],
    fallback: Mapping[TP, int],
    for_times: Callable[[Mapping[TP, int]], Mapping[TP, int | None]],
    opts: KafkaSourceOptions,
    *,
    is_start: bool,
) -> dict[TP, int]:
    unknown = sorted(set(spec.per_partition) - set(tps))
    if unknown:
        raise ConfigError(f"option {spec.option}: {', '.join(map(_name, unknown))} do not exist")
    wanted = {tp: spec.every if spec.every is not None else spec.per_partition.get(tp) for tp in tps}
    query = {tp: ts for tp, ts in wanted.items() if ts is not None}
    answers = for_times(query) if query else {}
    out = {}
    for tp in tps:
        if tp not in query:
            out[tp] = fallback[tp]
            continue
        off = answers.get(tp)
        if off is None:  # no record has a timestamp >= the one asked for
            if is_start and opts.starting_timestamp_strategy == "error":
                raise ConfigError(
                    f"option {spec.option}: no record of {_name(tp)} has a timestamp at or after "
                    f"{query[tp]}; set startingOffsetsByTimestampStrategy=latest to start at its end"
                )
            off = latest[tp]
        out[tp] = min(max(off, earliest[tp]), latest[tp])
    return out


def plan_batch(opts: KafkaSourceOptions, source: OffsetSource) -> dict[TP, tuple[int, int]]:
    """``[start, end)`` per partition of a batch read; ends are true ends (found by EOF)."""
    tps = source.topic_partitions()
    earliest, latest = source.earliest_of(tps), source.latest_of(tps)
    args = (tps, earliest, latest, source.offsets_for_times)
    starts = resolve(opts.starting, "startingOffsets", *args, default="earliest", opts=opts, is_start=True)
    ends = resolve(opts.ending, "endingOffsets", *args, default="latest", opts=opts, is_start=False)
    for tp in tps:
        if ends[tp] < starts[tp]:
            raise ConfigError(
                f"option endingOffsets: {_name(tp)} ends at {ends[tp]}, before it starts ({starts[tp]})"
            )
    return {tp: (starts[tp], ends[tp]) for tp in tps}


def initial_offsets(opts: KafkaSourceOptions, source: OffsetSource) -> dict[TP, int]:
    """Where a new streaming query starts (``startingOffsets`` etc., default latest)."""
    tps = source.topic_partitions()
    earliest, latest = source.earliest_of(tps), source.latest_of(tps)
    return resolve(
        opts.starting,
        "startingOffsets",
        tps,
        earliest,
        latest,
        source.offsets_for_times,
        default="latest",
        opts=opts,
        is_start=True,
    )


def continue_from(
    begin: Mapping[TP, int],
    tps: Sequence[TP],
    earliest: Mapping[TP, int],
    latest: Mapping[TP, int],
    *,
    fail_on_data_loss: bool,
) -> dict[TP, int]:
    """Where the next batch really starts per partition, after Spark's data-loss checks:
    new partitions start at their earliest offset; partitions that are gone are dropped; an
    offset below the log start or beyond the partition's end (a recreated topic) is data loss."""
    gone = sorted(set(begin) - set(tps))
    if gone:
        report_data_loss(
            f"{', '.join(map(_name, gone))} are gone (topic deleted?); some data may have been missed",
            fail=fail_on_data_loss,
        )
    out = {}
    for tp in tps:
        if tp not in begin:
            if earliest[tp] > 0:
                report_data_loss(
                    f"added partition {_name(tp)} starts at offset {earliest[tp]} instead of 0; "
                    "some data may have been missed",
                    fail=fail_on_data_loss,
                )
            out[tp] = earliest[tp]
        elif begin[tp] > latest[tp]:
            report_data_loss(
                f"{_name(tp)}: the query is at offset {begin[tp]} but the partition ends at {latest[tp]}: "
                "the topic was deleted and recreated (or truncated), records may have been missed",
                fail=fail_on_data_loss,
            )
            out[tp] = earliest[tp]
        elif begin[tp] < earliest[tp]:
            report_data_loss(
                f"{_name(tp)}: offsets {begin[tp]}..{earliest[tp] - 1} were deleted before they were read",
                fail=fail_on_data_loss,
            )
            out[tp] = earliest[tp]
        else:
            out[tp] = begin[tp]
    return out


def rate_limit(begin: Mapping[_K, int], ends: Mapping[_K, int], max_rows: int) -> dict[_K, int]:
    """At most *max_rows* offsets in total, shared in proportion to each partition's lag (as
    Spark's Kafka source does); every lagging partition advances by at least one offset."""
    sizes = {p: ends[p] - begin[p] for p in ends}
    total = sum(sizes.values())
    if total <= max_rows:
        return dict(ends)
    out = {}
    for p, size in sizes.items():
        share = max_rows * size / total
        step = math.ceil(share) if share < 1 else math.floor(share)
        out[p] = begin[p] + min(size, step)
    return out


class TriggerGate:
    """``minOffsetsPerTrigger``/``maxTriggerDelay``: a trigger with fewer new offsets than the
    minimum is skipped, unless the last batch is at least the delay old (and something is new).

    The clock starts when the query (re)starts, so a restarted query also waits for the minimum.
    """

    def __init__(
        self, min_offsets: int, max_delay_ms: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.min_offsets = min_offsets
        self.max_delay = max_delay_ms / 1000
        self.clock = clock
        self.last_trigger = clock()

    def allows(self, available: int) -> bool:
        now = self.clock()
        if available <= 0:
            return False
        if available >= self.min_offsets or now - self.last_trigger >= self.max_delay:
            self.last_trigger = now
            return True
        return False


def encode_offsets(offsets: Mapping[TP, int]) -> dict[str, dict[str, int]]:
    """Spark's offset JSON: ``{"topic": {"partition": next offset}}``."""
    out: dict[str, dict[str, int]] = {}
    for (t, p), off in sorted(offsets.items()):
        out.setdefault(t, {})[str(p)] = int(off)
    return out


def decode_offsets(obj: Mapping[str, Any], topic: str) -> dict[TP, int]:
    """Spark's offset JSON, or ``{"partition": offset}`` of *topic* (earlier versions)."""
    out: dict[TP, int] = {}
    for key, value in obj.items():
        if isinstance(value, Mapping):
            out.update({(str(key), int(p)): int(o) for p, o in value.items()})
        else:
            out[(topic, int(key))] = int(value)
    return out
