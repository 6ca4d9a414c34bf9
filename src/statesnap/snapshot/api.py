"""``SnapshotApi``: create, list, show, delete, pin and diff snapshots of one table.

The CLI's ``statesnap snapshot …`` commands are thin wrappers around it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from statesnap.blob import BlobStore, open_blob_store
from statesnap.checkpoint.layout import manifest_key
from statesnap.checkpoint.manifest import CheckpointManifest
from statesnap.checkpoint.repository import CheckpointRepository, discover_tables
from statesnap.durations import parse_duration
from statesnap.errors import (
    BlobNotFoundError,
    CheckpointError,
    ConfigError,
    SnapshotError,
    SnapshotNotFoundError,
)
from statesnap.snapshot.model import CheckpointRef, Snapshot, SnapshotState, TaskSnapshot
from statesnap.snapshot.orchestrator import LocalOrchestrator
from statesnap.snapshot.store import BlobSnapshotStore, SnapshotStore


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
    def open(cls, url: str | BlobStore, table: str, **storage_options: Any) -> SnapshotApi:
        """The API for *table* under a checkpoint root, found by its descriptor or manifests."""
        blob = open_blob_store(url, **storage_options) if isinstance(url, str) else url
        blob.check(writable=False)
        found = discover_tables(blob, table)
        if not found:
            raise CheckpointError(f"no table {table!r} under {blob.url}: start a Table over it first")
        if len(found) > 1:
            raise ConfigError(
                f"table {table!r} exists for several clusters under {blob.url}: "
                + ", ".join(loc.directory for loc in found)
            )
        repo = CheckpointRepository(blob, found[0].directory)
        described = repo.descriptor() or {}
        latest = repo.latest()
        topic = str(described.get("topic") or (latest.topic if latest else table))
        cluster_id = str(described.get("cluster_id") or (latest.cluster_id if latest else ""))
        count = int(described.get("partitions") or 0)
        partitions = tuple(range(count)) if count else tuple(sorted(latest.partitions) if latest else ())
        return cls(
            BlobSnapshotStore(blob, repo.directory),
            repo,
            table=table,
            topic=topic,
            cluster_id=cluster_id,
            partitions=partitions,
        )

    # --- life cycle ----------------------------------------------------------------------------

    def create(
        self,
        *,
        label: str | None = None,
        pin: bool = False,
        timeout: str | float | timedelta = "60s",
        expires_in: str | float | timedelta | None = None,
    ) -> Snapshot:
        """Start a new generation, or return the current one if it is still ``CREATED``."""
        if not self.partitions:
            raise SnapshotError(f"table {self.table!r} has no known partitions")
        now = self._clock()
        deadline = now + parse_duration(timeout)
        expires_at = None if expires_in is None else now + parse_duration(expires_in)
        floor = self.repo.next_generation() - 1

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

        return self.store.update_current(bump)

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

    # --- queries -------------------------------------------------------------------------------

    def current(self) -> Snapshot:
        return self.store.current(block=True)

    def list(self) -> list[Snapshot]:
        """Every snapshot, newest first, including checkpoints committed without a snapshot
        record (by the Spark engine, or by an older statesnap): every checkpoint is a snapshot."""
        records = {s.generation: s for s in self.store.list()}
        for gen, item in self.repo.manifests():
            if gen not in records and isinstance(item, CheckpointManifest):
                records[gen] = self._from_manifest(item)
        return [records[g] for g in sorted(records, reverse=True)]

    def get(self, generation: int) -> Snapshot:
        try:
            return self.store.get(generation)
        except SnapshotNotFoundError:
            try:
                return self._from_manifest(self.repo.read_manifest(generation))
            except BlobNotFoundError:
                raise SnapshotNotFoundError(
                    f"no snapshot generation {generation} in {self.repo.url}"
                ) from None

    def _from_manifest(self, manifest: CheckpointManifest) -> Snapshot:
        """A COMPLETED snapshot with one task, for a checkpoint that has no snapshot record."""
        engine = str(manifest.writer.get("engine", "python"))
        task = TaskSnapshot(
            engine,
            {(manifest.topic, p): pc.next_offset for p, pc in manifest.partitions.items()},
            {manifest.table: CheckpointRef(self.repo.url, manifest.partitions)},
            manifest.created_at,
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
        return self.store.update(
            generation, lambda s: None if s.pinned == pinned else s.evolve(pinned=pinned)
        )

    def unpin(self, generation: int) -> Snapshot:
        return self.pin(generation, pinned=False)

    def delete(self, generation: int) -> None:
        """Delete a snapshot's record and manifest; its files go at the next GC. Pinned snapshots
        and the snapshot in progress cannot be deleted."""
        snap = self.get(generation)
        if generation == self.current().generation:
            raise SnapshotError(
                f"snapshot {generation} is the current one; deleting it would let its generation be reused"
            )
        if snap.pinned:
            raise SnapshotError(f"snapshot {generation} is pinned; unpin it first")
        if snap.state is SnapshotState.CREATED:
            raise SnapshotError(f"snapshot {generation} is in progress; wait for it or let it time out")
        self.repo.store.delete([self.repo.key(manifest_key(generation))])
        with contextlib.suppress(SnapshotNotFoundError):
            self.store.delete(generation)

    def retained(self) -> set[int]:
        """Generations retention GC must keep: pinned or not yet expired."""
        now = self._clock()
        return {s.generation for s in self.list() if s.retained(now)}

    def restore_offsets(self, generation: int) -> dict[int, int]:
        """The per-partition offsets a table restored from *generation* resumes at."""
        try:
            return self.repo.read_manifest(generation).offsets
        except BlobNotFoundError as e:
            raise SnapshotNotFoundError(f"snapshot {generation} has no committed checkpoint") from e


def snapshot_json(snap: Snapshot) -> dict[str, Any]:
    """The CLI's ``--json`` shape: the record plus a ``tasks`` list and ``missing_partitions``."""
    obj = snap.to_json()
    obj["missing_partitions"] = snap.missing_partitions
    return obj
