"""Bootstrap a checkpoint from a topic's history on Spark, in parallel over partitions.

Steps, in this order (the manifest last, so a crash leaves only unreferenced files):

1. Driver: cluster id, partitions, the true end of every partition (found by partition EOF), and
   the newest usable checkpoint of the table (the selection every reader uses), if any: each
   partition resumes at its offsets. It joins the snapshot in progress or starts one.
2. Tasks (one per offset range; big partitions are split so every core works): read the range
   with confluent-kafka and fold it into newest-row-per-key in Arrow. A partition read by one task
   merges the previous checkpoint's rows and writes its sorted ``base`` file itself; partitions
   split over several tasks are merged in a second, small stage that writes the file.
3. Driver: report every partition (next offset = the end its tasks reached) to the snapshot
   orchestrator, which commits the manifest and the snapshot record, then runs retention GC.

What the run did is a :class:`BootstrapResult` (:func:`run_bootstrap`): the checkpoint it
resumed from, the records it read and how long reading and committing took, measured by this
run. The tasks read, fold and write each partition's file in one pass, so the restore time
includes writing the data files; the checkpoint time is the commit (manifest, snapshot, GC).

The Kafka reading runs in Python tasks directly (the same code as the ``statesnap-kafka``
source) rather than through a DataFrame: the records never cross into the JVM and back.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from statesnap.checkpoint import (
    CheckpointManifest,
    CheckpointRepository,
    PartitionCheckpoint,
    datafile,
)
from statesnap.checkpoint.datafile import latest_per_key
from statesnap.checkpoint.manifest import DataFile
from statesnap.errors import CheckpointError
from statesnap.spark.changes import ChangeFolder, from_ipc, to_ipc, write_data_file
from statesnap.spark.kafka_io import change_table, iter_range, split_ranges
from statesnap.spark.options import KafkaSourceOptions
from statesnap.spark.workers import is_local
from statesnap.spark.writer import SparkTableWriter
from statesnap.task.migration import RowMigrator, StateVersion
from statesnap.task.options import CheckpointOptions
from statesnap.task.restore import RestoreReport

__all__ = [
    "MIN_SPLIT_RECORDS",
    "PROGRESS_INTERVAL_SECONDS",
    "BootstrapResult",
    "BootstrapSpec",
    "Progress",
    "bootstrap",
    "completed",
    "run_bootstrap",
]

log = logging.getLogger(__name__)

#: A partition is split over several tasks only in pieces of at least this many records.
MIN_SPLIT_RECORDS = 200_000

#: ``progress(records_read, tasks_done, tasks)`` while the job runs: counted as tasks finish.
Progress = Callable[[int, int, int], None]

#: How often a running job's progress is reported.
PROGRESS_INTERVAL_SECONDS = 0.5


@dataclass(frozen=True, slots=True)
class BootstrapResult:
    """What one bootstrap run did; ``manifest`` is the checkpoint it wrote, or the previous one
    when nothing was appended (``written`` False)."""

    manifest: CheckpointManifest
    written: bool
    restore: RestoreReport
    checkpoint_seconds: float

    def __repr__(self) -> str:
        """One short line, not the manifest's nested repr."""
        return (
            f"BootstrapResult(table={self.manifest.table!r}, checkpoint={self.manifest.generation}, "
            f"written={self.written}, keys={self.manifest.keys}, "
            f"checkpoint_seconds={self.checkpoint_seconds:.2f})"
        )


@dataclass(frozen=True, slots=True)
class _Split:
    partition: int
    index: int
    count: int
    start: int
    end: int
    previous: tuple[DataFile, ...]


@dataclass(frozen=True, slots=True)
class BootstrapSpec:
    """What one bootstrap run is asked to do (the keywords of :func:`bootstrap`, as one value).

    ``checkpoints``: the checkpoint store, or :class:`CheckpointOptions` with its storage
    options, retention (GC after the commit), an exact generation to continue from, whether a
    checkpoint is required, and how the run takes part in snapshots (``snapshots.task_id``
    defaults to ``spark-bootstrap``). ``min_partitions``: at least this many tasks (default: the
    cluster's default parallelism, splitting only ranges of more than 2 × 200k records; an
    explicit value splits down to single records). ``timeout``: how long an unreachable cluster
    is waited for. ``state``: the state version the checkpoints are written at; a checkpoint of
    an older version is migrated by ``state.migrations`` as the tasks read its rows (every
    partition then gets a new base file), or refused in one line without them.
    """

    bootstrap_servers: str
    topic: str
    table: str
    checkpoints: CheckpointOptions
    kafka_config: Mapping[str, Any] = field(default_factory=dict)
    min_partitions: int | None = None
    timeout: float = 15.0
    state: StateVersion = field(default_factory=StateVersion)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kafka_config", MappingProxyType(dict(self.kafka_config)))


