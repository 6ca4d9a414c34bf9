"""The RocksDB store's column-wise SST writer: what it loads reads back exactly as rocksdict's own
``SstFileWriter`` would have it, through gets, scans, exports, later writes and compactions."""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statesnap.checkpoint import datafile
from statesnap.stores import rocksdb, sstfile
from statesnap.stores.rocksdb import RocksDBStore

# Lengths around every varint width (1, 2 and 3 bytes, key length + 8 included) and around the
# block size, so that an entry can be larger than a block.
BY_ROWS = rocksdb._write_sst_by_rows
VALUE_SIZES = [0, 1, 99, 107, 119, 120, 127, 128, 16383, 16384, 40000, 300_000]


def _rows(keys: list[bytes], values: list[bytes], first_offset: int = 0) -> pa.Table:
    """A partition's checkpoint rows, sorted by key, some with a null timestamp."""
    order = sorted(range(len(keys)), key=keys.__getitem__)
    return pa.table(
        {
            "key": [keys[i] for i in order],
            "value": [values[i] for i in order],
            "offset": [first_offset + i for i in order],
            "timestamp": pa.array(
                [None if i % 5 == 0 else 1_700_000_000_000 + i for i in order], pa.int64()
            ).cast(datafile.TIMESTAMP),
        },
        schema=datafile.SCHEMA,
    )


def _varied(n: int, seed: int) -> tuple[list[bytes], list[bytes]]:
    rng = random.Random(seed)
    keys = {
        b"k%06d" % i + bytes(rng.randrange(256) for _ in range(rng.choice([0, 3, 130]))) for i in range(n)
    }
    values = [bytes(rng.randrange(4) for _ in range(rng.choice(VALUE_SIZES))) for _ in keys]
    return sorted(keys), values


@pytest.fixture
def no_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """The columnar writer must be what loads: a refused file would otherwise hide behind the
    fallback."""

    def refuse(*_: object) -> None:
        raise AssertionError("RocksDB refused the columnar SST file")

    monkeypatch.setattr(rocksdb, "_write_sst_by_rows", refuse)


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Several chunks per partition, and chunks cut by bytes as well as by rows."""
    monkeypatch.setattr(sstfile, "_ENCODE_ROWS", 37)
    monkeypatch.setattr(sstfile, "_CHUNK_BYTES", 100_000)


def _store(path: Path) -> Iterator[RocksDBStore]:
    s = RocksDBStore(path, temporary=True)
    yield s
    s.close()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RocksDBStore]:
    yield from _store(tmp_path / "fast")


@pytest.fixture
def reference(tmp_path: Path) -> Iterator[RocksDBStore]:
    yield from _store(tmp_path / "reference")


def _load_reference(monkeypatch: pytest.MonkeyPatch, ref: RocksDBStore, parts: dict[int, pa.Table]) -> None:
    with monkeypatch.context() as m:
        m.setattr(sstfile, "write_sst", lambda path, partition, rows, _pool: BY_ROWS(path, partition, rows))
        for p, t in parts.items():
            ref.load(p, t)


def _same(a: RocksDBStore, b: RocksDBStore) -> None:
    assert list(a.items()) == list(b.items())
    assert len(a) == len(b)
    for key, value in b.items():
        assert a.get(key) == value
        assert key in a
    ea, eb = a.export(), b.export()
    assert ea.keys() == eb.keys()
    for p in ea:
        assert ea[p].equals(eb[p])


@pytest.mark.parametrize("compress", [True, False])
@pytest.mark.usefixtures("no_fallback", "small_chunks")
def test_loads_read_back_as_rocksdicts_writer_has_them(
    store: RocksDBStore, reference: RocksDBStore, monkeypatch: pytest.MonkeyPatch, compress: bool
) -> None:
    monkeypatch.setattr(sstfile, "COMPRESS", compress)
    # Two partitions with interleaved key ranges (their files overlap in RocksDB's level 0).
    keys, values = _varied(400, seed=1)
    parts = {0: _rows(keys[::2], values[::2]), 5: _rows(keys[1::2], values[1::2], first_offset=1000)}
    for p, t in parts.items():
        store.load(p, t)
    _load_reference(monkeypatch, reference, parts)
    _same(store, reference)
    assert store.get(b"k") is None
    assert store.get(b"k999999") is None
    assert b"zz" not in store
    # Ordered scans seek into the ingested blocks.
    after = keys[101]
    assert list(store.scan(after=after, limit=7)) == list(reference.scan(after=after, limit=7))
    assert list(store.scan(prefix=b"k00013")) == list(reference.scan(prefix=b"k00013"))
    assert [k for k, _ in store.scan(prefix=b"k00013")] == [k for k in keys if k.startswith(b"k00013")]


@pytest.mark.usefixtures("no_fallback", "small_chunks")
def test_loaded_rows_take_later_writes_and_survive_compaction(store: RocksDBStore) -> None:
    keys, values = _varied(300, seed=2)
    store.load(3, _rows(keys, values))
    expected = dict(zip(keys, values, strict=True))
    # Ingested rows carry sequence number 0: every later write must win over them.
    store.apply(3, [(keys[0], b"new", 500, 1), (keys[1], None, 501, 2), (b"k999999", b"added", 502, 3)])
    expected[keys[0]] = b"new"
    del expected[keys[1]]
    expected[b"k999999"] = b"added"
    assert dict(store.items()) == expected
    # A full compaction reads every block of the ingested file and rewrites it.
    store._db.compact_range(None, None)
    assert dict(store.items()) == expected
    assert len(store) == len(expected)
    assert all(store.get(k) == v for k, v in expected.items())
    exported = store.export()[3]
    assert exported.column("key").to_pylist() == sorted(expected)
    row = exported.column("key").to_pylist().index(keys[5])
    assert exported.column("offset")[row].as_py() == 5
    assert exported.column("timestamp")[row].as_py() is None  # null timestamps stay null


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.dictionaries(
        st.binary(min_size=0, max_size=140), st.binary(min_size=0, max_size=300), min_size=1, max_size=60
    )
)
@pytest.mark.usefixtures("no_fallback")
def test_any_rows_round_trip(tmp_path_factory: pytest.TempPathFactory, rows: dict[bytes, bytes]) -> None:
    path = tmp_path_factory.mktemp("prop")
    for s in _store(path):
        s.load(2, _rows(list(rows), list(rows.values())))
        assert dict(s.items()) == rows
        assert [k for k, _ in s.items()] == sorted(rows)
        assert all(s.get(k) == v for k, v in rows.items())
        assert len(s) == len(rows)


def test_a_refused_file_is_rebuilt_with_rocksdicts_writer(
    store: RocksDBStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(path: str, *_: object) -> None:
        Path(path).write_bytes(b"not an sst file")

    monkeypatch.setattr(sstfile, "write_sst", broken)
    keys, values = _varied(50, seed=3)
    with caplog.at_level(logging.WARNING, logger="statesnap.stores.rocksdb"):
        store.load(1, _rows(keys, values))
    assert "refused" in caplog.text
    assert dict(store.items()) == dict(zip(keys, values, strict=True))


@pytest.mark.usefixtures("no_fallback")
def test_null_values_are_refused_not_written(store: RocksDBStore) -> None:
    """Base rows never hold tombstones; one that does is an error, not a silently dropped row."""
    rows = _rows([b"a", b"b"], [b"1", b"2"])
    rows = rows.set_column(1, "value", pa.array([b"1", None], pa.binary()))
    with pytest.raises(ValueError, match="tombstones"):
        store.load(0, rows)
    assert len(store) == 0
