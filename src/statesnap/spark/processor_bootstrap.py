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

Several co-partitioned inputs: a task reads partition p of every input (the first from the
checkpoint's offset, the others from the offsets its rows hold) and hands the handler their records
merged as a Python task merges them once every input is at its end (:mod:`statesnap.processor.merge`),
so either engine may continue the other's checkpoint. A count by key is the first input's only.

A task holds its partition's state in a dict store (executor memory must hold one partition's
stores); the processor's ``store=`` kind is what Python restores into. Every input partition is
bootstrapped, whatever ``partitions=`` or ``group=`` the processor was built with, as the table
bootstrap covers every partition of its topic.

A count (:class:`CountPerKey`, what ``proc.count(store)`` declares) may be folded by key instead
of record by record, by the routes of :mod:`statesnap.spark.processor_counts`; the driver here
plans, checks the claim, takes the generation and commits for them as for the handler path.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from statesnap.checkpoint import CheckpointManifest, PartitionCheckpoint
from statesnap.checkpoint.manifest import DataFile
from statesnap.errors import ConfigError, HandlerError
from statesnap.kafka.admin import log_start_offsets
from statesnap.kafka.backlog import high_watermarks
from statesnap.kafka.config import KafkaSettings
from statesnap.processor import Processor
from statesnap.spark.bootstrap import Progress, completed
from statesnap.spark.processor_counts import (
    CountJob,
    CountPerKey,
    CountRule,
    JobProgress,
    check_count,
)
from statesnap.spark.processor_tasks import Done, Work, partition_task
from statesnap.spark.workers import is_local
from statesnap.spark.writer import SparkTableWriter
from statesnap.task.cluster import log_ends
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
class ProcessorBootstrapResult:
    """What one processor bootstrap did. ``manifest`` is the checkpoint it committed, or the
    previous one when nothing was appended (``written`` False). ``restore`` is this run's: the
    checkpoint it started from and the records it read after it. ``stores``: rows per store in the
    checkpoint (None when nothing was written and nothing counted). ``url`` is the checkpoint
    directory's absolute identity, ``shown`` the same under the location as the user gave it."""

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
    skipped: int = 0
    shown: str | None = None

    def __post_init__(self) -> None:
        if self.stores is not None:
            object.__setattr__(self, "stores", MappingProxyType(dict(self.stores)))

    def __repr__(self) -> str:
        """One short line: ``print(bootstrap_processor(...))`` showed the whole manifest (~3 KB)."""
        stores = dict(self.stores) if self.stores is not None else None
        return (
            f"ProcessorBootstrapResult(processor={self.processor!r}, checkpoint={self.manifest.generation}, "
            f"written={self.written}, path={self.path.value}, processed={self.processed:,}, "
            f"stores={stores!r}, seconds={self.seconds:.2f})"
        )

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
            "skipped": self.skipped,
            "stores": None if self.stores is None else dict(self.stores),
        }


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
    if len(proc.inputs) > 1 and aggregation is not None:
        raise ConfigError(
            f"processor {proc.name!r} has {len(proc.inputs)} inputs; a count by key folds one input's "
            "records: bootstrap it with its handler (aggregation=None)"
        )
    options = _options_of(proc)
    chosen = checkpoints if checkpoints is not None else options["checkpoints"]
    if chosen is None:
        raise ConfigError(
            f"processor {proc.name!r} has no checkpoint store: a Spark bootstrap writes a "
            "checkpoint (pass checkpoints=URL)"
        )
    ckpt = chosen if isinstance(chosen, CheckpointOptions) else CheckpointOptions(chosen)
    if emit and proc.processing.exactly_once:
        raise ConfigError(
            f"processor {proc.name!r} is exactly-once, and a Spark bootstrap's outputs are sent at "
            "least once (a retried task sends its partition's again): bootstrap with emit=False"
        )
    if aggregation is not None:
        check_count(proc, aggregation)
        if emit:
            raise ConfigError(
                f"processor {proc.name!r}: a Spark count by key folds counts, it sends no outputs; to "
                "emit the history's results bootstrap with its handler (aggregation=None, emit=True)"
            )
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
    writer.participant.state_versions = {proc.name: proc.state.version}
    previous = writer.previous
    if previous is not None and previous.state_version(proc.name) != proc.state.version:
        writer.close()
        raise ConfigError(
            f"processor {proc.name!r} is state version {proc.state.version} and checkpoint generation "
            f"{previous.generation} holds version {previous.state_version(proc.name)}; a Spark bootstrap "
            "does not migrate (yet): restore it once in Python (proc.run(follow=False)), then bootstrap"
        )
    try:
        return _Run(spark, proc, writer, emit, progress, started, min_partitions).run(aggregation)
    finally:
        writer.close()


