"""The writes of the batch being processed, kept apart from the task's store until they count.

A handler's writes go straight into ``batch``, and the first write of a key by the record being
handled saves what ``batch`` held for it in ``undo``. When the handlers return, the record's
writes count (``undo`` is forgotten); if one raises, ``undo`` puts ``batch`` back, so a record sent
to the dead-letter topic leaves no half of its writes behind. ``batch`` reaches the store in one
``apply`` per partition batch — the store's fast path — and a read looks in ``batch``, then the
store (read your writes): one dictionary lookup before the store's, on the per-record hot path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from operator import add

from statesnap.stores import StateStore

__all__ = ["WriteBuffer"]

#: A buffered write: (value or None for a delete, input offset, input timestamp).
Write = tuple[bytes | None, int, int]
#: What ``undo`` saves for a key the batch did not hold yet.
_ABSENT: Write = (b"", -1, -1)


class WriteBuffer:
    """Buffered writes of one task (all stores share its keyspace)."""

    __slots__ = ("_stored", "batch", "store", "undo")

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self.batch: dict[bytes, Write] = {}
        self.undo: dict[bytes, Write] = {}
        #: ``store.get``, bound once: a handler's store read that misses ``batch`` calls it.
        self._stored: Callable[[bytes], bytes | None] = store.get

    def get(self, key: bytes) -> bytes | None:
        write = self.batch.get(key)
        if write is not None:
            return write[0]
        return self._stored(key)

    def put(self, key: bytes, value: bytes | None, offset: int, timestamp: int) -> None:
        batch, undo = self.batch, self.undo
        if key not in undo:
            undo[key] = batch.get(key, _ABSENT)
        batch[key] = (value, offset, timestamp)

    def accept(self) -> None:
        """The record's handlers returned: its writes count."""
        if self.undo:
            self.undo.clear()

    def reject(self) -> None:
        """A handler raised: put back what the record's writes replaced."""
        batch = self.batch
        for key, before in self.undo.items():
            if before is _ABSENT:
                del batch[key]
            else:
                batch[key] = before
        self.undo.clear()

    def apply(self, partition: int) -> None:
        """Hand the batch's writes to the store (end of a partition's batch)."""
        batch = self.batch
        if batch:
            # (key,) + (value, offset, timestamp) per key, built at C speed (a comprehension
            # unpacking each write costs about twice as much per row)
            self.store.apply(partition, list(map(add, zip(batch), batch.values())))
            batch.clear()

    def keys(self, prefix: bytes) -> Iterator[bytes]:
        """Live keys starting with *prefix*, in byte order, buffered writes included."""
        mine = {k: w for k, w in self.batch.items() if k.startswith(prefix)}
        stored = (k for k, _ in self.store.scan(prefix=prefix) if k not in mine)
        live = [k for k, w in mine.items() if w[0] is not None]
        yield from sorted([*stored, *live])
