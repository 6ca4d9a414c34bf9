"""A writer's part in its table's snapshots: the one way any checkpoint gets committed.

Every writer — a Python :class:`~statesnap.Table` task, the Spark bootstrap driver, the Spark
streaming driver — is a :class:`Participant`: it joins the snapshot in progress or starts one
(:meth:`Participant.begin`), writes its partitions' files into that generation's data directory
and reports them (:meth:`Participant.submit`). The orchestrator commits the manifest and marks the
snapshot ``COMPLETED`` when the reports cover every partition, then the completing process runs
retention GC through :meth:`SnapshotApi.gc`. A single writer owns every partition, so its report
completes the snapshot at once.

Ownership may change (a table in a consumer group): :meth:`SnapshotTask.gain` and
:meth:`SnapshotTask.lose` move partitions in and out of ``owned``. A task that gains partitions
after it reported to the snapshot in progress reports again, with everything it owns now (a
report replaces the task's previous one), so a snapshot completes after its partitions moved.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pyarrow as pa

from statesnap.checkpoint import layout
from statesnap.checkpoint.compaction import needs_base
from statesnap.checkpoint.datafile import empty_table
from statesnap.checkpoint.manifest import CheckpointManifest, PartitionCheckpoint
from statesnap.checkpoint.retention import RetentionPolicy
from statesnap.checkpoint.writer import PartitionUpdate, write_partition_files
from statesnap.errors import CheckpointHistoryLostError, StaleGenerationError
from statesnap.snapshot.api import SnapshotApi
from statesnap.snapshot.model import CheckpointRef, Snapshot, SnapshotState, TaskSnapshot

__all__ = ["Participant", "SnapshotTask", "TaskState"]

log = logging.getLogger(__name__)


class Participant:
    """One task of a table's snapshots (any engine)."""

    def __init__(
        self,
        api: SnapshotApi,
        *,
        task_id: str,
        owned: tuple[int, ...],
        engine: str,
        retention: RetentionPolicy | None,
        snapshot_timeout: timedelta,
        previous: CheckpointManifest | None,
        refresh_interval: float = 0.5,
        topic_id: str | None = None,
    ) -> None:
        self.api = api
        self.repo = api.repo
        self.task_id = task_id
        self.owned = owned
        self.engine = engine
        self.retention = retention
        self.snapshot_timeout = snapshot_timeout
        #: The topic incarnation this task reads; manifests record it (see checkpoint.selection).
        self.topic_id = topic_id
        self.orchestrator = api.orchestrator
        self.orchestrator.refresh_interval = refresh_interval
        self.orchestrator.on_completed = self._completed
        #: The newest checkpoint this task's files can build on (restored, or completed since).
        self.last_checkpoint = previous
        self.reported = previous.generation if previous is not None else 0
        #: The partitions this task's report to generation ``reported`` covered.
        self.covered: frozenset[int] = frozenset(owned)
        #: Set by the completing process's hook: the GC that ran after the last completion.
        self.on_checkpoint: Callable[[CheckpointManifest], None] | None = None
        #: The table descriptor as this task first saw it: written back if the store is wiped.
        self._descriptor: dict[str, Any] | None = None
        #: What every manifest's ``writer`` record says of the task's state beyond the engine (a
        #: processor's inputs and stores, so readers know them without its code).
        self.describes: Mapping[str, Any] = {}
        #: The state version of each store this task writes (a table: its own name), recorded in
        #: every manifest. Empty: every store at version 1, as manifests before versions said.
        self.state_versions: Mapping[str, int] = {}

    def same_versions(self, manifest: CheckpointManifest) -> bool:
        """Whether *manifest*'s rows are of the state versions this task writes: files of
        another version (a checkpoint this task migrated while restoring) are never built on."""
        return all(manifest.state_version(s) == v for s, v in self.state_versions.items())

    @property
    def single(self) -> bool:
        """Whether this task owns every partition (then its report completes a snapshot)."""
        return set(self.owned) >= set(self.api.partitions)

    def start(self) -> None:
        """Start watching for snapshots created elsewhere (the API, other instances)."""
        self.orchestrator.start()

    def close(self) -> None:
        """Stop watching and release the snapshot store's clients."""
        self.api.close()

    # --- the protocol --------------------------------------------------------------------------

    def pending(self, block: bool = False) -> Snapshot | None:
        """The snapshot in progress this task has yet to report to, or to report to again
        because it gained partitions since it reported (cached unless *block*)."""
        target = self.orchestrator.target_generation(block=block)
        if target.state is SnapshotState.COMPLETED and 0 < target.generation == self.reported:
            self._adopt(target.generation)
        if target.state is not SnapshotState.CREATED:
            return None
        if target.generation > self.reported:
            return target
        if target.generation == self.reported and not self.covered >= set(self.owned):
            return target
        return None

    def begin(self) -> Snapshot:
        """Join the snapshot in progress, or start one (a stale one is failed first)."""
        joined = self.pending(block=True)
        if joined is not None:
            return joined
        self.still_builds_on()
        return self.api.create(timeout=self.snapshot_timeout)

    def still_builds_on(self, target: Snapshot | None = None) -> bool:
        """Is the checkpoint this task builds on still there? One read per checkpoint: before
        :meth:`begin` creates a generation (*target* None), and again before a task writes into
        *target* (one it joined, or a wipe between that check and the snapshot's record). A wiped
        store (or a deleted snapshot) would otherwise get delta files on top of files that no
        longer exist, under a generation number already used: see :meth:`_lost`. False where
        *target*'s number is one a wiped store handed out again (that snapshot is failed: no
        number a task saw returns)."""
        if self._descriptor is None:
            self._descriptor = self.repo.descriptor()
        prev = self.last_checkpoint
        if prev is None or self._still_there(prev):
            return True
        used = target.generation if target is not None else 0  # generations start at 1
        reused = 0 < used <= max(self.reported, prev.generation)
        if reused:
            self.fail(used, "its number was used before the store was wiped")
        self._lost(prev, used=used)
        return not reused

    def _still_there(self, last: CheckpointManifest) -> bool:
        return self.repo.store.exists(self.repo.key(layout.manifest_key(last.generation)))

    def _lost(self, last: CheckpointManifest, used: int = 0) -> None:
        """*last* is gone: keep generations above it (and above *used*, one whose files went with
        it), put the descriptor back, then :meth:`_history_lost`."""
        self.api.raise_high_water(max(self.reported, last.generation, used))  # generations never repeat
        if self._descriptor is not None:
            d = self._descriptor
            partitions, spec = int(d.get("partitions", 0)), str(d.get("snapshot_store", "blob"))
            self.repo.ensure_descriptor(d["table"], d["topic"], d["cluster_id"], partitions, spec)
        self._history_lost(last)

    def _history_lost(self, last: CheckpointManifest) -> None:
        """What a writer does when its last checkpoint vanished; this one cannot rebuild it."""
        raise CheckpointHistoryLostError(
            f"{self.repo.shown}: generation {last.generation}, the checkpoint this writer builds on, "
            "is gone (the store was wiped or restored from an older copy, or the snapshot deleted); "
            "restart the writer to continue from the newest checkpoint left"
        )

    def fail(self, generation: int, reason: str) -> None:
        """This task cannot report to *generation*: the snapshot fails at once (a later ``begin``
        starts a new one) instead of waiting for the report until it is stale."""
        self.orchestrator.fail(generation, self.task_id, reason)

    def submit(
        self,
        generation: int,
        partitions: Mapping[int, PartitionCheckpoint],
        offsets: Mapping[int, int],
        writer: Mapping[str, Any] | None = None,
    ) -> CheckpointManifest | None:
        """Report this task's partitions of *generation*; returns the manifest when this report
        completed the snapshot, None when other tasks have yet to report or it was fenced."""
        task = TaskSnapshot(
            self.task_id,
            {(self.api.topic, p): off for p, off in offsets.items()},
            {self.api.table: CheckpointRef(self.repo.url, dict(partitions))},
            writer={
                "engine": self.engine,
                **self.describes,
                **({"topic_id": self.topic_id} if self.topic_id else {}),
                **({"state_versions": dict(self.state_versions)} if self.state_versions else {}),
                **(writer or {}),
            },
        )
        try:
            result = self.orchestrator.report(generation, task)
        except StaleGenerationError as e:
            log.warning("%s", e)
            return None
        self.reported = generation
        self.covered = frozenset(offsets)
        if result.state is SnapshotState.COMPLETED and result.generation == generation:
            if self.last_checkpoint is None or self.last_checkpoint.generation != generation:
                self.last_checkpoint = self.repo.read_manifest(generation)
            return self.last_checkpoint
        return None

    def write(
        self,
        generation: int,
        updates: Mapping[int, PartitionUpdate],
        previous: CheckpointManifest | None = None,
    ) -> dict[int, PartitionCheckpoint]:
        """Write *updates* into *generation*'s data directory, building on *previous* (default:
        the last checkpoint). A caller that decided what changed against one manifest passes it:
        the refresher thread may adopt another one meanwhile."""
        base = previous if previous is not None else self.last_checkpoint
        return write_partition_files(self.repo, generation, updates, base)

    def _adopt(self, generation: int) -> None:
        """A snapshot we reported to completed elsewhere: its files become our reuse base."""
        if self.last_checkpoint is None or self.last_checkpoint.generation < generation:
            self.last_checkpoint = self.repo.read_manifest(generation)

    def _completed(self, manifest: CheckpointManifest) -> None:
        """Called by the orchestrator in the process that finished a snapshot: adopt it, run GC.
        Never an older one: the refresher thread may finish a snapshot late, after a newer one."""
        last = self.last_checkpoint
        newer = last is None or manifest.generation > last.generation
        if newer and set(manifest.partitions) >= set(self.owned):
            self.last_checkpoint = manifest
        if self.retention is not None:
            self.api.gc(self.retention)
        if self.on_checkpoint is not None:
            self.on_checkpoint(manifest)