def bootstrap(
    spark: Any,
    *,
    bootstrap_servers: str,
    topic: str,
    table: str,
    checkpoints: str | CheckpointOptions,
    kafka_config: Mapping[str, Any] | None = None,
    min_partitions: int | None = None,
    timeout: float = 15.0,
    state: int | StateVersion = 1,
) -> CheckpointManifest:
    """Write a checkpoint of *topic*'s table as of now, using the whole Spark cluster.

    The driver is one task of the table's snapshots: it joins the snapshot in progress (one
    ``statesnap snapshot create`` started) or starts one, and reports every partition, so the
    snapshot completes with its report, through the same orchestrator as every writer.
    With a usable checkpoint of *table* (or ``checkpoints.generation``) only the records after
    its offsets are read; without one, the whole history (or, with ``checkpoints.require``, a
    ``NoUsableCheckpointError``). Returns the committed manifest (the previous one if nothing
    was appended and no snapshot waits). *state*: the version the rows are written at, an int
    or a :class:`StateVersion` whose migrations bring an older checkpoint's rows up as the tasks
    read them. See :class:`BootstrapSpec` for the other settings.
    """
    spec = BootstrapSpec(
        bootstrap_servers,
        topic,
        table,
        checkpoints if isinstance(checkpoints, CheckpointOptions) else CheckpointOptions(checkpoints),
        kafka_config or {},
        min_partitions,
        timeout,
        StateVersion.of(state),
    )
    return run_bootstrap(spark, spec).manifest


def run_bootstrap(spark: Any, spec: BootstrapSpec, *, progress: Progress | None = None) -> BootstrapResult:
    """:func:`bootstrap` as *spec* says, returning what the run did; *progress* is called while
    the job runs."""
    started = time.monotonic()
    writer = SparkTableWriter.open(
        bootstrap_servers=spec.bootstrap_servers,
        topic=spec.topic,
        table=spec.table,
        checkpoints=spec.checkpoints,
        kafka_config=spec.kafka_config,
        task_id=spec.checkpoints.snapshots.task_id or "spark-bootstrap",
        timeout=spec.timeout,
        remote_executors=not is_local(spark),
    )
    try:
        migrator = None
        if writer.previous is not None:
            migrator = spec.state.migrator(
                writer.previous, spec.table, partitions=len(writer.partitions), partitioner="murmur2_random"
            )
        writer.participant.state_versions = {spec.table: spec.state.version}
        return _bootstrap(spark, writer, spec.min_partitions, started, progress, migrator)
    finally:
        writer.close()


