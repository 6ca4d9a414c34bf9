"""The ``statesnap-kafka`` source: Kafka on Spark's Python Data Source API, over confluent-kafka.

Batch reads cover ``startingOffsets`` … ``endingOffsets``; streaming reads track offsets as a
per-partition JSON map (``{"0": 123, "1": 77}``, next offset to read) in Spark's checkpoint, so a
query stopped and restarted with the same ``checkpointLocation`` resumes with no record missed and
none read twice. Rows reach Spark as Arrow record batches in exactly Spark's Kafka schema.

``statesnap-kafka-ranges`` is the same source emitting one row per planned offset range
(``partition, start, end``) instead of the records: the streaming materializer lets Spark plan and
checkpoint the ranges, and reads them itself on the executors, straight into data files.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from statesnap.errors import ConfigError, KafkaError
from statesnap.spark.kafka_io import OffsetOracle, iter_range, spark_batch, split_ranges
from statesnap.spark.options import EARLIEST, LATEST, KafkaSourceOptions, OffsetSpec, parse_options

log = logging.getLogger(__name__)

SOURCE_NAME = "statesnap-kafka"
RANGES_SOURCE_NAME = "statesnap-kafka-ranges"

#: Exactly Spark's Kafka source schema (``includeHeaders`` is not supported).
SPARK_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
)
RANGES_SCHEMA = StructType(
    [
        StructField("partition", IntegerType()),
        StructField("start", LongType()),
        StructField("end", LongType()),
    ]
)
_RANGES_ARROW = pa.schema([("partition", pa.int32()), ("start", pa.int64()), ("end", pa.int64())])

#: Without ``minPartitions``, ranges are split only down to this many records: below it a Spark
#: task costs more than it saves.
DEFAULT_MIN_SPLIT = 50_000


class KafkaRange(InputPartition):
    """One task's work: offsets ``[start, end)`` of one Kafka partition."""

    def __init__(self, partition: int, start: int, end: int) -> None:
        super().__init__((partition, start, end))
        self.partition = partition
        self.start = start
        self.end = end


def resolve_offsets(
    spec: OffsetSpec,
    option: str,
    partitions: Sequence[int],
    earliest: Mapping[int, int],
    latest: Mapping[int, int],
    *,
    default: str,
    fail_on_data_loss: bool,
) -> dict[int, int]:
    """Concrete offsets for ``earliest``/``latest``/JSON specs, checked against the topic."""
    if spec == "earliest":
        return {p: earliest[p] for p in partitions}
    if spec == "latest":
        return {p: latest[p] for p in partitions}
    assert isinstance(spec, dict)
    unknown = sorted(set(spec) - set(partitions))
    if unknown:
        raise ConfigError(f"option {option}: the topic has no partition(s) {unknown}")
    out = {}
    for p in partitions:
        off = spec.get(p, EARLIEST if default == "earliest" else LATEST)
        if off == EARLIEST:
            off = earliest[p]
        elif off == LATEST:
            off = latest[p]
        elif off > latest[p]:
            raise ConfigError(
                f"option {option}: offset {off} of partition {p} is beyond the end of the "
                f"partition ({latest[p]})"
            )
        elif off < earliest[p]:
            if fail_on_data_loss:
                raise KafkaError(
                    f"option {option}: offset {off} of partition {p} was deleted (the log starts "
                    f"at {earliest[p]}); set failOnDataLoss=false to start at the log start"
                )
            off = earliest[p]
        out[p] = off
    return out


def plan_ranges(opts: KafkaSourceOptions, oracle: OffsetOracle) -> dict[int, tuple[int, int]]:
    """``[start, end)`` per partition of a batch read; the end is the true end found by EOF."""
    parts = oracle.partitions()
    earliest, latest = oracle.earliest(parts), oracle.latest(parts)
    starts = resolve_offsets(
        opts.starting,
        "startingOffsets",
        parts,
        earliest,
        latest,
        default="earliest",
        fail_on_data_loss=opts.fail_on_data_loss,
    )
    ends = resolve_offsets(
        opts.ending,
        "endingOffsets",
        parts,
        earliest,
        latest,
        default="latest",
        fail_on_data_loss=opts.fail_on_data_loss,
    )
    for p in parts:
        if ends[p] < starts[p]:
            raise ConfigError(
                f"option endingOffsets: partition {p} ends at {ends[p]}, before startingOffsets ({starts[p]})"
            )
    return {p: (starts[p], ends[p]) for p in parts}


def _splits(
    opts: KafkaSourceOptions, ranges: Mapping[int, tuple[int, int]], *, split: bool
) -> list[KafkaRange]:
    if not split:
        pieces = [(p, s, e) for p, (s, e) in sorted(ranges.items()) if e > s]
    elif opts.min_partitions is not None:
        pieces = split_ranges(
            ranges, min_partitions=opts.min_partitions, max_records=opts.max_records_per_partition
        )
    else:
        pieces = split_ranges(
            ranges,
            min_partitions=os.cpu_count() or 1,
            max_records=opts.max_records_per_partition,
            min_split=DEFAULT_MIN_SPLIT,
        )
    return [KafkaRange(p, s, e) for p, s, e in pieces]


