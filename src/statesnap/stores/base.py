"""The :class:`StateStore` protocol: where a table keeps its rows between checkpoints.

Every row is stored as one value blob with a fixed header, ``partition:int32 | offset:int64 |
timestamp:int64`` (big-endian), followed by the value bytes. Keeping the header with the value costs
20 bytes per key instead of three Python objects, and gives checkpoints the per-row offset and
timestamp the data-file format records (Kafka Streams' timestamped stores do the same).

A *tombstone blob* (kept where a store must remember a deletion: the change set of incremental
checkpoints, the columnar store's overlay) is the bare header with the partition stored as
``~partition``: negative, so its first byte is >= 0x80 and no live blob can be mistaken for one.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statesnap.checkpoint import datafile
from statesnap.keys.index import KeyIndex, binary_parts
from statesnap.keys.order import key_order

__all__ = [
    "HEADER",
    "HEADER_SIZE",
    "HEADER_STRUCT",
    "NO_TIMESTAMP",
    "ChangeSet",
    "KafkaMessage",
    "Record",
    "StateStore",
    "blob_origin",
    "decode_changes",
    "decode_rows",
    "encode_rows",
    "header_fields",
    "partition_prefixes",
    "tombstone_blob",
]

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

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """:meth:`get` of each of *keys*, in order: for callers with many keys at once (a
        follower's HTTP scan, processors), cheaper per key than as many :meth:`get` calls."""
        ...

    def row_origin(self, key: bytes) -> tuple[int, int] | None:
        """(partition, offset) of the record that wrote *key*'s live row, where the store keeps
        it (rows restored into a columnar base keep only their values): for telling a producer's
        partitioner from the table's. Only error paths ask."""
        ...

    def __contains__(self, key: object) -> bool: ...

    def __len__(self) -> int: ...

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value), in no particular order (the cheapest full pass; see :meth:`scan`)."""
        ...

    def scan(
        self, after: bytes | None = None, prefix: bytes | None = None, limit: int | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) pairs in ascending key-byte order: keys greater than *after*, starting
        with *prefix*, at most *limit* of them. Costs O(log n + page) where the store allows."""
        ...

    def apply(self, partition: int, records: Sequence[Record]) -> None:
        """Apply changelog records of one partition in offset order."""
        ...

    def expire(self, partition: int, keys: Sequence[bytes], offset: int, timestamp: int) -> int:
        """Delete those of *keys* the store holds, as a tombstone at *offset*/*timestamp* each
        would — except that a key the store did not hold when its change set began (written and
        now deleted between two checkpoints: a processor's window that came and went) leaves the
        change set instead, where the store tracks that (:attr:`ChangeSet.born`). No checkpoint
        holds such a key, so none of them needs a tombstone, and the change set, the next delta
        and export stay bounded by what lives plus what changed. Returns the keys deleted."""
        ...

    def track_births(self) -> None:
        """From now on, note the keys written that the store did not hold when its change set
        began (:attr:`ChangeSet.born`), so that :meth:`expire` can forget them: a processor with
        window stores asks for it; other tables do not pay the lookup per write."""
        ...

    def apply_messages(self, partition: int, messages: Sequence[KafkaMessage]) -> None:
        """Apply Kafka messages of one partition in offset order (the replay hot path).

        Messages without a key are skipped: a table is keyed (Kafka Streams does the same).
        """
        ...

    def load(self, partition: int, rows: pa.Table, index: KeyIndex | None = None) -> None:
        """Bulk-load a partition's checkpointed rows (sorted by key, no tombstones). *index*: the
        rows' persisted key index, for a store that looks keys up in the rows themselves (the
        columnar store); the others copy the rows and ignore it."""
        ...

    def export(self) -> dict[int, pa.Table]:
        """The full contents per partition, as data-file tables sorted by key."""
        ...

    def changes(self) -> dict[int, pa.Table]:
        """Rows written since the last :meth:`mark_checkpointed`, per partition, as data-file
        tables sorted by key; a deleted key is a row with a null value and the tombstone's offset
        and timestamp. Applying them (newest row per key, tombstones delete) to the previous
        export gives the current export: the contents of a ``delta`` file."""
        ...

    def mark_checkpointed(self) -> None:
        """Forget the change set: the rows returned by the last :meth:`changes` or
        :meth:`export` are now in a checkpoint. Rows written after that call stay in the set
        (a background writer may keep applying while a checkpoint is written); without such a
        call nothing is forgotten: a report that wrote no file of this store (its offsets had not
        moved) may be marked long after, when later records are in the set."""
        ...

    def forget_changes(self) -> None:
        """Drop the whole change set: for a table no checkpoint is ever taken of (a read-only
        follower, no checkpoint store), whose change set would otherwise grow to every key."""
        ...

    def compact(self) -> None:
        """Fold rows written since the restore into the store's compact form where it keeps them
        apart (the columnar overlay), once they outgrow their share: what a checkpoint's export
        does, for a table that never checkpoints. Rows and reads are unchanged."""
        ...

    def drop_partitions(self, partitions: Collection[int]) -> int:
        """Forget every row (and change-set entry) of *partitions*; returns the live rows dropped.

        A member of a consumer group calls it when partitions move to another member. Costs a
        pass over the store: rebalances are rare next to writes."""
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


