"""Run a processor over its input's history on Spark and commit the checkpoint Python resumes from.

The processor's twin of :mod:`statesnap.spark.bootstrap` (one system, two engines). Steps, in this
order (the manifest last, so a crash leaves only unreferenced files):

1. Driver: open the processor's table through the task core (cluster facts, the true end of every
   partition found by EOF, the newest usable checkpoint), join or start a snapshot.
2. Tasks, one per input partition, in parallel (a handler must see a partition's records in offset
   order, so partitions are never split): load the base checkpoint's rows of the partition into a
   local store, build the handler with :meth:`Processor.handler_for`, run it over the records from
   the checkpoint's offset (or the log start) up to the planned end, expire windows as a commit
   point does, and write the store's export as the partition's ``base`` file in the generation's
   data directory. The task returns the file to the driver, never the rows.
3. Driver: report every partition through the same participant and orchestrator a Python task
   commits through; a Python ``proc.run()`` then restores this checkpoint and processes the tail.

A bootstrap over history emits nothing by default (``emit=False``): outputs of those records were
produced when they were first processed, or belong to a backfill the caller runs on purpose
(``emit=True`` produces them, at least once: a retried Spark task sends its partition's outputs
again). Records a handler fails on go nowhere either way unless ``emit=True`` and the processor
has a dead-letter topic; without one the run stops with :class:`~statesnap.errors.HandlerError`.

A task holds its partition's state in a dict store (executor memory must hold one partition's
stores); the processor's ``store=`` kind is what Python restores into. Every input partition is
bootstrapped, whatever ``partitions=`` or ``group=`` the processor was built with, as the table
bootstrap covers every partition of its topic.

A count (:class:`CountPerKey`, what ``proc.count(store)`` declares) may be folded by key instead
of record by record: in Python tasks with Arrow's hash aggregation (partitions split over every
core, partial counts merged), or as ``groupBy(partition, key).count()`` over the
``statesnap-kafka`` source; either writes the handler path's rows in the processor's keyspace
(:mod:`statesnap.processor.keyspace`), byte for byte (``benchmarks/processor_spark.py`` measures
the three).

Longer than 500 lines: the count routes (``CountPerKey`` down to ``_merge_counts``) belong in a
module of their own, ``spark/processor_counts.py``; this change was limited to this file.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from itertools import chain
from types import MappingProxyType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Message

from statesnap.checkpoint import CheckpointManifest, CheckpointRepository, PartitionCheckpoint, datafile
from statesnap.checkpoint.manifest import DataFile
from statesnap.errors import CheckpointError, ConfigError, HandlerError
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
from statesnap.spark.workers import is_local
from statesnap.spark.writer import SparkTableWriter
from statesnap.stores import MemoryStore
from statesnap.task.options import CheckpointOptions
from statesnap.task.restore import RestoreReport

__all__ = [
    "BootstrapPath",
    "CountPerKey",
    "ProcessorBootstrapResult",
    "bootstrap_processor",
]

log = logging.getLogger(__name__)

#: Whole-task figures a task reports: seconds spent loading the base rows, processing, writing.
_PHASES = ("load", "process", "write")


class BootstrapPath(StrEnum):
    """How the history was folded: the processor's handler, or a Spark aggregation by key."""

    HANDLER = "handler"
    AGGREGATION = "aggregation"


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


