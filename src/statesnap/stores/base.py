"""The :class:`StateStore` protocol: where a table keeps its rows between checkpoints.

Every row is stored as one value blob with a fixed header, ``partition:int32 | offset:int64 |
timestamp:int64`` (big-endian), followed by the value bytes. Keeping the header with the value costs
20 bytes per key instead of three Python objects, and gives checkpoints the per-row offset and
timestamp the data-file format records (Kafka Streams' timestamped stores do the same).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statesnap.checkpoint import datafile

HEADER = np.dtype([("partition", ">i4"), ("offset", ">i8"), ("timestamp", ">i8")])
HEADER_SIZE = HEADER.itemsize  # 20
NO_TIMESTAMP = -1

#: One change from the changelog: key, value (None = tombstone), offset, timestamp in ms.
Record = tuple[bytes, bytes | None, int, int]


class KafkaMessage(Protocol):
    """The part of confluent-kafka's ``Message`` the stores read on the replay hot path."""

    def key(self) -> bytes | None: ...

    def value(self) -> bytes | None: ...

    def offset(self) -> int: ...

    def timestamp(self) -> tuple[int, int]: ...


class StateStore(Protocol):
    """Local state of one table (all partitions it owns). Not thread-safe for writers."""

    kind: str

    def get(self, key: bytes) -> bytes | None: ...

    def __contains__(self, key: object) -> bool: ...

    def __len__(self) -> int: ...

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value), in no particular order."""
        ...

    def apply(self, partition: int, records: Sequence[Record]) -> None:
        """Apply changelog records of one partition in offset order."""
        ...

    def apply_messages(self, partition: int, messages: Sequence[KafkaMessage]) -> None:
        """Apply Kafka messages of one partition in offset order (the replay hot path).

        Messages without a key are skipped: a table is keyed (Kafka Streams does the same).
        """
        ...

    def load(self, partition: int, rows: pa.Table) -> None:
        """Bulk-load a partition's checkpointed rows (sorted by key, no tombstones)."""
        ...

    def export(self) -> dict[int, pa.Table]:
        """The full contents per partition, as data-file tables sorted by key."""
        ...

    def clear(self) -> None: ...

    def flush(self) -> None:
        """Make applied records durable locally (a commit point)."""
        ...

    def close(self) -> None: ...


def encode_rows(partition: int, rows: pa.Table) -> pa.Array:
    """Header + value blobs for a data-file table, built column-wise (no per-row Python work)."""
    n = rows.num_rows
    header = np.empty(n, dtype=HEADER)
    header["partition"] = partition
    header["offset"] = rows.column("offset").to_numpy()
    ts = rows.column("timestamp").cast(pa.int64()).fill_null(NO_TIMESTAMP)
    header["timestamp"] = ts.to_numpy()
    fixed = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(HEADER_SIZE), n, [None, pa.py_buffer(header.tobytes())]
    )
    values = rows.column("value").combine_chunks()
    return pc.binary_join_element_wise(fixed.cast(pa.binary()), values, b"")


def decode_rows(keys: pa.Array, blobs: pa.Array) -> dict[int, pa.Table]:
    """Split header + value blobs back into per-partition data-file tables sorted by key."""
    if len(keys) == 0:
        return {}
    fixed = pc.binary_slice(blobs, 0, HEADER_SIZE).cast(pa.binary(HEADER_SIZE))
    header = np.frombuffer(
        fixed.buffers()[1], dtype=HEADER, count=len(fixed), offset=fixed.offset * HEADER_SIZE
    )
    ts = header["timestamp"].astype(np.int64)
    table = pa.table(
        {
            "key": keys,
            "value": pc.binary_slice(blobs, HEADER_SIZE, (1 << 31) - 1),
            "offset": pa.array(header["offset"].astype(np.int64)),
            "timestamp": pa.array(ts, mask=ts < 0).cast(pa.timestamp("ms")),
            "_partition": pa.array(header["partition"].astype(np.int32)),
        }
    )
    out = {}
    for p in np.unique(header["partition"]):
        part = table.filter(pc.equal(table.column("_partition"), int(p))).drop_columns(["_partition"])
        out[int(p)] = part.sort_by("key").cast(datafile.SCHEMA)
    return out


#: ``HEADER_STRUCT.pack(partition, offset, timestamp)``: the per-record header on the hot path.
HEADER_STRUCT = struct.Struct(">iqq")
