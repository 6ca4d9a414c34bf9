"""Parquet data files: encode/decode, checksums, merge-on-read (base then deltas)."""

from __future__ import annotations

import hashlib
import io
import json
import random
from collections.abc import Callable

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statesnap.checkpoint import datafile
from statesnap.errors import CorruptCheckpointError

from .conftest import rows


def test_encode_decode_round_trip_sorted_by_key() -> None:
    table = rows([(b"b", b"2", 5), (b"a", b"1", 7), (b"c", b"", 9)])
    enc = datafile.encode(table)
    assert enc.rows == 3
    assert enc.sha256 == hashlib.sha256(enc.data).hexdigest()
    back = datafile.decode(enc.data, expected_sha256=enc.sha256)
    assert back.schema == datafile.SCHEMA
    assert back.column("key").to_pylist() == [b"a", b"b", b"c"]
    assert back.column("value").to_pylist() == [b"1", b"2", b""]  # empty value is not a tombstone
    assert back.column("offset").to_pylist() == [7, 5, 9]


def test_files_are_plain_zstd_parquet_readable_by_any_engine() -> None:
    enc = datafile.encode(rows([(b"k", b"v", 1)]))
    meta = pq.ParquetFile(io.BytesIO(enc.data)).metadata
    assert meta.row_group(0).column(0).compression == "ZSTD"
    assert pq.read_table(io.BytesIO(enc.data)).column_names == ["key", "value", "offset", "timestamp"]


@pytest.mark.parametrize(
    ("values", "codec"),
    [
        (lambda i: random.Random(i).randbytes(100), "UNCOMPRESSED"),  # random: zstd gains nothing
        (lambda i: b'{"user": "u%d", "plan": "basic", "active": true}' % i, "ZSTD"),
    ],
    ids=["incompressible", "json"],
)
def test_the_value_column_is_compressed_only_when_zstd_shrinks_it(
    values: Callable[[int], bytes], codec: str
) -> None:
    table = rows([(b"k%05d" % i, values(i), i) for i in range(2000)])
    enc = datafile.encode(table)
    column = pq.ParquetFile(io.BytesIO(enc.data)).metadata.row_group(0)
    assert [column.column(i).compression for i in range(4)] == ["ZSTD", codec, "ZSTD", "ZSTD"]
    assert datafile.decode(enc.data).equals(datafile.sorted_rows(table))


def test_encode_is_deterministic() -> None:
    table = rows([(b"x%d" % i, b"v", i) for i in range(50)])
    assert datafile.encode(table).sha256 == datafile.encode(table).sha256


def test_empty_file_round_trips() -> None:
    enc = datafile.encode(datafile.empty_table())
    assert enc.rows == 0
    assert datafile.decode(enc.data).num_rows == 0


def test_checksum_mismatch_is_corrupt() -> None:
    enc = datafile.encode(rows([(b"k", b"v", 1)]))
    with pytest.raises(CorruptCheckpointError, match="checksum mismatch") as info:
        datafile.decode(enc.data, expected_sha256="0" * 64, source="file:///x/p0.parquet")
    assert "file:///x/p0.parquet" in str(info.value)