@dataclass(frozen=True, slots=True)
class ProcessorBootstrapResult:
    """What one processor bootstrap did. ``manifest`` is the checkpoint it committed, or the
    previous one when nothing was appended (``written`` False). ``restore`` is this run's: the
    checkpoint it started from and the records it read after it. ``stores``: rows per store in the
    checkpoint (None when nothing was written and nothing counted)."""

    processor: str
    topic: str
    url: str
    manifest: CheckpointManifest
    written: bool
    path: BootstrapPath
    restore: RestoreReport
    checkpoint_seconds: float
    seconds: float
    processed: int = 0
    dead_lettered: int = 0
    emitted: int = 0
    stores: Mapping[str, int] | None = None

    def __post_init__(self) -> None:
        if self.stores is not None:
            object.__setattr__(self, "stores", MappingProxyType(dict(self.stores)))

    @property
    def keys(self) -> int:
        """Rows of the checkpoint (every store, as a table's key count counts its rows)."""
        return sum(pc.keys or 0 for pc in self.manifest.partitions.values())

    def to_json(self) -> dict[str, Any]:
        """The keys ``materialize --json`` prints, plus what is the processor's own."""
        return {
            "table": self.processor,
            "topic": self.topic,
            "engine": "spark",
            "checkpoint": self.manifest.generation,
            "written": self.written,
            "keys": self.keys,
            "offsets": dict(self.manifest.offsets),
            "restore": {
                "checkpoint": self.restore.checkpoint,
                "replayed_records": self.restore.replayed_records,
                "restore_seconds": round(self.restore.restore_seconds, 3),
            },
            "checkpoint_seconds": round(self.checkpoint_seconds, 3),
            "seconds": round(self.seconds, 3),
            "bytes": self.manifest.total_bytes,
            "url": self.url,
            "engine_reason": f"Spark bootstrap of the processor's history ({self.path.value} path)",
            "path": self.path.value,
            "processed": self.processed,
            "emitted": self.emitted,
            "dead_lettered": self.dead_lettered,
            "stores": None if self.stores is None else dict(self.stores),
        }


@dataclass(frozen=True, slots=True)
class _Work:
    """One partition's task: records ``[start, end)`` on top of the base checkpoint's files.

    Its file is ``p<partition>-base-<run>``, *run* drawn once per run: a retried Spark task finds
    its own file and reuses it (same run, same rows), while a later run that joins the same
    generation — the snapshot a failed run began is still open — writes its own instead of
    reusing rows another plan (other offsets, a fixed handler) computed."""

    partition: int
    start: int
    end: int
    previous: tuple[DataFile, ...]
    run: int = 0


@dataclass(frozen=True, slots=True)
class _Done:
    """What a task returns to the driver (its file as JSON, never rows)."""

    partition: int
    files: tuple[dict[str, Any], ...]
    rows: int
    stores: dict[str, int]
    processed: int = 0
    dead_lettered: int = 0
    emitted: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    #: A handler failed without a dead-letter topic: (message, offset).
    failed: tuple[str, int] | None = None


def bootstrap_processor(
    spark: Any,
    proc: Processor,
    *,
    checkpoints: str | CheckpointOptions | None = None,
    bootstrap_servers: str | None = None,
    kafka_config: Mapping[str, Any] | None = None,
    timeout: float | None = None,
    aggregation: CountPerKey | None = None,
    emit: bool = False,
    min_partitions: int | None = None,
    progress: Progress | None = None,
) -> ProcessorBootstrapResult:
    """Run *proc* over its input's history on Spark and commit one checkpoint of every store.

    One Spark task per input partition runs the handler over the partition's records in offset
    order, from the newest usable checkpoint's offsets (its rows loaded first) or the log start,
    to the end found at plan time; the driver commits through the snapshot participant a Python
    task uses, so ``proc.run()`` resumes from the result. Emits nothing unless *emit* (see the
    module docstring). *aggregation* runs a declared count by key instead; its Python tasks
    split partitions so every core works (``min_partitions``: at least that many tasks, splitting
    down to single records; default the cluster's parallelism, in pieces of 200k records or more).
    The connection, checkpoint store and timeout default to what *proc* was built with; given
    here, they override it. *progress* hears ``(records, tasks done, tasks)`` while the job runs.
    """
    started = time.monotonic()
    options = _options_of(proc)
    chosen = checkpoints if checkpoints is not None else options["checkpoints"]
    if chosen is None:
        raise ConfigError(
            f"processor {proc.name!r} has no checkpoint store: a Spark bootstrap writes a "
            "checkpoint (pass checkpoints=URL)"
        )
    ckpt = chosen if isinstance(chosen, CheckpointOptions) else CheckpointOptions(chosen)
    if emit and proc.exactly_once:
        raise ConfigError(
            f"processor {proc.name!r} is exactly-once, and a Spark bootstrap's outputs are sent at "
            "least once (a retried task sends its partition's again): bootstrap with emit=False"
        )
    if aggregation is not None:
        _check_aggregation(proc, aggregation)
    writer = SparkTableWriter.open(
        bootstrap_servers=bootstrap_servers or options["bootstrap_servers"],
        topic=proc.inputs[0],
        table=proc.name,
        checkpoints=ckpt,
        kafka_config=kafka_config if kafka_config is not None else options["kafka_config"],
        task_id=ckpt.snapshots.task_id or "spark-bootstrap",
        timeout=timeout if timeout is not None else options["timeout"],
        remote_executors=not is_local(spark),
    )
    writer.participant.describes = proc.describe()
    try:
        return _Run(spark, proc, writer, emit, progress, started, min_partitions).run(aggregation)
    finally:
        writer.close()


