"""How tasks learn the target generation and report their part of a snapshot.

Protocol, per generation G:

1. ``SnapshotApi.create()`` writes G as ``CREATED`` (or returns the current ``CREATED`` one).
2. Each task, after its next commit, sees G via ``target_generation()`` (cached: no round trip),
   writes its data files into ``data/G/`` and calls ``report(G, task_snapshot)``. A task with no
   new data since the last commit reports too, so an idle partition never stalls a snapshot.
3. The report that makes the reports cover every expected partition commits G's checkpoint
   manifest (write-once) and marks G ``COMPLETED``. A crash in between is finished by whoever
   looks next (``refresh``), idempotently.
4. A report for any generation but the current ``CREATED`` one is fenced
   (:class:`~statesnap.errors.StaleGenerationError`); a snapshot past its deadline is marked
   ``FAILED`` naming the partitions and tasks that did not report; a failing task marks it
   ``FAILED``. Nothing is ever ``COMPLETED`` with a partition missing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from statesnap.checkpoint.manifest import CheckpointManifest, CheckpointState, PartitionCheckpoint
from statesnap.checkpoint.repository import CheckpointRepository
from statesnap.errors import (
    CheckpointConflictError,
    CheckpointMismatchError,
    StaleGenerationError,
    StatesnapError,
)
from statesnap.failure_log import FailureLog
from statesnap.snapshot.model import Snapshot, SnapshotState, TaskSnapshot
from statesnap.snapshot.store import SnapshotStore
from statesnap.version import __version__

__all__ = ["NO_WRITER", "LocalOrchestrator", "Orchestrator", "manifest_of", "timed_out"]

log = logging.getLogger(__name__)

#: What a snapshot no task reported to needs: a snapshot is taken by the table's writers, at
#: their next commit; creating one only asks them.
NO_WRITER = (
    "no writer reported: a writer must be running to take the snapshot (statesnap materialize "
    "--follow, statesnap run --follow, or a Python Table/Processor task with this table's "
    "snapshot store)"
)


def timed_out(snapshot: Snapshot, owners: list[str], what: str = "timed out") -> str:
    """Why *snapshot* failed at its deadline: no writer at all, or the partitions still missing
    and (a hint) the tasks that reported them last time."""
    missing = snapshot.missing_partitions
    who = f"; tasks that owned them last time: {', '.join(owners)}" if owners else ""
    if not snapshot.tasks:
        return f"{what} waiting for partitions {missing}: {NO_WRITER}{who}"
    return f"{what} waiting for partitions {missing}{who} (is their writer running?)"


class Orchestrator(Protocol):
    """What a task needs: the target generation, and somewhere to report."""

    def target_generation(self, block: bool = False) -> Snapshot: ...

    def report(self, generation: int, task: TaskSnapshot) -> Snapshot: ...

    def fail(self, generation: int, task_id: str, reason: str) -> Snapshot: ...


def manifest_of(snapshot: Snapshot, *, table: str, topic: str, cluster_id: str) -> CheckpointManifest:
    """The checkpoint manifest a complete snapshot commits: every task's partitions, merged.

    The ``writer`` record names the engine(s) that wrote it; a snapshot of one task (a single
    process, a Spark job) also carries that task's own figures (files and bytes written, …).
    """
    partitions: dict[int, PartitionCheckpoint] = {}
    for task in snapshot.tasks.values():
        ref = task.checkpoints.get(table)
        if ref is None:
            continue
        partitions.update(ref.partitions)
    files = [f for pc in partitions.values() for f in pc.files]
    engines = sorted({str(t.writer.get("engine", "python")) for t in snapshot.tasks.values()})
    writer: dict[str, Any] = {}
    if len(snapshot.tasks) == 1:
        writer.update(next(iter(snapshot.tasks.values())).writer)
    writer.update(
        {
            "name": "statesnap",
            "version": __version__,
            "engine": engines[0] if len(engines) == 1 else "+".join(engines),
            "tasks": sorted(snapshot.tasks),
            "label": snapshot.label,
            "bytes": sum(f.bytes for f in files),
            "snapshot_seconds": round((datetime.now(UTC) - snapshot.created_at).total_seconds(), 3),
        }
    )
    for task in snapshot.tasks.values():  # every task of a processor describes it alike
        if "processor" in task.writer:
            writer.setdefault("processor", task.writer["processor"])
    topic_ids = {str(t.writer["topic_id"]) for t in snapshot.tasks.values() if t.writer.get("topic_id")}
    writer.pop("topic_id", None)
    writer.pop("state_versions", None)
    return CheckpointManifest(
        table=table,
        topic=topic,
        cluster_id=cluster_id,
        generation=snapshot.generation,
        partitions=partitions,
        created_at=datetime.now(UTC),
        state=CheckpointState.COMPLETED,
        writer=writer,
        topic_id=topic_ids.pop() if len(topic_ids) == 1 else None,
        state_versions=_state_versions(snapshot, table),
    )


def _state_versions(snapshot: Snapshot, table: str) -> dict[str, int]:
    """The state version of each store, as every task that wrote one says: tasks of one snapshot
    that disagree (two versions of the code in one consumer group) would mix formats in one
    checkpoint, so that snapshot is refused rather than committed."""
    versions: dict[str, int] = {}
    for task in snapshot.tasks.values():
        if table not in task.checkpoints:
            continue
        for store, version in dict(task.writer.get("state_versions") or {}).items():
            if versions.setdefault(str(store), int(version)) != int(version):
                raise CheckpointMismatchError(
                    f"snapshot {snapshot.generation} of {table!r}: tasks wrote store {store!r} at state "
                    f"versions {versions[str(store)]} and {version}; stop the old code's tasks before "
                    "the new version's take part"
                )
    return versions


class LocalOrchestrator:
    """An orchestrator embedded in each application process, coordinating through the shared
    :class:`SnapshotStore`. A background thread refreshes the cached current snapshot every
    ``refresh_interval`` seconds, so ``target_generation()`` after each commit costs nothing."""

    def __init__(
        self,
        store: SnapshotStore,
        repo: CheckpointRepository,
        *,
        table: str,
        topic: str,
        cluster_id: str,
        refresh_interval: float = 0.5,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        on_completed: Callable[[CheckpointManifest], None] | None = None,
    ) -> None:
        self.store = store
        self.repo = repo
        self.table = table
        self.topic = topic
        self.cluster_id = cluster_id
        self.refresh_interval = refresh_interval
        self._clock = clock
        #: Called with the manifest in the process that completes a snapshot (GC runs there).
        self.on_completed = on_completed
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the background refresher (idempotent)."""
        if self._thread is None:
            self.refresh()
            self._thread = threading.Thread(target=self._run, name="statesnap-orchestrator", daemon=True)
            self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Stop watching; a refresh stuck on a store that does not answer is not waited for
        past *timeout* (its thread is a daemon and ends with the process)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("snapshot refresh still waiting on the snapshot store; not waiting for it")
            self._thread = None

    def _run(self) -> None:
        # Every refresh_interval (0.5 s): a store that is down for minutes is said once a minute
        # with a count (it was two lines a second), and once when it answers again.
        failures = FailureLog(log)
        while not self._stop.wait(self.refresh_interval):
            try:
                self.refresh()
            except StatesnapError as e:  # a store that failed to answer: say so, try again
                failures.failed(
                    "refresh", "snapshot refresh failed; retrying every %.3g s: %s", self.refresh_interval, e
                )
            except Exception:
                log.exception("snapshot refresh failed; will retry")
            else:
                failures.recovered("refresh", "snapshot refresh works again")

    def refresh(self) -> Snapshot:
        """Re-read the current snapshot; finish a complete one, fail an expired one."""
        current = self.store.current(block=True)
        if current.state is not SnapshotState.CREATED:
            return current
        if current.complete:
            return self._finish(current)
        if current.deadline is not None and self._clock() > current.deadline:
            return self.expire(current.generation)
        return current

    def target_generation(self, block: bool = False) -> Snapshot:
        """The current snapshot; tasks act when it is ``CREATED``. Cached unless *block*."""
        return self.store.current(block=block)

    def report(self, generation: int, task: TaskSnapshot) -> Snapshot:
        """Record *task*'s part of *generation*; completes the snapshot when every partition is in."""

        def add(current: Snapshot) -> Snapshot:
            if current.generation != generation or current.state is not SnapshotState.CREATED:
                raise StaleGenerationError(
                    f"report of task {task.task_id!r} for generation {generation} fenced: current is "
                    f"generation {current.generation} ({current.state.value})"
                )
            return current.evolve(tasks={**current.tasks, task.task_id: task})

        snapshot = self.store.update_current(add)
        log.info(
            "task %s reported generation %d (%d/%d partitions)",
            task.task_id,
            generation,
            len(snapshot.reported_partitions),
            len(snapshot.expected_partitions),
        )
        if snapshot.complete:
            return self._finish(snapshot)
        return snapshot

    def _finish(self, snapshot: Snapshot) -> Snapshot:
        manifest = manifest_of(snapshot, table=self.table, topic=self.topic, cluster_id=self.cluster_id)
        try:
            self.repo.commit(manifest)
        except CheckpointConflictError:
            manifest = self.repo.read_manifest(snapshot.generation)  # finished by someone else

        def complete(current: Snapshot) -> Snapshot | None:
            if current.generation != snapshot.generation or current.state is not SnapshotState.CREATED:
                return None
            return current.evolve(state=SnapshotState.COMPLETED)

        done = self.store.update_current(complete)
        log.info(
            "snapshot generation %d completed with tasks %s", snapshot.generation, sorted(snapshot.tasks)
        )
        if self.on_completed is not None:
            self.on_completed(manifest)
        return done

    def fail(self, generation: int, task_id: str, reason: str) -> Snapshot:
        """A task could not take part: the snapshot fails; a new ``create`` starts a new one."""

        def mark(current: Snapshot) -> Snapshot | None:
            if current.generation != generation or current.state is not SnapshotState.CREATED:
                return None
            if current.complete:  # every partition reported: its manifest may already be committed
                return None
            return current.evolve(state=SnapshotState.FAILED, error=f"task {task_id} failed: {reason}")

        return self.store.update_current(mark)

    def expire(self, generation: int) -> Snapshot:
        """Fail *generation* for missing its deadline, naming what did not report."""

        def mark(current: Snapshot) -> Snapshot | None:
            if current.generation != generation or current.state is not SnapshotState.CREATED:
                return None
            if current.complete:
                return None
            missing = current.missing_partitions
            owners = self._owners(missing)
            return current.evolve(state=SnapshotState.FAILED, error=timed_out(current, owners))

        result = self.store.update_current(mark)
        if result.state is SnapshotState.FAILED:
            log.warning("snapshot generation %d failed: %s", generation, result.error)
        return result

    def _owners(self, partitions: list[int]) -> list[str]:
        """Task ids that reported *partitions* in the newest completed snapshot."""
        for snap in self.store.list():
            if snap.state is SnapshotState.COMPLETED:
                return sorted({t.task_id for t in snap.tasks.values() if t.partitions & set(partitions)})
        return []