def _read(opts: KafkaSourceOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, KafkaRange):
        return  # Spark plans one empty partition when a read covers no offsets
    for msgs in iter_range(opts, partition.partition, partition.start, partition.end):
        yield spark_batch(msgs, opts.topic, partition.partition)


def _ranges_batch(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    if isinstance(partition, KafkaRange):
        yield pa.RecordBatch.from_arrays(
            [
                pa.array([partition.partition], pa.int32()),
                pa.array([partition.start], pa.int64()),
                pa.array([partition.end], pa.int64()),
            ],
            schema=_RANGES_ARROW,
        )


class KafkaBatchReader(DataSourceReader):
    """Plans on the driver (ends found by EOF), reads ranges in tasks."""

    def __init__(self, opts: KafkaSourceOptions, *, emit_ranges: bool = False) -> None:
        self.opts = opts
        self.emit_ranges = emit_ranges

    def partitions(self) -> list[InputPartition]:
        oracle = OffsetOracle(self.opts)
        try:
            ranges = plan_ranges(self.opts, oracle)
        finally:
            oracle.close()
        return list(_splits(self.opts, ranges, split=not self.emit_ranges))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if self.emit_ranges:
            return _ranges_batch(partition)
        return _read(self.opts, partition)


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are ``{"<partition>": next offset}``; ends are found by EOF on every trigger.

    Lives in a long-running Python process on the driver (Spark keeps it for the whole query),
    so the :class:`OffsetOracle` and its consumer are reused across triggers. A copy is pickled to
    the tasks for :meth:`read`; the oracle never travels.
    """

    def __init__(self, opts: KafkaSourceOptions, *, emit_ranges: bool = False) -> None:
        self.opts = opts
        self.emit_ranges = emit_ranges
        self._oracle: OffsetOracle | None = None
        self._target: dict[int, int] | None = None
        self._latest: dict[int, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts, "emit_ranges": self.emit_ranges}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.opts = state["opts"]
        self.emit_ranges = state["emit_ranges"]
        self._oracle = None
        self._target = None
        self._latest = None

    @property
    def oracle(self) -> OffsetOracle:
        if self._oracle is None:
            self._oracle = OffsetOracle(self.opts)
        return self._oracle

    def initialOffset(self) -> dict[str, int]:  # noqa: N802 - Spark's API
        ranges = plan_ranges(self.opts, self.oracle)
        return {str(p): start for p, (start, _end) in sorted(ranges.items())}

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        if self.opts.max_offsets_per_trigger:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        self._target = self.oracle.latest(self.oracle.partitions())

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:  # noqa: N802
        parts = self.oracle.partitions()
        ends = self.oracle.latest(parts)
        self._latest = dict(ends)
        begin = {p: int(start.get(str(p), 0)) for p in parts}
        if self._target is not None:
            ends = {p: min(ends[p], self._target.get(p, begin[p])) for p in parts}
        ends = {p: max(ends[p], begin[p]) for p in parts}
        if isinstance(limit, ReadMaxRows):
            ends = rate_limit(begin, ends, limit.max_rows)
        return {str(p): ends[p] for p in sorted(ends)}

    def reportLatestOffset(self) -> dict[str, int] | None:  # noqa: N802
        return None if self._latest is None else {str(p): o for p, o in sorted(self._latest.items())}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        ranges = {int(p): (int(start.get(p, 0)), int(e)) for p, e in end.items()}
        return list(_splits(self.opts, ranges, split=not self.emit_ranges))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if self.emit_ranges:
            return _ranges_batch(partition)
        return _read(self.opts, partition)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to do: the source keeps no state outside Spark's checkpoint."""

    def stop(self) -> None:
        if self._oracle is not None:
            self._oracle.close()
            self._oracle = None


def rate_limit(begin: Mapping[int, int], ends: Mapping[int, int], max_rows: int) -> dict[int, int]:
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


class KafkaDataSource(DataSource):
    """``spark.read.format("statesnap-kafka")`` / ``spark.readStream.format(...)``."""

    emit_ranges = False

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        parse_options(self.options, streaming=False)  # fail at load(), naming the bad option
        return SPARK_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaBatchReader(parse_options(self.options, streaming=False), emit_ranges=self.emit_ranges)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        return KafkaStreamReader(parse_options(self.options, streaming=True), emit_ranges=self.emit_ranges)


class KafkaRangesDataSource(KafkaDataSource):
    """Same planning and checkpointing as ``statesnap-kafka``; rows are the planned ranges."""

    emit_ranges = True

    @classmethod
    def name(cls) -> str:
        return RANGES_SOURCE_NAME

    def schema(self) -> StructType:
        parse_options(self.options, streaming=False)
        return RANGES_SCHEMA
