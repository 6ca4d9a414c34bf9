"""Fold a processor's declared count by key over its input's history on Spark (two routes).

A count (:class:`CountPerKey`, what ``proc.count(store)`` declares) may be folded by key instead
of record by record: in Python tasks with Arrow's hash aggregation (partitions split over every
core, partial counts merged), or as ``groupBy(partition, key).count()`` over the
``statesnap-kafka`` source; either writes the handler path's rows in the processor's keyspace
(:mod:`statesnap.processor.keyspace`), byte for byte (``benchmarks/processor_spark.py`` measures
the three).

The driver (:mod:`statesnap.spark.processor_bootstrap`) plans, checks the claim, takes the
generation and commits; a route counts, writes each partition's ``base`` file and returns the file,
never the rows. It reads a plan through :class:`CountWork`: this module never imports the driver.

Over 500 lines only by :class:`JobProgress` and :func:`rows_per_store`, which the driver shares and
which belong next to ``Progress`` (:mod:`statesnap.spark.bootstrap`) and in the keyspace.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from itertools import chain
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Message

from statesnap.checkpoint import CheckpointRepository, datafile
from statesnap.checkpoint.manifest import DataFile
from statesnap.errors import ConfigError
from statesnap.processor import Processor
from statesnap.processor.keyspace import (
    META_STORE,
    partition_prefix,
    store_prefix,
    stream_time_key,
    stream_time_of,
    stream_time_value,
)
from statesnap.processor.outputs import Outputs
from statesnap.serde import Serde
from statesnap.spark.bootstrap import MIN_SPLIT_RECORDS, PROGRESS_INTERVAL_SECONDS, Progress
from statesnap.spark.changes import from_ipc, to_ipc, write_data_file
from statesnap.spark.kafka_io import iter_range, split_ranges
from statesnap.spark.options import KafkaSourceOptions, offsets_json, source_options
from statesnap.spark.source import SOURCE_NAME
from statesnap.stores import MemoryStore

__all__ = [
    "CountJob",
    "CountPerKey",
    "CountRule",
    "CountWork",
    "JobProgress",
    "PartitionCount",
    "check_count",
    "rows_per_store",
]


@dataclass(frozen=True, slots=True)
class CountPerKey:
    """Declares that the processor counts records per input key into key-value store *store*.

    That is, its only state is ``store[record.key] = store.get(record.key, 0) + 1`` for every
    record with a key (records without one leave the store alone): ``proc.count(store)``. Counting
    combines, so the history is folded by key instead of running the handler record by record:
    by default in Python tasks with Arrow's hash aggregation (partitions split over every core,
    partial counts merged per partition in a second stage; the records never cross into the JVM,
    as :func:`~statesnap.spark.bootstrap` reads them), or with ``dataframe=True`` as
    ``groupBy(partition, key).count()`` over the ``statesnap-kafka`` source (measured with 5 M
    events over 500 k keys, 4 partitions, ``local[2]`` on 2 cores at load ~3: Arrow tasks 3.2x the
    single Python process, the handler path 1.3x, the DataFrame route 1.2x: its records cross
    from the Python source into the JVM). The driver checks
    the claim first: it runs the handler over the first *sample* records of a partition and
    refuses (:class:`ConfigError`) when its rows differ from the count's, byte for byte.
    """

    store: str
    sample: int = 1000
    dataframe: bool = False


def check_count(proc: Processor, aggregation: CountPerKey) -> None:
    """Refuses (:class:`ConfigError`) a count the processor's declaration cannot be: a count
    models one key-value store without ttl, and no punctuator; checked before any Spark job."""
    specs = proc.stores
    spec = specs.get(aggregation.store)
    if spec is None or spec.window is not None:
        raise ConfigError(
            f"processor {proc.name!r}: CountPerKey needs a key-value store named {aggregation.store!r} "
            f"(stores: {', '.join(specs) or 'none'})"
        )
    if spec.ttl is not None:
        raise ConfigError(
            f"processor {proc.name!r}: store {aggregation.store!r} has a ttl (its entries expire by "
            "stream time), which a count by key does not model; bootstrap it with its handler"
        )
    if len(specs) != 1:
        raise ConfigError(
            f"processor {proc.name!r}: CountPerKey folds only store {aggregation.store!r}, but the "
            f"processor has {len(specs)} stores; bootstrap it with its handler (aggregation=None)"
        )
    if proc.punctuators:  # punctuators write state a count does not model
        raise ConfigError(
            f"processor {proc.name!r} has punctuators: a Spark count cannot run them; bootstrap it "
            "with its handler (aggregation=None)"
        )
    if aggregation.sample < 0:
        raise ConfigError(f"CountPerKey sample must not be negative, got {aggregation.sample}")


class CountWork(Protocol):
    """What a route reads of one partition's plan (the driver's plan is one): records ``[start,
    end)`` on top of the base checkpoint's files *previous*; *run* names its ``base`` file."""

    @property
    def partition(self) -> int: ...
    @property
    def start(self) -> int: ...
    @property
    def end(self) -> int: ...
    @property
    def previous(self) -> tuple[DataFile, ...]: ...
    @property
    def run(self) -> int: ...