def _options_of(proc: Processor) -> dict[str, Any]:
    """The connection and checkpoint settings *proc* was built with."""
    return {"name": proc.name, **proc.settings.table_options()}


def _check_aggregation(proc: Processor, aggregation: CountPerKey) -> None:
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


class _Run:
    """One bootstrap: the plan, the Spark job of either path, the commit."""

    def __init__(
        self,
        spark: Any,
        proc: Processor,
        writer: SparkTableWriter,
        emit: bool,
        progress: Progress | None,
        started: float,
        min_partitions: int | None = None,
    ) -> None:
        self.min_partitions = min_partitions
        self.spark = spark
        self.proc = proc
        self.writer = writer
        self.emit = emit
        self.progress = progress
        self.started = started
        self.count_via: str | None = None
        self.repo = writer.repo
        self.previous = writer.previous
        assert writer.state.log_end is not None
        self.ends = dict(writer.state.log_end)
        self.prior = dict(self.previous.partitions) if self.previous is not None else {}
        self.starts = {
            p: self.prior[p].next_offset if p in self.prior else writer.state.log_start[p]
            for p in writer.partitions
        }

    def _result(
        self, manifest: CheckpointManifest, written: bool, path: BootstrapPath, **kw: Any
    ) -> ProcessorBootstrapResult:
        return ProcessorBootstrapResult(
            self.proc.name,
            self.writer.topic,
            self.repo.url,
            manifest,
            written,
            path,
            seconds=time.monotonic() - self.started,
            **kw,
        )

    def run(self, aggregation: CountPerKey | None) -> ProcessorBootstrapResult:
        partitions, previous, participant = self.writer.partitions, self.previous, self.writer.participant
        path = BootstrapPath.HANDLER if aggregation is None else BootstrapPath.AGGREGATION
        if (
            previous is not None
            and all(self.starts[p] == self.ends[p] for p in partitions)
            and set(partitions) <= set(previous.partitions)
        ):
            restore = RestoreReport(
                checkpoint=previous.generation, load_seconds=time.monotonic() - self.started
            )
            pending = participant.pending(block=True)
            if pending is None:
                log.info("%s: nothing appended since generation %d", self.repo.url, previous.generation)
                return self._result(previous, False, path, restore=restore, checkpoint_seconds=0.0)
            committing = time.monotonic()
            joined = _completed(
                participant.submit(pending.generation, dict(previous.partitions), previous.offsets),
                pending.generation,
                self.repo.url,
            )
            return self._result(
                joined, True, path, restore=restore, checkpoint_seconds=time.monotonic() - committing
            )

        run = secrets.randbits(48)  # names this run's files (see _Work)
        work = [
            _Work(p, self.starts[p], self.ends[p], self.prior[p].files if p in self.prior else (), run)
            for p in partitions
        ]
        rule = None if aggregation is None else _CountRule.of(self.proc, aggregation)
        if aggregation is not None:
            self.count_via = "dataframe" if aggregation.dataframe else "tasks"
        if rule is not None:  # before a generation is taken: a refused claim leaves nothing behind
            rule.check_claim(self.proc, self.writer.opts, work)
        generation = participant.begin().generation
        planned = time.monotonic()
        done: dict[int, _Done]
        if rule is None:
            done = self._handler_job(work, generation)
        else:
            fold = [w for w in work if w.end > w.start]
            if aggregation is not None and aggregation.dataframe:
                done = self._dataframe_count_job(rule, fold, generation)
            else:
                done = self._task_count_job(rule, fold, generation)
            done.update(self._handler_job([w for w in work if w.end <= w.start], generation))
        ran = time.monotonic()
        for d in done.values():
            if d.failed is not None:
                message, offset = d.failed
                raise HandlerError(message, topic=self.writer.topic, partition=d.partition, offset=offset)
        return self._commit(generation, path, done, planned, ran)

    def _commit(
        self, generation: int, path: BootstrapPath, done: Mapping[int, _Done], planned: float, ran: float
    ) -> ProcessorBootstrapResult:
        files = {p: tuple(DataFile.from_json(f) for f in d.files) for p, d in done.items()}
        records = sum(d.processed for d in done.values())
        stores: dict[str, int] = {}
        for d in done.values():
            for name, n in d.stores.items():
                stores[name] = stores.get(name, 0) + n
        written = [
            f
            for p, d in done.items()
            for f in files[p]
            if p not in self.prior or self.prior[p].files != files[p]
        ]
        spent = {k: round(sum(d.seconds.get(k, 0.0) for d in done.values()), 3) for k in _PHASES}
        restore = RestoreReport(
            checkpoint=self.previous.generation if self.previous is not None else None,
            replayed_records=records,
            load_seconds=planned - self.started,
            replay_seconds=ran - planned,
        )
        committing = time.monotonic()
        manifest = self.writer.participant.submit(
            generation,
            {
                p: PartitionCheckpoint(p, self.ends[p], files[p], keys=done[p].rows if files[p] else 0)
                for p in self.writer.partitions
            },
            {p: self.ends[p] for p in self.writer.partitions},
            {
                "mode": "incremental" if self.previous is not None else "full",
                "base_generation": self.previous.generation if self.previous is not None else None,
                "path": path.value,
                **({"count_via": self.count_via} if self.count_via else {}),
                "spark_tasks": len(done),
                "files_written": len(written),
                "bytes_written": sum(f.bytes for f in written),
                "records_read": records,
                "duration_seconds": round(time.monotonic() - self.started, 3),
                "plan_seconds": round(planned - self.started, 3),
                "job_seconds": round(ran - planned, 3),
                "task_seconds": spent,
                "spark_version": self.spark.version,
            },
        )
        log.info(
            "bootstrapped processor %s (%s) generation %d: %d records by %d tasks in %.1fs",
            self.proc.name,
            path.value,
            generation,
            records,
            len(done),
            time.monotonic() - self.started,
        )
        committed = _completed(manifest, generation, self.repo.url)
        return self._result(
            committed,
            True,
            path,
            restore=restore,
            checkpoint_seconds=time.monotonic() - committing,
            processed=records,
            dead_lettered=sum(d.dead_lettered for d in done.values()),
            emitted=sum(d.emitted for d in done.values()),
            stores=stores,
        )

    def _handler_job(self, work: list[_Work], generation: int) -> dict[int, _Done]:
        """One task per partition running the handler (see the module docstring)."""
        if not work:
            return {}
        sc = self.spark.sparkContext
        records_acc, tasks_acc = sc.accumulator(0), sc.accumulator(0)
        task = _partition_task(self.proc, self.writer.opts, self.repo, generation, self.emit)

        def counted(w: _Work) -> _Done:
            d = task(w)
            records_acc.add(d.processed)
            tasks_acc.add(1)
            return d

        with _Reporting(self.progress, records_acc, tasks_acc, len(work)):
            out = sc.parallelize(work, len(work)).map(counted).collect()
        if self.progress is not None:
            self.progress(sum(d.processed for d in out), len(work), len(work))
        return {d.partition: d for d in out}

    def _task_count_job(self, rule: _CountRule, work: list[_Work], generation: int) -> dict[int, _Done]:
        """Counts per key in Python tasks (Arrow's hash aggregation per batch, partials folded as
        they pile up); a partition split over several tasks is merged in a second, small stage."""
        if not work:
            return {}
        sc = self.spark.sparkContext
        opts, repo = self.writer.opts, self.repo
        by_partition = {w.partition: w for w in work}
        pieces = split_ranges(
            {w.partition: (w.start, w.end) for w in work},
            min_partitions=self.min_partitions or sc.defaultParallelism,
            max_records=None,
            min_split=1 if self.min_partitions else MIN_SPLIT_RECORDS,
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

        def finish(group: tuple[int, Iterable[tuple[int, Any, int, float]]]) -> _Done:
            p, parts = group
            ordered = sorted(parts, key=lambda part: part[0])
            if len(ordered) == 1 and isinstance(ordered[0][1], _Done):
                return _counted(ordered[0][1], ordered[0][3])
            merged = _merge_counts([from_ipc(part[1]) for part in ordered])
            done = rule.fold(_groups_of(merged), by_partition[p], repo, generation)
            return _counted(done, sum(part[3] for part in ordered), sum(part[2] for part in ordered))

        stage = sc.parallelize(numbered, len(numbered)).map(count)
        if len(pieces) == len(by_partition):  # every partition in one task: no second stage
            stage = stage.map(lambda kv: finish((kv[0], [kv[1]])))
        else:
            stage = stage.groupByKey(min(len(by_partition), sc.defaultParallelism)).map(finish)
        with _Reporting(self.progress, records_acc, tasks_acc, len(pieces)):
            out: list[_Done] = stage.collect()
        if self.progress is not None:
            self.progress(sum(d.processed for d in out), len(pieces), len(pieces))
        return {d.partition: d for d in out}

    def _dataframe_count_job(self, rule: _CountRule, work: list[_Work], generation: int) -> dict[int, _Done]:
        """``groupBy(partition, key)`` over the ``statesnap-kafka`` source (ranges split over every
        core, the counting in the JVM); then one Python function per Kafka partition adds the
        groups to the base checkpoint's rows in the processor's keyspace and writes the file."""
        if not work:
            return {}
        from pyspark.sql import functions as sf

        opts, topic, repo = self.writer.opts, self.writer.topic, self.repo
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
        groups = (
            self.spark.read.format(SOURCE_NAME)
            .options(**options)
            .load()
            .groupBy("partition", "key")  # records without a key: one group, for the stream time
            .agg(
                sf.count(sf.lit(1)).alias("n"),
                sf.max("offset").alias("offset"),
                sf.max_by(sf.unix_millis("timestamp"), "offset").alias("timestamp"),
                sf.max(sf.unix_millis("timestamp")).alias("latest"),
            )
        )
        by_partition = {w.partition: w for w in work}

        def fold(rows: Iterable[Any]) -> Iterator[_Done]:
            grouped: dict[int, list[_Group]] = {}
            for partition, key, n, offset, ts, latest in rows:
                grouped.setdefault(partition, []).append(
                    (None if key is None else bytes(key), n, offset, ts, latest)
                )
            for p, found in grouped.items():
                yield rule.fold(found, by_partition[p], repo, generation)

        spread = min(len(work), sc.defaultParallelism)
        if self.progress is not None:
            self.progress(0, 0, len(work))
        # Rows, not mapInArrow: that needs pandas on every worker; one row per key is cheap next to
        # the records the JVM counted.
        folded: list[_Done] = groups.repartition(spread, "partition").rdd.mapPartitions(fold).collect()
        out = {d.partition: d for d in folded}
        if self.progress is not None:
            self.progress(sum(d.processed for d in out.values()), len(work), len(work))
        return out


class _Reporting:
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


def _partition_task(
    proc: Processor, opts: KafkaSourceOptions, repo: CheckpointRepository, generation: int, emit: bool
) -> Callable[[_Work], _Done]:
    """The function a Spark task runs for one partition (a closure: it pickles with *proc*)."""
    names = [*proc.stores, META_STORE]

    def run(w: _Work) -> _Done:
        clock = time.perf_counter
        mark = clock()
        p = w.partition
        rows = repo.merge_files(w.previous) if w.previous else datafile.empty_table()
        if w.end <= w.start:  # nothing new: the base checkpoint's files stand (or an empty base)
            if w.previous:
                return _Done(
                    p, tuple(f.to_json() for f in w.previous), rows.num_rows, rows_per_store(rows, names)
                )
            if w.end == 0:
                return _Done(p, (), 0, dict.fromkeys(names, 0))
            empty = write_data_file(repo, generation, p, "base", w.run, rows)
            return _Done(p, (empty.to_json(),), 0, dict.fromkeys(names, 0))
        store = MemoryStore()
        store.load(p, rows)
        store.forget_changes()  # no incremental checkpoint is taken of this store: keep no change set
        outputs = Outputs(opts.settings(), proc.key_serde, proc.value_serde)
        outputs.suppressed = not emit
        handler = proc.handler_for(store, outputs)
        seconds = {"load": clock() - mark}
        mark = clock()
        processed = 0
        try:
            for msgs in iter_range(opts, p, w.start, w.end):
                handler.apply(p, msgs, None)
                processed += len(msgs)
                store.forget_changes()
            handler.commit_point(checkpoint=True)  # nothing expired stays in the file, as at a Python commit
        except HandlerError as e:
            return _Done(p, (), 0, {}, processed, failed=(str(e), e.offset))
        finally:
            outputs.close()
        seconds["process"] = clock() - mark
        mark = clock()
        rows = store.export().get(p, datafile.empty_table())
        written = write_data_file(repo, generation, p, "base", w.run, rows)
        seconds["write"] = clock() - mark
        return _Done(
            p,
            (written.to_json(),),
            rows.num_rows,
            rows_per_store(rows, names),
            processed,
            handler.dead_lettered,
            outputs.emitted,
            seconds,
        )

    return run


#: One group of the Spark count: (key, records, last offset, its timestamp, largest timestamp).
_Group = tuple[bytes | None, int, int, int | None, int | None]


@dataclass(frozen=True, slots=True)
class _CountRule:
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
    def of(cls, proc: Processor, aggregation: CountPerKey) -> _CountRule:
        keys, values = proc.store_serdes(aggregation.store)
        return cls(aggregation.store, aggregation.sample, proc.key_serde, keys, values)

    def stored_key(self, prefix: bytes, raw: bytes) -> bytes:
        return prefix + self.keys.serialize(self.input_keys.deserialize(raw))

    def fold(self, groups: list[_Group], w: _Work, repo: CheckpointRepository, generation: int) -> _Done:
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
        records, latest = 0, -1
        last: tuple[int, int | None] = (-1, None)
        for raw, count, newest_offset, newest_ts, newest in groups:
            records += count
            latest = max(latest, -1 if newest is None else newest)
            if newest_offset > last[0]:
                last = (newest_offset, newest_ts)
            if raw is None:  # records without a key leave the count alone
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
        return _Done(
            p, (written.to_json(),), table.num_rows, rows_per_store(table, names), records, seconds=seconds
        )

    def check_claim(self, proc: Processor, opts: KafkaSourceOptions, work: list[_Work]) -> None:
        """Run the handler over the first records of the first partition with new records and
        compare its rows with the count's; :class:`ConfigError` when they differ."""
        w = next((w for w in work if w.end > w.start), None)
        if w is None or self.sample == 0:
            return
        end = min(w.end, w.start + self.sample)
        store = MemoryStore()
        outputs = Outputs(opts.settings(), proc.key_serde, proc.value_serde)
        outputs.suppressed = True
        handler = proc.handler_for(store, outputs)
        records = []
        for msgs in iter_range(opts, w.partition, w.start, end):
            handler.apply(w.partition, msgs, None)
            records += [(m.key(), m.offset()) for m in msgs]
        prefix = partition_prefix(self.store, w.partition)
        counts: dict[bytes, int] = {}
        for raw, _offset in records:
            if raw is not None:
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
#: Partial counts are folded together once this many rows piled up (memory ~ keys, not records).
_FOLD_ROWS = 1_000_000


class _Counter:
    """A split's records as partial counts per key (``key, n, offset, timestamp, latest``: the
    records, the last offset, its timestamp and the largest timestamp); records without a key
    are one group too (they move stream time)."""

    def __init__(self) -> None:
        self.records = 0
        self._parts: list[pa.Table] = []
        self._rows = 0

    def add(self, msgs: list[Any]) -> None:
        n = len(msgs)
        self.records += n
        pairs = np.fromiter(chain.from_iterable(map(_TIMESTAMP, msgs)), np.int64, 2 * n).reshape(n, 2)
        missing = pairs[:, 0] == 0  # TIMESTAMP_NOT_AVAILABLE
        batch = pa.table(
            {
                "key": pa.array(list(map(_KEY, msgs)), pa.binary()),
                "offset": pa.array(np.fromiter(map(_OFFSET, msgs), np.int64, n)),
                "ts": pa.array(pairs[:, 1], pa.int64(), mask=missing if missing.any() else None),
            }
        )
        counted = batch.group_by("key", use_threads=False).aggregate(
            [("offset", "count"), ("offset", "max"), ("ts", "last", _LAST), ("ts", "max")]
        )
        self._parts.append(
            counted.select(["key", "offset_count", "offset_max", "ts_last", "ts_max"]).rename_columns(
                _COUNT_COLUMNS
            )
        )
        self._rows += counted.num_rows
        if self._rows >= _FOLD_ROWS and len(self._parts) > 1:
            self._parts = [_merge_counts(self._parts)]
            self._rows = self._parts[0].num_rows

    def result(self) -> pa.Table:
        if not self._parts:
            return pa.table({c: pa.array([], t) for c, t in zip(_COUNT_COLUMNS, _COUNT_TYPES, strict=True)})
        return _merge_counts(self._parts) if len(self._parts) > 1 else self._parts[0]


_COUNT_COLUMNS = ["key", "n", "offset", "ts", "latest"]
_COUNT_TYPES = [pa.binary(), pa.int64(), pa.int64(), pa.int64(), pa.int64()]


def _merge_counts(parts: list[pa.Table]) -> pa.Table:
    """Partial counts in offset order merged: counts add, the later part's last record wins."""
    merged = (
        pa.concat_tables(parts)
        .group_by("key", use_threads=False)
        .aggregate([("n", "sum"), ("offset", "max"), ("ts", "last", _LAST), ("latest", "max")])
    )
    return merged.select(["key", "n_sum", "offset_max", "ts_last", "latest_max"]).rename_columns(
        _COUNT_COLUMNS
    )


def _groups_of(counts: pa.Table) -> list[_Group]:
    return list(zip(*(counts.column(c).to_pylist() for c in _COUNT_COLUMNS), strict=True))


def _counted(done: _Done, seconds: float, records: int | None = None) -> _Done:
    """*done* with the reading tasks' seconds (and records, for a partition read in pieces)."""
    spent = dict(done.seconds)
    spent["process"] = spent.get("process", 0.0) + seconds
    return replace(done, seconds=spent, processed=done.processed if records is None else records)


def _completed(manifest: CheckpointManifest | None, generation: int, url: str) -> CheckpointManifest:
    if manifest is None:
        raise CheckpointError(
            f"{url}: snapshot {generation} did not complete with the Spark writer's report: a newer "
            "generation fenced it, or other tasks own partitions of this processor"
        )
    return manifest
