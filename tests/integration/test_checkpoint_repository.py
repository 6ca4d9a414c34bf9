"""The checkpoint repository and writer on both blob stores: commit is write-once, data before
manifest, incremental (delta) files merge on read, and what a writer returns is what readers read."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pyarrow as pa
import pytest

from statesnap.blob import open_blob_store
from statesnap.checkpoint import CheckpointRepository, PartitionUpdate, discover_tables
from statesnap.checkpoint.datafile import SCHEMA
from statesnap.errors import CheckpointConflictError
from statesnap.task.write import write_checkpoint

pytestmark = pytest.mark.integration


def _rows(items: list[tuple[bytes, bytes | None, int]]) -> pa.Table:
    return pa.table(
        {
            "key": [k for k, _, _ in items],
            "value": [v for _, v, _ in items],
            "offset": [o for _, _, o in items],
            "timestamp": [None] * len(items),
        },
        schema=SCHEMA,
    )


@pytest.fixture
def repo(checkpoint_location: Any) -> CheckpointRepository:
    store = open_blob_store(checkpoint_location.url, **checkpoint_location.options)
    return CheckpointRepository.for_table(store, "cluster-x", f"tbl{uuid.uuid4().hex[:6]}")


def _write(repo: CheckpointRepository, updates: dict[int, PartitionUpdate], previous: Any = None) -> Any:
    table = repo.directory.rsplit("/", 1)[-1].removeprefix("cluster-x_")
    return write_checkpoint(
        repo, table=table, topic="topic", cluster_id="cluster-x", updates=updates, previous=previous
    )


def test_incremental_checkpoints_merge_on_read(repo: CheckpointRepository) -> None:
    first = _write(
        repo,
        {
            0: PartitionUpdate(0, 3, base=_rows([(b"a", b"1", 0), (b"b", b"1", 1), (b"c", b"1", 2)])),
            1: PartitionUpdate(1, 1, base=_rows([(b"z", b"1", 0)])),
        },
    )
    assert first.generation == 1
    second = _write(
        repo,
        {
            0: PartitionUpdate(0, 5, delta=_rows([(b"a", b"2", 3), (b"b", None, 4)])),
            1: PartitionUpdate(1, 1),  # unchanged: its file is referenced again, not rewritten
        },
        previous=first,
    )
    assert second.generation == 2
    assert [f.kind for f in second.partitions[0].files] == ["base", "delta"]
    assert second.partitions[1].files == first.partitions[1].files
    assert second.offsets == {0: 5, 1: 1}
    p0 = repo.load_partition(repo.read_manifest(2), 0)
    assert list(zip(p0.column("key").to_pylist(), p0.column("value").to_pylist(), strict=True)) == [
        (b"a", b"2"),
        (b"c", b"1"),
    ]
    assert dict(repo.iter_partitions(second)).keys() == {0, 1}
    assert repo.verify(2).ok
    assert repo.latest() == repo.read_manifest(2)


def test_a_writer_returns_exactly_what_readers_read(repo: CheckpointRepository) -> None:
    """The manifest write_checkpoint returns (and Table keeps as last_checkpoint) must equal
    the committed one a reader parses, created_at included, or the writer and every reader
    disagree about the checkpoint's age."""
    m = _write(repo, {0: PartitionUpdate(0, 1, base=_rows([(b"a", b"1", 0)]))})
    assert repo.read_manifest(m.generation) == m


def test_two_writers_cannot_commit_the_same_generation(repo: CheckpointRepository) -> None:
    """The manifest is write-once: a second commit of a generation is refused, the first stays."""
    first = _write(repo, {0: PartitionUpdate(0, 1, base=_rows([(b"a", b"mine", 0)]))})
    theirs = dataclasses.replace(first, writer={"engine": "other"})
    with pytest.raises(CheckpointConflictError, match=f"generation {first.generation}"):
        repo.commit(theirs)
    winner = repo.read_manifest(first.generation)  # the winner's manifest is untouched
    assert winner == first
    assert repo.load_partition(first, 0).column("value").to_pylist() == [b"mine"]


def test_next_generation_skips_unfinished_writes(repo: CheckpointRepository) -> None:
    _write(repo, {0: PartitionUpdate(0, 1, base=_rows([(b"a", b"1", 0)]))})
    # A writer that crashed after its data files, before its manifest, used generation 2.
    repo.write_file(2, 0, "base", 0, _rows([(b"a", b"2", 1)]))
    assert repo.generations() == [1]
    assert repo.next_generation() == 3
    m = _write(repo, {0: PartitionUpdate(0, 2, base=_rows([(b"a", b"3", 1)]))})
    assert m.generation == 3


def test_manifest_is_written_last(repo: CheckpointRepository, monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[str] = []
    real_write = type(repo.store).write

    def spy(self: Any, key: str, data: bytes, *, if_absent: bool = False) -> None:
        order.append(key.split("/", 1)[1].split("/", 1)[0])
        real_write(self, key, data, if_absent=if_absent)

    monkeypatch.setattr(type(repo.store), "write", spy)
    _write(repo, {p: PartitionUpdate(p, 1, base=_rows([(b"k%d" % p, b"v", 0)])) for p in range(4)})
    # descriptor, CREATED record, the data files, the task's report, then the manifest, and only
    # then the COMPLETED record: a reader that sees a manifest sees every file it names.
    assert order[order.index("data") : order.index("data") + 4] == ["data"] * 4
    assert order.index("snapshots") > max(i for i, kind in enumerate(order) if kind == "data")
    assert order[-1] == "generations"
    assert order.count("snapshots") == 1


def test_discover_tables(repo: CheckpointRepository) -> None:
    _write(repo, {0: PartitionUpdate(0, 1, base=_rows([(b"a", b"1", 0)]))})
    found = discover_tables(repo.store)
    table = repo.directory.removeprefix("cluster-x_")
    assert [(t.directory, t.table, t.cluster_id) for t in found] == [(repo.directory, table, "cluster-x")]