@dataclass(frozen=True, slots=True)
class PartitionCount:
    """What counting one partition returns to the driver (its file as JSON, never rows)."""

    partition: int
    file: dict[str, Any]
    rows: int
    stores: dict[str, int]
    records: int
    seconds: dict[str, float]
    #: Records the count skipped (no key, or a tombstone), as the handler path counts them.
    skipped: int = 0


@dataclass(frozen=True, slots=True)
class CountJob:
    """One count by key into generation *generation*: the rule, where the records come from
    (*opts*, *topic*), where the files go (*repo*); its two routes return each partition's
    :class:`PartitionCount`. *progress* hears ``(records, tasks done, tasks)``."""

    spark: Any
    rule: CountRule
    opts: KafkaSourceOptions
    topic: str
    repo: CheckpointRepository
    generation: int
    progress: Progress | None = None
    #: At least this many Python tasks (splitting down to single records); default the cluster's.
    min_partitions: int | None = None

    def in_tasks(self, work: Sequence[CountWork]) -> dict[int, PartitionCount]:
        """Counts per key in Python tasks (Arrow's hash aggregation per batch, partials folded as
        they pile up); a partition split over several tasks is merged in a second, small stage."""
        if not work:
            return {}
        # the closures below travel to the executors: they take these, never self (the session)
        rule, opts, repo, generation = self.rule, self.opts, self.repo, self.generation
        min_partitions, progress = self.min_partitions, self.progress
        sc = self.spark.sparkContext
        by_partition = {w.partition: w for w in work}
        pieces = split_ranges(
            {w.partition: (w.start, w.end) for w in work},
            min_partitions=min_partitions or sc.defaultParallelism,
            max_records=None,
            min_split=1 if min_partitions else MIN_SPLIT_RECORDS,
        )
        splits = {p: sum(1 for q, _s, _e in pieces if q == p) for p in by_partition}
        numbered = [(p, i, s, e) for i, (p, s, e) in enumerate(pieces)]
        records_acc, tasks_acc = sc.accumulator(0), sc.accumulator(0)

        def count(piece: tuple[int, int, int, int]) -> tuple[int, tuple[int, Any, int, float]]:
            p, index, start, end = piece
            mark = time.perf_counter()
            counter = _Counter()
            for msgs in iter_range(opts, p, start, end):
                counter.add(msgs)
            counts = counter.result()
            records_acc.add(counter.records)
            tasks_acc.add(1)
            spent = time.perf_counter() - mark
            if splits[p] == 1:
                return p, (index, rule.fold(_groups_of(counts), by_partition[p], repo, generation), 0, spent)
            return p, (index, to_ipc(counts), counter.records, spent)

        def finish(group: tuple[int, Iterable[tuple[int, Any, int, float]]]) -> PartitionCount:
            p, parts = group
            ordered = sorted(parts, key=lambda part: part[0])
            if len(ordered) == 1 and isinstance(ordered[0][1], PartitionCount):
                return _counted(ordered[0][1], ordered[0][3])
            merged = _merge_counts([from_ipc(part[1]) for part in ordered])
            done = rule.fold(_groups_of(merged), by_partition[p], repo, generation)
            return _counted(done, sum(part[3] for part in ordered), sum(part[2] for part in ordered))

        stage = sc.parallelize(numbered, len(numbered)).map(count)
        if len(pieces) == len(by_partition):  # every partition in one task: no second stage
            stage = stage.map(lambda kv: finish((kv[0], [kv[1]])))
        else:
            stage = stage.groupByKey(min(len(by_partition), sc.defaultParallelism)).map(finish)
        with JobProgress(progress, records_acc, tasks_acc, len(pieces)):
            out: list[PartitionCount] = stage.collect()
        if progress is not None:
            progress(sum(d.records for d in out), len(pieces), len(pieces))
        return {d.partition: d for d in out}

    def in_dataframe(self, work: Sequence[CountWork]) -> dict[int, PartitionCount]:
        """``groupBy(partition, key)`` over the ``statesnap-kafka`` source (ranges split over every
        core, the counting in the JVM); then one Python function per Kafka partition adds the
        groups to the base checkpoint's rows in the processor's keyspace and writes the file."""
        if not work:
            return {}
        from pyspark.sql import functions as sf

        # the closure below travels to the executors: it takes these, never self (the session)
        rule, opts, topic, repo = self.rule, self.opts, self.topic, self.repo
        generation, progress = self.generation, self.progress
        sc = self.spark.sparkContext
        options = source_options(
            opts.bootstrap_servers,
            topic,
            opts.kafka_config,
            startingOffsets=offsets_json(topic, {w.partition: w.start for w in work}),
            endingOffsets=offsets_json(topic, {w.partition: w.end for w in work}),
            minPartitions=sc.defaultParallelism,
        )
        del options["subscribe"]
        options["assign"] = json.dumps({topic: sorted(w.partition for w in work)})
        counted = sf.when(sf.col("value").isNotNull(), sf.col("offset"))  # a counted record's offset
        groups = (
            self.spark.read.format(SOURCE_NAME)
            .options(**options)
            .load()
            .groupBy("partition", "key")  # records without a key: one group, for the last record
            .agg(
                sf.count("value").alias("n"),  # tombstones are not counted
                sf.count(sf.lit(1)).alias("records"),
                sf.max(counted).alias("offset"),
                sf.max_by(sf.unix_millis("timestamp"), counted).alias("timestamp"),
                sf.max("offset").alias("last_offset"),
                sf.max_by(sf.unix_millis("timestamp"), "offset").alias("last_timestamp"),
                sf.max(sf.unix_millis("timestamp")).alias("latest"),
            )
        )
        by_partition = {w.partition: w for w in work}

        def fold(rows: Iterable[Any]) -> Iterator[PartitionCount]:
            grouped: dict[int, list[_Group]] = {}
            for partition, key, *rest in rows:
                grouped.setdefault(partition, []).append((None if key is None else bytes(key), *rest))
            for p, found in grouped.items():
                yield rule.fold(found, by_partition[p], repo, generation)

        spread = min(len(work), sc.defaultParallelism)
        if progress is not None:
            progress(0, 0, len(work))
        # Rows, not mapInArrow: that needs pandas on every worker; one row per key is cheap next to
        # the records the JVM counted.
        folded: list[PartitionCount] = (
            groups.repartition(spread, "partition").rdd.mapPartitions(fold).collect()
        )
        out = {d.partition: d for d in folded}
        if progress is not None:
            progress(sum(d.records for d in out.values()), len(work), len(work))
        return out


