"""Cloning one generation of a table (or processor) into a new table: blue/green from a snapshot.

The clone is a table of its own: its own directory (``<cluster-id>_<new name>``), descriptor,
copies of the generation's data files, manifest and snapshot record. Data files are copied
server-side on S3, hard-linked (or copied) on a filesystem, read and written between stores that
cannot copy between each other; either way each side owns separate objects, so GC, ``snapshot
delete`` or a wipe of one side never deletes a file the other lists.

The steps, in order: refuse (bad name, missing or unfinished generation, existing target) before
writing anything; verify the source generation as a restore would (checksums included); claim
the target by writing its descriptor (write-once); copy the data files (a failure removes what
was written, so the clone can be run again); commit the manifest (write-once: the clone exists from
here on, exactly when a checkpoint does); record the generation as COMPLETED in the target's
snapshot store. The clone keeps the generation number and the files' paths, so the manifest's
file list is unchanged and only what names the table (the descriptor's and manifest's ``table``)
is rewritten. A new application started with the new name restores it and continues above it.

The clone is **not pinned** by default: it is the newest (indeed the only) checkpoint of its
table, which GC never deletes; once the new application writes newer checkpoints it ages out under
that application's retention like any other checkpoint, rather than keeping a full copy of the
state forever because nobody remembered to unpin it. ``pin=True`` keeps it as a rollback point.
"""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from statesnap.blob import BlobStore, copy_blob, open_blob_store
from statesnap.checkpoint import layout
from statesnap.checkpoint.discovery import locate_table
from statesnap.checkpoint.manifest import CheckpointManifest, canonical_checksum
from statesnap.checkpoint.repository import IO_THREADS, CheckpointRepository
from statesnap.errors import (
    BlobExistsError,
    CheckpointConflictError,
    ConfigError,
    CorruptCheckpointError,
    SnapshotError,
    SnapshotNotFoundError,
)
from statesnap.kafka.config import KafkaSettings
from statesnap.snapshot.api import SnapshotApi
from statesnap.snapshot.factory import open_snapshot_store
from statesnap.snapshot.model import CheckpointRef, Snapshot, SnapshotState, TaskSnapshot
from statesnap.snapshot.store import resolve_spec

