"""Folding a partition's changelog into data-file rows, on the executors, in Arrow.

A partition's records are folded into *newest row per key*; tombstones are kept while a later
fold may still need them to delete an older row, and dropped once the fold holds the partition's
whole history (a ``base`` file never contains tombstones, a ``delta`` file may).
"""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from statesnap.checkpoint import datafile, layout
from statesnap.checkpoint.datafile import latest_per_key
from statesnap.checkpoint.manifest import DataFile, FileKind
from statesnap.checkpoint.repository import CheckpointRepository
from statesnap.errors import CheckpointConflictError

__all__ = ["FOLD_ROWS", "ChangeFolder", "from_ipc", "to_ipc", "write_data_file"]

#: Fold pending records once this many have piled up (or more than the folded table holds): keeps
#: memory near the table's size instead of the history's, at O(n log n) total sorting work.
FOLD_ROWS = 1_000_000


class ChangeFolder:
    """Accumulates one partition's changes in offset order; :meth:`result` is newest-per-key.

    Start it from the partition's checkpointed contents (``start``) to get the full table with
    tombstones applied, or from nothing with ``keep_tombstones=True`` to get a delta.
    """

    def __init__(self, start: pa.Table | None = None, *, keep_tombstones: bool = False) -> None:
        self.keep_tombstones = keep_tombstones
        self._folded = start if start is not None else datafile.empty_table()
        self._pending: list[pa.Table] = []
        self._pending_rows = 0

    def add(self, changes: pa.Table) -> None:
        self._pending.append(changes)
        self._pending_rows += changes.num_rows
        if self._pending_rows >= max(FOLD_ROWS, self._folded.num_rows):
            self._fold()

    def _fold(self) -> None:
        if self._pending:
            self._folded = latest_per_key(
                [self._folded, *self._pending], keep_tombstones=self.keep_tombstones
            )
            self._pending = []
            self._pending_rows = 0

    def result(self) -> pa.Table:
        self._fold()
        if not self.keep_tombstones and self._folded.column("value").null_count:
            self._folded = self._folded.filter(pc.is_valid(self._folded.column("value")))
        return self._folded


def write_data_file(
    repo: CheckpointRepository, generation: int, partition: int, kind: str, n: int, rows: pa.Table
) -> DataFile:
    """Write one data file from a task (a base with its key index: see
    :meth:`CheckpointRepository.write_file`); a retried task finds its own file and reuses it.

    Safe because a file's name fixes its content: the same generation, partition and range
    always fold to the same rows, and :func:`datafile.encode` is deterministic. A base's index is
    not (its seed is random), but any index of the same name indexes the same rows: the one there
    is described, or written if the earlier attempt died before it.
    """
    try:
        return repo.write_file(generation, partition, kind, n, rows)
    except CheckpointConflictError:
        rel = layout.data_key(generation, partition, kind, n)
        data = repo.store.read(repo.key(rel))
        count = pq.read_metadata(pa.BufferReader(data)).num_rows
        base = kind == "base"
        return DataFile(
            rel,
            FileKind.BASE if base else FileKind.DELTA,
            count,
            len(data),
            hashlib.sha256(data).hexdigest(),
            index=repo.write_index(rel, datafile.sorted_rows(rows)) if base else None,
        )


def to_ipc(table: pa.Table) -> bytes:
    """Arrow IPC bytes: how folded partial results travel through a Spark shuffle."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.BufferReader(data)).read_all()
