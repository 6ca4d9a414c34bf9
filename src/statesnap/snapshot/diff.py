"""What changed between two snapshots: keys added, removed and changed.

Runs on Arrow in this process (a hash join over the two checkpoints' merged rows); for tables
larger than memory, :func:`statesnap.spark.diff` does the same join on Spark.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from statesnap.checkpoint.repository import CheckpointRepository
from statesnap.errors import BlobNotFoundError, SnapshotNotFoundError
from statesnap.processor.keyspace import META_STORE, store_prefix

__all__ = ["SAMPLE", "SnapshotDiff", "diff_snapshots", "load_rows"]


@dataclass(frozen=True, slots=True)
class SnapshotDiff:
    """Counts, plus up to ``sample`` example keys of each kind."""

    old: int
    new: int
    added: int
    removed: int
    changed: int
    unchanged: int
    examples: dict[str, list[str]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "old": self.old,
            "new": self.new,
            "added": self.added,
            "removed": self.removed,
            "changed": self.changed,
            "unchanged": self.unchanged,
            "examples": self.examples,
        }


def load_rows(repo: CheckpointRepository, generation: int) -> pa.Table:
    """Every (key, value) of a checkpoint, all partitions merged; a generation that is gone (deleted,
    collected) is :class:`SnapshotNotFoundError`, as ``snapshot show`` and ``delete`` say."""
    try:
        manifest = repo.read_manifest(generation)
    except BlobNotFoundError:
        raise SnapshotNotFoundError(f"no snapshot generation {generation} in {repo.url}") from None
    parts = [rows.select(["key", "value"]) for _p, rows in repo.iter_partitions(manifest)]
    if not parts:
        return pa.table({"key": pa.array([], pa.binary()), "value": pa.array([], pa.binary())})
    rows = pa.concat_tables(parts)
    if "processor" in manifest.writer:  # a processor's own bookkeeping (stream time) is no state
        bookkeeping = pc.starts_with(rows.column("key").cast(pa.binary()), store_prefix(META_STORE).decode())
        rows = rows.filter(pc.invert(bookkeeping))
    return rows


def _keys(table: pa.Table, mask: pa.ChunkedArray, column: str, sample: int) -> list[str]:
    chosen = table.filter(mask).column(column).slice(0, sample).to_pylist()
    return [k.decode("utf-8", "backslashreplace") for k in chosen]


#: Example keys of each kind a diff shows, on either engine.
SAMPLE = 5


def diff_snapshots(repo: CheckpointRepository, old: int, new: int, *, sample: int = SAMPLE) -> SnapshotDiff:
    """Compare generation *old* with generation *new* of the same table."""
    a = load_rows(repo, old).rename_columns(["key", "old_value"])
    b = load_rows(repo, new).rename_columns(["key_new", "new_value"])
    joined = a.join(b, keys="key", right_keys="key_new", join_type="full outer", coalesce_keys=False)
    has_old = pc.is_valid(joined.column("key"))
    has_new = pc.is_valid(joined.column("key_new"))
    both = pc.and_(has_old, has_new)
    same = pc.fill_null(pc.equal(joined.column("old_value"), joined.column("new_value")), False)
    added = pc.and_(pc.invert(has_old), has_new)
    removed = pc.and_(has_old, pc.invert(has_new))
    changed = pc.and_(both, pc.invert(same))

    def count(mask: Any) -> int:
        return int(pc.sum(pc.cast(mask, pa.int64())).as_py() or 0)

    return SnapshotDiff(
        old=a.num_rows,
        new=b.num_rows,
        added=count(added),
        removed=count(removed),
        changed=count(changed),
        unchanged=count(pc.and_(both, same)),
        examples={
            "added": _keys(joined, added, "key_new", sample),
            "removed": _keys(joined, removed, "key", sample),
            "changed": _keys(joined, changed, "key", sample),
        },
    )
