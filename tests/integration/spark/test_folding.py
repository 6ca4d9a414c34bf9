"""The pure parts of the Spark jobs: splitting ranges, folding changes, the batch journal.

No Spark session or broker; they live here because importing ``statesnap.spark`` needs pyspark.
The folding property is the equivalence invariant in miniature: however a partition's changelog
is cut into tasks and chunks, folding it equals replaying it record by record.
"""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import pairwise

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statesnap.checkpoint import datafile
from statesnap.checkpoint.datafile import latest_per_key
from statesnap.checkpoint.journal import BatchEntry, BatchRange, journal_id, pending_entries
from statesnap.checkpoint.manifest import CheckpointManifest, DataFile, FileKind, PartitionCheckpoint
from statesnap.spark.changes import ChangeFolder, from_ipc, to_ipc
from statesnap.spark.kafka_io import split_ranges

pytestmark = [pytest.mark.spark]

Change = tuple[int, int | None]  # key id, value id (None = tombstone)


def _rows(changes: list[Change], first_offset: int) -> pa.Table:
    return pa.table(
        [
            pa.array([b"k%d" % k for k, _v in changes], pa.binary()),
            pa.array([None if v is None else b"v%d" % v for _k, v in changes], pa.binary()),
            pa.array(range(first_offset, first_offset + len(changes)), pa.int64()),
            pa.array([None] * len(changes), pa.timestamp("ms")),
        ],
        schema=datafile.SCHEMA,
    )


def _as_dict(table: pa.Table) -> dict[bytes, bytes]:
    return dict(zip(table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True))


@settings(max_examples=150, deadline=None)
@given(
    changes=st.lists(st.tuples(st.integers(0, 12), st.none() | st.integers(0, 99)), max_size=120),
    cuts=st.lists(st.integers(0, 120), max_size=4),
    chunk=st.integers(1, 40),
    base_size=st.integers(0, 30),
)
def test_folding_any_cut_of_a_changelog_equals_replaying_it(
    changes: list[Change], cuts: list[int], chunk: int, base_size: int
) -> None:
    """Bootstrap's plan: a checkpointed base, then splits (the first folds onto the base and
    drops tombstones, later ones keep them), each read in chunks, then merged in order."""
    expected: dict[bytes, bytes] = {}
    for k, v in changes:
        if v is None:
            expected.pop(b"k%d" % k, None)
        else:
            expected[b"k%d" % k] = b"v%d" % v
    base_changes, rest = changes[:base_size], changes[base_size:]
    base = datafile.merge([latest_per_key([_rows(base_changes, 0)], keep_tombstones=False)])
    bounds = sorted({0, len(rest), *(c for c in cuts if c < len(rest))})
    parts = []
    for i, (a, b) in enumerate(pairwise(bounds)):
        folder = ChangeFolder(base if i == 0 else None, keep_tombstones=i > 0)
        for s in range(a, b, chunk):
            folder.add(_rows(rest[s : min(s + chunk, b)], len(base_changes) + s))
        parts.append(from_ipc(to_ipc(folder.result())))
    final = latest_per_key(parts or [base], keep_tombstones=False)
    assert _as_dict(final) == expected
    assert final.num_rows == len(expected)
    encoded = datafile.decode(datafile.encode(final).data)  # what a base file holds: sorted
    assert encoded.column("key").to_pylist() == sorted(expected)


def test_split_ranges_gives_every_core_work_but_not_tiny_tasks() -> None:
    assert split_ranges({0: (0, 100)}, min_partitions=4, max_records=None) == [
        (0, 0, 25),
        (0, 25, 50),
        (0, 50, 75),
        (0, 75, 100),
    ]
    assert split_ranges({0: (0, 100), 1: (5, 5)}, min_partitions=None, max_records=40) == [
        (0, 0, 33),
        (0, 33, 66),
        (0, 66, 100),
    ]
    assert split_ranges({0: (0, 100)}, min_partitions=8, max_records=None, min_split=30) == [
        (0, 0, 50),
        (0, 50, 100),
    ]
    pieces = split_ranges({0: (0, 1000), 1: (0, 10)}, min_partitions=5, max_records=None)
    assert sum(e - s for _p, s, e in pieces) == 1010
    assert len(pieces) >= 5


def _manifest(offsets: dict[int, int]) -> CheckpointManifest:
    return CheckpointManifest(
        "t", "topic", "c", 1, {p: PartitionCheckpoint(p, o) for p, o in offsets.items()}, datetime.now(UTC)
    )


def _file(name: str) -> DataFile:
    """A delta file named *name* in generation 7 (the shape every writer uses)."""
    return DataFile(f"data/{7:020d}/{name}.parquet", FileKind.DELTA, 1, 1, "0" * 64)


def test_journal_keeps_only_entries_that_continue_the_checkpoint() -> None:
    done = BatchEntry(3, {0: BatchRange(0, 10, _file("a"))})
    next1 = BatchEntry(4, {0: BatchRange(10, 20, _file("b")), 1: BatchRange(0, 5, None)})
    next2 = BatchEntry(5, {0: BatchRange(20, 30, _file("c"))})
    pending, obsolete = pending_entries(
        [done, next1, next2], _manifest({0: 10, 1: 0}), {_file(n).path for n in "abc"}
    )
    assert [e.batch_id for e in pending] == [4, 5]
    assert [e.batch_id for e in obsolete] == [3]
    # A file GC took, or a gap, ends the chain: those batches are read again instead.
    pending, obsolete = pending_entries(
        [done, next1, next2], _manifest({0: 10, 1: 0}), {_file(n).path for n in "ac"}
    )
    assert pending == []
    assert [e.batch_id for e in obsolete] == [3, 4, 5]
    pending, _ = pending_entries([next2], _manifest({0: 10}), {_file("c").path})
    assert pending == []
    entry = BatchEntry.from_bytes(next1.to_bytes(), "x")
    assert entry == next1
    assert journal_id("/a/b") == journal_id("/a/b/") != journal_id("/a/c")
