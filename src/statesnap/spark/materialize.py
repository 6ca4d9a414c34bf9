"""Continuous materialization of a topic into checkpoints with Structured Streaming.

Spark plans and checkpoints the offset ranges (the ``statesnap-kafka-ranges`` source); every
micro-batch, in ``foreachBatch``:

1. tasks read their partition's range with confluent-kafka, fold it into newest-row-per-key
   (tombstones kept) and write one ``delta`` file per partition, named by the batch id;
2. the driver appends the batch to the journal (:mod:`statesnap.checkpoint.journal`), then returns.

The driver is one task of the table's snapshots (a
:class:`~statesnap.snapshot.participant.Participant`, like every writer). A timer on the driver —
not only the next batch — commits a checkpoint when the checkpoint interval has passed with
something new, and reports to any snapshot in progress (``statesnap snapshot create``) even when
the topic is quiet: partitions whose deltas piled up are compacted into a new ``base`` by tasks,
the participant reports every partition (previous files + pending deltas, offsets = the end of
the last batch), the orchestrator commits manifest and snapshot record, then retention GC runs
(it keeps files the journal references). Journal entries a manifest covers are deleted.

What the materializer reads is decided by *its own* offsets (checkpoint + journal), not Spark's:
a batch reads from where the materializer stands to the batch's end. A batch Spark re-runs after
a crash (same batch id) finds nothing left to read; a batch whose journal entry or files were
lost is read again by the next batch. Spark's streaming state that disagrees with statesnap's
(ahead of it, another topic incarnation, another cluster or store) is moved aside at start.
Killed anywhere and restarted, the next checkpoint is still exactly a full replay. One
materializer per table at a time.

Generations stay consecutive: delta files are written before any generation is reserved (a
checkpoint is committed only every checkpoint interval), so they go into the data directory
of the checkpoint they build on (the table's highest generation in use before the first one),
not into a directory of their own — a new directory number is a generation used, and the next
snapshot would skip it. A run numbers its files past every file already in that directory, so a
file left by a crashed or abandoned run is never mistaken for one of its own; a retried task of
the same batch finds its own file (same name, same range, same content). A number is still
skipped when a run reserves a generation and fails before committing it (a failed snapshot).

What a run did is in :attr:`StreamMaterializer.restore` (the checkpoint it resumed from, the
records it read until it reached the topic's end as found at start, and how long that took) —
a manifest's ``writer`` metadata describes the checkpoint, not the run.

Length: one class, the streaming materializer, whose journal adoption, batch application and
checkpointing share one lock and one set of offsets; split, they would reach into each other.
"""

from __future__ import annotations

import contextlib
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from statesnap.checkpoint import CheckpointManifest, PartitionCheckpoint, layout
from statesnap.checkpoint.compaction import needs_base
from statesnap.checkpoint.journal import BatchEntry, BatchJournal, BatchRange, pending_entries
from statesnap.checkpoint.manifest import DataFile
from statesnap.errors import CheckpointError, CheckpointHistoryLostError, ConfigError
from statesnap.failure_log import FailureLog
from statesnap.snapshot.model import Snapshot
from statesnap.spark.changes import ChangeFolder, write_data_file
from statesnap.spark.kafka_io import change_table, iter_range
from statesnap.spark.options import offsets_json, source_options
from statesnap.spark.query_state import reconcile_query_state
from statesnap.spark.registration import register
from statesnap.spark.source import RANGES_SOURCE_NAME
from statesnap.spark.workers import is_local
from statesnap.spark.writer import SparkTableWriter
from statesnap.task.migration import StateVersion, check_base
from statesnap.task.options import CheckpointOptions
from statesnap.task.restore import RestoreReport

__all__ = [
    "STREAM_CHECKPOINT_INTERVAL",
    "STREAM_TRIGGER_INTERVAL",
    "Observer",
    "StreamMaterializer",
    "materialize_stream",
    "stream_checkpoints",
]

log = logging.getLogger(__name__)

