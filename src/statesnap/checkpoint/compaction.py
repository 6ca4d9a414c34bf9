"""The compaction rule: when a partition's next file is a new base instead of another delta.

It sits beside the format it reasons about (:class:`~statesnap.checkpoint.manifest.DataFile` and
its kinds) because every writer obeys it — Python tasks and the Spark streaming materializer —
and a restore's cost (base + every delta, merge-on-read) depends on it.
"""

from __future__ import annotations

from statesnap.checkpoint.manifest import DataFile, FileKind

__all__ = ["COMPACT_AFTER", "needs_base"]

#: A partition whose checkpoint holds more delta files than this gets a new base instead.
COMPACT_AFTER = 8


def needs_base(files: tuple[DataFile, ...], max_deltas: int = COMPACT_AFTER - 1) -> bool:
    """Whether a partition's next file should be a new base: more than *max_deltas* delta files,
    or more delta than base bytes, so a restore would read much more than the table. The one
    compaction rule of every writer (Python tasks and the Spark streaming materializer)."""
    deltas = [f for f in files if f.kind == FileKind.DELTA]
    base_bytes = sum(f.bytes for f in files if f.kind == FileKind.BASE)
    return len(deltas) > max_deltas or (
        bool(deltas) and sum(f.bytes for f in deltas) > max(base_bytes, 1 << 20)
    )