@dataclass(frozen=True, slots=True)
class TaskState:
    """What a Python table tells its task at a commit point: its offsets, and how to get its
    full contents (``export``), its changes since the last checkpoint (``changes``, for ``delta``
    files) and how to tell it they are in a checkpoint (``mark_checkpointed``)."""

    offsets: Mapping[int, int]
    export: Callable[[], dict[int, pa.Table]]
    changes: Callable[[], dict[int, pa.Table]] | None = None
    mark_checkpointed: Callable[[], None] | None = None
    #: Partitions whose next file must be a new base even where a delta would do (rows were
    #: dropped that must not stay in older base files: a processor's expired windows).
    rebase: Collection[int] = ()


class SnapshotTask(Participant):
    """A Python :class:`~statesnap.Table` task: reports at commit points, starts a snapshot when
    its checkpoint interval is due. A checkpoint writes only what changed: a ``delta`` file of the
    upserts and tombstones since the previous checkpoint per changed partition (merge-on-read), a
    new ``base`` where the partition has none yet or its deltas piled up, and nothing for an
    unchanged partition (its files are referenced again)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._mark: Callable[[], None] | None = None
        #: Per owned partition, the checkpoint whose contents the store's change set is relative
        #: to: a delta may only be written on top of exactly those files (see :meth:`_builds_on`).
        prev = self.last_checkpoint
        self._mine: dict[int, PartitionCheckpoint] = (
            {p: prev.partitions[p] for p in self.owned if p in prev.partitions} if prev is not None else {}
        )
        self._last_refs: dict[int, PartitionCheckpoint] | None = None

    # --- ownership (consumer groups) -----------------------------------------------------------

    def gain(self, partitions: Collection[int], restored: CheckpointManifest | None) -> None:
        """*partitions* now belong to this task, restored from *restored* (None: replayed from
        the beginning). A snapshot in progress gets a new report from this task."""
        self.owned = tuple(sorted(set(self.owned) | set(partitions)))
        for p in partitions:
            if restored is not None and p in restored.partitions:
                self._mine[p] = restored.partitions[p]
            else:
                self._mine.pop(p, None)
        last = self.last_checkpoint
        if restored is not None and (last is None or restored.generation > last.generation):
            self.last_checkpoint = restored

    def lose(self, partitions: Collection[int]) -> None:
        """*partitions* moved to another task (after this task reported them, if it could)."""
        gone = set(partitions)
        self.owned = tuple(p for p in self.owned if p not in gone)
        for p in gone:
            self._mine.pop(p, None)

    # --- commit points -------------------------------------------------------------------------

    def on_commit(self, state: TaskState, *, checkpoint_due: bool) -> CheckpointManifest | None:
        """Called at every commit point: report to a pending snapshot; start one if due."""
        if not state.offsets:
            return None  # owns no partition (yet): nothing to report
        target = self.pending()
        if target is None and checkpoint_due and not self.unchanged(state):
            target = self.begin()
        if target is not None and (target.generation > self.reported or not self.covered >= set(self.owned)):
            return self.report(target, state)
        return None

    def checkpoint(self, state: TaskState, *, full: bool = False) -> CheckpointManifest | None:
        """Take part in a snapshot now: join the pending one or start one; None if nothing changed.
        *full*: a new base for every changed partition."""
        if not state.offsets:
            return None
        target = self.pending(block=True)
        if target is None:
            if self.unchanged(state):
                return None
            target = self.begin()
        return self.report(target, state, full=full)

    def unchanged(self, state: TaskState) -> bool:
        """Nothing to checkpoint: same offsets as the last checkpoint, and its rows of this task's
        state versions (after a migrated restore the next checkpoint writes the new version)."""
        prev = self.last_checkpoint
        return (
            prev is not None
            and self.same_versions(prev)
            and all(prev.offsets.get(p) == off for p, off in state.offsets.items())
        )

    def report(self, target: Snapshot, state: TaskState, *, full: bool = False) -> CheckpointManifest | None:
        """Write this task's files into the target generation and report them. Files of another
        state version are not built on: every partition then gets a new base. Nor are the files of
        a checkpoint that is gone (a deleted snapshot this task joined the next one on top of, a
        wiped store): see :meth:`_lost`."""
        if not self.still_builds_on(target):  # a task that can rebuild writes bases
            return None
        prev = self.last_checkpoint
        if prev is not None and not self.same_versions(prev):
            prev = None
        changed = [
            p
            for p, off in state.offsets.items()
            if prev is None or p not in prev.partitions or prev.partitions[p].next_offset != off
        ]
        incremental = state.changes is not None and prev is not None and not full
        rebase = [
            p
            for p in changed
            if not incremental
            or prev is None
            or p not in prev.partitions
            or needs_base(prev.partitions[p].files)
            or not self._builds_on(p, prev.partitions[p])
            or p in state.rebase
        ]
        # The change set is handed out whenever no export hands it out, even with nothing to
        # write: the mark forgets only what was handed out, and the rows of an unchanged partition
        # are in the files it references (another writer's, at these offsets), so a later delta
        # holding them would start below its base.
        everything_rebased = bool(rebase) and len(rebase) == len(changed)
        deltas = state.changes() if state.changes is not None and not everything_rebased else {}
        bases = state.export() if rebase else {}
        updates = {
            p: PartitionUpdate(
                p,
                off,
                base=bases.get(p, empty_table()) if p in rebase else None,
                delta=deltas.get(p, empty_table()) if p in changed and p not in rebase else None,
            )
            for p, off in state.offsets.items()
        }
        refs = self.write(target.generation, updates, prev)  # what `changed` was judged against
        prefix = f"data/{target.generation:020d}/"
        written = [f for pc in refs.values() for f in pc.files if f.path.startswith(prefix)]
        self._mark = state.mark_checkpointed
        self._last_refs = dict(refs)
        manifest = self.submit(
            target.generation,
            refs,
            state.offsets,
            {
                "files_written": len(written),
                "bytes_written": sum(f.bytes for f in written),
                "delta_partitions": sorted(set(changed) - set(rebase)),
                "base_partitions": sorted(rebase),
            },
        )
        if manifest is not None:
            self._checkpointed()
        return manifest

    def _history_lost(self, last: CheckpointManifest) -> None:
        # The store holds the whole table, so the next checkpoint can be complete on its own.
        log.warning(
            "%s: generation %d, the checkpoint this table builds on, is gone (the store was wiped "
            "or restored from an older copy, or the snapshot deleted); writing a complete checkpoint",
            self.repo.url,
            last.generation,
        )
        self.last_checkpoint = None
        self._mine.clear()

    def _adopt(self, generation: int) -> None:
        super()._adopt(generation)
        if generation == self.reported:
            self._checkpointed()  # the snapshot our files went into completed elsewhere

    def _builds_on(self, partition: int, previous: PartitionCheckpoint) -> bool:
        """Whether the change set of *partition* is relative to *previous*: the files are the
        ones this task restored or reported last. Not so after a rebalance — the partition was
        gained, or another task's report of it went into the checkpoint — then a new base."""
        mine = self._mine.get(partition)
        return (
            mine is not None
            and mine.next_offset == previous.next_offset
            and [f.path for f in mine.files] == [f.path for f in previous.files]
        )

    def _checkpointed(self) -> None:
        """The rows handed to the last report are in a completed checkpoint: forget them (a
        snapshot that failed instead keeps them for the next delta)."""
        if self._mark is not None:
            self._mark()
            self._mark = None
        if self._last_refs is not None:
            owned = set(self.owned)
            self._mine.update({p: pc for p, pc in self._last_refs.items() if p in owned})
            self._last_refs = None