#: Called with (stage, batch id or generation): "deltas", "journaled", "checkpointed". Raising
#: from it aborts the batch at that point, which is how the crash tests inject failures.
Observer = Callable[[str, int], None]

#: The number at the end of a data file's name (``p00000-delta-<n>.parquet``).
_FILE_NUMBER_RE = re.compile(r"-(\d+)\.parquet$")


class StreamMaterializer:
    """A running materialization: the streaming query plus the state between checkpoints."""

    def __init__(
        self,
        spark: Any,
        *,
        bootstrap_servers: str,
        topic: str,
        table: str,
        checkpoints: CheckpointOptions,
        checkpoint_location: str,
        kafka_config: Mapping[str, Any] | None,
        compact_after: int,
        observer: Observer | None,
        timer_interval: float = 1.0,
        timeout: float = 15.0,
        state: StateVersion | None = None,
    ) -> None:
        if compact_after < 1:
            raise ConfigError(f"compact_after must be >= 1, got {compact_after}")
        opening = time.monotonic()
        self.spark = spark
        self.topic = topic
        self.table = table
        self.checkpoint_interval = checkpoints.interval
        self.compact_after = compact_after
        self.observer = observer
        self.timer_interval = timer_interval
        self.writer = SparkTableWriter.open(
            bootstrap_servers=bootstrap_servers,
            topic=topic,
            table=table,
            checkpoints=checkpoints,
            kafka_config=kafka_config,
            task_id=checkpoints.snapshots.task_id or "spark-stream",
            timeout=timeout,
            remote_executors=not is_local(spark),
        )
        self.participant = self.writer.participant
        state = state or StateVersion()
        try:
            check_base(state, self.writer.previous, table, engine="spark")
        except BaseException:
            self.writer.close()
            raise
        self.participant.state_versions = {table: state.version}
        self.repo = self.writer.repo
        self.opts = self.writer.opts
        self.cluster_id = self.writer.cluster_id
        self.partitions = set(self.writer.partitions)
        self.journal = BatchJournal(self.repo, checkpoint_location)
        self.base = self.writer.previous
        self._earliest = dict(self.writer.state.log_start)
        #: Journaled batches the next checkpoint will include, oldest first.
        self.pending: list[BatchEntry] = []
        #: Next offset per partition: everything below is in the base or a pending delta.
        self.offsets: dict[int, int] = {}
        self._adopt(self.journal.entries())
        #: Where this run's delta files go: a directory and the first free file number in it.
        self._delta_dir, self._delta_floor = self._delta_home()
        self._lock = threading.RLock()
        #: Notified when a batch leaves ``foreachBatch``: a clean stop lets one in flight finish.
        self._batch_done = threading.Condition()
        self._batch_running = False
        self._last_checkpoint_at = time.monotonic()
        self._stats = {"tasks": 0, "records": 0}
        #: This run's progress: records read and batches that read something.
        self.records_read = 0
        self.batches = 0
        #: What this run restored: the checkpoint it resumed from, then (once it reached the
        #: partitions' ends found at start, or at stop) the records it read to get there and how
        #: long that took after the checkpoint and journal were loaded.
        self.restore = RestoreReport(
            checkpoint=self.base.generation if self.base is not None else None,
            load_seconds=time.monotonic() - opening,
        )
        self.caught_up = False
        self._ends_at_start = dict(self.writer.state.log_end or {})
        self._loaded_at = time.monotonic()
        self._note_progress()
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None
        self.timer_error: BaseException | None = None
        self.query: Any = None
        #: Why the materializer stopped by itself (the query is then no longer active).
        self.failure: CheckpointHistoryLostError | None = None
        log.info(
            "materializer %s: resuming at %s with %d pending batches",
            self.repo.url,
            self.offsets,
            len(self.pending),
        )

    @property
    def last_checkpoint(self) -> CheckpointManifest | None:
        return self.base

    def _note_progress(self, *, stopping: bool = False) -> None:
        """Complete :attr:`restore` once every partition reached its end as found at start (or at
        *stopping*, with what was read so far)."""
        if self.caught_up:
            return
        ends = self._ends_at_start
        self.caught_up = all(self.offsets.get(p, 0) >= end for p, end in ends.items())
        if self.caught_up or stopping:
            self.restore.replayed_records = self.records_read
            self.restore.replay_seconds = time.monotonic() - self._loaded_at

    def _delta_home(self) -> tuple[int, int]:
        """The data directory this run's delta files go to and the first file number free in it:
        the newest generation it builds on (never a new number: see the module docstring)."""
        homes = [self.base.generation if self.base is not None else self.repo.next_generation() - 1]
        for entry in self.pending:
            homes += [layout.data_generation(r.file.path) or 0 for r in entry.partitions.values() if r.file]
        home = max(homes)
        prefix = self.repo.key(f"{layout.DATA_DIR}/{home:020d}/")
        taken = [
            int(m.group(1)) for b in self.repo.store.list(prefix) if (m := _FILE_NUMBER_RE.search(b.key))
        ]
        return home, max(taken, default=-1) + 1

    def _adopt(self, entries: list[BatchEntry]) -> None:
        """Keep the journaled batches that continue the base checkpoint with all their files
        present; derive the offsets from them. Dropped batches are simply read again."""
        dirs = {r.file.path.rsplit("/", 1)[0] for e in entries for r in e.partitions.values() if r.file}
        skip = len(self.repo.directory) + 1
        present = {b.key[skip:] for d in dirs for b in self.repo.store.list(self.repo.key(d) + "/")}
        self.pending, obsolete = pending_entries(entries, self.base, present)
        self.journal.delete([e.batch_id for e in obsolete])
        offsets = dict(self.base.offsets) if self.base is not None else {}
        for p, start in self._earliest.items():
            offsets.setdefault(p, start)
        for entry in self.pending:
            offsets.update({p: r.end for p, r in entry.partitions.items()})
        self.offsets = offsets

    # --- the streaming query -------------------------------------------------------------------

    def start(
        self,
        checkpoint_location: str,
        trigger: dict[str, Any],
        *,
        max_offsets_per_trigger: int | None,
        query_name: str | None,
        timer: bool = True,
    ) -> None:
        """Start the query (and, for a continuous one, the checkpoint timer)."""
        if self.pending:  # batches a previous run journaled: make them a checkpoint right away
            self.checkpoint(force=True)
        reconcile_query_state(
            checkpoint_location,
            topic=self.topic,
            offsets=self.offsets,
            identity={"table_url": self.repo.url, "cluster_id": self.cluster_id, "topic": self.topic},
        )
        register(self.spark)
        options = source_options(
            self.opts.bootstrap_servers,
            self.topic,
            self.opts.kafka_config,
            startingOffsets=offsets_json(self.topic, self.offsets),
            maxOffsetsPerTrigger=max_offsets_per_trigger,
        )
        stream = self.spark.readStream.format(RANGES_SOURCE_NAME).options(**options).load()
        writer = (
            stream.writeStream.foreachBatch(self._on_batch)
            .option("checkpointLocation", checkpoint_location)
            .trigger(**trigger)
        )
        if query_name:
            writer = writer.queryName(query_name)
        self.participant.start()
        self.query = writer.start()
        if timer:
            self._timer = threading.Thread(target=self._tick, name="statesnap-stream-timer", daemon=True)
            self._timer.start()

    def _tick(self) -> None:
        """Checkpoints on time even when no batch runs: a quiet topic, a snapshot in progress."""
        failures = FailureLog(log)  # a store down for an hour: a line a minute, not one a tick
        while not self._stop.wait(self.timer_interval):
            try:
                self.maybe_checkpoint()
            except CheckpointHistoryLostError as e:  # nothing to build on: stop, do not run blind
                self._fail(e)
                return
            except Exception as e:  # the query goes on; the next tick retries
                failures.failed(
                    "checkpoint",
                    "materializer %s: checkpoint failed; the query goes on and retries every %.3g s: %s",
                    self.repo.url,
                    self.timer_interval,
                    e,
                )
            else:
                failures.recovered("checkpoint", "materializer %s: checkpoints work again", self.repo.url)

    def _on_batch(self, df: Any, batch_id: int) -> None:
        with self._batch_done:
            self._batch_running = True
        try:
            planned: dict[int, int] = {}
            for row in df.collect():
                planned[int(row["partition"])] = max(planned.get(int(row["partition"]), 0), int(row["end"]))
            with self._lock:
                self._apply_batch(batch_id, planned)
                try:
                    self.maybe_checkpoint()
                except CheckpointHistoryLostError as e:
                    self.failure = e
                    raise
        finally:
            with self._batch_done:
                self._batch_running = False
                self._batch_done.notify_all()

    def _fail(self, error: CheckpointHistoryLostError) -> None:
        log.error("materializer %s: %s", self.repo.url, error)
        self.failure = error
        self._stop.set()
        if self.query is not None:
            with contextlib.suppress(Exception):
                self.query.stop()

    def _notify(self, stage: str, number: int) -> None:
        if self.observer is not None:
            self.observer(stage, number)

    def _apply_batch(self, batch_id: int, planned: Mapping[int, int]) -> None:
        # Read from where *we* stand, whatever range Spark planned: re-runs read nothing, gaps
        # (a lost journal entry) are filled.
        work = {
            p: (self.offsets.get(p, 0), end) for p, end in planned.items() if end > self.offsets.get(p, 0)
        }
        if not work:
            log.info("batch %d: nothing new (already materialized)", batch_id)
            return
        # Named past every file of earlier runs in the directory; a retried task finds its own.
        opts, repo, home, number = self.opts, self.repo, self._delta_dir, self._delta_floor + batch_id

        def write_delta(item: tuple[int, tuple[int, int]]) -> tuple[int, int, int, Any, int]:
            p, (start, end) = item
            folder = ChangeFolder(keep_tombstones=True)
            count = 0
            for msgs in iter_range(opts, p, start, end):
                count += len(msgs)
                folder.add(change_table(msgs))
            rows = folder.result()
            written = write_data_file(repo, home, p, "delta", number, rows) if rows.num_rows else None
            return p, start, end, written.to_json() if written else None, count

        items = sorted(work.items())
        sc = self.spark.sparkContext
        results = sc.parallelize(items, len(items)).map(write_delta).collect()
        self._notify("deltas", batch_id)
        entry = BatchEntry(
            batch_id,
            {
                p: BatchRange(start, end, DataFile.from_json(f) if f else None)
                for p, start, end, f, _n in results
            },
        )
        self.journal.write(entry)
        self._notify("journaled", batch_id)
        self.pending.append(entry)
        self.offsets.update({p: r.end for p, r in entry.partitions.items()})
        self.partitions.update(entry.partitions)
        self._stats["tasks"] += len(items)
        read = sum(r[4] for r in results)
        self._stats["records"] += read
        self.records_read += read
        self.batches += 1
        self._note_progress()

    # --- checkpoints ---------------------------------------------------------------------------

    def _changed(self) -> bool:
        base_offsets = self.base.offsets if self.base is not None else {}
        return any(self.offsets.get(p) != base_offsets.get(p) for p in self.partitions) and (
            self.base is not None
            or any(self.offsets.get(p, 0) > self._earliest.get(p, 0) for p in self.partitions)
        )

    def maybe_checkpoint(self) -> CheckpointManifest | None:
        """Report to a snapshot in progress, or checkpoint when the interval is due."""
        with self._lock:
            due = time.monotonic() - self._last_checkpoint_at >= self.checkpoint_interval.total_seconds()
            if self.participant.pending() is not None or (due and self._changed()):
                return self._checkpoint(force=False)
            return None

    def checkpoint(self, *, force: bool = True) -> CheckpointManifest | None:
        """Commit a checkpoint of everything materialized so far (None if nothing is new and no
        snapshot waits for this task)."""
        with self._lock:
            return self._checkpoint(force=force)

    def _checkpoint(self, *, force: bool) -> CheckpointManifest | None:
        self._last_checkpoint_at = time.monotonic()
        self._adopt(self.pending)  # a delta file deleted meanwhile drops its batch (read again later)
        target: Snapshot | None = self.participant.pending(block=True)
        if target is None:
            if not self._changed():
                return None
            target = self.participant.begin()
            if target.generation <= self.participant.reported:
                return None  # we already reported to it; other tasks have yet to
        if not self.participant.still_builds_on(target):  # raises: this state is those files
            return None
        started = time.monotonic()
        files: dict[int, tuple[DataFile, ...]] = {}
        for p in sorted(self.partitions):
            known = self.base.partitions.get(p) if self.base is not None else None
            deltas = [e.partitions[p].file for e in self.pending if p in e.partitions]
            files[p] = (*(known.files if known else ()), *(f for f in deltas if f is not None))
        # A new base where deltas piled up, and an empty one for a partition read past offset 0
        # without a row (every writer's first checkpoint of a partition holds a base file).
        compacted = self._compact(
            target.generation,
            {
                p: fs
                for p, fs in files.items()
                if needs_base(fs, self.compact_after) or (not fs and self.offsets.get(p, 0) > 0)
            },
        )
        partitions: dict[int, PartitionCheckpoint] = {}
        for p, fs in files.items():
            known = self.base.partitions.get(p) if self.base is not None else None
            if p in compacted:
                meta, count = compacted[p]
                partitions[p] = PartitionCheckpoint(p, self.offsets.get(p, 0), (meta,), count)
            else:
                unchanged = known is not None and known.files == fs
                keys = known.keys if unchanged and known is not None else (0 if not fs else None)
                partitions[p] = PartitionCheckpoint(p, self.offsets.get(p, 0), fs, keys)
        old = {f.path for f in self.base.files} if self.base is not None else set()
        new_files = [f for pc in partitions.values() for f in pc.files if f.path not in old]
        last_batch = self.pending[-1].batch_id if self.pending else None
        manifest = self.participant.submit(
            target.generation,
            partitions,
            {p: pc.next_offset for p, pc in partitions.items()},
            {
                "mode": "stream",
                "base_generation": self.base.generation if self.base is not None else None,
                "spark_tasks": self._stats["tasks"] + len(compacted),
                "batches": len(self.pending),
                "records_read": self._stats["records"],
                "files_written": len(new_files),
                "bytes_written": sum(f.bytes for f in new_files),
                "compacted_partitions": sorted(compacted),
                "duration_seconds": round(time.monotonic() - started, 3),
                "spark_journal": self.journal.id,
                "spark_batch_id": last_batch,
                "spark_version": self.spark.version,
            },
        )
        if manifest is None:
            if force and not self.participant.single:
                raise CheckpointError(f"{self.repo.shown}: snapshot {target.generation} did not complete")
            return None
        self._notify("checkpointed", manifest.generation)
        done = [e.batch_id for e in self.pending]
        self.base = manifest
        self.pending = []
        self._delta_dir, self._delta_floor = self._delta_home()
        self._stats = {"tasks": 0, "records": 0}
        self.journal.delete(done)
        log.info("materializer %s: committed generation %d", self.repo.url, manifest.generation)
        return manifest

    def _compact(
        self, generation: int, work: Mapping[int, tuple[DataFile, ...]]
    ) -> dict[int, tuple[DataFile, int]]:
        """Merge base + deltas into one new base per partition, in tasks, in *generation*."""
        if not work:
            return {}
        repo = self.repo
        run = secrets.randbits(48)  # a failed run's same-named file may hold other rows

        def compact(item: tuple[int, tuple[DataFile, ...]]) -> tuple[int, dict[str, Any], int]:
            p, fs = item
            rows = repo.merge_files(fs)
            return p, write_data_file(repo, generation, p, "base", run, rows).to_json(), rows.num_rows

        items = sorted(work.items())
        out = self.spark.sparkContext.parallelize(items, len(items)).map(compact).collect()
        return {p: (DataFile.from_json(meta), keys) for p, meta, keys in out}

    def stop(self, *, checkpoint: bool = True, drain_seconds: float = 0.0) -> CheckpointManifest | None:
        """Stop the query and the timer; with *checkpoint*, commit what the finished batches
        materialized. A batch in ``foreachBatch`` may finish first for up to *drain_seconds*
        (its records then make the final checkpoint; one interrupted is read again by the next
        run). The table's snapshot participation ends here."""
        self._stop.set()
        if self._timer is not None:
            self._timer.join()
        try:
            with self._batch_done:
                self._batch_done.wait_for(lambda: not self._batch_running, timeout=drain_seconds)
            if self.query is not None:
                self.query.stop()
            with self._lock:
                self._note_progress(stopping=True)
            return self.checkpoint(force=True) if checkpoint else None
        finally:
            self.writer.close()