def _bootstrap(
    spark: Any,
    writer: SparkTableWriter,
    min_partitions: int | None,
    started: float,
    progress: Progress | None,
    migrator: RowMigrator | None = None,
) -> BootstrapResult:
    """The run; with *migrator*, the previous checkpoint's rows are of an older state version:
    every partition is rewritten (migrated), even one with nothing new to read."""
    repo, previous, partitions = writer.repo, writer.previous, writer.partitions
    assert writer.state.log_end is not None
    ends = dict(writer.state.log_end)
    prior = previous.partitions if previous is not None else {}
    starts = {p: prior[p].next_offset if p in prior else writer.state.log_start[p] for p in partitions}
    participant = writer.participant
    if (
        previous is not None
        and migrator is None
        and all(starts[p] == ends[p] for p in partitions)
        and set(partitions) <= set(previous.partitions)
    ):
        restore = RestoreReport(checkpoint=previous.generation, load_seconds=time.monotonic() - started)
        pending = participant.pending(block=True)
        if pending is None:
            log.info("%s: nothing appended since generation %d", repo.url, previous.generation)
            return BootstrapResult(previous, False, restore, 0.0)
        committing = time.monotonic()
        participant.still_builds_on(pending)  # raises where `previous` is gone meanwhile
        done = participant.submit(pending.generation, dict(previous.partitions), previous.offsets)
        joined = completed(done, pending.generation, repo.url)
        return BootstrapResult(joined, True, restore, time.monotonic() - committing)

    snapshot = participant.begin()
    generation = snapshot.generation
    planned = time.monotonic()
    sc = spark.sparkContext
    target = min_partitions or sc.defaultParallelism
    splits = _plan(starts, ends, previous, target, min_split=1 if min_partitions else MIN_SPLIT_RECORDS)
    if migrator is not None:  # a partition with nothing new still has old-version rows to migrate
        planned_partitions = {s.partition for s in splits}
        splits += [
            _Split(p, 0, 1, starts[p], starts[p], prior[p].files)
            for p in partitions
            if p in prior and p not in planned_partitions
        ]
    results = _run(sc, splits, writer.opts, repo, generation, progress, migrator)
    ran = time.monotonic()

    files: dict[int, tuple[DataFile, ...]] = {}
    records = 0
    spent = {"read": 0.0, "fold": 0.0, "write": 0.0}
    for p, (meta, count, seconds) in results.items():
        files[p] = (DataFile.from_json(meta),)
        records += count
        spent = {k: spent[k] + seconds[k] for k in spent}
    for p in partitions:
        if p in files:
            continue
        if p in prior:  # nothing new: keep referencing what the previous checkpoint holds
            files[p] = prior[p].files
        elif ends[p] > 0:  # nothing left to read (retention took it all): an empty base, as every
            # writer's first checkpoint of a partition is one (a manifest with none is corrupt)
            files[p] = (
                write_data_file(repo, generation, p, "base", secrets.randbits(48), datafile.empty_table()),
            )
        else:
            files[p] = ()
    written = [f for p in results for f in files[p]]
    restore = RestoreReport(
        checkpoint=previous.generation if previous is not None else None,
        replayed_records=records,
        load_seconds=planned - started,
        replay_seconds=ran - planned,
    )
    committing = time.monotonic()
    manifest = participant.submit(
        generation,
        {p: PartitionCheckpoint(p, ends[p], files[p], keys=_keys(files[p])) for p in partitions},
        {p: ends[p] for p in partitions},
        {
            "mode": "incremental" if previous is not None else "full",
            **({"migrated_from": migrator.source} if migrator is not None else {}),
            "base_generation": previous.generation if previous is not None else None,
            "spark_tasks": len(splits),
            "files_written": len(written),
            "bytes_written": sum(f.bytes for f in written),
            "records_read": records,
            "duration_seconds": round(time.monotonic() - started, 3),
            "plan_seconds": round(planned - started, 3),
            "job_seconds": round(ran - planned, 3),
            "task_seconds": {k: round(v, 3) for k, v in spent.items()},
            "spark_version": spark.version,
        },
    )
    log.info(
        "bootstrapped %s generation %d: %d records read by %d tasks in %.1fs",
        repo.url,
        generation,
        records,
        len(splits),
        time.monotonic() - started,
    )
    committed = completed(manifest, generation, repo.url)
    return BootstrapResult(committed, True, restore, time.monotonic() - committing)


def _keys(files: tuple[DataFile, ...]) -> int | None:
    """A partition's key count when its files say it: one base file holds no tombstones."""
    if not files:
        return 0
    return files[0].rows if len(files) == 1 and files[0].kind == "base" else None


def completed(
    manifest: CheckpointManifest | None, generation: int, url: str, *, of: str = "table"
) -> CheckpointManifest:
    """The manifest a Spark writer's report completed, or why there is none (*of*: what the
    writer writes, a table or a processor)."""
    if manifest is None:
        raise CheckpointError(
            f"{url}: snapshot {generation} did not complete with the Spark writer's report: a newer "
            f"generation fenced it, or other tasks own partitions of this {of}"
        )
    return manifest


