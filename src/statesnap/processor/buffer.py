"""The writes of the records being processed, kept apart from the task's store until they count
and, in a task, held across batches as a write-back cache.

A handler's writes go straight into ``batch`` (the current partition's writes), and the first
write of a key by the record being handled saves what ``batch`` held for it in ``undo``. When
the handlers return, the record's writes count (``undo`` is forgotten); if one raises, ``undo``
puts ``batch`` back, so a record sent to the dead-letter topic leaves no half of its writes
behind. A read looks in ``batch``, then the store (read your writes).

When each partition's writes reach the store depends on :attr:`WriteBuffer.hold`:

- 0 (a processor with a TTL store, whose sweep scans the store itself; a handler built outside
  a task): at the end of every partition's batch, in one ``apply`` — the store's fast path.
- N > 0 (a task's handlers and batch folds, on either engine; a window store's expiry forgets
  what is held of the expired windows, :meth:`WriteBuffer.expire`, so a window that opens and
  closes between two commit points never reaches the store):
  they stay here, across batches, until more than N keys are held or a commit point comes
  (:meth:`commit`), as Kafka Streams' record cache holds a task's writes until its commit or
  until the cache is full. A key written by many records between two commit points then
  reaches the store once, and its reads are one dictionary lookup: while catching up over
  200 k keys that is a fifth of the per-record path's cost (``benchmarks/aggregations.py --only
  handler``). Where keys are seldom written twice (millions of them, each touched once in a
  while) holding costs more than it saves (a second large dictionary between the records and
  the store: 5-15 % more per record): when N keys fill up before the records written since the
  last hand-over reach twice that, writes go to the store at every batch's end again, and a
  commit point tries holding anew once :data:`RETRY_AFTER` times N records went by.

A count folded per batch holds its aggregates decoded (:mod:`statesnap.processor.held_counts`):
per key (per key and tumbling window) an integer and the offset and timestamp of its last record,
added to by vector operations per batch instead of a read, a decode, an encode and a write per key.
They are encoded into the held writes at every hand-over, and before any other path (a batch the
count cannot fold at once, an exactly-once replay) reads the store (:meth:`WriteBuffer.settle`).

Readers from outside the handlers read through :class:`HeldReads`, so what a processor's store
shows and what its positions claim stay the same (they may see a write of the record being
handled a moment before it counts: a rejected record's writes are put back as they are now).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from operator import add
from typing import Any, Protocol

from statesnap.processor.held_counts import HeldCounts, Write
from statesnap.stores import StateStore

__all__ = ["HELD_KEYS", "RETRY_AFTER", "HeldReads", "StoreReads", "WriteBuffer"]

#: What ``undo`` saves for a key the batch did not hold yet.
_ABSENT: Write = (b"", -1, -1)

#: Keys a processor holds across batches before they go to the store (about 250 B
#: each with their values: ~64 MB at most; Kafka Streams' record cache defaults to 10 MB).
HELD_KEYS = 262_144
#: Holding that did not pay is tried again at a commit point once this many times the hold's keys
#: in records went by meanwhile: a try costs about 10 % while it fills, so at most ~1 % in all.
RETRY_AFTER = 8


class WriteBuffer:
    """Buffered writes of one task (all stores share its keyspace), per partition."""

    __slots__ = (
        "_counts",
        "_partitions",
        "_paused",
        "_paused_for",
        "_since",
        "_stored",
        "batch",
        "hold",
        "store",
        "undo",
    )

    def __init__(self, store: StateStore) -> None:
        self.store = store
        #: Writes not yet in the store, per partition; ``batch`` is the current partition's.
        self._partitions: dict[int, dict[bytes, Write]] = {}
        self.batch: dict[bytes, Write] = {}
        self.undo: dict[bytes, Write] = {}
        #: Keys held across batches before :meth:`apply` hands them over (0: none, see module).
        self.hold = 0
        #: Records applied since writes were last handed over; whether holding is off (it did
        #: not pay: see the module), and the records applied since it went off.
        self._since = 0
        self._paused = False
        self._paused_for = 0
        #: Batch counts' decoded aggregates, per store (see :class:`HeldCounts`).
        self._counts: dict[str, HeldCounts] = {}
        #: ``store.get``, bound once: a handler's store read that misses ``batch`` calls it.
        self._stored: Callable[[bytes], bytes | None] = store.get

    def switch(self, partition: int) -> None:
        """The records handled next are *partition*'s: ``batch`` becomes its writes."""
        batch = self._partitions.get(partition)
        if batch is None:
            batch = self._partitions[partition] = {}
        self.batch = batch

    def get(self, key: bytes) -> bytes | None:
        write = self.batch.get(key)
        if write is not None:
            return write[0]
        return self._stored(key)

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """:meth:`get` of each of *keys* (a batch fold's reads): the held ones by one C-level
        ``map``, the others by one ``get_many`` of the store."""
        batch = self.batch
        if not batch:
            return self.store.get_many(keys)
        writes = list(map(batch.get, keys))
        if None not in writes:
            return [write[0] for write in writes]  # type: ignore[index]
        stored = iter(self.store.get_many([k for k, w in zip(keys, writes, strict=True) if w is None]))
        return [next(stored) if write is None else write[0] for write in writes]

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

    @property
    def holding(self) -> bool:
        """Whether writes are held across batches now (see the module)."""
        return self.hold > 0 and not self._paused

    def counts(
        self,
        store: str,
        encode: Callable[[list[Any]], list[bytes]],
        index: Callable[[int, int, list[bytes]], None] | None = None,
    ) -> HeldCounts | None:
        """Where a count of *store* folded per batch holds its aggregates (*encode*, *index*: see
        :class:`HeldCounts`), or None while writes are not held."""
        if not self.holding:
            return None
        held = self._counts.get(store)
        if held is None:
            held = self._counts[store] = HeldCounts(store, encode, index)
        return held

    def expire(self, store: str, partition: int, through: int, keys: Sequence[bytes]) -> None:
        """*store*'s windows in *partition* starting at or before *through* expired: their held
        counts and the held writes of *keys* (their stored keys) are forgotten. What reached the
        store of them the caller deletes there, after this: a held write can never land later."""
        counts = self._counts.get(store)
        if counts is not None:
            counts.drop(partition, through)
        batch = self._partitions.get(partition)
        if batch and keys:
            pop = batch.pop
            for key in keys:
                pop(key, None)

    def settle(self) -> None:
        """Held counts into the held writes: before a path that reads the store otherwise."""
        for held in self._counts.values():
            held.hand_over(self._partitions)

    def apply(self, partition: int, records: int) -> None:
        """End of *partition*'s batch of *records*: its writes go to the store, unless they may
        be held (no more than :attr:`hold` keys in all, and holding pays)."""
        if not self.holding:
            self._paused_for += records
            self._hand_over(partition, self._partitions.get(partition))
            return
        self._since += records
        held = sum(map(len, self._partitions.values())) + sum(map(len, self._counts.values()))
        if held <= self.hold:
            return
        self._paused = self._since < 2 * held  # keys seldom written twice: holding does not pay
        self.flush()

    def flush(self) -> None:
        """Every held write to the store (a partition leaving, the cache full)."""
        self.settle()
        for partition, batch in self._partitions.items():
            self._hand_over(partition, batch)
        self._since = 0

    def commit(self) -> None:
        """A commit point: every held write to the store; where holding stopped paying, it is
        tried anew here once :data:`RETRY_AFTER` times the hold in records went by."""
        self.flush()
        if self._paused and self._paused_for >= RETRY_AFTER * self.hold:
            self._paused = False
            self._paused_for = 0

    def _hand_over(self, partition: int, batch: dict[bytes, Write] | None) -> None:
        if batch:
            # (key,) + (value, offset, timestamp) per key, built at C speed (a comprehension
            # unpacking each write costs about twice as much per row). The store has them before
            # they leave the buffer: a reader never finds a key in neither.
            self.store.apply(partition, list(map(add, zip(batch), batch.values())))
            batch.clear()

    def keys(self, prefix: bytes) -> Iterator[bytes]:
        """Live keys starting with *prefix*, in byte order, buffered writes included (*prefix*
        is the current partition's)."""
        mine = {k: w for k, w in self.batch.items() if k.startswith(prefix)}
        stored = (k for k, _ in self.store.scan(prefix=prefix) if k not in mine)
        live = [k for k, w in mine.items() if w[0] is not None]
        yield from sorted([*stored, *live])

    def held(self, key: bytes) -> Write | None:
        """The write of *key* not yet in the store, in any partition (readers from other
        threads: each lookup is one atomic dictionary read)."""
        for counts in list(self._counts.values()):
            counted = counts.held(key)
            if counted is not None:
                return counted
        for batch in list(self._partitions.values()):
            write = batch.get(key)
            if write is not None:
                return write
        return None

    def held_items(self, prefix: bytes) -> list[tuple[bytes, bytes | None]]:
        """Writes not yet in the store under *prefix*, in key order (a copy: see :meth:`held`)."""
        found: dict[bytes, bytes | None] = {}
        for batch in list(self._partitions.values()):
            found.update((k, w[0]) for k, w in list(batch.items()) if k.startswith(prefix))
        for counts in list(self._counts.values()):  # newer than any held write of their keys
            found.update(counts.held_items(prefix))
        return sorted(found.items())