#: One group of the Spark count: (key, records counted (not tombstones), records, the last counted
#: record's offset and timestamp, the last record's offset and timestamp, the largest timestamp).
_Group = tuple[bytes | None, int, int, int | None, int | None, int, int | None, int | None]


@dataclass(frozen=True, slots=True)
class CountRule:
    """What a count per key writes, byte for byte as the handler path writes it: the stored key
    is ``<store>\\0<partition><store key serde(input key serde⁻¹(raw key))>``, the value the
    store's value serde of the count, the row's offset and timestamp the key's last record's; the
    bookkeeping store holds the partition's stream time (the largest record timestamp)."""

    store: str
    sample: int
    input_keys: Serde
    keys: Serde
    values: Serde

    @classmethod
    def of(cls, proc: Processor, aggregation: CountPerKey) -> CountRule:
        keys, values = proc.store_serdes(aggregation.store)
        return cls(aggregation.store, aggregation.sample, proc.key_serde, keys, values)

    def stored_key(self, prefix: bytes, raw: bytes) -> bytes:
        return prefix + self.keys.serialize(self.input_keys.deserialize(raw))

    def fold(
        self, groups: list[_Group], w: CountWork, repo: CheckpointRepository, generation: int
    ) -> PartitionCount:
        """One partition's groups added to its base checkpoint's rows, written as its base file."""
        mark = time.perf_counter()
        p = w.partition
        base = repo.merge_files(w.previous) if w.previous else datafile.empty_table()
        rows: dict[bytes, tuple[bytes, int, int | None]] = dict(
            zip(
                base.column("key").to_pylist(),
                zip(
                    base.column("value").to_pylist(),
                    base.column("offset").to_pylist(),
                    _millis(base.column("timestamp")),
                    strict=True,
                ),
                strict=True,
            )
        )
        loaded = time.perf_counter()
        prefix = partition_prefix(self.store, p)
        counted: dict[bytes, tuple[int, int, int | None]] = {}
        records, latest, skipped = 0, -1, 0
        last: tuple[int, int | None] = (-1, None)
        for raw, count, in_group, newest_offset, stamp, last_offset, last_ts, newest in groups:
            records += in_group
            skipped += in_group if raw is None else in_group - count
            newest_ts = None if stamp == -1 else stamp  # -1: the counter's "no timestamp"
            if last_offset > last[0]:
                last = (last_offset, last_ts)
            if raw is None:  # records without a key count nothing and move no stream time
                continue
            latest = max(latest, -1 if newest is None else newest)
            if count == 0 or newest_offset is None:  # only tombstones: Kafka Streams counts none
                continue
            key = self.stored_key(prefix, raw)
            seen = counted.get(key)
            if seen is None:
                counted[key] = (count, newest_offset, newest_ts)
            else:  # two raw keys the serdes make one: their counts add up
                newer = seen if seen[1] > newest_offset else (0, newest_offset, newest_ts)
                counted[key] = (seen[0] + count, newer[1], newer[2])
        for key, (n, offset, ts) in counted.items():
            before = rows.get(key)
            total = n + (0 if before is None else int(self.values.deserialize(before[0])))
            rows[key] = (self.values.serialize(total), offset, ts)
        meta = stream_time_key(p)
        before_meta = rows.get(meta)
        if latest > stream_time_of(None if before_meta is None else before_meta[0]):
            # as the handler path: the row moves only when stream time does
            rows[meta] = (stream_time_value(latest), last[0], last[1])
        ordered = sorted(rows)
        table = pa.Table.from_arrays(
            [
                pa.array(ordered, pa.binary()),
                pa.array([rows[k][0] for k in ordered], pa.binary()),
                pa.array([rows[k][1] for k in ordered], pa.int64()),
                pa.array([rows[k][2] for k in ordered], pa.int64()).cast(datafile.TIMESTAMP),
            ],
            schema=datafile.SCHEMA,
        )
        folded = time.perf_counter()
        written = write_data_file(repo, generation, p, "base", w.run, table)
        seconds = {"load": loaded - mark, "process": folded - loaded, "write": time.perf_counter() - folded}
        names = [self.store, META_STORE]
        return PartitionCount(
            p, written.to_json(), table.num_rows, rows_per_store(table, names), records, seconds, skipped
        )

    def check_claim(self, proc: Processor, opts: KafkaSourceOptions, work: Sequence[CountWork]) -> None:
        """Run the handler over the first records of the first partition with new records and
        compare its rows with the count's; :class:`ConfigError` when they differ."""
        w = next((w for w in work if w.end > w.start), None)
        if w is None or self.sample == 0:
            return
        end = min(w.end, w.start + self.sample)
        store = MemoryStore()
        outputs = Outputs(opts.settings(), proc.key_serde, proc.value_serde)
        outputs.state_only = True
        handler = proc.handler_for(store, outputs)
        records = []
        for msgs in iter_range(opts, w.partition, w.start, end):
            handler.apply(w.partition, msgs, None)
            records += [(m.key(), m.value() is not None) for m in msgs]
        prefix = partition_prefix(self.store, w.partition)
        counts: dict[bytes, int] = {}
        for raw, has_value in records:
            if raw is not None and has_value:
                key = self.stored_key(prefix, raw)
                counts[key] = counts.get(key, 0) + 1
        expected = {k: self.values.serialize(n) for k, n in counts.items()}
        meta = store_prefix(META_STORE)
        got = {k: v for k, v in store.items() if not k.startswith(meta)}
        if got != expected:
            wrong = sorted(set(got) ^ set(expected)) or sorted(k for k in got if got[k] != expected.get(k))
            raise ConfigError(
                f"processor {proc.name!r}: its handler does not count records per key into store "
                f"{self.store!r} (on the first {len(records)} records of partition {w.partition}, "
                f"{len(wrong)} stored keys differ, e.g. {wrong[0][:60]!r}); bootstrap it with its "
                "handler (aggregation=None)"
            )