def _plan(
    starts: Mapping[int, int],
    ends: Mapping[int, int],
    previous: CheckpointManifest | None,
    target: int,
    *,
    min_split: int,
) -> list[_Split]:
    pieces = split_ranges(
        {p: (starts[p], ends[p]) for p in starts},
        min_partitions=target,
        max_records=None,
        min_split=min_split,
    )
    counts: dict[int, int] = {}
    for p, _s, _e in pieces:
        counts[p] = counts.get(p, 0) + 1
    splits, seen = [], dict.fromkeys(counts, 0)
    for p, s, e in pieces:
        known = previous.partitions.get(p) if previous is not None else None
        prior = known.files if known is not None and seen[p] == 0 else ()
        splits.append(_Split(p, seen[p], counts[p], s, e, prior))
        seen[p] += 1
    return splits


def _run(
    sc: Any,
    splits: list[_Split],
    opts: KafkaSourceOptions,
    repo: CheckpointRepository,
    generation: int,
    progress: Progress | None = None,
    migrator: RowMigrator | None = None,
) -> dict[int, tuple[dict[str, Any], int, dict[str, float]]]:
    """Both stages; per partition: the written file (as JSON), records read, task seconds spent
    reading (Kafka + Arrow conversion), folding and writing. *progress* hears the first stage's
    finished tasks (accumulators: a retried task may count twice, the figures are progress only)."""
    if not splits:
        return {}
    records_acc, tasks_acc = sc.accumulator(0), sc.accumulator(0)
    # Names this run's files: a retried task finds its own file (same range, same rows), but a run
    # joining a generation a failed run left open reads a longer range and must not reuse that
    # run's file under the same name (its rows would stop short of the offsets claimed).
    run = secrets.randbits(48)

    def read_split(split: _Split) -> tuple[int, tuple[Any, ...]]:
        clock = time.perf_counter
        spent = {"read": 0.0, "fold": 0.0, "write": 0.0}
        mark = clock()
        start = None
        if split.previous:
            start = repo.merge_files(split.previous)
            if migrator is not None:  # old-version rows, brought up before the new records fold in
                start = migrator.rows(split.partition, start)
        folder = ChangeFolder(start, keep_tombstones=split.index > 0)
        count = 0
        for msgs in iter_range(opts, split.partition, split.start, split.end):
            count += len(msgs)
            changes = change_table(msgs)
            now = clock()
            spent["read"] += now - mark
            folder.add(changes)
            mark = clock()
            spent["fold"] += mark - now
        rows = folder.result()
        now = clock()
        spent["fold"] += now - mark
        records_acc.add(count)
        tasks_acc.add(1)
        if split.count == 1:
            written = write_data_file(repo, generation, split.partition, "base", run, rows)
            spent["write"] += clock() - now
            return split.partition, ("file", split.index, written.to_json(), count, spent)
        return split.partition, ("part", split.index, to_ipc(rows), count, spent)

    def finish(group: tuple[int, Iterable[tuple[Any, ...]]]) -> tuple[int, tuple[Any, ...]]:
        partition, items = group
        parts = sorted(items, key=lambda item: item[1])
        count = sum(item[3] for item in parts)
        spent = {k: sum(item[4][k] for item in parts) for k in ("read", "fold", "write")}
        if len(parts) == 1 and parts[0][0] == "file":
            return partition, (parts[0][2], count, spent)
        mark = time.perf_counter()
        rows = latest_per_key([from_ipc(item[2]) for item in parts], keep_tombstones=False)
        written = write_data_file(repo, generation, partition, "base", run, rows)
        spent["write"] += time.perf_counter() - mark
        return partition, (written.to_json(), count, spent)

    n_partitions = len({s.partition for s in splits})
    stage1 = sc.parallelize(splits, len(splits)).map(read_split)
    done = threading.Event()

    def report() -> None:  # a daemon thread: it ends with the job (or the process)
        while not done.wait(PROGRESS_INTERVAL_SECONDS):
            assert progress is not None
            progress(int(records_acc.value), int(tasks_acc.value), len(splits))

    if progress is not None:
        threading.Thread(target=report, name="statesnap-bootstrap-progress", daemon=True).start()
    try:
        if n_partitions == len(splits):  # every partition in one task: no second stage needed
            collected: Iterator[Any] = iter(stage1.map(lambda kv: finish((kv[0], [kv[1]]))).collect())
        else:
            stage2 = stage1.groupByKey(min(n_partitions, sc.defaultParallelism)).map(finish)
            collected = iter(stage2.collect())
    finally:
        done.set()
    out = dict(collected)
    if progress is not None:
        progress(sum(count for _meta, count, _spent in out.values()), len(splits), len(splits))
    return out
