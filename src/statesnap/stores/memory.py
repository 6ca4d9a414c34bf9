"""In-memory state store: one dict of key → header+value blob.

Sized for tables that fit in RAM: about 2× the raw key and value bytes (one bytes object per key
and per value plus the dict slot). Every row is a Python object, so a restore costs a pass of
Python work per row; the ``columnar`` store keeps restored rows in Arrow buffers instead.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Iterator, Sequence

import pyarrow as pa

from statesnap.keys.index import KeyIndex
from statesnap.stores.base import (
    HEADER_SIZE,
    HEADER_STRUCT,
    NO_TIMESTAMP,
    ChangeSet,
    KafkaMessage,
    Record,
    blob_origin,
    decode_changes,
    decode_rows,
    encode_rows,
    partition_prefixes,
)

__all__ = ["MemoryStore"]


class MemoryStore:
    """A dict store; lost on exit, rebuilt from checkpoints at start-up."""

    kind = "memory"

    def __init__(self) -> None:
        self._rows: dict[bytes, bytes] = {}
        self._changes = ChangeSet()
        # Sorted keys for scan(), built on demand; dropped when a batch adds or deletes keys.
        self._sorted: list[bytes] | None = None

    def get(self, key: bytes) -> bytes | None:
        blob = self._rows.get(key)
        return None if blob is None else blob[HEADER_SIZE:]

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """The dict lookups in one C-level ``map``; only the header strip is a Python step."""
        return [None if blob is None else blob[HEADER_SIZE:] for blob in map(self._rows.get, keys)]

    def row_origin(self, key: bytes) -> tuple[int, int] | None:
        return blob_origin(self._rows.get(key))

    def __contains__(self, key: object) -> bool:
        return key in self._rows

    def __len__(self) -> int:
        return len(self._rows)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        for key, blob in list(self._rows.items()):
            yield key, blob[HEADER_SIZE:]

    def scan(
        self, after: bytes | None = None, prefix: bytes | None = None, limit: int | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """Ordered reads over a lazily sorted key list: O(n log n) once after the key set
        changed, then O(log n + page) per call."""
        keys = self._sorted
        if keys is None:
            keys = self._sorted = sorted(self._rows)
        if after is not None and (prefix is None or after >= prefix):
            i = bisect.bisect_right(keys, after)
        else:
            i = bisect.bisect_left(keys, prefix) if prefix is not None else 0
        rows = self._rows
        left = limit
        while i < len(keys) and (left is None or left > 0):
            key = keys[i]
            i += 1
            if prefix is not None and not key.startswith(prefix):
                return
            blob = rows.get(key)
            if blob is None:  # deleted since the list was sorted
                continue
            yield key, blob[HEADER_SIZE:]
            if left is not None:
                left -= 1

    def apply(self, partition: int, records: Sequence[Record]) -> None:
        rows = self._rows
        pack = HEADER_STRUCT.pack
        size = len(rows)
        deleted = False
        with self._changes.lock:
            changed, born = self._changes.rows, self._changes.born
            if not self._changes.tracking:
                for key, value, offset, ts in records:
                    if value is None:
                        deleted = rows.pop(key, None) is not None or deleted
                        changed[key] = pack(~partition, offset, ts)
                    else:
                        changed[key] = rows[key] = pack(partition, offset, ts) + value
            else:
                held = size
                for key, value, offset, ts in records:
                    if value is None:
                        if rows.pop(key, None) is not None:
                            deleted = True
                            held -= 1
                        elif key not in changed:
                            born.add(key)
                        changed[key] = pack(~partition, offset, ts)
                    else:
                        rows[key] = blob = pack(partition, offset, ts) + value
                        if len(rows) != held:  # a new key (no second lookup of an old one)
                            held += 1
                            if key not in changed:
                                born.add(key)
                        changed[key] = blob
        if deleted or len(rows) != size:
            self._sorted = None

    def track_births(self) -> None:
        self._changes.tracking = True

    def expire(self, partition: int, keys: Sequence[bytes], offset: int, timestamp: int) -> int:
        """Delete the held ones of *keys* (see :meth:`StateStore.expire`): those born since the
        change set began leave it, the others get a tombstone there."""
        rows = self._rows
        pack = HEADER_STRUCT.pack
        gone = 0
        with self._changes.lock:
            changed, born = self._changes.rows, self._changes.born
            for key in keys:
                if rows.pop(key, None) is None:
                    continue
                gone += 1
                if key in born:
                    born.discard(key)
                    del changed[key]
                else:
                    changed[key] = pack(~partition, offset, timestamp)
        if gone:
            self._sorted = None
        return gone

    def apply_messages(self, partition: int, messages: Sequence[KafkaMessage]) -> None:
        rows = self._rows
        pack = HEADER_STRUCT.pack
        size = len(rows)
        deleted = False
        with self._changes.lock:
            changed = self._changes.rows
            for msg in messages:
                key = msg.key()
                if key is None:
                    continue
                value = msg.value()
                ts_type, ts = msg.timestamp()
                if value is None:
                    deleted = rows.pop(key, None) is not None or deleted
                    changed[key] = pack(~partition, msg.offset(), ts if ts_type else NO_TIMESTAMP)
                else:
                    changed[key] = rows[key] = (
                        pack(partition, msg.offset(), ts if ts_type else NO_TIMESTAMP) + value
                    )
        if deleted or len(rows) != size:
            self._sorted = None

    def load(self, partition: int, rows: pa.Table, index: KeyIndex | None = None) -> None:
        if rows.num_rows == 0:
            return
        keys = rows.column("key").combine_chunks().to_pylist()
        self._rows.update(zip(keys, encode_rows(partition, rows).to_pylist(), strict=True))
        self._sorted = None

    def export(self) -> dict[int, pa.Table]:
        with self._changes.lock:  # writers apply whole batches under it: the two lists agree
            self._changes.snapshot_locked()  # what mark_checkpointed() may forget once this is written
            rows = self._rows
            keys, blobs = list(rows), list(rows.values())
        return decode_rows(pa.array(keys, pa.binary()), pa.array(blobs, pa.binary()))

    def changes(self) -> dict[int, pa.Table]:
        return decode_changes(self._changes.snapshot())

    def mark_checkpointed(self) -> None:
        self._changes.mark_checkpointed()

    def forget_changes(self) -> None:
        self._changes.clear()

    def compact(self) -> None:
        """Nothing to do: every row is in the one dict."""

    def drop_partitions(self, partitions: Collection[int]) -> int:
        prefixes = partition_prefixes(partitions)
        before = len(self._rows)
        # A new dict, swapped in whole: readers on other threads see the old or the new one.
        self._rows = {k: b for k, b in self._rows.items() if not b.startswith(prefixes)}
        self._sorted = None
        self._changes.drop_partitions(partitions)
        return before - len(self._rows)

    def clear(self) -> None:
        self._rows = {}
        self._sorted = None
        self._changes.clear()

    def flush(self) -> None:
        """Nothing to do: memory holds no durable state."""

    def close(self) -> None:
        self._rows = {}
        self._sorted = None
        self._changes.clear()
