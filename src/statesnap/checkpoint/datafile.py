"""Parquet data files: ``key: binary, value: binary, offset: int64, timestamp: timestamp[ms]``.

Sorted by key, zstd-compressed, readable as they are by Spark, DuckDB, pandas and Polars. A null
``value`` is a tombstone; it only appears in ``delta`` files.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from statesnap.errors import CorruptCheckpointError

SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary(), nullable=False),
        pa.field("value", pa.binary(), nullable=True),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", pa.timestamp("ms"), nullable=True),
    ]
)
#: Row groups of this many rows keep memory bounded for readers that stream a file.
ROW_GROUP_SIZE = 256 * 1024


@dataclass(frozen=True, slots=True)
class EncodedFile:
    """A data file ready to upload, with what the manifest records about it."""

    data: bytes
    rows: int
    sha256: str


def empty_table() -> pa.Table:
    return SCHEMA.empty_table()


def encode(table: pa.Table, *, sort: bool = True) -> EncodedFile:
    """Serialize rows to Parquet bytes; sorts by key unless the caller already did."""
    table = table.select(SCHEMA.names).cast(SCHEMA)
    if sort and table.num_rows > 1:
        table = table.sort_by("key")
    sink = pa.BufferOutputStream()
    pq.write_table(
        table,
        sink,
        compression="zstd",
        row_group_size=ROW_GROUP_SIZE,
        use_dictionary=["offset"],
        write_statistics=["key"],
    )
    data = sink.getvalue().to_pybytes()
    return EncodedFile(data, table.num_rows, hashlib.sha256(data).hexdigest())


def decode(data: bytes, *, expected_sha256: str | None = None, source: str = "data file") -> pa.Table:
    """Parse a data file, first checking its checksum; corruption is a CorruptCheckpointError."""
    if expected_sha256 is not None:
        actual = hashlib.sha256(data).hexdigest()
        if actual != expected_sha256:
            raise CorruptCheckpointError(
                f"{source}: checksum mismatch (expected {expected_sha256[:12]}…, got {actual[:12]}…)"
            )
    try:
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as e:
        raise CorruptCheckpointError(f"{source}: unreadable Parquet ({e})") from e
    missing = set(SCHEMA.names) - set(table.column_names)
    if missing:
        raise CorruptCheckpointError(f"{source}: missing columns {sorted(missing)}")
    return table.select(SCHEMA.names).cast(SCHEMA)


def merge(tables: Sequence[pa.Table]) -> pa.Table:
    """Apply ``base`` then ``delta`` files in order: newest row per key wins, tombstones delete.

    The result is sorted by key and holds no tombstones, i.e. it is the partition's table.
    """
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return empty_table()
    if len(tables) == 1:
        only = tables[0]
        if only.column("value").null_count:
            only = only.filter(pc.is_valid(only.column("value")))
        return only
    stacked = pa.concat_tables(
        t.append_column("_seq", pa.array([i] * t.num_rows, pa.int32())) for i, t in enumerate(tables)
    )
    stacked = stacked.sort_by([("key", "ascending"), ("_seq", "descending")])
    keys = stacked.column("key").combine_chunks()
    if len(keys) > 1:
        changed = pc.not_equal(keys.slice(1), keys.slice(0, len(keys) - 1))
        first = pa.concat_arrays(
            [pa.array([True]), changed.combine_chunks() if isinstance(changed, pa.ChunkedArray) else changed]
        )
    else:
        first = pa.array([True] * len(keys))
    newest = stacked.filter(first).drop_columns(["_seq"])
    return newest.filter(pc.is_valid(newest.column("value")))
