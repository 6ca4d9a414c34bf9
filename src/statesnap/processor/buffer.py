"""The writes of the batch being processed, kept apart from the task's store until they count.

A handler's writes go to ``pending`` (this record's); when the handler returns they join
``batch``; if it raises they are dropped, so a record sent to the dead-letter topic leaves no
half of its writes behind. ``batch`` reaches the store in one ``apply`` per partition batch — the
store's fast path — and reads see ``pending``, then ``batch``, then the store (read your writes).
"""

from __future__ import annotations

from collections.abc import Iterator

from statesnap.stores import StateStore

__all__ = ["WriteBuffer"]

#: A buffered write: (value or None for a delete, input offset, input timestamp).
Write = tuple[bytes | None, int, int]


class WriteBuffer:
    """Buffered writes of one task (all stores share its keyspace)."""

    __slots__ = ("batch", "pending", "store")

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self.pending: dict[bytes, Write] = {}
        self.batch: dict[bytes, Write] = {}

    def get(self, key: bytes) -> bytes | None:
        write = self.pending.get(key)
        if write is None:
            write = self.batch.get(key)
        if write is not None:
            return write[0]
        return self.store.get(key)

    def put(self, key: bytes, value: bytes | None, offset: int, timestamp: int) -> None:
        self.pending[key] = (value, offset, timestamp)

    def accept(self) -> None:
        """The record's handlers returned: its writes count."""
        if self.pending:
            self.batch.update(self.pending)
            self.pending.clear()

    def reject(self) -> None:
        """A handler raised: forget the record's writes."""
        self.pending.clear()

    def apply(self, partition: int) -> None:
        """Hand the batch's writes to the store (end of a partition's batch)."""
        if self.batch:
            self.store.apply(partition, [(k, v, off, ts) for k, (v, off, ts) in self.batch.items()])
            self.batch.clear()

    def keys(self, prefix: bytes) -> Iterator[bytes]:
        """Live keys starting with *prefix*, in byte order, buffered writes included."""
        writes = {**self.batch, **self.pending}
        mine = {k: w for k, w in writes.items() if k.startswith(prefix)}
        stored = (k for k, _ in self.store.scan(prefix=prefix) if k not in mine)
        live = [k for k, w in mine.items() if w[0] is not None]
        yield from sorted([*stored, *live])
