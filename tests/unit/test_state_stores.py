"""Local state stores (memory, rocksdb): apply/load/export round trips, tombstones, len."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statesnap.checkpoint import datafile
from statesnap.errors import ConfigError
from statesnap.stores import StateStore, open_state_store
from statesnap.stores.base import NO_TIMESTAMP, Record

KINDS = ["memory", "columnar", "rocksdb"]


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store(kind: str, tmp_path: Path) -> Iterator[StateStore]:
    s = open_state_store(kind, path=tmp_path / "db")
    yield s
    s.close()


def test_apply_get_contains_len(store: StateStore) -> None:
    store.apply(0, [(b"a", b"1", 0, 1000), (b"b", b"2", 1, 1001), (b"a", b"3", 2, 1002)])
    store.apply(1, [(b"c", b"", 0, NO_TIMESTAMP)])
    assert store.get(b"a") == b"3"
    assert store.get(b"c") == b""  # an empty value is a value, not a deletion
    assert store.get(b"zz") is None
    assert b"a" in store
    assert b"c" in store
    assert b"zz" not in store
    assert len(store) == 3
    assert dict(store.items()) == {b"a": b"3", b"b": b"2", b"c": b""}


def test_tombstones_delete_and_keep_len_exact(store: StateStore) -> None:
    store.apply(0, [(b"a", b"1", 0, 1), (b"b", b"1", 1, 1)])
    store.apply(0, [(b"a", None, 2, 2), (b"never", None, 3, 3), (b"a", None, 4, 4)])
    assert b"a" not in store
    assert store.get(b"a") is None
    assert len(store) == 1
    # Put, delete and put again within one batch.
    store.apply(0, [(b"x", b"1", 5, 5), (b"x", None, 6, 6), (b"x", b"2", 7, 7), (b"b", None, 8, 8)])
    assert dict(store.items()) == {b"x": b"2"}
    assert len(store) == 1


def test_export_is_per_partition_sorted_with_offsets_and_timestamps(store: StateStore) -> None:
    store.apply(0, [(b"b", b"2", 7, 1_700_000_000_000), (b"a", b"1", 8, NO_TIMESTAMP)])
    store.apply(3, [(b"z", b"9", 1, 5)])
    out = store.export()
    assert set(out) == {0, 3}
    p0 = out[0]
    assert p0.schema == datafile.SCHEMA
    assert p0.column("key").to_pylist() == [b"a", b"b"]
    assert p0.column("value").to_pylist() == [b"1", b"2"]
    assert p0.column("offset").to_pylist() == [8, 7]
    ts = p0.column("timestamp").cast(pa.int64()).to_pylist()
    assert ts == [None, 1_700_000_000_000]  # no timestamp -> null, not -1
    assert out[3].column("key").to_pylist() == [b"z"]


def test_export_of_an_empty_store(store: StateStore) -> None:
    assert store.export() == {}


def test_load_export_round_trip_into_a_fresh_store(store: StateStore, kind: str, tmp_path: Path) -> None:
    store.apply(0, [(b"k%03d" % i, b"v%d" % i, i, 1000 + i) for i in range(200)])
    store.apply(1, [(b"j%03d" % i, b"w" * i, i, NO_TIMESTAMP) for i in range(50)])
    exported = store.export()
    fresh = open_state_store(kind, path=tmp_path / "fresh")
    try:
        for p, table in exported.items():
            # Through a data file, as a restore does.
            fresh.load(p, datafile.decode(datafile.encode(table).data))
        assert len(fresh) == len(store) == 250
        assert sorted(fresh.items()) == sorted(store.items())
        again = fresh.export()
        assert set(again) == set(exported)
        for p in exported:
            assert again[p].equals(exported[p])
        # The loaded store keeps working: updates and tombstones on top of loaded rows.
        fresh.apply(0, [(b"k000", None, 300, 1), (b"k001", b"new", 301, 1), (b"new", b"n", 302, 1)])
        assert len(fresh) == 250
        assert fresh.get(b"k001") == b"new"
    finally:
        fresh.close()


def test_clear_and_flush(store: StateStore) -> None:
    store.apply(0, [(b"a", b"1", 0, 0)])
    store.flush()
    store.clear()
    assert len(store) == 0
    assert list(store.items()) == []
    store.apply(0, [(b"b", b"1", 1, 0)])
    assert dict(store.items()) == {b"b": b"1"}


def test_rocksdb_never_deletes_what_it_did_not_create(tmp_path: Path) -> None:
    """Issue 11: ``store_path`` is the user's directory. The store works in a subdirectory it
    creates and marks; the user's files survive construction and close."""
    user_dir = tmp_path / "state"
    user_dir.mkdir()
    (user_dir / "precious.txt").write_text("the user's data")
    (user_dir / "sub").mkdir()
    (user_dir / "sub" / "more.txt").write_text("more")
    s = open_state_store("rocksdb", path=user_dir, name="orders")
    own = user_dir / "statesnap-orders"
    assert own.is_dir()
    s.apply(0, [(b"a", b"1", 0, 0)])
    assert s.get(b"a") == b"1"
    s.close()
    assert (user_dir / "precious.txt").read_text() == "the user's data"
    assert (user_dir / "sub" / "more.txt").read_text() == "more"
    assert user_dir.is_dir()
    assert not own.exists()  # what the store created is gone


