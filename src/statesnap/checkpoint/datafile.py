"""Parquet data files: ``key: binary, value: binary, offset: int64, timestamp: timestamp[ms, UTC]``.

Sorted by key, zstd-compressed, readable as they are by Spark, DuckDB, pandas and Polars. The
``value`` column is left uncompressed when a sample of it does not compress by an eighth (random,
encrypted or already-compressed values: RocksDB's rule for a block): zstd would spend the CPU for
nothing, and every Parquet reader reads a column's codec from the file. A null
``value`` is a tombstone; it only appears in ``delta`` files. ``timestamp`` is stored UTC-adjusted
(Parquet ``isAdjustedToUTC=true``): Kafka timestamps are instants, and every engine then reads the
same type (Spark ``timestamp``, not ``timestamp_ntz``). Files written before that read the same.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from statesnap.decode_memory import decode_pool
from statesnap.errors import CorruptCheckpointError
from statesnap.keys.index import binary_parts
from statesnap.keys.order import key_order

__all__ = [
    "GOOD_COMPRESSION",
    "ROW_GROUP_SIZE",
    "SCHEMA",
    "TIMESTAMP",
    "EncodedFile",
    "decode",
    "empty_table",
    "encode",
    "latest_per_key",
    "merge",
    "sorted_rows",
    "value_codec",
]

#: Kafka's record timestamps: milliseconds since the epoch, an instant.
TIMESTAMP = pa.timestamp("ms", tz="UTC")
SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary(), nullable=False),
        pa.field("value", pa.binary(), nullable=True),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", TIMESTAMP, nullable=True),
    ]
)
#: Row groups of this many rows keep memory bounded for readers that stream a file.
ROW_GROUP_SIZE = 256 * 1024
#: The value column is compressed when zstd shrinks a sample of it below this share (RocksDB
#: stores a block uncompressed when compression saves less than an eighth of it).
GOOD_COMPRESSION = 7 / 8
#: Bytes of value data sampled, in three slices (start, middle, end): about a millisecond of zstd.
_SAMPLE_BYTES = 3 * 16 * 1024


@dataclass(frozen=True, slots=True)
class EncodedFile:
    """A data file ready to upload, with what the manifest records about it."""

    data: bytes
    rows: int
    sha256: str


def empty_table() -> pa.Table:
    return SCHEMA.empty_table()


def sorted_rows(table: pa.Table) -> pa.Table:
    """*table* in the data-file schema, sorted by key: the rows exactly as :func:`encode` writes
    them (a base's persisted key index names rows by their position in the file)."""
    table = table.select(SCHEMA.names).cast(SCHEMA)
    if not _sorted_by_key(table):
        table = table.take(pa.array(key_order(table.column("key"))))
    return table


def encode(table: pa.Table, *, sort: bool = True) -> EncodedFile:
    """Serialize rows to Parquet bytes; sorts by key unless the caller already did."""
    table = sorted_rows(table) if sort else table.select(SCHEMA.names).cast(SCHEMA)
    sink = pa.BufferOutputStream()
    codecs = dict.fromkeys(SCHEMA.names, "zstd")
    codecs["value"] = value_codec(table.column("value"))
    pq.write_table(
        table,
        sink,
        compression=codecs,
        row_group_size=ROW_GROUP_SIZE,
        use_dictionary=False,  # offsets are unique, keys and values mostly are: a dictionary only costs
        write_statistics=["key"],
    )
    data = sink.getvalue().to_pybytes()
    return EncodedFile(data, table.num_rows, hashlib.sha256(data).hexdigest())


def value_codec(values: pa.ChunkedArray) -> str:
    """``zstd``, or ``none`` when a sample of the values' bytes does not compress by an eighth."""
    sample = _value_sample(values)
    if len(sample) < 1024:  # too little to judge (or to gain by skipping)
        return "zstd"
    packed = pa.compress(sample, codec="zstd", asbytes=False)
    return "zstd" if packed.size < GOOD_COMPRESSION * len(sample) else "none"


def _value_sample(values: pa.ChunkedArray) -> bytes:
    """Up to :data:`_SAMPLE_BYTES` of the value bytes: slices at the start, middle and end."""
    chunks = [c for c in values.chunks if len(c)]
    if not chunks:
        return b""
    at, data = binary_parts(max(chunks, key=len))
    view = memoryview(data)[int(at[0]) : int(at[-1])]
    part = _SAMPLE_BYTES // 3
    if len(view) <= _SAMPLE_BYTES:
        return view.tobytes()
    mid = len(view) // 2 - part // 2
    return b"".join([view[:part], view[mid : mid + part], view[len(view) - part :]])


def _sorted_by_key(table: pa.Table) -> bool:
    """Whether the keys ascend (one vectorized pass): the stores' exports and change sets are
    sorted already, and sorting them again cost a fifth of a delta file's encoding."""
    if table.num_rows < 2:
        return True
    keys = table.column("key")
    return bool(pc.all(pc.less(keys.slice(0, len(keys) - 1), keys.slice(1))).as_py())


@functools.cache
def _parquet_format() -> Any:
    """pyarrow.dataset's Parquet reader (imported on first use: 65 ms commands that never decode
    a file need not pay; pq.read_table imports it on its first call too)."""
    import pyarrow.dataset as ds

    return ds.ParquetFileFormat()


def decode(data: bytes, *, expected_sha256: str | None = None, source: str = "data file") -> pa.Table:
    """Parse a data file, first checking its checksum; corruption is a CorruptCheckpointError."""
    if expected_sha256 is not None:
        actual = hashlib.sha256(data).hexdigest()
        if actual != expected_sha256:
            raise CorruptCheckpointError(
                f"{source}: checksum mismatch (expected {expected_sha256[:12]}…, got {actual[:12]}…)"
            )
    try:  # what pq.read_table does, into the decode pool (see statesnap.decode_memory)
        fragment = _parquet_format().make_fragment(pa.BufferReader(data))
        table = fragment.to_table(memory_pool=decode_pool())
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as e:
        raise CorruptCheckpointError(f"{source}: unreadable Parquet ({e})") from e
    missing = set(SCHEMA.names) - set(table.column_names)
    if missing:
        raise CorruptCheckpointError(f"{source}: missing columns {sorted(missing)}")
    return table.select(SCHEMA.names).cast(SCHEMA)


def latest_per_key(tables: Sequence[pa.Table], *, keep_tombstones: bool) -> pa.Table:
    """Newest row per key, where later tables and later rows are newer (offset order).

    A hash aggregation picks each key's last position, so the cost is linear in the rows and
    only the winning rows are copied; a changelog with many updates per key shrinks a lot before
    anything is sorted. The result is unsorted: :func:`encode` sorts what it writes.
    """
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return empty_table()
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    if table.num_rows > 1:
        positions = pa.array(np.arange(table.num_rows, dtype=np.int64))
        newest = (
            pa.table({"key": table.column("key"), "pos": positions})
            .group_by("key", use_threads=False)
            .aggregate([("pos", "max")])
            .column("pos_max")
        )
        table = table.take(newest)
    if not keep_tombstones and table.column("value").null_count:
        table = table.filter(pc.is_valid(table.column("value")))
    return table.combine_chunks()


def merge(tables: Sequence[pa.Table]) -> pa.Table:
    """Apply ``base`` then ``delta`` files in order: newest row per key wins, tombstones delete.

    The result is sorted by key and holds no tombstones, i.e. it is the partition's table.
    """
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return empty_table()
    if len(tables) == 1:
        # One data file: already sorted, one row per key.
        only = tables[0]
        if only.column("value").null_count:
            only = only.filter(pc.is_valid(only.column("value")))
        return only
    return sorted_rows(latest_per_key(tables, keep_tombstones=False))
