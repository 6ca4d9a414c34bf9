"""The ``statesnap-kafka`` source: Spark's Kafka source on the Python Data Source API, over confluent-kafka.

Same options, same schema (``includeHeaders`` adds Spark's ``headers`` column), same offsets:
batch reads cover ``startingOffsets`` … ``endingOffsets`` (or their timestamp variants);
streaming reads keep Spark's offset JSON (``{"topic": {"0": 123}}``, next offset to read) in
Spark's checkpoint, so a query stopped and restarted with the same ``checkpointLocation``
resumes with no record missed and none read twice. Where the log no longer holds what the
checkpoint says — offsets deleted, partitions gone, a recreated topic — the query fails under
``failOnDataLoss=true`` (the default), as Spark's does. Rows reach Spark as Arrow batches.
Planning rules live in :mod:`statesnap.spark.planning`; docs/spark-kafka-source.md maps options.

A statesnap error raised on the driver (options, planning, offsets) reaches Spark without its
frames: Spark prints the traceback a Python source raises inside its own error, and the error's
one line already names what is wrong and what to do (the full traceback is logged at DEBUG).

``statesnap-kafka-ranges`` is the same source emitting one row per planned offset range
(``partition, start, end``) instead of the records: the streaming materializer lets Spark plan and
checkpoint the ranges, and reads them itself on the executors, straight into data files.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ParamSpec, TypeVar

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
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from statesnap.errors import ConfigError, StatesnapError
from statesnap.kafka.config import check_sasl_mechanism
from statesnap.spark.kafka_io import OffsetOracle, iter_range, spark_batch, split_ranges
from statesnap.spark.option_parsing import parse_options
from statesnap.spark.options import TP, KafkaSourceOptions
from statesnap.spark.planning import (
    TriggerGate,
    continue_from,
    decode_offsets,
    encode_offsets,
    initial_offsets,
    plan_batch,
    rate_limit,
    report_data_loss,
)

__all__ = [
    "RANGES_SOURCE_NAME",
    "SOURCE_NAME",
    "SPARK_SCHEMA",
    "SPARK_SCHEMA_WITH_HEADERS",
    "KafkaDataSource",
    "KafkaRangesDataSource",
    "rate_limit",
]

log = logging.getLogger(__name__)

SOURCE_NAME = "statesnap-kafka"
RANGES_SOURCE_NAME = "statesnap-kafka-ranges"

#: Exactly Spark's Kafka source schema.
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
#: Spark's schema with ``includeHeaders=true``.
SPARK_SCHEMA_WITH_HEADERS = StructType(
    [
        *SPARK_SCHEMA.fields,
        StructField(
            "headers",
            ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())])),
        ),
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

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _in_one_line(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """*method* with a statesnap error raised from here, without the frames below: Spark shows
    the traceback inside its own error, where the error's line is what names the cause."""

    @functools.wraps(method)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(*args, **kwargs)
        except StatesnapError as e:
            log.debug("%s failed", method.__qualname__, exc_info=True)
            raise e.with_traceback(None)  # noqa: B904 - the same error, its cause kept

    return call


def _parsed(options: Mapping[str, Any], *, streaming: bool | None) -> KafkaSourceOptions:
    """The options, with SASL lacking a mechanism named as such first: librdkafka's own check
    would say "No provider for SASL mechanism GSSAPI: recompile librdkafka…"."""
    unchecked = parse_options(options, streaming=streaming, check_client=False)
    check_sasl_mechanism(unchecked.kafka_config, prefix="kafka.")
    return parse_options(options, streaming=streaming)


#: Without ``minPartitions``, ranges are split only down to this many records: below it a Spark
#: task costs more than it saves.
DEFAULT_MIN_SPLIT = 50_000


class KafkaRange(InputPartition):
    """One task's work: offsets ``[start, end)`` of one Kafka partition."""

    def __init__(self, partition: int, start: int, end: int, topic: str = "") -> None:
        super().__init__((topic, partition, start, end))
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end


