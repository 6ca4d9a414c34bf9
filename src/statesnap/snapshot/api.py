"""``SnapshotApi``: create, list, show, delete, pin, diff and garbage-collect snapshots of one table.

Every writer (a Python task, the Spark bootstrap driver, the Spark streaming driver) and every
tool (the CLI's ``snapshot`` and ``checkpoints gc`` commands) goes through it, whichever snapshot
store the table uses, so a snapshot behaves the same whoever wrote it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from statesnap.blob import BlobStore, open_blob_store
from statesnap.checkpoint import layout
from statesnap.checkpoint.discovery import locate_table
from statesnap.checkpoint.journal import journal_references
from statesnap.checkpoint.manifest import CheckpointManifest
from statesnap.checkpoint.repository import CheckpointRepository
from statesnap.checkpoint.retention import GcReport, RetentionPolicy, collect_garbage
from statesnap.durations import parse_duration
from statesnap.errors import (
    BlobNotFoundError,
    CorruptCheckpointError,
    SnapshotError,
    SnapshotNotFoundError,
)
from statesnap.kafka.config import KafkaSettings
from statesnap.snapshot.audit import read_high_water
from statesnap.snapshot.factory import open_snapshot_store
from statesnap.snapshot.model import CheckpointRef, Snapshot, SnapshotState, TaskSnapshot
from statesnap.snapshot.orchestrator import LocalOrchestrator, timed_out
from statesnap.snapshot.store import BlobSnapshotStore, SnapshotStore, resolve_spec

__all__ = ["SnapshotApi", "snapshot_json"]

log = logging.getLogger(__name__)

#: Beside the manifests: the highest generation ever handed out, so deleting the newest snapshot
#: (and GC removing its files) can never let its number be used again.


class SnapshotApi:
    """Snapshots of one table, over its checkpoint repository and snapshot store."""

    def __init__(
        self,
        store: SnapshotStore,
        repo: CheckpointRepository,
        *,
        table: str,
        topic: str,
        cluster_id: str,
        partitions: Sequence[int],
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.store = store
        self.repo = repo
        self.table = table
        self.topic = topic
        self.cluster_id = cluster_id
        self.partitions = tuple(sorted(partitions))
        self._clock = clock
        self.orchestrator = LocalOrchestrator(
            store, repo, table=table, topic=topic, cluster_id=cluster_id, clock=clock
        )

    @classmethod
    def open(
        cls,
        url: str | BlobStore,
        table: str,
        *,
        snapshot_store: str | None = None,
        kafka: KafkaSettings | None = None,
        cluster_id: str | None = None,
        **storage_options: Any,
    ) -> SnapshotApi:
        """The API for an existing *table* under a checkpoint root (found by :func:`locate_table`)."""
        blob = open_blob_store(url, **storage_options) if isinstance(url, str) else url
        blob.check(writable=False)
        return cls.for_repo(
            locate_table(blob, table, cluster_id), table, snapshot_store=snapshot_store, kafka=kafka
        )

    @classmethod
    def for_repo(
        cls,
        repo: CheckpointRepository,
        table: str,
        *,
        snapshot_store: str | None = None,
        kafka: KafkaSettings | None = None,
        topic: str | None = None,
        cluster_id: str | None = None,
        partitions: Sequence[int] | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> SnapshotApi:
        """The API over *repo*; what is not given comes from the descriptor or newest manifest.

        The snapshot store is the one the descriptor records; *snapshot_store* (or
        ``STATESNAP_SNAPSHOT_STORE``) must agree with it (:class:`SnapshotStoreError` otherwise).
        """
        described = repo.descriptor() or {}
        latest = repo.latest() if topic is None or cluster_id is None or partitions is None else None
        spec = resolve_spec(snapshot_store, described.get("snapshot_store"), table)
        topic = topic or str(described.get("topic") or (latest.topic if latest else table))
        cluster_id = cluster_id or str(described.get("cluster_id") or (latest.cluster_id if latest else ""))
        if partitions is None:
            count = int(described.get("partitions") or 0)
            partitions = tuple(range(count)) if count else tuple(sorted(latest.partitions) if latest else ())
        store = open_snapshot_store(spec, blob=repo.store, directory=repo.directory, table=table, kafka=kafka)
        return cls(
            store, repo, table=table, topic=topic, cluster_id=cluster_id, partitions=partitions, clock=clock
        )

    def close(self) -> None:
        """Stop the orchestrator's refresher and release the store's clients."""
        self.orchestrator.close()
        closer = getattr(self.store, "close", None)
        if callable(closer):
            closer()

    # --- life cycle ----------------------------------------------------------------------------

    def create(
        self,
        *,
        label: str | None = None,
        pin: bool = False,
        timeout: str | float | timedelta = "60s",
        expires_in: str | float | timedelta | None = None,
    ) -> Snapshot:
        """Start a new generation, or join the one in progress (``CREATED`` and within its
        deadline). Joining honours ``pin``, ``label`` and ``expires_in``; a label that differs from
        the running snapshot's raises :class:`SnapshotError` instead of being dropped."""
        if not self.partitions:
            raise SnapshotError(f"table {self.table!r} has no known partitions")
        self.orchestrator.refresh()  # finish a complete snapshot, fail one past its deadline
        now = self._clock()
        deadline = now + parse_duration(timeout)
        expires_at = None if expires_in is None else now + parse_duration(expires_in)
        floor = self._high_water()

        def bump(current: Snapshot) -> Snapshot | None:
            if current.state is SnapshotState.CREATED:
                return None
            return Snapshot(
                generation=max(current.generation, floor) + 1,
                state=SnapshotState.CREATED,
                created_at=now,
                updated_at=now,
                expected_partitions=self.partitions,
                label=label,
                pinned=pin,
                expires_at=expires_at,
                deadline=deadline,
            )

        snap = self.store.update_current(bump)
        gen = snap.generation

        def join(current: Snapshot) -> Snapshot | None:
            # Computed from the record as it is now: concurrent joins must not undo each other.
            if current.generation != gen or current.state is not SnapshotState.CREATED:
                raise SnapshotError(f"snapshot {gen} finished before pin/label could be added")
            if label is not None and current.label not in (None, label):
                raise SnapshotError(
                    f"snapshot {current.generation} is in progress with label {current.label!r}; wait "
                    f"for it before creating one labelled {label!r}"
                )
            wants = {
                "pinned": current.pinned or pin,
                "label": current.label if label is None else label,
                "expires_at": max(
                    (e for e in (current.expires_at, expires_at) if e is not None), default=None
                ),
            }
            if all(getattr(current, k) == v for k, v in wants.items()):
                return None
            return current.evolve(**wants)

        if pin or label is not None or expires_at is not None:
            snap = self.store.update_current(join)
        return snap

    def wait(self, generation: int, timeout: str | float | timedelta = "60s", poll: float = 0.1) -> Snapshot:
        """Block until *generation* is ``COMPLETED`` or ``FAILED``; past *timeout*, fail it."""
        limit = time.monotonic() + parse_duration(timeout).total_seconds()
        while True:
            current = self.orchestrator.refresh()
            snap = current if current.generation == generation else self.get(generation)
            if snap.state is not SnapshotState.CREATED:
                return snap
            if time.monotonic() > limit:
                return self.orchestrator.expire(generation)
            time.sleep(poll)

    # --- queries (read-only: a snapshot past its deadline *reads* as FAILED) --------------------

    def _as_seen(self, snap: Snapshot) -> Snapshot:
        if (
            snap.state is SnapshotState.CREATED
            and snap.deadline is not None
            and self._clock() > snap.deadline
            and not snap.complete
        ):
            return replace(
                snap,
                state=SnapshotState.FAILED,
                error=timed_out(snap, [], f"deadline {snap.deadline.isoformat()} passed"),
            )
        return snap

    def current(self) -> Snapshot:
        """The newest snapshot; :class:`SnapshotNotFoundError` if there is none yet."""
        snap = self.store.current(block=True)
        if snap.generation == 0:
            latest = self.repo.latest()
            if latest is None:
                raise SnapshotNotFoundError(f"table {self.table!r} has no snapshots yet in {self.repo.shown}")
            return self._from_manifest(latest)
        return self._as_seen(snap)

    def list(self) -> list[Snapshot]:
        """Every snapshot, newest first, including checkpoints committed without a snapshot
        record (by statesnap before 0.2): every checkpoint is a snapshot."""
        records = {s.generation: self._as_seen(s) for s in self.store.list()}
        for gen, item in self.repo.manifests():
            if gen not in records and isinstance(item, CheckpointManifest):
                records[gen] = self._from_manifest(item)
        return [records[g] for g in sorted(records, reverse=True)]

    def get(self, generation: int) -> Snapshot:
        try:
            return self._as_seen(self.store.get(generation))
        except SnapshotNotFoundError:
            try:
                return self._from_manifest(self.repo.read_manifest(generation))
            except BlobNotFoundError:
                raise SnapshotNotFoundError(
                    f"no snapshot generation {generation} of table {self.table!r} in {self.repo.shown}"
                ) from None

    def _from_manifest(self, manifest: CheckpointManifest) -> Snapshot:
        """A COMPLETED snapshot with one task, for a checkpoint that has no snapshot record."""
        engine = str(manifest.writer.get("engine", "python"))
        task = TaskSnapshot(
            engine,
            {(manifest.topic, p): pc.next_offset for p, pc in manifest.partitions.items()},
            {manifest.table: CheckpointRef(self.repo.url, manifest.partitions)},
            manifest.created_at,
            {"engine": engine},
        )
        return Snapshot(
            generation=manifest.generation,
            state=SnapshotState.COMPLETED,
            created_at=manifest.created_at,
            updated_at=manifest.created_at,
            expected_partitions=tuple(sorted(manifest.partitions)),
            tasks={engine: task},
        )

    # --- retention -----------------------------------------------------------------------------

    def pin(self, generation: int, pinned: bool = True) -> Snapshot:
        """Keep *generation* through retention GC until unpinned."""
        self._adopt(generation)
        return self.store.update(
            generation, lambda s: None if s.pinned == pinned else s.evolve(pinned=pinned)
        )

    def unpin(self, generation: int) -> Snapshot:
        return self.pin(generation, pinned=False)

    def _adopt(self, generation: int) -> None:
        """Give a checkpoint that has no snapshot record (an older statesnap wrote it) one."""
        with contextlib.suppress(SnapshotNotFoundError):
            self.store.get(generation)
            return
        snap = self.get(generation)  # raises SnapshotNotFoundError naming the generation
        if not isinstance(self.store, BlobSnapshotStore):
            raise SnapshotError(
                f"generation {generation} has no snapshot record in {self.store!r}; pin it with the "
                "blob store it was written with"
            )
        self.store.insert(snap)

    def delete(self, generation: int) -> None:
        """Delete a snapshot's record and manifest; its files go at the next GC. Pinned snapshots
        and the snapshot in progress cannot be deleted; the newest can (generations still never
        repeat: the high-water mark keeps its number)."""
        snap = self.get(generation)
        if snap.pinned:
            raise SnapshotError(f"snapshot {generation} is pinned; unpin it first")
        if snap.state is SnapshotState.CREATED:
            raise SnapshotError(f"snapshot {generation} is in progress; wait for it or let it time out")
        self.raise_high_water(generation)
        self.repo.store.delete([self.repo.key(layout.manifest_key(generation))])
        with contextlib.suppress(SnapshotNotFoundError):
            self.store.delete(generation)

    def retained(self) -> set[int]:
        """Generations retention GC must keep: pinned, not yet expired, or in progress."""
        now = self._clock()
        return {
            s.generation for s in self.store.list() if s.retained(now) or s.state is SnapshotState.CREATED
        }

    def gc(self, policy: RetentionPolicy, *, dry_run: bool = False, now: datetime | None = None) -> GcReport:
        """The one GC entry point: the policy's rule plus everything that must be kept — pinned and
        unexpired snapshots, the newest usable checkpoint, files of snapshots in progress and of
        the Spark journal — then the records of deleted generations, through the snapshot store."""
        now = now or self._clock()
        records = [self._as_seen(s) for s in self.store.list()]  # past its deadline reads FAILED
        keep = {s.generation for s in records if s.retained(now) or s.state is SnapshotState.CREATED}
        referenced = journal_references(self.repo)
        for snap in records:
            if snap.state is SnapshotState.CREATED:
                for task in snap.tasks.values():
                    for ref in task.checkpoints.values():
                        referenced.update(f.path for pc in ref.partitions.values() for f in pc.files)
        report = collect_garbage(
            self.repo,
            policy,
            now=now,
            dry_run=dry_run,
            keep=keep.__contains__,
            referenced_elsewhere=referenced,
        )
        committed = set(report.retained)
        # Records go with their checkpoint; a record whose checkpoint is gone (deleted, a GC killed
        # half-way) or never came (FAILED, a dead writer's) goes once older than min_age.
        doomed = [
            s.generation
            for s in records
            if s.generation in report.deleted_generations
            or (
                s.generation not in committed
                and s.generation not in keep
                and now - s.updated_at >= policy.min_age
            )
        ]
        report.deleted_records = sorted(doomed)
        report.pinned = sorted(s.generation for s in records if s.pinned)
        if not dry_run and doomed:
            self.raise_high_water(max(doomed))  # its number is never used again
            for gen in doomed:
                with contextlib.suppress(SnapshotNotFoundError):
                    self.store.delete(gen)
        return report

    def restore_offsets(self, generation: int) -> dict[int, int]:
        """The per-partition offsets a table restored from *generation* resumes at."""
        try:
            return self.repo.read_manifest(generation).offsets
        except BlobNotFoundError as e:
            raise SnapshotNotFoundError(f"snapshot {generation} has no committed checkpoint") from e

    # --- the high-water mark -------------------------------------------------------------------

    def _high_water(self) -> int:
        """The highest generation ever used: manifests, data directories, records and the mark."""
        top = self.repo.next_generation() - 1
        try:
            mark = read_high_water(self.repo)
        except CorruptCheckpointError as e:
            log.warning("ignoring the generation high-water mark (checkpoints verify reports it): %s", e)
            mark = None
        return top if mark is None else max(top, mark)

    def raise_high_water(self, generation: int) -> None:
        """Record that *generation* was used (a writer remembers numbers a wiped store forgot)."""
        if generation <= self._high_water():
            return
        log.debug("%s: generation high-water mark is now %d", self.repo.url, generation)
        body = json.dumps({"generation": generation}).encode()
        self.repo.store.write(self.repo.key(layout.HIGH_WATER), body)


def snapshot_json(snap: Snapshot) -> dict[str, Any]:
    """The CLI's ``--json`` shape: the record plus a ``tasks`` list and ``missing_partitions``."""
    obj = snap.to_json()
    obj["missing_partitions"] = snap.missing_partitions
    return obj
