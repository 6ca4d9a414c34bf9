"""Offline migration on Spark (``statesnap checkpoints migrate --engine spark``): one task per
partition reads the source generation's files (verified against its manifest), migrates the rows
and writes the partition's new base file (with its key index) into the new generation; the
driver only collects file descriptions, counts and samples, so no partition's rows ever cross
into the driver or the JVM. The planning, the pin and the commit are the Python engine's
(:mod:`statesnap.task.offline_migration`): this module only replaces its loop over partitions.

A migration that moves a key out of its partition is refused in the task; the task returns the
refusal instead of raising, so the driver raises the same one-line :class:`MigrationError` as
the Python engine (not a Spark stack trace).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from statesnap.checkpoint.manifest import CheckpointManifest, DataFile, PartitionCheckpoint
from statesnap.checkpoint.partition_files import checked_merge
from statesnap.checkpoint.repository import CheckpointRepository
from statesnap.errors import MigrationError
from statesnap.spark.changes import write_data_file
from statesnap.task.migration import MigrationCounts, RowMigrator

__all__ = ["SparkMigration", "migrate_on_spark", "ship_by_value"]

Sample = tuple[int, bytes, bytes, bytes | None, bytes | None]


@dataclass(slots=True)
class SparkMigration:
    """What the job did: every partition's new entry (none on a dry run), the counts summed over
    the tasks and the first samples in partition order."""

    partitions: dict[int, PartitionCheckpoint] = field(default_factory=dict)
    counts: MigrationCounts = field(default_factory=MigrationCounts)
    samples: list[Sample] = field(default_factory=list)


def migrate_on_spark(
    spark: Any,
    repo: CheckpointRepository,
    source: CheckpointManifest,
    migrator: RowMigrator,
    generation: int | None,
) -> SparkMigration:
    """Migrate every partition of *source* in a Spark task of its own, writing each new base into
    *generation* (None: a dry run, nothing written). *migrator* is copied to every task; its own
    counts and samples stay empty (the result has them)."""
    run = secrets.randbits(48)  # names this run's files apart from a crashed run's in the generation
    entries = sorted(source.partitions.values(), key=lambda pc: pc.partition)

    def migrate(
        pc: PartitionCheckpoint,
    ) -> tuple[int, str | None, dict[str, Any] | None, dict[str, int], list[Sample]]:
        local = RowMigrator(
            migrator.store,
            migrator.source,
            migrator.target,
            migrator.steps,
            migrator.partition_of,
            migrator.partitions,
            sample_size=migrator.sample_size,
        )
        files = [repo.read_file(f) for f in pc.files]
        rows = checked_merge(pc, files, source=f"{repo.shown} p{pc.partition}")
        try:
            migrated = local.rows(pc.partition, rows)
        except MigrationError as e:
            return pc.partition, str(e), None, {}, []
        written = None
        if generation is not None:
            written = write_data_file(repo, generation, pc.partition, "base", run, migrated).to_json()
        return pc.partition, None, written, local.counts.to_json(), local.samples

    result = SparkMigration()
    if not entries:
        return result
    sc = spark.sparkContext
    collected = sc.parallelize(entries, len(entries)).map(migrate).collect()
    for partition, refused, written, counts, samples in sorted(collected, key=lambda item: item[0]):
        if refused is not None:
            raise MigrationError(refused)
        result.counts.add(MigrationCounts(**counts))
        result.samples.extend(samples[: max(0, migrator.sample_size - len(result.samples))])
        if written is not None:
            pc = source.partitions[partition]
            new = DataFile.from_json(written)
            result.partitions[partition] = PartitionCheckpoint(
                partition, pc.next_offset, (new,), keys=new.rows, leader_epoch=pc.leader_epoch
            )
    return result


def ship_by_value(module: str) -> None:
    """Send *module*'s functions to Spark's workers by value, not by name: a migration the CLI
    imported from the current directory is not importable by a cluster's workers."""
    import importlib

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(importlib.import_module(module))  # type: ignore[no-untyped-call]