def _splits(
    opts: KafkaSourceOptions, ranges: Mapping[TP, tuple[int, int]], *, split: bool
) -> list[KafkaRange]:
    if not split:
        pieces = [(tp, s, e) for tp, (s, e) in sorted(ranges.items()) if e > s]
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
    return [KafkaRange(p, s, e, topic=t) for (t, p), s, e in pieces]


def _read(opts: KafkaSourceOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, KafkaRange):
        return  # Spark plans one empty partition when a read covers no offsets
    topic = partition.topic or opts.topic
    for msgs in iter_range(opts, partition.partition, partition.start, partition.end, topic=topic):
        yield spark_batch(msgs, topic, partition.partition, headers=opts.include_headers)


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

    @_in_one_line
    def partitions(self) -> list[InputPartition]:
        oracle = OffsetOracle(self.opts)
        try:
            ranges = plan_batch(self.opts, oracle)
        finally:
            oracle.close()
        return list(_splits(self.opts, ranges, split=not self.emit_ranges))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if self.emit_ranges:
            return _ranges_batch(partition)
        return _read(self.opts, partition)


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are Spark's ``{"topic": {"partition": next offset}}``; ends are found by EOF on
    every trigger, and checked against the log (``failOnDataLoss``).

    Lives in a long-running Python process on the driver (Spark keeps it for the whole query),
    so the :class:`OffsetOracle` and its consumer are reused across triggers. A copy is pickled to
    the tasks for :meth:`read`; the oracle never travels.
    """

    def __init__(self, opts: KafkaSourceOptions, *, emit_ranges: bool = False) -> None:
        self.opts = opts
        self.emit_ranges = emit_ranges
        self._reset()

    def _reset(self) -> None:
        self._oracle: OffsetOracle | None = None
        self._target: dict[TP, int] | None = None
        self._latest: dict[TP, int] | None = None
        #: (end offsets, where each partition really starts) of the last latestOffset() answer.
        self._planned: tuple[dict[TP, int], dict[TP, int]] | None = None
        self._gate = (
            TriggerGate(self.opts.min_offsets_per_trigger, self.opts.max_trigger_delay_ms)
            if self.opts.min_offsets_per_trigger
            else None
        )

    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts, "emit_ranges": self.emit_ranges}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.opts = state["opts"]
        self.emit_ranges = state["emit_ranges"]
        self._reset()

    @property
    def oracle(self) -> OffsetOracle:
        if self._oracle is None:
            self._oracle = OffsetOracle(self.opts)
        return self._oracle

    @_in_one_line
    def initialOffset(self) -> dict[str, Any]:  # noqa: N802 - Spark's API
        return encode_offsets(initial_offsets(self.opts, self.oracle))

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        if self.opts.max_offsets_per_trigger:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        if self.opts.min_offsets_per_trigger:
            return ReadMinRows(self.opts.min_offsets_per_trigger)
        return ReadAllAvailable()

    @_in_one_line
    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        self._target = self.oracle.latest_of(self.oracle.topic_partitions(missing_ok=True))

    @_in_one_line
    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:  # noqa: N802
        begin = decode_offsets(start, self.opts.topic)
        tps = self.oracle.topic_partitions(missing_ok=True)
        earliest, latest = self.oracle.earliest_of(tps), self.oracle.latest_of(tps)
        self._latest = dict(latest)
        really = continue_from(begin, tps, earliest, latest, fail_on_data_loss=self.opts.fail_on_data_loss)
        ends = dict(latest)
        if self._target is not None:  # Trigger.AvailableNow: nothing past what was there at start
            ends = {tp: min(ends[tp], self._target.get(tp, really[tp])) for tp in tps}
        ends = {tp: max(ends[tp], really[tp]) for tp in tps}
        if not isinstance(limit, ReadAllAvailable):
            available = sum(ends[tp] - really[tp] for tp in tps)
            if self._gate is not None and self._target is None and not self._gate.allows(available):
                return start
            if isinstance(limit, ReadMaxRows):
                ends = rate_limit(really, ends, limit.max_rows)
        self._planned = (ends, really)
        return encode_offsets(ends)

    def reportLatestOffset(self) -> dict[str, Any] | None:  # noqa: N802
        return None if self._latest is None else encode_offsets(self._latest)

    @_in_one_line
    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        begin = decode_offsets(start, self.opts.topic)
        ends = decode_offsets(end, self.opts.topic)
        if self._planned is not None and self._planned[0] == ends:
            really = self._planned[1]
        else:
            really, ends = self._recheck(begin, ends)
        ranges = {tp: (really[tp], ends[tp]) for tp in ends}
        return list(_splits(self.opts, ranges, split=not self.emit_ranges))

    def _recheck(self, begin: dict[TP, int], ends: dict[TP, int]) -> tuple[dict[TP, int], dict[TP, int]]:
        """A batch this process did not plan (Spark re-runs the last one after a restart):
        check its offsets against the log as it is now before any task waits for records."""
        tps = sorted(ends)
        earliest, latest = self.oracle.earliest_of(tps), self.oracle.latest_of(tps)
        for tp in tps:
            if ends[tp] > latest[tp]:
                report_data_loss(
                    f"{tp[0]}[{tp[1]}]: the batch being re-run reads up to offset {ends[tp]} but the "
                    f"partition ends at {latest[tp]}: the topic was deleted and recreated (or truncated)",
                    fail=self.opts.fail_on_data_loss,
                )
        known = {tp: off for tp, off in begin.items() if tp in ends}
        really = continue_from(known, tps, earliest, latest, fail_on_data_loss=self.opts.fail_on_data_loss)
        return really, {tp: min(ends[tp], latest[tp]) for tp in tps}

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if self.emit_ranges:
            return _ranges_batch(partition)
        return _read(self.opts, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the source keeps no state outside Spark's checkpoint."""

    def stop(self) -> None:
        if self._oracle is not None:
            self._oracle.close()
            self._oracle = None


