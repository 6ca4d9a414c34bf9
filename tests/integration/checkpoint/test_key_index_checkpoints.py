"""Persisted key indexes in real checkpoints (issue 21), on a local directory and on S3 (moto): the
writer puts one beside each large base and in its manifest entry; the restore path reads it (no
hashing or sorting) and restores exactly what a restore without it does; a checkpoint without one
restores as before; a damaged one is logged and rebuilt, and verify reports it; GC keeps an index
with its base and deletes it with it; clone copies it. No Kafka behaviour is involved: the
cluster's answers are given as a :class:`TopicState`."""

from __future__ import annotations

import json
import logging
import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pytest

from integration.cli_runner import ok, statesnap
from statesnap.blob import open_blob_store
from statesnap.checkpoint import CheckpointManifest, CheckpointRepository, PartitionUpdate, datafile
from statesnap.checkpoint import repository as repository_module
from statesnap.checkpoint.manifest import canonical_checksum
from statesnap.checkpoint.partition_files import DecodedPartition
from statesnap.checkpoint.restore import CheckpointSelector
from statesnap.checkpoint.retention import RetentionPolicy, collect_garbage
from statesnap.checkpoint.selection import TopicState
from statesnap.snapshot.clone import clone_generation
from statesnap.stores.columnar import ColumnarStore
from statesnap.task.write import write_checkpoint

pytestmark = pytest.mark.integration

CLUSTER = "cluster-k"
#: Just past the size from which bases get an index.
BIG = repository_module.INDEX_MIN_ROWS + 4000


def _rows(n: int, prefix: bytes, offset: int = 0) -> pa.Table:
    keys = [prefix + b"%07d" % i for i in range(n)]
    return pa.table(
        {
            "key": pa.array(keys, pa.binary()),
            "value": pa.array([b"v%d-" % offset + k for k in keys], pa.binary()),
            "offset": pa.array(range(offset, offset + n), pa.int64()),
            "timestamp": pa.array([offset] * n, pa.int64()).cast(datafile.TIMESTAMP),
        }
    ).cast(datafile.SCHEMA)


@pytest.fixture
def repo(checkpoint_location: Any) -> CheckpointRepository:
    store = open_blob_store(checkpoint_location.url, **checkpoint_location.options)
    return CheckpointRepository.for_table(store, CLUSTER, f"t{uuid.uuid4().hex[:8]}")


def _table(repo: CheckpointRepository) -> str:
    return repo.directory.rsplit("/", 1)[-1].removeprefix(f"{CLUSTER}_")


def _write(
    repo: CheckpointRepository,
    updates: dict[int, PartitionUpdate],
    previous: CheckpointManifest | None = None,
) -> CheckpointManifest:
    name = _table(repo)
    return write_checkpoint(
        repo, table=name, topic=name, cluster_id=CLUSTER, updates=updates, previous=previous
    )


def _restore(repo: CheckpointRepository, *, indexes: bool = True) -> tuple[ColumnarStore, CheckpointSelector]:
    """The selector's restore, as every engine's restore runs it, into a columnar store."""
    name = _table(repo)
    store = ColumnarStore()

    def undo() -> None:
        store.drop_partitions([0, 1])

    selector = CheckpointSelector(repo, name, require_checkpoint=True, key_indexes=indexes)
    state = TopicState(name, CLUSTER, (0, 1), {0: 0, 1: 0})

    def load(part: DecodedPartition) -> None:
        if part.changes is None:
            store.load(part.partition, part.rows, part.index)
        else:  # as the task restore does it
            part.check_keys(store.load_split(part.partition, part.rows, part.index, part.changes))

    manifest = selector.restore(state, [0, 1], load, undo, datetime.now(UTC))
    assert manifest is not None
    return store, selector


def _same(a: ColumnarStore, b: ColumnarStore, keys: list[bytes]) -> None:
    assert len(a) == len(b)
    assert [a.get(k) for k in keys] == [b.get(k) for k in keys]
    assert a.get_many(keys) == b.get_many(keys)
    exported = a.export()
    assert exported.keys() == b.export().keys()
    assert all(t.equals(b.export()[p]) for p, t in exported.items())


def _probe_keys() -> list[bytes]:
    rng = random.Random(3)
    return [p + b"%07d" % rng.randrange(2 * BIG) for p in (b"a", b"b") for _ in range(500)]


