"""In-memory state store: one dict of key → header+value blob.

Sized for tables that fit in RAM: about 2× the raw key and value bytes (one bytes object per key
and per value plus the dict slot).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa

from statesnap.stores.base import (
    HEADER_SIZE,
    HEADER_STRUCT,
    NO_TIMESTAMP,
    KafkaMessage,
    Record,
    decode_rows,
    encode_rows,
)


class MemoryStore:
    """The default store; lost on exit, rebuilt from checkpoints at start-up."""

    kind = "memory"

    def __init__(self) -> None:
        self._rows: dict[bytes, bytes] = {}

    def get(self, key: bytes) -> bytes | None:
        blob = self._rows.get(key)
        return None if blob is None else blob[HEADER_SIZE:]

    def __contains__(self, key: object) -> bool:
        return key in self._rows

    def __len__(self) -> int:
        return len(self._rows)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        for key, blob in list(self._rows.items()):
            yield key, blob[HEADER_SIZE:]

    def apply(self, partition: int, records: Sequence[Record]) -> None:
        rows = self._rows
        pack = HEADER_STRUCT.pack
        for key, value, offset, ts in records:
            if value is None:
                rows.pop(key, None)
            else:
                rows[key] = pack(partition, offset, ts) + value

    def apply_messages(self, partition: int, messages: Sequence[KafkaMessage]) -> None:
        rows = self._rows
        pack = HEADER_STRUCT.pack
        for msg in messages:
            key = msg.key()
            if key is None:
                continue
            value = msg.value()
            if value is None:
                rows.pop(key, None)
            else:
                ts_type, ts = msg.timestamp()
                rows[key] = pack(partition, msg.offset(), ts if ts_type else NO_TIMESTAMP) + value

    def load(self, partition: int, rows: pa.Table) -> None:
        if rows.num_rows == 0:
            return
        keys = rows.column("key").combine_chunks().to_pylist()
        self._rows.update(zip(keys, encode_rows(partition, rows).to_pylist(), strict=True))

    def export(self) -> dict[int, pa.Table]:
        snapshot = self._rows.copy()  # C-level copy: consistent even if a writer thread runs
        keys = pa.array(list(snapshot.keys()), pa.binary())
        blobs = pa.array(list(snapshot.values()), pa.binary())
        return decode_rows(keys, blobs)

    def clear(self) -> None:
        self._rows = {}

    def flush(self) -> None:
        """Nothing to do: memory holds no durable state."""

    def close(self) -> None:
        self._rows = {}
