"""``write_checkpoint``: one checkpoint by one writer, as a one-task snapshot.

For tools and tests that hold a table's rows and want them committed the way every writer
commits: begin (join or create a generation), write the data files, report to the orchestrator,
which commits the manifest and the snapshot record.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from statesnap.checkpoint.manifest import CheckpointManifest, PartitionCheckpoint
from statesnap.checkpoint.repository import CheckpointRepository
from statesnap.checkpoint.retention import RetentionPolicy
from statesnap.checkpoint.writer import PartitionUpdate
from statesnap.errors import CheckpointError
from statesnap.kafka.config import KafkaSettings
from statesnap.snapshot.participant import Participant
from statesnap.task.opening import TaskEngine, join_snapshots
from statesnap.task.options import SnapshotOptions

__all__ = ["WriteFiles", "write_checkpoint"]

#: Writes a generation's data files itself (a Spark job: the rows never reach this process) and
#: returns every partition's entry; called with the generation once the snapshot has begun.
WriteFiles = Callable[[int], Mapping[int, PartitionCheckpoint]]


def write_checkpoint(
    repo: CheckpointRepository,
    *,
    table: str,
    topic: str,
    cluster_id: str,
    updates: Mapping[int, PartitionUpdate] | WriteFiles,
    previous: CheckpointManifest | None = None,
    engine: str = "python",
    extra: Mapping[str, Any] | None = None,
    retention: RetentionPolicy | None = None,
    snapshot_store: str | None = None,
    kafka: KafkaSettings | None = None,
    snapshot_timeout: timedelta = timedelta(minutes=5),
) -> CheckpointManifest:
    """Commit *updates* (every partition of the table) as one snapshot; returns its manifest.

    Partitions without a new ``base``/``delta`` reference *previous*'s files again. *updates* may
    instead be a :data:`WriteFiles` that writes the files itself (every partition of *previous*).
    *snapshot_timeout*: how long the snapshot may stay open before another writer fails it.
    """
    named = set(updates) if isinstance(updates, Mapping) else set()
    partitions = tuple(sorted(named | set(previous.partitions if previous is not None else ())))
    task = join_snapshots(
        Participant,
        repo,
        table=table,
        topic=topic,
        cluster_id=cluster_id,
        partitions=partitions,
        settings=kafka,
        snapshots=SnapshotOptions(snapshot_store, snapshot_timeout),
        retention=retention,
        task_id=engine,
        owned=partitions,
        engine=TaskEngine(engine),
        previous=previous,
    )
    api = task.api
    try:
        snap = task.begin()
        try:
            files = (
                task.write(snap.generation, updates)
                if isinstance(updates, Mapping)
                else dict(updates(snap.generation))
            )
        except Exception as e:  # the snapshot would wait for this report until it went stale
            with contextlib.suppress(Exception):  # the error to report is the one that happened
                task.fail(snap.generation, f"{type(e).__name__}: {e}")
            raise
        offsets = {p: pc.next_offset for p, pc in files.items()}
        manifest = task.submit(snap.generation, files, offsets, extra)
    finally:
        api.close()
    if manifest is None:
        raise CheckpointError(
            f"{repo.shown}: snapshot {snap.generation} did not complete with this writer's report "
            "(fenced by a newer generation, or the table has partitions this writer does not own)"
        )
    return manifest