def test_a_large_base_gets_its_index_and_the_restore_reads_it(repo: CheckpointRepository) -> None:
    """Partition 0 (a large base) has its index beside it, listed on its base's entry; partition 1
    (small) has none. The restore adopts the index (nothing built for partition 0) and equals a
    restore that builds it, row for row and lookup for lookup."""
    m = _write(
        repo,
        {0: PartitionUpdate(0, BIG, base=_rows(BIG, b"a")), 1: PartitionUpdate(1, 10, base=_rows(10, b"b"))},
    )
    base = m.partitions[0].files[0]
    assert base.index is not None
    assert base.index.path == base.path.replace("-base-", "-index-").replace(".parquet", ".keyidx")
    assert base.index.rows == BIG
    assert m.partitions[1].files[0].index is None
    stored = {b.key: b.size for b in repo.store.list(repo.key("data/"))}
    assert stored[repo.key(base.index.path)] == base.index.bytes
    assert m.total_bytes == sum(f.bytes for f in m.files) + base.index.bytes

    indexed, _ = _restore(repo)
    built, _ = _restore(repo, indexes=False)
    assert 0 in indexed._base.persisted
    assert not built._base.persisted
    _same(indexed, built, _probe_keys())
    assert repo.verify(m.generation).ok


def _delta(rows: pa.Table, offset: int) -> pa.Table:
    """Changes over *rows*' keys: updates, tombstones and new keys, newer than *offset*."""
    keys = rows.column("key").to_pylist()
    changed = [(k, b"new-" + k) for k in keys[::97]] + [(k, None) for k in keys[5::89]]
    changed += [(b"a-new-%05d" % i, b"fresh") for i in range(300)]
    changed.append((keys[5], b"back"))  # deleted, then written again: the newest row wins
    return pa.table(
        {
            "key": pa.array([k for k, _ in changed], pa.binary()),
            "value": pa.array([v for _, v in changed], pa.binary()),
            "offset": pa.array(range(offset, offset + len(changed)), pa.int64()),
            "timestamp": pa.array([offset] * len(changed), pa.int64()).cast(datafile.TIMESTAMP),
        }
    ).cast(datafile.SCHEMA)


def test_an_incremental_checkpoint_restores_over_the_bases_index(repo: CheckpointRepository) -> None:
    """A base with its index, then two deltas (updates, tombstones, new keys, a key deleted and
    written again): the columnar restore takes the base with its index and lays the deltas over
    it (nothing hashed or sorted for partition 0), and equals a restore that merges and builds,
    row for row and lookup for lookup; len() is the manifest's key count."""
    base = _rows(BIG, b"a")
    m1 = _write(
        repo, {0: PartitionUpdate(0, BIG, base=base), 1: PartitionUpdate(1, 10, base=_rows(10, b"b"))}
    )
    small = PartitionUpdate(1, 10)  # unchanged: its files are referenced again
    d1 = _delta(base, BIG)
    keys1 = datafile.merge([base, d1]).num_rows  # what a writer knows after a delta
    m2 = _write(repo, {0: PartitionUpdate(0, BIG + d1.num_rows, delta=d1, keys=keys1), 1: small}, previous=m1)
    d2 = _delta(base.slice(1), BIG + d1.num_rows)
    end = BIG + d1.num_rows + d2.num_rows
    keys2 = datafile.merge([base, d1, d2]).num_rows
    m3 = _write(repo, {0: PartitionUpdate(0, end, delta=d2, keys=keys2), 1: small}, previous=m2)
    assert [f.kind.value for f in m3.partitions[0].files] == ["base", "delta", "delta"]
    split, _ = _restore(repo)
    merged, _ = _restore(repo, indexes=False)
    assert 0 in split._base.persisted  # the base's own index: nothing was built for it
    assert not merged._base.persisted
    keys = [*_probe_keys(), b"a-new-00007", d1.column("key")[3].as_py(), base.column("key")[5].as_py()]
    _same(split, merged, keys)
    assert len(split) == keys2 + 10 == sum(pc.keys or 0 for pc in m3.partitions.values())
    assert split.get(base.column("key")[5].as_py()) == b"back"


def test_an_incremental_checkpoint_whose_key_count_is_wrong_is_skipped(repo: CheckpointRepository) -> None:
    """A manifest claiming one key more than its base and deltas hold is implausible on the split
    path too: the restore skips it, saying why, for the checkpoint before it."""
    base = _rows(BIG, b"a")
    m1 = _write(repo, {0: PartitionUpdate(0, BIG, base=base)})
    delta = _delta(base, BIG)
    keys = datafile.merge([base, delta]).num_rows
    m2 = _write(repo, {0: PartitionUpdate(0, BIG + delta.num_rows, delta=delta, keys=keys)}, previous=m1)
    key = repo.key(f"snapshots/{m2.generation:020d}.json")
    doc = json.loads(repo.store.read(key))
    doc["partitions"]["0"]["keys"] += 1
    doc["checksum"] = canonical_checksum(doc)  # resealed: a writer's bug, not a flipped byte
    repo.store.write(key, json.dumps(doc).encode())
    store, selector = _restore(repo)
    assert [s.generation for s in selector.skipped] == [m2.generation]
    assert len(store) == BIG


