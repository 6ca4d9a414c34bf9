"""A partition's decoded files, checked against what its manifest entry claims.

Every file's checksum may match and the manifest still be wrong (edited by hand, or by a writer's
bug), so a restore checks the files add up: each holds the rows the manifest says, every row's
offset lies below the partition's next offset, a delta holds only records newer than the base's
(a base covers everything below a checkpoint's offsets, a delta what came after; deltas may
overlap each other when a partition was restored and replayed between two checkpoints), and the
partition has the keys the manifest claims.

A partition is usually merged into one table (:func:`checked_merge`). A store that keeps the
base's rows and looks keys up in them through the base's persisted key index (the columnar
store) takes the partition *split* instead (:func:`split_or_merge`): the base as written, its
index, and the deltas' newest row per key (tombstones kept) to lay over it, so an incremental
checkpoint restores without hashing or sorting the base. The key count is then checked on what
the store holds (:meth:`DecodedPartition.check_keys`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc_compute

from statesnap.checkpoint import datafile
from statesnap.checkpoint.manifest import CheckpointManifest, FileKind, PartitionCheckpoint
from statesnap.errors import CorruptCheckpointError
from statesnap.keys.index import KeyIndex

__all__ = ["DecodedPartition", "check_files", "checked_merge", "split_or_merge", "splittable"]

#: A partition is split only while its deltas hold at most this share of its base's rows: past
#: it, laying them over the base costs about what merging them in does (and the writer soon
#: writes a new base: see CheckpointOptions' delta rules).
_SPLIT_SHARE = 1


@dataclass(frozen=True, slots=True)
class DecodedPartition:
    """A partition of *manifest*, verified: its rows merged (``changes`` None), or its base with
    the base's key index and the newest delta row per key to lay over it (tombstones as null
    values). *index* names *rows* by position: rows made anew from them must not be given it."""

    manifest: CheckpointManifest
    partition: int
    rows: pa.Table
    index: KeyIndex | None = None
    changes: pa.Table | None = None
    source: str = ""

    @property
    def entry(self) -> PartitionCheckpoint:
        return self.manifest.partitions[self.partition]

    def merged(self) -> pa.Table:
        """The partition's table: base and changes merged, the key count checked."""
        if self.changes is None:
            return self.rows
        merged = datafile.merge([self.rows, self.changes])
        self.check_keys(merged.num_rows)
        return merged

    def check_keys(self, keys: int) -> None:
        """Refuse a partition whose files merge to *keys* keys where the manifest claims others."""
        check_keys(self.entry, keys, self.source)


def check_files(pc: PartitionCheckpoint, tables: list[pa.Table], *, source: str) -> None:
    """Refuse files that do not add up to the manifest entry *pc* (all but the key count)."""
    base_newest = -1
    for f, table in zip(pc.files, tables, strict=True):
        where = f"{source}/{f.path}"
        if table.num_rows != f.rows:
            raise CorruptCheckpointError(f"{where}: {table.num_rows} rows, the manifest says {f.rows}")
        if not table.num_rows:
            continue
        bounds = pc_compute.min_max(table.column("offset"))
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if low is None or high is None:
            continue
        end = pc.next_offset if f.next_offset is None else f.next_offset
        if high >= end:
            raise CorruptCheckpointError(f"{where}: holds offset {high}, at or past the next offset {end}")
        if f.kind is FileKind.BASE:
            base_newest = high
        elif low <= base_newest:
            raise CorruptCheckpointError(
                f"{where}: delta holds offset {low}, not newer than its base's {base_newest} "
                "(files out of order or from another partition)"
            )


def check_keys(pc: PartitionCheckpoint, keys: int, source: str) -> None:
    if pc.keys is not None and keys != pc.keys:
        raise CorruptCheckpointError(
            f"{source}: partition {pc.partition} merges to {keys} keys, the manifest says "
            f"{pc.keys} (a file missing from the manifest?)"
        )


def checked_merge(pc: PartitionCheckpoint, tables: list[pa.Table], *, source: str) -> pa.Table:
    """Merge a partition's decoded files, refusing files that do not add up to the manifest."""
    check_files(pc, tables, source=source)
    merged = datafile.merge(tables)
    check_keys(pc, merged.num_rows, source)
    return merged


def splittable(pc: PartitionCheckpoint) -> bool:
    """Whether a store with the base's key index would take *pc* split: a base with an index,
    then deltas of at most :data:`_SPLIT_SHARE` times its rows (none at all is fine)."""
    files = pc.files
    return (
        bool(files)
        and files[0].kind is FileKind.BASE
        and files[0].index is not None
        and all(f.kind is FileKind.DELTA for f in files[1:])
        and sum(f.rows for f in files[1:]) <= files[0].rows * _SPLIT_SHARE
    )


def split_or_merge(
    manifest: CheckpointManifest,
    partition: int,
    tables: list[pa.Table],
    index: KeyIndex | None,
    *,
    source: str,
) -> DecodedPartition:
    """The partition's files checked, then split over its base's *index* (see
    :func:`splittable`) unless the base holds tombstones (the index names the base's rows as
    written); merged otherwise, keeping the index only for a base that is the whole partition."""
    pc = manifest.partitions[partition]
    check_files(pc, tables, source=source)
    base, deltas = tables[0] if tables else None, tables[1:]
    if index is not None and base is not None and splittable(pc) and not base.column("value").null_count:
        if not deltas:
            check_keys(pc, base.num_rows, source)
            return DecodedPartition(manifest, partition, base, index, None, source)
        changes = datafile.latest_per_key(deltas, keep_tombstones=True)
        return DecodedPartition(manifest, partition, base, index, changes, source)
    merged = datafile.merge(tables)
    check_keys(pc, merged.num_rows, source)
    return DecodedPartition(manifest, partition, merged, None, None, source)