#: What a plain URL means for a stream: a checkpoint every 5 minutes, a micro-batch every 10 s.
STREAM_CHECKPOINT_INTERVAL = timedelta(minutes=5)
STREAM_TRIGGER_INTERVAL = timedelta(seconds=10)


def stream_checkpoints(checkpoints: str | CheckpointOptions) -> CheckpointOptions:
    """*checkpoints* as a bundle: a URL gets the stream's intervals, a bundle stays as it is."""
    if isinstance(checkpoints, CheckpointOptions):
        return checkpoints
    return CheckpointOptions(
        checkpoints, interval=STREAM_CHECKPOINT_INTERVAL, commit_interval=STREAM_TRIGGER_INTERVAL
    )


def materialize_stream(
    spark: Any,
    *,
    bootstrap_servers: str,
    topic: str,
    table: str,
    checkpoints: str | CheckpointOptions,
    checkpoint_location: str,
    kafka_config: Mapping[str, Any] | None = None,
    available_now: bool = False,
    max_offsets_per_trigger: int | None = None,
    compact_after: int = 8,
    query_name: str | None = None,
    observer: Observer | None = None,
    timeout: float = 15.0,
    state: int | StateVersion = 1,
) -> StreamMaterializer:
    """Start materializing *topic* into checkpoints of *table*; returns the running handle.

    ``checkpoints``: the store, or :class:`CheckpointOptions` with its storage options, the
    checkpoint ``interval``, the micro-batch trigger (``commit_interval``: a batch is a commit
    point), retention, an exact generation to continue from and snapshot settings; a plain URL
    checkpoints every 5 minutes with a batch every 10 seconds.
    ``checkpoint_location`` is the Spark streaming checkpoint (restart with the same one to
    resume; state that disagrees with the checkpoint store is moved aside). A checkpoint is
    committed every interval when something new was materialized (checked at each batch and on
    a timer, so a quiet topic is checkpointed too); a snapshot created elsewhere (``statesnap
    snapshot create``) is reported to within about one trigger interval. Partitions with more
    than ``compact_after`` delta files (or more delta than base bytes) get a new base.
    ``available_now`` processes what exists and stops. Stop with
    :meth:`StreamMaterializer.stop` (which commits a final checkpoint). ``observer`` sees each
    step of a batch; ``timeout`` bounds waits for the cluster's metadata. ``state``: the
    version the checkpoints are written at (one of another version is refused: no migrations here).
    """
    options = stream_checkpoints(checkpoints)
    trigger_seconds = options.commit_every.total_seconds()  # a shorter checkpoint interval lowers it
    materializer = StreamMaterializer(
        spark,
        bootstrap_servers=bootstrap_servers,
        topic=topic,
        table=table,
        checkpoints=options,
        checkpoint_location=checkpoint_location,
        kafka_config=kafka_config,
        compact_after=compact_after,
        observer=observer,
        timer_interval=max(0.2, min(trigger_seconds, 1.0)),
        timeout=timeout,
        state=StateVersion.of(state),
    )
    if available_now:
        trigger: dict[str, Any] = {"availableNow": True}
    else:
        trigger = {"processingTime": f"{trigger_seconds:g} seconds"}
    materializer.start(
        checkpoint_location,
        trigger,
        max_offsets_per_trigger=max_offsets_per_trigger,
        query_name=query_name,
        timer=not available_now,
    )
    return materializer
