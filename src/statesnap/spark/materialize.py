"""Continuous materialization of a topic into checkpoints with Structured Streaming.

Spark plans and checkpoints the offset ranges (the ``statesnap-kafka-ranges`` source); every
micro-batch, in ``foreachBatch``:

1. tasks read their partition's range with confluent-kafka, fold it into newest-row-per-key
   (tombstones kept) and write one ``delta`` file per partition, named by the batch id;
2. the driver appends the batch to the journal (:mod:`statesnap.spark.journal`), then returns;
3. when ``checkpoint_interval`` has passed: partitions whose deltas piled up are compacted into a
   new ``base`` by tasks, the manifest (previous files + pending deltas, offsets = the end of the
   last batch) is committed, journal entries it covers are deleted, then retention GC runs.

What the materializer reads is decided by *its own* offsets (checkpoint + journal), not Spark's:
a batch reads from where the materializer stands to the batch's end. A batch Spark re-runs after
a crash (same batch id) finds nothing left to read; a batch whose journal entry or files were
lost is read again by the next batch. Killed anywhere and restarted, the next checkpoint is
still exactly a full replay. One materializer per table at a time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from statesnap.blob import open_blob_store
from statesnap.checkpoint import (
    CheckpointManifest,
    CheckpointRepository,
    PartitionCheckpoint,
    RetentionPolicy,
    collect_garbage,
    datafile,
)
from statesnap.checkpoint.layout import valid_table_name
from statesnap.checkpoint.manifest import DataFile
from statesnap.checkpoint.selection import TopicState
from statesnap.durations import parse_duration
from statesnap.errors import ConfigError
from statesnap.kafka.admin import KafkaAdmin
from statesnap.spark.bootstrap import table_options, usable_previous
from statesnap.spark.changes import ChangeFolder, commit_files, write_data_file
from statesnap.spark.journal import BatchEntry, BatchJournal, BatchRange, pending_entries
from statesnap.spark.kafka_io import OffsetOracle, change_table, iter_range
from statesnap.spark.options import offsets_json, source_options
from statesnap.spark.source import RANGES_SOURCE_NAME

log = logging.getLogger(__name__)

#: Called with (stage, batch id or generation): "deltas", "journaled", "checkpointed". Raising
#: from it aborts the batch at that point, which is how the crash tests inject failures.
Observer = Callable[[str, int], None]


class StreamMaterializer:
    """A running materialization: the streaming query plus the state between checkpoints."""

    def __init__(
        self,
        spark: Any,
        *,
        bootstrap_servers: str,
        topic: str,
        table: str,
        checkpoints: str,
        checkpoint_location: str,
        storage_options: Mapping[str, Any] | None,
        kafka_config: Mapping[str, Any] | None,
        checkpoint_interval: timedelta,
        retention: RetentionPolicy,
        compact_after: int,
        observer: Observer | None,
        timeout: float = 15.0,
    ) -> None:
        if not valid_table_name(table):
            raise ConfigError(f"invalid table name {table!r}: use letters, digits, '.', '_', '-'")
        if checkpoint_interval >= retention.orphan_grace:
            raise ConfigError(
                f"checkpoint_interval ({checkpoint_interval}) must be shorter than the retention "
                f"orphan_grace ({retention.orphan_grace}): GC could delete deltas still pending"
            )
        if compact_after < 1:
            raise ConfigError(f"compact_after must be >= 1, got {compact_after}")
        self.spark = spark
        self.topic = topic
        self.table = table
        self.checkpoint_interval = checkpoint_interval
        self.retention = retention
        self.compact_after = compact_after
        self.observer = observer
        self.opts = table_options(bootstrap_servers, topic, kafka_config, timeout)
        admin = KafkaAdmin(self.opts.settings())
        self.cluster_id = admin.cluster_id()
        info = admin.describe_topic(topic)
        self.partitions = set(info.partitions)
        store = open_blob_store(checkpoints, **dict(storage_options or {}))
        store.check(writable=True)
        self.repo = CheckpointRepository.for_table(store, self.cluster_id, table)
        self.journal = BatchJournal(self.repo, checkpoint_location)
        oracle = OffsetOracle(self.opts)
        try:
            earliest = oracle.earliest(info.partitions)
        finally:
            oracle.close()
        state = TopicState(
            topic, self.cluster_id, info.partitions, earliest, info.compacted, info.delete_retention_ms
        )
        self.base = usable_previous(self.repo, table, state)
        self.last_checkpoint = self.base
        self._earliest = earliest
        #: Journaled batches the next checkpoint will include, oldest first.
        self.pending: list[BatchEntry] = []
        #: Next offset per partition: everything below is in the base or a pending delta.
        self.offsets: dict[int, int] = {}
        self._adopt(self.journal.entries())
        self.generation = self.repo.next_generation()
        self._lock = threading.RLock()
        self._last_checkpoint_at = time.monotonic()
        self._stats = {"tasks": 0, "records": 0}
        self.query: Any = None
        log.info(
            "materializer %s: resuming at %s with %d pending batches",
            self.repo.url,
            self.offsets,
            len(self.pending),
        )

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
    ) -> None:
        from statesnap.spark import register

        if self.pending:  # batches a previous run journaled: make them a checkpoint right away,
            self.checkpoint()  # so they are referenced before any GC could take them for orphans
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
        self.query = writer.start()

    def _on_batch(self, df: Any, batch_id: int) -> None:
        planned: dict[int, int] = {}
        for row in df.collect():
            planned[int(row["partition"])] = max(planned.get(int(row["partition"]), 0), int(row["end"]))
        with self._lock:
            self._apply_batch(batch_id, planned)
            if time.monotonic() - self._last_checkpoint_at >= self.checkpoint_interval.total_seconds():
                self._checkpoint()

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
        opts, repo, gen = self.opts, self.repo, self.generation

        def write_delta(item: tuple[int, tuple[int, int]]) -> tuple[int, int, int, Any, int]:
            p, (start, end) = item
            folder = ChangeFolder(keep_tombstones=True)
            count = 0
            for msgs in iter_range(opts, p, start, end):
                count += len(msgs)
                folder.add(change_table(msgs))
            rows = folder.result()
            written = write_data_file(repo, gen, p, "delta", batch_id, rows) if rows.num_rows else None
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
        self._stats["records"] += sum(r[4] for r in results)

    # --- checkpoints ---------------------------------------------------------------------------

    def checkpoint(self) -> CheckpointManifest | None:
        """Commit a checkpoint of everything materialized so far (None if nothing is new)."""
        with self._lock:
            return self._checkpoint()

    def _checkpoint(self) -> CheckpointManifest | None:
        self._last_checkpoint_at = time.monotonic()
        started = time.monotonic()
        self._adopt(self.pending)  # a delta file deleted meanwhile drops its batch (read again later)
        base_offsets = self.base.offsets if self.base is not None else {}
        if self.base is not None and all(self.offsets.get(p) == base_offsets.get(p) for p in self.partitions):
            return None
        files: dict[int, tuple[DataFile, ...]] = {}
        for p in sorted(self.partitions):
            known = self.base.partitions.get(p) if self.base is not None else None
            deltas = [e.partitions[p].file for e in self.pending if p in e.partitions]
            files[p] = (*(known.files if known else ()), *(f for f in deltas if f is not None))
        compacted = self._compact({p: fs for p, fs in files.items() if self._needs_compaction(fs)})
        files.update(compacted)
        old = {f.path for f in self.base.files} if self.base is not None else set()
        new_files = [f for fs in files.values() for f in fs if f.path not in old]
        last_batch = self.pending[-1].batch_id if self.pending else None
        manifest = commit_files(
            self.repo,
            table=self.table,
            topic=self.topic,
            cluster_id=self.cluster_id,
            generation=self.generation,
            partitions={p: PartitionCheckpoint(p, self.offsets.get(p, 0), fs) for p, fs in files.items()},
            extra={
                "mode": "stream",
                "base_generation": self.base.generation if self.base is not None else None,
                "tasks": self._stats["tasks"] + len(compacted),
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
        self._notify("checkpointed", manifest.generation)
        done = [e.batch_id for e in self.pending]
        self.base = self.last_checkpoint = manifest
        self.pending = []
        self.generation = manifest.generation + 1
        self._stats = {"tasks": 0, "records": 0}
        self.journal.delete(done)
        collect_garbage(self.repo, self.retention)
        log.info("materializer %s: committed generation %d", self.repo.url, manifest.generation)
        return manifest

    def _needs_compaction(self, files: tuple[DataFile, ...]) -> bool:
        deltas = [f for f in files if f.kind == "delta"]
        base_bytes = sum(f.bytes for f in files if f.kind == "base")
        return len(deltas) > self.compact_after or (
            bool(deltas) and sum(f.bytes for f in deltas) > max(base_bytes, 1 << 20)
        )

    def _compact(self, work: Mapping[int, tuple[DataFile, ...]]) -> dict[int, tuple[DataFile, ...]]:
        """Merge base + deltas into one new base per partition, in tasks."""
        if not work:
            return {}
        repo, gen = self.repo, self.generation

        def compact(item: tuple[int, tuple[DataFile, ...]]) -> tuple[int, dict[str, Any]]:
            p, fs = item
            rows = datafile.merge([repo.read_file(f) for f in fs])
            return p, write_data_file(repo, gen, p, "base", 0, rows).to_json()

        items = sorted(work.items())
        out = self.spark.sparkContext.parallelize(items, len(items)).map(compact).collect()
        return {p: (DataFile.from_json(meta),) for p, meta in out}

    def stop(self, *, checkpoint: bool = True) -> CheckpointManifest | None:
        """Stop the query; with *checkpoint*, commit what the finished batches materialized."""
        if self.query is not None:
            self.query.stop()
        return self.checkpoint() if checkpoint else None


def materialize_stream(
    spark: Any,
    *,
    bootstrap_servers: str,
    topic: str,
    table: str,
    checkpoints: str,
    checkpoint_location: str,
    storage_options: Mapping[str, Any] | None = None,
    kafka_config: Mapping[str, Any] | None = None,
    checkpoint_interval: str | float | timedelta = "5m",
    trigger_interval: str | float | timedelta = "10s",
    available_now: bool = False,
    max_offsets_per_trigger: int | None = None,
    retention: RetentionPolicy | None = None,
    compact_after: int = 8,
    query_name: str | None = None,
    observer: Observer | None = None,
    timeout: float = 15.0,
) -> StreamMaterializer:
    """Start materializing *topic* into checkpoints of *table*; returns the running handle.

    ``checkpoint_location`` is the Spark streaming checkpoint (restart with the same one to
    resume). A checkpoint is committed at the end of the first micro-batch after
    ``checkpoint_interval``; partitions with more than ``compact_after`` delta files (or more
    delta than base bytes) get a new base. ``available_now`` processes what exists and stops.
    Stop with :meth:`StreamMaterializer.stop` (which commits a final checkpoint). ``observer``
    sees each step of a batch; ``timeout`` bounds waits for the cluster's metadata.
    """
    materializer = StreamMaterializer(
        spark,
        bootstrap_servers=bootstrap_servers,
        topic=topic,
        table=table,
        checkpoints=checkpoints,
        checkpoint_location=checkpoint_location,
        storage_options=storage_options,
        kafka_config=kafka_config,
        checkpoint_interval=parse_duration(checkpoint_interval),
        retention=retention or RetentionPolicy(),
        compact_after=compact_after,
        observer=observer,
        timeout=timeout,
    )
    if available_now:
        trigger: dict[str, Any] = {"availableNow": True}
    else:
        seconds = parse_duration(trigger_interval).total_seconds()
        trigger = {"processingTime": f"{seconds:g} seconds"}
    materializer.start(
        checkpoint_location, trigger, max_offsets_per_trigger=max_offsets_per_trigger, query_name=query_name
    )
    return materializer