def _options_of(proc: Processor) -> dict[str, Any]:
    """The connection and checkpoint settings *proc* was built with."""
    return {"name": proc.name, **proc.settings.table_options()}


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
        #: Per other input, its log start and end per partition (the end found by EOF).
        self.other_ends = {
            topic: other_input_ends(writer.opts.settings(), topic, writer.partitions)
            for topic in proc.inputs[1:]
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
            shown=self.repo.shown,
            **kw,
        )

    def run(self, aggregation: CountPerKey | None) -> ProcessorBootstrapResult:
        partitions, previous, participant = self.writer.partitions, self.previous, self.writer.participant
        path = BootstrapPath.HANDLER if aggregation is None else BootstrapPath.AGGREGATION
        if (
            previous is not None
            and not self.other_ends  # other inputs' starts are in the rows: the tasks judge them
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
            participant.still_builds_on(pending)  # raises where `previous` is gone meanwhile
            joined = completed(
                participant.submit(pending.generation, dict(previous.partitions), previous.offsets),
                pending.generation,
                self.repo.url,
                of="processor",
            )
            return self._result(
                joined, True, path, restore=restore, checkpoint_seconds=time.monotonic() - committing
            )

        run = secrets.randbits(48)  # names this run's files (see Work)
        work = [
            Work(
                p,
                self.starts[p],
                self.ends[p],
                self.prior[p].files if p in self.prior else (),
                run,
                tuple((topic, low[p], high[p]) for topic, (low, high) in self.other_ends.items()),
            )
            for p in partitions
        ]
        rule = None if aggregation is None else CountRule.of(self.proc, aggregation)
        if aggregation is not None:
            self.count_via = "dataframe" if aggregation.dataframe else "tasks"
        if rule is not None:  # before a generation is taken: a refused claim leaves nothing behind
            rule.check_claim(self.proc, self.writer.opts, work)
        generation = participant.begin().generation
        planned = time.monotonic()
        done: dict[int, Done]
        if rule is None:
            done = self._handler_job(work, generation)
        else:
            fold = [w for w in work if w.end > w.start]
            done = self._count_job(rule, aggregation is not None and aggregation.dataframe, fold, generation)
            done.update(self._handler_job([w for w in work if w.end <= w.start], generation))
        ran = time.monotonic()
        for d in done.values():
            if d.failed is not None:
                message, offset = d.failed
                raise HandlerError(message, topic=self.writer.topic, partition=d.partition, offset=offset)
        return self._commit(generation, path, done, planned, ran)

    def _commit(
        self, generation: int, path: BootstrapPath, done: Mapping[int, Done], planned: float, ran: float
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
        committed = completed(manifest, generation, self.repo.url, of="processor")
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
            skipped=sum(d.skipped for d in done.values()),
        )

    def _handler_job(self, work: list[Work], generation: int) -> dict[int, Done]:
        """One task per partition running the handler (see the module docstring)."""
        if not work:
            return {}
        sc = self.spark.sparkContext
        records_acc, tasks_acc = sc.accumulator(0), sc.accumulator(0)
        task = partition_task(self.proc, self.writer.opts, self.repo, generation, self.emit)

        def counted(w: Work) -> Done:
            d = task(w)
            records_acc.add(d.processed)
            tasks_acc.add(1)
            return d

        with JobProgress(self.progress, records_acc, tasks_acc, len(work)):
            out = sc.parallelize(work, len(work)).map(counted).collect()
        if self.progress is not None:
            self.progress(sum(d.processed for d in out), len(work), len(work))
        return {d.partition: d for d in out}

    def _count_job(
        self, rule: CountRule, dataframe: bool, work: list[Work], generation: int
    ) -> dict[int, Done]:
        """The count by key over *work*, in Python tasks or as a DataFrame ``groupBy``."""
        w = self.writer
        job = CountJob(
            self.spark, rule, w.opts, w.topic, self.repo, generation, self.progress, self.min_partitions
        )
        counted = job.in_dataframe(work) if dataframe else job.in_tasks(work)
        return {
            p: Done(p, (c.file,), c.rows, c.stores, c.records, seconds=c.seconds, skipped=c.skipped)
            for p, c in counted.items()
        }


def other_input_ends(
    settings: KafkaSettings, topic: str, partitions: tuple[int, ...]
) -> tuple[dict[int, int], dict[int, int]]:
    """Where another input starts and ends per partition: the end read to partition EOF, as the
    first input's is found (the dev broker under-reports watermarks)."""
    ends = log_ends(settings, topic, high_watermarks(settings, topic, partitions))
    return log_start_offsets(settings, topic, partitions), {p: int(end) for p, end in ends.items()}