def test_a_checkpoint_without_index_restores_as_before(
    repo: CheckpointRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Written as before indexes (no index entry, no index file): the restore builds the index."""
    monkeypatch.setattr(repository_module, "INDEX_MIN_ROWS", 1 << 40)
    m = _write(repo, {0: PartitionUpdate(0, BIG, base=_rows(BIG, b"a"))})
    assert m.index_files == []
    assert b"index" not in repo.store.read(repo.key(f"snapshots/{m.generation:020d}.json"))
    store, _ = _restore(repo)
    assert not store._base.persisted
    assert len(store) == BIG
    assert store.get(b"a%07d" % 77) == b"v0-a%07d" % 77


@pytest.mark.parametrize("damage", ["flipped", "missing"])
def test_a_damaged_index_is_logged_and_rebuilt_and_verify_reports_it(
    repo: CheckpointRepository, damage: str, caplog: pytest.LogCaptureFixture, checkpoint_location: Any
) -> None:
    """The index is derived from the base, which verified: the restore warns and builds it (the
    checkpoint is not skipped: the state is whole without it). ``verify`` says the checkpoint is
    damaged (not ok) but restorable, and readers that verify first still choose it."""
    m = _write(repo, {0: PartitionUpdate(0, BIG, base=_rows(BIG, b"a"))})
    index = m.index_files[0]
    key = repo.key(index.path)
    if damage == "missing":
        repo.store.delete([key])
    else:
        data = bytearray(repo.store.read(key))
        data[200] ^= 0xFF
        repo.store.delete([key])
        repo.store.write(key, bytes(data))
    with caplog.at_level(logging.WARNING):
        store, selector = _restore(repo)
    assert "key index ignored" in caplog.text
    assert not selector.skipped
    assert not store._base.persisted
    assert len(store) == BIG
    assert store.get(b"a%07d" % 5) == b"v0-a%07d" % 5
    verdict = repo.verify(m.generation)
    assert not verdict.ok
    assert verdict.restorable
    assert verdict.index_problems
    assert index.path in verdict.index_problems[0]
    assert ("missing" if damage == "missing" else "checksum mismatch") in verdict.problems[0]
    found = CheckpointSelector(repo, _table(repo)).newest_verified(None, datetime.now(UTC))
    assert found is not None
    assert found.generation == m.generation
    # As a user sees it: verify says only the index is damaged (exit 1, it is damage), and
    # `checkpoints show` still picks the checkpoint as the newest usable one.
    storage = [a for k, v in checkpoint_location.options.items() for a in ("--storage-option", f"{k}={v}")]
    where = [checkpoint_location.url, "--table", _table(repo), *storage]
    verify = statesnap("checkpoints", "verify", *where)
    assert verify.returncode == 1, verify.stderr[-2000:]
    assert "KEY INDEX DAMAGED (restores rebuild it)" in verify.stdout, verify.stdout
    verdicts = [
        r for r in json.loads(statesnap("checkpoints", "verify", *where, "--json").stdout) if r["generation"]
    ]
    assert [(r["ok"], r["restorable"]) for r in verdicts] == [(False, True)]
    assert ok(statesnap("checkpoints", "show", *where, "--json"))["generation"] == m.generation


def test_gc_keeps_an_index_with_its_base_and_deletes_it_with_it(repo: CheckpointRepository) -> None:
    """A delta on top carries the base (and its index) into the next manifest: GC keeping only that
    manifest keeps both. A new base replaces them: GC then deletes the old base and its index."""
    policy = RetentionPolicy(min_count=1, min_age=timedelta(0), orphan_grace=timedelta(hours=1))
    first = _write(repo, {0: PartitionUpdate(0, BIG, base=_rows(BIG, b"a"))})
    old_base, old_index = first.files[0], first.index_files[0]
    second = _write(repo, {0: PartitionUpdate(0, BIG + 5, delta=_rows(5, b"c", BIG))}, first)
    assert second.files[0] == old_base
    assert second.index_files == [old_index]
    report = collect_garbage(repo, policy)
    assert report.deleted_generations == [first.generation]
    assert not report.deleted_files
    assert not report.orphans
    assert repo.store.exists(repo.key(old_index.path))
    third = _write(repo, {0: PartitionUpdate(0, BIG + 5, base=_rows(BIG, b"d", BIG + 5))}, second)
    report = collect_garbage(repo, policy)
    assert sorted(report.deleted_files) == sorted([old_base.path, old_index.path, second.files[1].path])
    assert not repo.store.exists(repo.key(old_index.path))
    assert repo.store.exists(repo.key(third.index_files[0].path))


def test_clone_copies_the_index(repo: CheckpointRepository) -> None:
    m = _write(repo, {0: PartitionUpdate(0, BIG, base=_rows(BIG, b"a"))})
    result = clone_generation(repo.store, _table(repo), m.generation, "copied", cluster_id=CLUSTER)
    assert result.files == 2
    target = CheckpointRepository.for_table(repo.store, CLUSTER, "copied")
    index = m.index_files[0]
    assert repo.store.read(target.key(index.path)) == repo.store.read(repo.key(index.path))
    assert target.verify(m.generation).ok
