"""A table's part in snapshots: at commit points, write its partitions' files for the target
generation and report them; start generations when its checkpoint interval is due.

A single-process table owns every partition, so its report completes the snapshot at once and a
"checkpoint" is simply a snapshot of one task; several instances each report their partitions and
the snapshot completes when the last one does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta

import pyarrow as pa

from statesnap.checkpoint.datafile import empty_table
from statesnap.checkpoint.manifest import CheckpointManifest
from statesnap.checkpoint.repository import CheckpointRepository
from statesnap.checkpoint.retention import RetentionPolicy, collect_garbage
from statesnap.checkpoint.writer import PartitionUpdate, write_partition_files
from statesnap.errors import StaleGenerationError
from statesnap.snapshot.api import SnapshotApi
from statesnap.snapshot.model import CheckpointRef, Snapshot, SnapshotState, TaskSnapshot
from statesnap.snapshot.store import BlobSnapshotStore

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TaskState:
    """What the table tells the participant at a commit point."""

    offsets: Mapping[int, int]
    export: Callable[[], dict[int, pa.Table]]


class SnapshotTask:
    """One task (a Table instance) taking part in its table's snapshots."""

    def __init__(
        self,
        repo: CheckpointRepository,
        *,
        task_id: str,
        table: str,
        topic: str,
        cluster_id: str,
        all_partitions: tuple[int, ...],
        owned: tuple[int, ...],
        retention: RetentionPolicy,
        snapshot_timeout: timedelta,
        refresh_interval: float,
        previous: CheckpointManifest | None,
    ) -> None:
        self.repo = repo
        self.task_id = task_id
        self.table = table
        self.topic = topic
        self.owned = owned
        self.retention = retention
        self.snapshot_timeout = snapshot_timeout
        self.api = SnapshotApi(
            BlobSnapshotStore(repo.store, repo.directory),
            repo,
            table=table,
            topic=topic,
            cluster_id=cluster_id,
            partitions=all_partitions,
        )
        self.orchestrator = self.api.orchestrator
        self.orchestrator.refresh_interval = refresh_interval
        self.orchestrator.on_completed = self._completed
        self.last_checkpoint = previous
        self.reported = previous.generation if previous is not None else 0

    @property
    def single(self) -> bool:
        """Whether this task owns every partition (then its report completes a snapshot)."""
        return set(self.owned) >= set(self.api.partitions)

    def start(self) -> None:
        """Start watching for snapshots created elsewhere (the API, other instances)."""
        self.orchestrator.start()

    def close(self) -> None:
        self.orchestrator.close()

    def on_commit(self, state: TaskState, *, checkpoint_due: bool) -> CheckpointManifest | None:
        """Called at every commit point: report to a pending snapshot; start one if due."""
        target = self.orchestrator.target_generation(block=False)
        if target.state is SnapshotState.COMPLETED and 0 < target.generation == self.reported:
            self._adopt(target.generation)
        if checkpoint_due and target.state is not SnapshotState.CREATED:
            if self.unchanged(state):
                return None
            target = self.api.create(timeout=self.snapshot_timeout)
        if target.state is SnapshotState.CREATED and target.generation > self.reported:
            return self.report(target, state)
        return None

    def checkpoint(self, state: TaskState) -> CheckpointManifest | None:
        """Take part in a snapshot now: join the pending one or start one; None if nothing changed."""
        target = self.orchestrator.target_generation(block=True)
        if target.state is not SnapshotState.CREATED or target.generation <= self.reported:
            if self.unchanged(state):
                return None
            target = self.api.create(timeout=self.snapshot_timeout)
        return self.report(target, state)

    def unchanged(self, state: TaskState) -> bool:
        prev = self.last_checkpoint
        return prev is not None and all(prev.offsets.get(p) == off for p, off in state.offsets.items())

    def report(self, target: Snapshot, state: TaskState) -> CheckpointManifest | None:
        """Write this task's files into the target generation and report them."""
        prev = self.last_checkpoint
        changed = [
            p
            for p, off in state.offsets.items()
            if prev is None or p not in prev.partitions or prev.partitions[p].next_offset != off
        ]
        exported = state.export() if changed else {}
        updates = {
            p: PartitionUpdate(p, off, base=exported.get(p, empty_table()) if p in changed else None)
            for p, off in state.offsets.items()
        }
        refs = write_partition_files(self.repo, target.generation, updates, prev)
        task = TaskSnapshot(
            self.task_id,
            {(self.topic, p): off for p, off in state.offsets.items()},
            {self.table: CheckpointRef(self.repo.url, refs)},
        )
        try:
            result = self.orchestrator.report(target.generation, task)
        except StaleGenerationError as e:
            log.warning("%s", e)
            return None
        self.reported = target.generation
        if result.state is SnapshotState.COMPLETED and result.generation == target.generation:
            return self.last_checkpoint
        return None

    def _adopt(self, generation: int) -> None:
        """A snapshot we reported to completed elsewhere: its files become our reuse base."""
        if self.last_checkpoint is None or self.last_checkpoint.generation < generation:
            self.last_checkpoint = self.repo.read_manifest(generation)

    def _completed(self, manifest: CheckpointManifest) -> None:
        """Called by the orchestrator in the process that finished a snapshot: adopt it, run GC."""
        if set(manifest.partitions) >= set(self.owned):
            self.last_checkpoint = manifest
        keep = self.api.retained()
        collect_garbage(self.repo, self.retention, keep=keep.__contains__)
