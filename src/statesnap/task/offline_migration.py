"""Migrating a checkpoint offline: one generation's rows, brought to a new state version, written
as a new generation (``statesnap checkpoints migrate``).

The steps, in order: find the table and the source generation (the newest that verifies, or the
one asked for) and check it verifies, checksums included; say which migrations run (its recorded
state version up to the target, refused in one line when the versions do not match the ones asked
for); run them over every partition (a key moved out of its partition is refused, as when a
restore migrates); a dry run stops here with the counts and a sample. Otherwise pin the source
generation (a rollback point GC never deletes) and commit the migrated rows as a new generation,
numbered like any other (above the high-water mark), every partition a new base file, the manifest
recording the new state version. A table then restored by code of that version loads it as it is.

Two engines, one plan and one commit: in Python the migrated partitions are held in memory until
they are written; with a SparkSession (``spark=``, ``--engine spark``) every partition is read,
migrated and written by a Spark task of its own (:mod:`statesnap.spark.migration`), so a table
larger than one process's memory migrates too, and the driver holds only counts and samples.
"""

from __future__ import annotations

import importlib
import logging
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from statesnap.blob import BlobStore, open_blob_store
from statesnap.checkpoint.discovery import locate_table
from statesnap.checkpoint.manifest import UNVERSIONED, CheckpointManifest, PartitionCheckpoint
from statesnap.checkpoint.repository import CheckpointRepository
from statesnap.checkpoint.restore import CheckpointSelector
from statesnap.checkpoint.writer import PartitionUpdate
from statesnap.errors import (
    ConfigError,
    CorruptCheckpointError,
    SnapshotNotFoundError,
    StateVersionError,
)
from statesnap.kafka.config import KafkaSettings
from statesnap.kafka.partitioner import PartitionerSpec, resolve_partitioner
from statesnap.snapshot.api import SnapshotApi
from statesnap.task.migration import Migration, MigrationCounts, RowMigrator, StateVersion
from statesnap.task.write import WriteFiles, write_checkpoint

__all__ = ["OfflineMigration", "load_migration", "migrate_checkpoint"]

log = logging.getLogger(__name__)

#: Rows a dry run shows (changed or dropped ones, first found).
SAMPLE_ROWS = 5

#: How long the new generation's snapshot may stay open (another writer fails it after): the
#: Python engine writes what it has migrated; a Spark job migrates while the snapshot is open.
_SNAPSHOT_TIMEOUT = timedelta(minutes=5)
_SPARK_SNAPSHOT_TIMEOUT = timedelta(hours=2)


@dataclass(frozen=True, slots=True)
class OfflineMigration:
    """What ``migrate_checkpoint`` did (or, on a dry run, would do)."""

    table: str
    url: str
    source_generation: int
    from_version: int
    to_version: int
    counts: MigrationCounts
    dry_run: bool
    #: The new generation (None on a dry run).
    generation: int | None = None
    seconds: float = 0.0
    #: (partition, old key, old value, new key, new value); new ones None for a dropped row.
    samples: tuple[tuple[int, bytes, bytes, bytes | None, bytes | None], ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "location": self.url,
            "source_generation": self.source_generation,
            "generation": self.generation,
            "from_version": self.from_version,
            "to_version": self.to_version,
            "dry_run": self.dry_run,
            **self.counts.to_json(),
            "seconds": round(self.seconds, 3),
            "sample": [
                {
                    "partition": p,
                    "key": _shown(k),
                    "value": _shown(v),
                    "new_key": None if nk is None else _shown(nk),
                    "new_value": None if nv is None else _shown(nv),
                }
                for p, k, v, nk, nv in self.samples
            ],
        }

    def summary(self) -> str:
        counts = self.counts
        what = (
            f"dry run: generation {self.source_generation} of {self.table} would become"
            if self.dry_run
            else f"migrated generation {self.source_generation} of {self.table} (now pinned) into "
            f"generation {self.generation}:"
        )
        return (
            f"{what} state version {self.to_version} from {self.from_version}; "
            f"{counts.kept} kept, {counts.changed} changed, {counts.dropped} dropped"
        )