def decode_rows(keys: pa.Array, blobs: pa.Array, *, keys_sorted: bool = False) -> dict[int, pa.Table]:
    """Split header + value blobs back into per-partition data-file tables sorted by key.

    Tombstone blobs become rows with a null value in their partition. The header fields are
    gathered by numpy straight from the blobs' buffer; rows are ordered by partition, then key, in
    one radix sort (:func:`~statesnap.keys.order.key_order`), so the whole table is reordered
    by one ``take`` and each partition is a zero-copy slice. *keys_sorted* (a scan of an ordered
    store): the keys ascend already, and a stable sort of the partitions alone orders the rows.
    """
    n = len(keys)
    if n == 0:
        return {}
    raw_part, offsets, ts = header_fields(blobs)
    dead = raw_part < 0
    partitions = np.where(dead, ~raw_part, raw_part)
    if keys_sorted and int(partitions.max()) < 1 << 16:  # numpy's stable sort of 16 bits is a radix sort
        order = np.argsort(partitions.astype(np.uint16), kind="stable").astype(np.int64)
    else:
        order = key_order(keys, partitions)
    by_part = partitions[order]
    cuts = (np.flatnonzero(np.diff(by_part)) + 1).tolist()
    bounds = list(zip([0, *cuts], [*cuts, n], strict=True))
    take = pa.array(order)
    values = pc.binary_slice(blobs, HEADER_SIZE, (1 << 31) - 1).take(take)  # drop headers first: less to move
    dead_sorted = dead[order]
    if dead_sorted.any():
        values = pc.if_else(pa.array(dead_sorted), pa.scalar(None, pa.binary()), values)
    ts_sorted = ts[order]
    table = pa.table(
        {
            "key": keys.take(take),
            "value": values,
            "offset": pa.array(offsets[order]),
            "timestamp": pa.array(ts_sorted, mask=ts_sorted < 0).cast(datafile.TIMESTAMP),
        },
        schema=datafile.SCHEMA,
    )
    return {int(by_part[lo]): table.slice(lo, hi - lo) for lo, hi in bounds}