class KafkaDataSource(DataSource):
    """``spark.read.format("statesnap-kafka")`` / ``spark.readStream.format(...)``, in any
    session: :mod:`pyspark_statesnap` names it as the ``DefaultSource`` PySpark looks up."""

    emit_ranges = False

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    @_in_one_line
    def schema(self) -> StructType:
        # Called by load() for batch and streaming alike: fail there, naming the bad option.
        opts = self._parse(streaming=None)
        return SPARK_SCHEMA_WITH_HEADERS if opts.include_headers else SPARK_SCHEMA

    @_in_one_line
    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaBatchReader(self._parse(streaming=False), emit_ranges=self.emit_ranges)

    @_in_one_line
    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        return KafkaStreamReader(self._parse(streaming=True), emit_ranges=self.emit_ranges)

    def _parse(self, *, streaming: bool | None) -> KafkaSourceOptions:
        return _parsed(self.options, streaming=streaming)


class KafkaRangesDataSource(KafkaDataSource):
    """Same planning and checkpointing as ``statesnap-kafka``; rows are the planned ranges of
    a single topic (the rows carry no topic)."""

    emit_ranges = True

    @classmethod
    def name(cls) -> str:
        return RANGES_SOURCE_NAME

    @_in_one_line
    def schema(self) -> StructType:
        self._parse(streaming=None)
        return RANGES_SCHEMA

    def _parse(self, *, streaming: bool | None) -> KafkaSourceOptions:
        opts = _parsed(self.options, streaming=streaming)
        sub = opts.strategy
        if sub.kind != "subscribe" or len(sub.topics) != 1:
            raise ConfigError(f"{RANGES_SOURCE_NAME} reads exactly one topic: use subscribe with one topic")
        return opts