def _millis(column: Any) -> list[int | None]:
    """Timestamps as epoch milliseconds (None where missing), whatever unit Arrow carries."""
    unit = column.type.unit
    ints: list[int | None] = pc.cast(column, pa.int64()).to_pylist()
    div = {"s": 1 / 1000, "ms": 1, "us": 1000, "ns": 1_000_000}[unit]
    if div == 1:
        return ints
    return [None if v is None else int(v // div) for v in ints]


_KEY, _OFFSET, _TIMESTAMP = Message.key, Message.offset, Message.timestamp
#: Arrow's ``last`` keeps nulls: a key's last record without a timestamp has none in the handler.
_LAST = pc.ScalarAggregateOptions(skip_nulls=False)
#: The last counted record's timestamp: tombstones (null here) are skipped.
_SKIP = pc.ScalarAggregateOptions(skip_nulls=True)
#: Partial counts are folded together once this many rows piled up (memory ~ keys, not records).
_FOLD_ROWS = 1_000_000


class _Counter:
    """A split's records as partial counts per key (the columns of :data:`_Group`); records
    without a key are one group too (the partition's last record may be one)."""

    def __init__(self) -> None:
        self.records = 0
        self._parts: list[pa.Table] = []
        self._rows = 0

    def add(self, msgs: list[Any]) -> None:
        n = len(msgs)
        self.records += n
        pairs = np.fromiter(chain.from_iterable(map(_TIMESTAMP, msgs)), np.int64, 2 * n).reshape(n, 2)
        missing = pairs[:, 0] == 0  # TIMESTAMP_NOT_AVAILABLE
        tombstone = np.fromiter((m.value() is None for m in msgs), np.bool_, n)
        offsets = np.fromiter(map(_OFFSET, msgs), np.int64, n)
        stamps = pairs[:, 1]
        batch = pa.table(
            {
                "key": pa.array(list(map(_KEY, msgs)), pa.binary()),
                "offset": pa.array(offsets),
                "ts": pa.array(stamps, pa.int64(), mask=missing if missing.any() else None),
                "counted": pa.array(offsets, pa.int64(), mask=tombstone if tombstone.any() else None),
                # a counted record's timestamp; a missing one reads as -1 (None on the handler path)
                "counted_ts": pa.array(
                    np.where(missing, -1, stamps), pa.int64(), mask=tombstone if tombstone.any() else None
                ),
            }
        )
        counted = batch.group_by("key", use_threads=False).aggregate(
            [
                ("counted", "count"),
                ("offset", "count"),
                ("counted", "max"),
                ("counted_ts", "last", _SKIP),
                ("offset", "max"),
                ("ts", "last", _LAST),
                ("ts", "max"),
            ]
        )
        self._parts.append(
            counted.select(
                [
                    "key",
                    "counted_count",
                    "offset_count",
                    "counted_max",
                    "counted_ts_last",
                    "offset_max",
                    "ts_last",
                    "ts_max",
                ]
            ).rename_columns(_COUNT_COLUMNS)
        )
        self._rows += counted.num_rows
        if self._rows >= _FOLD_ROWS and len(self._parts) > 1:
            self._parts = [_merge_counts(self._parts)]
            self._rows = self._parts[0].num_rows

    def result(self) -> pa.Table:
        if not self._parts:
            return pa.table({c: pa.array([], t) for c, t in zip(_COUNT_COLUMNS, _COUNT_TYPES, strict=True)})
        return _merge_counts(self._parts) if len(self._parts) > 1 else self._parts[0]


_COUNT_COLUMNS = ["key", "n", "records", "offset", "ts", "last_offset", "last_ts", "latest"]
_COUNT_TYPES = [pa.binary(), *[pa.int64()] * 7]


def _merge_counts(parts: list[pa.Table]) -> pa.Table:
    """Partial counts in offset order merged: counts add, the later part's last record wins."""
    merged = (
        pa.concat_tables(parts)
        .group_by("key", use_threads=False)
        .aggregate(
            [
                ("n", "sum"),
                ("records", "sum"),
                ("offset", "max"),
                ("ts", "last", _SKIP),  # a part without a counted record has none
                ("last_offset", "max"),
                ("last_ts", "last", _LAST),
                ("latest", "max"),
            ]
        )
    )
    return merged.select(
        [
            "key",
            "n_sum",
            "records_sum",
            "offset_max",
            "ts_last",
            "last_offset_max",
            "last_ts_last",
            "latest_max",
        ]
    ).rename_columns(_COUNT_COLUMNS)


def _groups_of(counts: pa.Table) -> list[_Group]:
    return list(zip(*(counts.column(c).to_pylist() for c in _COUNT_COLUMNS), strict=True))


def _counted(done: PartitionCount, seconds: float, records: int | None = None) -> PartitionCount:
    """*done* with the reading tasks' seconds (and records, for a partition read in pieces)."""
    spent = dict(done.seconds)
    spent["process"] = spent.get("process", 0.0) + seconds
    return replace(done, seconds=spent, records=done.records if records is None else records)


# Shared with the driver's handler path, which imports them from here (this module never imports it).


class JobProgress:
    """While the job runs, a daemon thread reports the accumulators every half second."""

    def __init__(self, progress: Progress | None, records: Any, tasks: Any, total: int) -> None:
        self.progress, self.records, self.tasks, self.total = progress, records, tasks, total
        self.done = threading.Event()

    def _report(self) -> None:
        while not self.done.wait(PROGRESS_INTERVAL_SECONDS):
            assert self.progress is not None
            self.progress(int(self.records.value), int(self.tasks.value), self.total)

    def __enter__(self) -> None:
        if self.progress is not None:
            threading.Thread(target=self._report, name="statesnap-processor-progress", daemon=True).start()

    def __exit__(self, *exc: object) -> None:
        self.done.set()


def rows_per_store(rows: pa.Table, names: Iterable[str]) -> dict[str, int]:
    """Rows of each named store in a partition's data-file rows (a vectorized prefix test)."""
    keys = rows.column("key")
    out = {}
    for name in names:
        prefix = store_prefix(name)
        head = pc.binary_slice(keys, 0, len(prefix)) if len(keys) else keys
        out[name] = int(pc.sum(pc.equal(head, pa.scalar(prefix, pa.binary()))).as_py() or 0)
    return out