def header_fields(blobs: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(partition, offset, timestamp) of every blob, read from unaligned views of its buffer."""
    offs, data = binary_parts(blobs)
    starts = offs[:-1].astype(np.int64)
    raw = np.frombuffer(data, np.uint8)
    size = raw.size  # >= HEADER_SIZE: every blob starts with a header
    part = np.ndarray(shape=(size - 3,), dtype=">i4", buffer=raw, strides=(1,))[starts]
    wide = np.ndarray(shape=(size - 7,), dtype=">i8", buffer=raw, strides=(1,))
    return part.astype(np.int32), wide[starts + 4].astype(np.int64), wide[starts + 12].astype(np.int64)


#: ``HEADER_STRUCT.pack(partition, offset, timestamp)``: the per-record header on the hot path.
HEADER_STRUCT = struct.Struct(">iqq")


def blob_origin(blob: bytes | memoryview | None) -> tuple[int, int] | None:
    """(partition, offset) in a row blob's header; None for no row or a tombstone."""
    if blob is None or len(blob) < HEADER_SIZE:
        return None
    partition, offset, _ts = HEADER_STRUCT.unpack(bytes(blob[:HEADER_SIZE]))
    return (partition, offset) if partition >= 0 else None


def partition_prefixes(partitions: Collection[int]) -> tuple[bytes, ...]:
    """The first header bytes of the live and tombstone blobs of *partitions*: a blob belongs to
    one of them iff it starts with one of these (``blob.startswith(prefixes)``)."""
    return tuple(struct.pack(">i", q) for p in partitions for q in (p, ~p))


def tombstone_blob(partition: int, offset: int, timestamp: int) -> bytes:
    """The header-only blob that records a deletion (see the module docstring)."""
    return HEADER_STRUCT.pack(~partition, offset, timestamp)


def decode_changes(changed: Mapping[bytes, bytes]) -> dict[int, pa.Table]:
    """A change set (key → live or tombstone blob) as per-partition delta tables sorted by key."""
    if not changed:
        return {}
    return decode_rows(pa.array(list(changed), pa.binary()), pa.array(list(changed.values()), pa.binary()))


class ChangeSet:
    """Keys written since the last checkpoint, with their newest blob: one dict store per record.

    Writers store into ``rows`` and hold ``lock`` for each batch they apply (once per batch, not
    per record). ``snapshot()`` hands ``rows`` out whole and starts a fresh dict for later writes;
    ``mark_checkpointed()`` then drops the handed-out dict: O(1) whatever the change set's size,
    and writes racing a checkpoint are never lost (they went to the fresh dict). A checkpoint that
    fails never marks, and the next ``snapshot()`` folds the newer writes into the handed-out rows.
    """

    __slots__ = ("_handed_out", "born", "lock", "rows", "tracking")

    def __init__(self) -> None:
        self.rows: dict[bytes, bytes] = {}
        #: Keys of ``rows`` the store did not hold when ``rows`` began (they are in no checkpoint,
        #: nor in the handed-out rows): :meth:`StateStore.expire` of one forgets it instead of
        #: keeping a tombstone, so rows that came and went between checkpoints (a processor's
        #: expired windows) leave nothing for the next delta, export or merge to walk. Writers
        #: that do not track it leave it empty (their expiries keep tombstones).
        self.born: set[bytes] = set()
        #: Whether writers track :attr:`born` (a lookup per write: only stores that expire rows
        #: ask for it, see :meth:`StateStore.track_births`).
        self.tracking = False
        self._handed_out: dict[bytes, bytes] | None = None
        self.lock = threading.Lock()

    def snapshot(self) -> dict[bytes, bytes]:
        """Every change not yet marked as checkpointed. Read it before the next call: that call
        may add newer writes to the same dict."""
        with self.lock:
            return self.snapshot_locked()

    def snapshot_locked(self) -> dict[bytes, bytes]:
        """:meth:`snapshot`, for a caller that holds :attr:`lock` (an export reading the rows
        that go with it)."""
        handed = self._handed_out
        if handed is None:
            handed = self.rows
        elif self.rows:
            handed.update(self.rows)  # newer writes win
        self._handed_out = handed
        self.rows = {}
        self.born = set()
        return handed

    def mark_checkpointed(self) -> None:
        with self.lock:
            self._handed_out = None  # only what was handed out: later writes are in `rows`

    def drop_partitions(self, partitions: Collection[int]) -> None:
        """Forget the entries of *partitions* (their rows left the store)."""
        prefixes = partition_prefixes(partitions)
        with self.lock:
            self.rows = {k: b for k, b in self.rows.items() if not b.startswith(prefixes)}
            self.born = {k for k in self.born if k in self.rows}
            if self._handed_out is not None:
                self._handed_out = {k: b for k, b in self._handed_out.items() if not b.startswith(prefixes)}

    def clear(self) -> None:
        with self.lock:
            self.rows = {}
            self.born = set()
            self._handed_out = None