def test_flipped_byte_is_caught_by_the_checksum() -> None:
    enc = datafile.encode(rows([(b"k", b"v", 1)]))
    broken = bytearray(enc.data)
    broken[len(broken) // 2] ^= 0xFF
    with pytest.raises(CorruptCheckpointError, match="checksum"):
        datafile.decode(bytes(broken), expected_sha256=enc.sha256)


@pytest.mark.parametrize("data", [b"", b"not parquet at all", b"PAR1" + b"\0" * 20 + b"PAR1"])
def test_unreadable_parquet_is_corrupt(data: bytes) -> None:
    with pytest.raises(CorruptCheckpointError, match="unreadable Parquet"):
        datafile.decode(data)


def test_missing_columns_are_corrupt() -> None:
    sink = io.BytesIO()
    pq.write_table(pa.table({"key": pa.array([b"k"]), "offset": pa.array([1])}), sink)
    with pytest.raises(CorruptCheckpointError, match="missing columns"):
        datafile.decode(sink.getvalue())


def test_merge_deltas_override_and_tombstones_delete() -> None:
    base = rows([(b"a", b"1", 0), (b"b", b"1", 1), (b"c", b"1", 2)])
    d1 = rows([(b"a", b"2", 3), (b"b", None, 4), (b"d", b"2", 5)])
    d2 = rows([(b"b", b"3", 6), (b"d", None, 7), (b"e", None, 8)])
    merged = datafile.merge([base, d1, d2])
    assert list(zip(merged.column("key").to_pylist(), merged.column("value").to_pylist(), strict=True)) == [
        (b"a", b"2"),
        (b"b", b"3"),
        (b"c", b"1"),
    ]
    assert merged.column("offset").to_pylist() == [3, 6, 2]


def test_merge_single_file_drops_tombstones_and_nothing_is_empty() -> None:
    only = datafile.merge([rows([(b"a", None, 1), (b"b", b"", 2)])])
    assert only.column("key").to_pylist() == [b"b"]
    assert datafile.merge([]).num_rows == 0
    assert datafile.merge([datafile.empty_table(), datafile.empty_table()]).num_rows == 0


_keys = st.binary(min_size=0, max_size=3)
_value = st.one_of(st.none(), st.binary(max_size=4))


@settings(max_examples=200)
@given(
    base=st.dictionaries(_keys, st.binary(max_size=4), max_size=12),
    deltas=st.lists(st.dictionaries(_keys, _value, max_size=8), max_size=4),
)
def test_merge_equals_applying_files_in_order(
    base: dict[bytes, bytes], deltas: list[dict[bytes, bytes | None]]
) -> None:
    """Merge-on-read must equal replaying base then each delta: the newest row per key wins,
    a null value deletes, and the result is sorted by key with no tombstones left."""
    model: dict[bytes, bytes] = dict(base)
    tables = [rows((k, v, i) for i, (k, v) in enumerate(base.items()))]
    offset = len(base)
    for delta in deltas:
        tables.append(rows((k, v, offset + i) for i, (k, v) in enumerate(delta.items())))
        offset += len(delta)
        for k, v in delta.items():
            if v is None:
                model.pop(k, None)
            else:
                model[k] = v
    # Files arrive as written: encoded and decoded.
    decoded = [datafile.decode(datafile.encode(t).data) for t in tables]
    merged = datafile.merge(decoded)
    got = list(zip(merged.column("key").to_pylist(), merged.column("value").to_pylist(), strict=True))
    assert got == sorted(model.items())


def test_timestamps_are_stored_utc_adjusted_and_older_naive_files_read_the_same() -> None:
    """Every engine then reads an instant (Spark ``timestamp``, not ``timestamp_ntz``)."""
    millis = 1_700_000_000_123
    table = pa.table(
        {
            "key": [b"k"],
            "value": [b"v"],
            "offset": pa.array([3], pa.int64()),
            "timestamp": pa.array([millis], pa.timestamp("ms")),  # naive, as older writers stored it
        }
    )
    enc = datafile.encode(table)
    column = pq.read_metadata(io.BytesIO(enc.data)).schema.column(3)
    assert json.loads(column.logical_type.to_json())["isAdjustedToUTC"] is True
    sink = io.BytesIO()
    pq.write_table(table, sink)  # a file written before the change
    for data in (enc.data, sink.getvalue()):
        back = datafile.decode(data)
        assert back.schema.field("timestamp").type == pa.timestamp("ms", tz="UTC")
        assert back.column("timestamp").cast(pa.int64()).to_pylist() == [millis]


@pytest.mark.parametrize(
    "keys",
    [
        [b"a", b"b", b"c", b"d"],  # sorted: written as given
        [b"a", b"c", b"b", b"d"],  # one pair out of order
        [b"a", b"a\x00", b"ab", b"b"],  # prefixes sort first
        [b"b", b"b", b"a", b"c"],  # a repeated key is not "sorted": sorted anyway
        [b"ab", b"a", b"b", b"c"],
    ],
)
def test_encode_sorts_only_what_is_not_sorted_already(keys: list[bytes]) -> None:
    """encode() skips the sort when the keys ascend (the stores hand it sorted tables); the file
    is sorted either way, across chunk boundaries too."""
    table = rows([(k, b"v%d" % i, i) for i, k in enumerate(keys)])
    chunked = pa.concat_tables([table.slice(0, 1), table.slice(1, 2), table.slice(3)])
    for t in (table, chunked):
        back = datafile.decode(datafile.encode(t).data)
        assert back.column("key").to_pylist() == sorted(keys)
        expected = sorted(range(len(keys)), key=lambda i: keys[i])
        assert back.column("offset").to_pylist() == expected
