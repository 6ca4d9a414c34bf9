"""The persisted key index (issue 21): its file format, and a columnar store that adopts it instead
of hashing and sorting. The restore path that reads it from a checkpoint is proved on real blob
stores in tests/integration/checkpoint/test_key_index_checkpoints.py."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from statesnap.checkpoint import datafile
from statesnap.errors import CorruptCheckpointError
from statesnap.keys.index import HashSeed, KeyIndex
from statesnap.stores.columnar import ColumnarStore


def _rows(n: int, prefix: bytes = b"key-") -> pa.Table:
    keys = sorted(prefix + b"%d" % i for i in range(n))
    return pa.table(
        {
            "key": pa.array(keys, pa.binary()),
            "value": pa.array([b"v" + k for k in keys], pa.binary()),
            "offset": pa.array(range(n), pa.int64()),
            "timestamp": pa.array([1] * n, pa.int64()).cast(pa.timestamp("ms")),
        }
    ).cast(datafile.SCHEMA)


def _as_read(table: pa.Table) -> pa.Table:
    """The table as a restore decodes it from Parquet (chunks of the reader's batch size)."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=datafile.ROW_GROUP_SIZE)
    return pq.read_table(pa.BufferReader(sink.getvalue()))


def _with_index(table: pa.Table) -> tuple[pa.Table, KeyIndex]:
    index = KeyIndex.from_bytes(
        KeyIndex.of_keys(table.column("key"), HashSeed.fresh()).to_bytes(), rows=table.num_rows
    )
    return table, index


def test_the_file_round_trips_with_its_own_seed() -> None:
    """The seed travels in the file (a fresh one per file, not the process's), the slots are a view
    of the bytes read, and every key is a candidate of its own row."""
    keys = _rows(5000).column("key")
    seed = HashSeed.fresh()
    data = KeyIndex.of_keys(keys, seed).to_bytes()
    back = KeyIndex.from_bytes(data, rows=5000)
    assert back.seed == seed != HashSeed.process()
    assert back.seed.plausible()
    assert not back.table.flags.owndata  # no copy of what was read
    for i in range(0, 5000, 7):
        assert i in back.candidates(keys[i].as_py())


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda b: b[:40], "shorter than"),
        (lambda b: b"X" + b[1:], "not a key index"),
        (lambda b: b[:64] + b[72:], "slots do not fit"),
        (lambda b: b[:16] + (4).to_bytes(8, "little") + b[24:], "implausible"),
        (lambda b: b[:-8] + b"\x00" * 8, "free slot"),
    ],
)
def test_a_damaged_file_is_refused_in_one_typed_line(damage: Callable[[bytes], bytes], match: str) -> None:
    data = KeyIndex.of_keys(_rows(100).column("key"), HashSeed.fresh()).to_bytes()
    with pytest.raises(CorruptCheckpointError, match=match):
        KeyIndex.from_bytes(damage(data), rows=100)
    with pytest.raises(CorruptCheckpointError, match="indexes 100 rows, its base file holds 99"):
        KeyIndex.from_bytes(data, rows=99)


def _compare(with_index: ColumnarStore, without: ColumnarStore, keys: list[bytes]) -> None:
    assert len(with_index) == len(without)
    assert [with_index.get(k) for k in keys] == [without.get(k) for k in keys]
    assert with_index.get_many(keys) == without.get_many(keys)
    assert [k in with_index for k in keys] == [k in without for k in keys]
    assert list(with_index.scan(limit=50)) == list(without.scan(limit=50))


def test_a_store_restored_with_the_index_answers_as_one_that_built_it() -> None:
    """Multi-chunk rows as Parquet decodes them: the persisted index is adopted (nothing hashed:
    no built index), and every read equals the store that hashed and sorted; the overlay on top
    and an export after it behave as before."""
    rows = _as_read(_rows(140_000))
    assert rows.column("key").num_chunks > 1
    table, index = _with_index(rows)
    s, plain = ColumnarStore(), ColumnarStore()
    s.load(3, table, index)
    plain.load(3, rows)
    rng = random.Random(5)
    keys = [b"key-%d" % rng.randrange(280_000) for _ in range(3000)] + [b"", b"zz"]
    _compare(s, plain, keys)
    assert s._base.persisted[3].index is index
    assert s._base._index is None
    for store in (s, plain):
        store.apply(
            3, [(b"key-1", b"new", 10**6, 1), (b"key-2", None, 10**6 + 1, 1), (b"q", b"x", 10**6 + 2, 1)]
        )
    _compare(s, plain, [*keys, b"key-1", b"key-2", b"q"])
    assert s.export()[3].equals(plain.export()[3])


def test_an_index_that_does_not_fit_its_rows_is_ignored_and_built(caplog: pytest.LogCaptureFixture) -> None:
    """An index of other rows (same count, other keys): its sampled entries do not match, so the
    store says so and hashes the rows itself; lookups stay right."""
    rows = _rows(2000)
    other = KeyIndex.from_bytes(
        KeyIndex.of_keys(_rows(2000, b"other-").column("key"), HashSeed.fresh()).to_bytes(), rows=2000
    )
    s = ColumnarStore()
    with caplog.at_level(logging.WARNING):
        s.load(0, rows, other)
    assert "does not fit its rows" in caplog.text
    assert not s._base.persisted
    assert s.get(b"key-7") == b"vkey-7"
    assert s.get(b"other-7") is None


def test_several_partitions_are_ready_at_once_then_probe_one_index() -> None:
    """Probing one persisted index per partition costs a hash and a cache miss per partition and
    lookup (_MAX_PROBES): the store answers at once from both, builds one index over both in the
    background, and then probes that alone; answers are the same throughout."""
    s = ColumnarStore()
    s.load(0, *_with_index(_rows(1000, b"a-")))
    s.load(1, *_with_index(_rows(1000, b"b-")))
    s.load(2, _rows(10, b"c-"))  # small: no index, built at once
    keys = [b"a-5", b"b-5", b"c-5", b"d-5"]
    expected = [b"va-5", b"vb-5", b"vc-5", None]
    assert [s.get(k) for k in keys] == expected
    assert s.wait_indexed(30)
    assert len(s._base.probes or []) == 1
    assert not s._base.persisted
    assert [s.get(k) for k in keys] == expected
    assert s.get_many(keys * 10) == expected * 10