def migrate_checkpoint(
    checkpoints: str | BlobStore,
    table: str,
    migration: Migration | Mapping[int, Migration],
    *,
    from_version: int | None = None,
    to_version: int | None = None,
    generation: int | None = None,
    dry_run: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    cluster_id: str | None = None,
    partitioner: PartitionerSpec = "murmur2_random",
    snapshot_store: str | None = None,
    kafka: KafkaSettings | None = None,
    sample: int = SAMPLE_ROWS,
    spark: Any | None = None,
) -> OfflineMigration:
    """Migrate *generation* (default: the newest that verifies) of *table* into a new generation.

    *migration*: one function taking the source's rows from *from_version* (default 1) to
    *to_version* (default the next) in one step, or ``{v: fn}`` chained as
    ``Table(migrations=...)`` chains them, from the recorded version (or *from_version*) up to
    *to_version* (default: past the last step). The source must hold *from_version*: running the
    same migration twice is refused, not applied twice.
    The source generation is pinned before the new one is written. Refused, before anything is
    written: a missing or unverifiable generation, versions that do not match, a migration that
    moves a key out of its partition.
    """
    started = time.monotonic()
    blob = (
        open_blob_store(checkpoints, **dict(storage_options or {}))
        if isinstance(checkpoints, str)
        else checkpoints
    )
    blob.check(writable=not dry_run)
    repo = locate_table(blob, table, cluster_id)
    source = _source(repo, table, generation)
    found = source.state_version(table)
    if from_version is None and callable(migration):
        # One function says nothing of the versions it reads: it is taken to be the first
        # migration (1 → 2), so running the same command twice is refused, not applied twice.
        from_version = UNVERSIONED
    if from_version is not None and from_version != found:
        raise StateVersionError(
            f"{table}: generation {source.generation} holds state version {found}, not {from_version}"
            + (" (name the version a function reads with --from-version)" if callable(migration) else "")
        )
    if to_version is not None:
        target = to_version
    elif callable(migration):
        target = found + 1
    else:
        target = max(migration, default=found) + 1
    if target <= found:
        raise ConfigError(f"to version {target} must be above the checkpoint's state version {found}")
    if callable(migration):
        steps: tuple[Migration, ...] = (migration,)
    else:
        steps = StateVersion(target, migration).steps(found, store=table, generation=source.generation)
    descriptor = repo.descriptor() or {}
    partitions = int(descriptor.get("partitions") or 0) or (max(source.partitions, default=-1) + 1)
    migrator = RowMigrator(
        table, found, target, steps, resolve_partitioner(partitioner), partitions, sample_size=sample
    )

    def pin_source() -> None:  # before the new generation commits: GC may not take the source
        api = SnapshotApi.for_repo(repo, table, snapshot_store=snapshot_store, kafka=kafka)
        try:
            api.pin(source.generation)
        finally:
            api.close()

    updates: dict[int, PartitionUpdate] | WriteFiles
    if spark is None:
        updates = {}
        for p, rows in repo.iter_partitions(source):
            migrated = migrator.rows(p, rows)
            updates[p] = PartitionUpdate(p, source.partitions[p].position, base=migrated)
        counts, samples = migrator.counts, migrator.samples
        if not dry_run:
            pin_source()
    else:
        from statesnap.spark.migration import migrate_on_spark

        # A dry run's tasks migrate without writing. A real run's count and write in one pass once
        # the snapshot has begun (the files go into its generation): a refusal found by a task
        # then fails that snapshot (its files are orphans GC removes) and pins nothing.
        on_spark = migrate_on_spark(spark, repo, source, migrator, None) if dry_run else None
        counts, samples = (
            (on_spark.counts, on_spark.samples) if on_spark is not None else (migrator.counts, [])
        )

        def updates(generation: int) -> dict[int, PartitionCheckpoint]:
            done = migrate_on_spark(spark, repo, source, migrator, generation)
            counts.add(done.counts)
            samples.extend(done.samples)
            pin_source()
            return done.partitions

    def result(manifest: CheckpointManifest | None) -> OfflineMigration:
        """What was done: the new generation *manifest* committed, or (None) a dry run."""
        return OfflineMigration(
            table,
            repo.url,
            source.generation,
            found,
            target,
            counts,
            dry_run=manifest is None,
            generation=None if manifest is None else manifest.generation,
            seconds=time.monotonic() - started,
            samples=tuple(samples),
        )

    if dry_run:
        return result(None)
    manifest = write_checkpoint(
        repo,
        table=table,
        topic=source.topic,
        cluster_id=source.cluster_id,
        updates=updates,
        previous=source,
        engine="python" if spark is None else "spark",
        extra={
            "state_versions": {table: target},
            "migrated_from": {"generation": source.generation, "state_version": found},
            **({"topic_id": source.topic_id} if source.topic_id else {}),
        },
        snapshot_store=snapshot_store,
        kafka=kafka,
        # A Spark job over a table too large for one process runs while the snapshot is open.
        snapshot_timeout=_SPARK_SNAPSHOT_TIMEOUT if spark is not None else _SNAPSHOT_TIMEOUT,
    )
    log.info("%s: generation %d migrated into %d", repo.url, source.generation, manifest.generation)
    return result(manifest)


def _source(repo: CheckpointRepository, table: str, generation: int | None) -> CheckpointManifest:
    """The generation to migrate, verified as a restore would (checksums included)."""
    if generation is None:
        newest = CheckpointSelector(repo, table, require_checkpoint=True).newest_verified(
            None, datetime.now(UTC)
        )
        assert newest is not None  # require_checkpoint raises instead
        return newest
    verdict = repo.verify(generation, deep=True)
    if verdict.vanished:
        raise SnapshotNotFoundError(f"no generation {generation} of table {table!r} in {repo.shown}")
    if not verdict.ok or verdict.manifest is None:
        raise CorruptCheckpointError(
            f"generation {generation} of table {table!r} does not verify, not migrated: "
            + "; ".join(verdict.problems[:3])
        )
    return verdict.manifest


def _shown(data: bytes) -> str:
    """Bytes for a person: text where it is text, else hex (truncated either way)."""
    try:
        text = data.decode()
    except UnicodeDecodeError:
        text = data.hex()
    return text if len(text) <= 120 else text[:117] + "…"


def load_migration(spec: str) -> Migration | Mapping[int, Migration]:
    """The migration ``MODULE:NAME`` names (a function, or ``{v: fn}``), the module imported from
    the current directory or ``PYTHONPATH``; anything else is one :class:`ConfigError`."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{spec!r} is not MODULE:FUNCTION (as in mymigrations:v1_to_v2)")
    if "" not in sys.path:
        sys.path.insert(0, "")  # the current directory, as `python -m` imports from it
    try:
        found: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            found = getattr(found, part)
    except Exception as e:  # a missing module or name, or the user's module raising on import
        raise ConfigError(f"cannot load migration {spec!r}: {type(e).__name__}: {e}") from e
    if not callable(found) and not isinstance(found, Mapping):
        raise ConfigError(
            f"{spec!r} is a {type(found).__name__}, not a function or a {{version: function}} dict"
        )
    return found  # type: ignore[no-any-return]