__all__ = ["CloneResult", "clone_generation"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CloneResult:
    """What a clone made: the new table's directory and generation, and how its files were copied
    (``link``/``copy`` on a filesystem, ``server`` on S3, ``bytes`` through this process).
    ``source``/``location`` are absolute identities (``to_json``); ``shown`` the two as the user
    gave them, which the summary prints."""

    table: str
    generation: int
    source: str
    location: str
    files: int
    bytes: int
    copied: dict[str, int]
    pinned: bool
    seconds: float
    shown: tuple[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "generation": self.generation,
            "source": self.source,
            "location": self.location,
            "files": self.files,
            "bytes": self.bytes,
            "copied": dict(sorted(self.copied.items())),
            "pinned": self.pinned,
            "seconds": round(self.seconds, 3),
        }

    def summary(self) -> str:
        how = ", ".join(f"{n} {k}" for k, n in sorted(self.copied.items())) or "no files"
        pin = ", pinned" if self.pinned else ""
        source, location = self.shown if self.shown is not None else (self.source, self.location)
        return (
            f"cloned {source} generation {self.generation} into table {self.table!r} at "
            f"{location} ({self.files} files, {self.bytes} bytes: {how}{pin})"
        )


def clone_generation(
    source: str | BlobStore,
    table: str,
    generation: int,
    to_table: str,
    *,
    to: str | BlobStore | None = None,
    storage_options: dict[str, Any] | None = None,
    to_storage_options: dict[str, Any] | None = None,
    cluster_id: str | None = None,
    snapshot_store: str | None = None,
    to_snapshot_store: str | None = None,
    kafka: KafkaSettings | None = None,
    pin: bool = False,
    label: str | None = None,
) -> CloneResult:
    """Clone *generation* of *table* into the new table *to_table* (under *to*, default the same
    root). Refused with a typed one-line error, before anything is written: an invalid or
    existing target name (:class:`ConfigError`, :class:`CheckpointConflictError`), a generation
    that does not exist (:class:`SnapshotNotFoundError`) or is not COMPLETED
    (:class:`SnapshotError`), one that fails verification (:class:`CorruptCheckpointError`).

    The target's snapshot store is *to_snapshot_store*, by default the source's kind (a topic
    store keeps the clone's records under the new table's name; it needs *kafka*).
    """
    started = time.monotonic()
    if not isinstance(to_table, str) or not layout.valid_table_name(to_table):
        raise ConfigError(f"invalid target table name {to_table!r}: use 1-200 letters, digits, '.', '_', '-'")
    source_blob = open_blob_store(source, **(storage_options or {})) if isinstance(source, str) else source
    source_blob.check(writable=False)
    if to is None:
        target_blob = source_blob
    elif isinstance(to, str):
        target_blob = open_blob_store(to, **(to_storage_options or storage_options or {}))
    else:
        target_blob = to
    repo = locate_table(source_blob, table, cluster_id)
    api = SnapshotApi.for_repo(repo, table, snapshot_store=snapshot_store, kafka=kafka)
    try:
        record = api.get(generation)  # SnapshotNotFoundError naming it
        if record.state is not SnapshotState.COMPLETED:
            raise SnapshotError(
                f"generation {generation} of table {table!r} is {record.state.value}, not COMPLETED: only "
                "a completed snapshot can be cloned"
            )
        manifest = _verified(repo, table, generation)
        source_spec = resolve_spec(snapshot_store, (repo.descriptor() or {}).get("snapshot_store"), table)
    finally:
        api.close()
    target = CheckpointRepository.for_table(target_blob, manifest.cluster_id, to_table)
    if target.url == repo.url or target.descriptor() is not None or target_blob.list(target.directory + "/"):
        raise CheckpointConflictError(
            f"table {to_table!r} already exists at {target.shown}: clone into a new table name"
        )
    target_blob.check(writable=True)
    spec = resolve_spec(to_snapshot_store, str(source_spec), to_table)
    snapshots = open_snapshot_store(
        spec, blob=target_blob, directory=target.directory, table=to_table, kafka=kafka
    )
    try:
        if snapshots.current(block=True).generation != 0:
            raise CheckpointConflictError(
                f"table {to_table!r} already has snapshot records in {spec}: clone into a new table name"
            )
        # The descriptor claims the target (write-once): a concurrent clone into the same name
        # is refused here, before it copies anything, so the clean-up below only ever removes
        # what this call wrote.
        _write_descriptor(repo, target, manifest, to_table, str(spec))
        try:
            copied = _copy_files(repo, target, manifest)
        except BaseException:
            _remove_partial(target)
            raise
        cloned = replace(
            manifest,
            table=to_table,
            created_at=datetime.now(UTC),
            writer={
                **manifest.writer,
                "cloned_from": {"table": table, "generation": generation, "location": repo.url},
            },
        )
        try:
            target.commit(cloned)
        except CheckpointConflictError as e:
            raise CheckpointConflictError(
                f"table {to_table!r} at {target.shown} was created meanwhile: clone into a new table name"
            ) from e
        pinned_record = _record(
            record, table, cloned, target, to_table, pin, label or f"clone of {table}@{generation}"
        )

        def install(current: Snapshot) -> Snapshot:
            if current.generation != 0:
                raise CheckpointConflictError(f"table {to_table!r} got a snapshot record meanwhile")
            return pinned_record

        snapshots.update_current(install)
    finally:
        closer = getattr(snapshots, "close", None)
        if callable(closer):
            closer()
    log.info("cloned %s generation %d into %s", repo.url, generation, target.url)
    return CloneResult(
        to_table,
        generation,
        repo.url,
        target.url,
        len(manifest.all_files),
        manifest.total_bytes,
        copied,
        pin,
        time.monotonic() - started,
        (repo.shown, target.shown),
    )


def _verified(repo: CheckpointRepository, table: str, generation: int) -> CheckpointManifest:
    """The generation's manifest once it verifies as a restore would (files, sizes, checksums)."""
    verdict = repo.verify(generation, deep=True)
    if verdict.vanished:
        raise SnapshotNotFoundError(
            f"generation {generation} of table {table!r} has no checkpoint manifest in {repo.shown}"
        )
    if not verdict.ok or verdict.manifest is None:
        raise CorruptCheckpointError(
            f"generation {generation} of table {table!r} does not verify, not cloned: "
            + "; ".join(verdict.problems[:3])
        )
    return verdict.manifest


def _copy_files(
    repo: CheckpointRepository, target: CheckpointRepository, manifest: CheckpointManifest
) -> dict[str, int]:
    """Every file of the manifest (data files and key indexes) at the same path under the target;
    counts per method."""

    def one(path: str) -> str:
        return copy_blob(repo.store, repo.key(path), target.store, target.key(path))

    copied: dict[str, int] = {}
    with ThreadPoolExecutor(IO_THREADS, thread_name_prefix="statesnap-clone") as pool:
        for how in pool.map(one, [f.path for f in manifest.all_files]):
            copied[how] = copied.get(how, 0) + 1
    return copied


def _remove_partial(target: CheckpointRepository) -> None:
    """Undo a clone that failed before its manifest (a source file deleted meanwhile, a store
    error): its files and descriptor go, so the same clone can simply be run again."""
    try:
        keys = [b.key for b in target.store.list(target.directory + "/")]
        target.store.delete([k for k in keys if k != target.key(layout.DESCRIPTOR)])
        target.store.delete([target.key(layout.DESCRIPTOR)])
    except Exception:  # the original error is the one to report
        log.warning(
            "could not remove the partial clone at %s; delete it by hand", target.shown, exc_info=True
        )


def _write_descriptor(
    repo: CheckpointRepository,
    target: CheckpointRepository,
    manifest: CheckpointManifest,
    to_table: str,
    spec: str,
) -> None:
    """The source's descriptor naming the new table (write-once, like every descriptor)."""
    body: dict[str, Any] = {
        k: v for k, v in (repo.descriptor() or {}).items() if k not in {"checksum", "table", "cluster_id"}
    }
    body.update(
        table=to_table,
        topic=body.get("topic", manifest.topic),
        cluster_id=manifest.cluster_id,
        partitions=body.get("partitions", len(manifest.partitions)),
        snapshot_store=spec,
    )
    body["checksum"] = canonical_checksum(body)
    try:
        target.store.write(target.key(layout.DESCRIPTOR), json.dumps(body).encode(), if_absent=True)
    except BlobExistsError as e:
        raise CheckpointConflictError(f"table {to_table!r} at {target.shown} was created meanwhile") from e


def _record(
    source: Snapshot,
    table: str,
    manifest: CheckpointManifest,
    target: CheckpointRepository,
    to_table: str,
    pin: bool,
    label: str,
) -> Snapshot:
    """The clone's COMPLETED record: the source's tasks and offsets, every checkpoint reference
    pointing at the target's directory and named after the new table."""
    now = datetime.now(UTC)
    tasks = {
        task_id: TaskSnapshot(
            task.task_id,
            task.offsets,
            {
                (to_table if name == table else name): CheckpointRef(target.url, ref.partitions)
                for name, ref in task.checkpoints.items()
            },
            task.reported_at,
            task.writer,
        )
        for task_id, task in source.tasks.items()
    }
    if not tasks:  # a checkpoint written without a record: one task, as the API shows it
        tasks = {
            "clone": TaskSnapshot(
                "clone",
                {(manifest.topic, p): pc.next_offset for p, pc in manifest.partitions.items()},
                {to_table: CheckpointRef(target.url, manifest.partitions)},
                now,
                {"engine": "clone"},
            )
        }
    return Snapshot(
        generation=manifest.generation,
        state=SnapshotState.COMPLETED,
        created_at=now,
        updated_at=now,
        expected_partitions=source.expected_partitions or tuple(sorted(manifest.partitions)),
        tasks=tasks,
        label=label,
        pinned=pin,
    )