class StoreReads(Protocol):
    """The reads a store's readers outside the handlers make (a store, or :class:`HeldReads`)."""

    def get(self, key: bytes) -> bytes | None: ...

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]: ...

    def scan(self, *, prefix: bytes) -> Iterator[tuple[bytes, bytes]]: ...


class HeldReads:
    """The task's store as readers outside the handlers see it: writes the buffer still holds
    over the store's rows (the reads :class:`~statesnap.processor.stores.StoreReader` makes)."""

    __slots__ = ("_buffer", "_store")

    def __init__(self, buffer: WriteBuffer) -> None:
        self._buffer = buffer
        self._store = buffer.store

    def get(self, key: bytes) -> bytes | None:
        write = self._buffer.held(key)
        return self._store.get(key) if write is None else write[0]

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        if not self._buffer.hold:
            return self._store.get_many(keys)
        return [self.get(key) for key in keys]

    def scan(self, *, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) under *prefix* in key order, held writes winning over stored rows."""
        held = self._buffer.held_items(prefix) if self._buffer.hold else []
        if not held:
            yield from self._store.scan(prefix=prefix)
            return
        i, n = 0, len(held)
        for key, value in self._store.scan(prefix=prefix):
            while i < n and held[i][0] <= key:
                held_key, held_value = held[i]
                i += 1
                if held_value is not None:
                    yield held_key, held_value
                if held_key == key:  # the held write replaces the stored row
                    break
            else:
                yield key, value
        for held_key, held_value in held[i:]:
            if held_value is not None:
                yield held_key, held_value