def test_rocksdb_wipes_its_own_leftovers_but_refuses_a_foreign_directory(tmp_path: Path) -> None:
    first = open_state_store("rocksdb", path=tmp_path, name="t")
    first.apply(0, [(b"old", b"1", 0, 0)])
    first.flush()
    # A crashed run leaves its marked directory behind: the next store starts empty from it.
    first._db.close()  # type: ignore[attr-defined]
    first._lock_file.close()  # type: ignore[attr-defined]
    again = open_state_store("rocksdb", path=tmp_path, name="t")
    try:
        assert len(again) == 0
        assert again.get(b"old") is None
    finally:
        again.close()
    foreign = tmp_path / "statesnap-x"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("not ours")
    with pytest.raises(ConfigError, match="not created by statesnap"):
        open_state_store("rocksdb", path=tmp_path, name="x")
    assert (foreign / "keep.txt").read_text() == "not ours"


def test_rocksdb_two_tables_cannot_share_one_directory(tmp_path: Path) -> None:
    s = open_state_store("rocksdb", path=tmp_path, name="t")
    try:
        with pytest.raises(ConfigError, match="in use"):
            open_state_store("rocksdb", path=tmp_path, name="t")
        assert s.get(b"x") is None  # the first store is untouched
    finally:
        s.close()


def test_rocksdb_temporary_directory_is_removed_on_close() -> None:
    s = open_state_store("rocksdb")
    path = s.path  # type: ignore[attr-defined]
    assert path.is_dir()
    s.close()
    assert not path.exists()


def test_unknown_store_kind() -> None:
    with pytest.raises(ConfigError, match="unknown state store 'redis'"):
        open_state_store("redis")


_ops = st.lists(
    st.tuples(
        st.integers(0, 2),
        st.sampled_from([b"a", b"b", b"c", b"d", b""]),
        st.one_of(st.none(), st.binary(max_size=5)),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_ops, batch=st.integers(1, 7))
def test_store_matches_a_dict_model(
    kind: str,
    tmp_path_factory: pytest.TempPathFactory,
    ops: list[tuple[int, bytes, bytes | None]],
    batch: int,
) -> None:
    """Applying any sequence of upserts and tombstones, in batches of any size, leaves exactly
    the dict a last-write-wins replay would, and export → load reproduces it."""
    # Keys are partition-affine, as in Kafka: the same key never lives in two partitions.
    ops = [(sum(k) % 3, k, v) for _, k, v in ops]
    model: dict[bytes, bytes] = {}
    s = open_state_store(kind, path=tmp_path_factory.mktemp("model"))
    try:
        for start in range(0, len(ops), batch):
            by_part: dict[int, list[Record]] = {}
            for i, (p, k, v) in enumerate(ops[start : start + batch], start=start):
                by_part.setdefault(p, []).append((k, v, i, i))
                if v is None:
                    model.pop(k, None)
                else:
                    model[k] = v
            for p, recs in by_part.items():
                s.apply(p, recs)
            assert len(s) == len(model)
        assert dict(s.items()) == model
        for k in [b"a", b"b", b"c", b"d", b"", b"zz"]:
            assert s.get(k) == model.get(k)
            assert (k in s) == (k in model)
        exported = s.export()
        fresh = open_state_store(kind, path=tmp_path_factory.mktemp("fresh"))
        try:
            for p, t in exported.items():
                fresh.load(p, t)
            assert dict(fresh.items()) == model
            assert len(fresh) == len(model)
        finally:
            fresh.close()
    finally:
        s.close()


def test_a_table_that_never_checkpoints_keeps_no_change_set_and_folds_its_overlay(
    store: StateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a read-only follower's commit points do (forget_changes, compact): the change set
    empties and the columnar overlay folds into the base once it outgrows its share, while every
    read stays the same."""
    import statesnap.stores.columnar as columnar_module

    monkeypatch.setattr(columnar_module, "_MIN_MERGE", 8)
    rows = [b"k%03d" % i for i in range(0, 200, 2)]
    table = pa.table(
        {
            "key": pa.array(rows, pa.binary()),
            "value": pa.array([b"base-" + k for k in rows], pa.binary()),
            "offset": pa.array(range(len(rows)), pa.int64()),
            "timestamp": pa.array([1] * len(rows), pa.int64()).cast(pa.timestamp("ms")),
        }
    ).cast(datafile.SCHEMA)
    store.load(0, table)
    writes: list[Record] = [
        (b"k%03d" % i, None if i % 3 == 0 else b"new-%d" % i, 100 + i, 5) for i in range(60)
    ]
    store.apply(0, writes)
    expected = dict(store.items())
    assert store.changes() != {}
    store.forget_changes()
    store.compact()
    assert store.changes() == {}
    assert dict(store.items()) == expected
    assert len(store) == len(expected)
    assert all(store.get(k) == v for k, v in expected.items())
    assert store.get(b"k000") is None
    if isinstance(store, columnar_module.ColumnarStore):
        assert store._over == {}, "the overlay was not folded into the base"
    store.apply(0, [(b"k001", b"later", 500, 5)])  # tracked again from here
    assert [t.column("key").to_pylist() for t in store.changes().values()] == [[b"k001"]]


def test_rocksdb_change_set_lives_in_the_database_not_in_python(tmp_path: Path) -> None:
    """The store meant for state larger than memory keeps what the next delta needs in RocksDB:
    Python's heap does not grow with the keys written between checkpoints (a dict of them made
    the RSS grow ~290 B a key), and the delta still holds every one of them."""
    store = open_state_store("rocksdb", path=tmp_path / "db")
    try:
        n, value = 200_000, b"v" * 100
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for lo in range(0, n, 1000):
                store.apply(lo % 3, [(b"key-%07d" % i, value, i, 1000) for i in range(lo, lo + 1000)])
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert grown < 2_000_000, f"Python heap grew {grown:,} B over {n:,} keys written"
        changes = store.changes()
        assert sum(t.num_rows for t in changes.values()) == n
        assert changes[1]["key"].to_pylist()[:2] == [b"key-0001000", b"key-0001001"]
        store.mark_checkpointed()
        assert store.changes() == {}
    finally:
        store.close()
