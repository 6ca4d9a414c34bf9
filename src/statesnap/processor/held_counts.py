"""A count's aggregates held decoded between hand-overs (:class:`HeldCounts`), for the write-back
cache of :mod:`statesnap.processor.buffer`.

A count folded per batch (:mod:`statesnap.processor.folds`) keeps, per key, an integer and the
offset and timestamp of its last record, instead of a store read, a decode, an encode and a
buffered write per key and batch. Where they live is what makes it fast: a dictionary from Kafka
key bytes to a slot, and three NumPy columns (count, offset, timestamp) indexed by slot. Over
~50 k keys a partition each probe of a large dictionary is a cache miss (about 200-350 ns), so a
batch probes one dictionary once per record (the plain loop's ``counts.get(k, 0) + 1`` probes one
too; the other probes of a batch's keys find them in cache) and everything else is a vector
operation over the batch. Integers and arrays are
also invisible to the garbage collector: an (offset, timestamp) tuple per key took 15 % of a
count's time in collections, and a second dictionary of origins a fifth more.

Readers on other threads (:meth:`HeldCounts.held`, :meth:`HeldCounts.held_items`) read without
locks: a group's slots are only ever added, after its columns have grown to hold them, and a
handed-over group is replaced, never reset in place.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from itertools import filterfalse
from typing import Any, NamedTuple

import numpy as np

from statesnap.processor.keyspace import partition_prefix, window_bytes

__all__ = ["CountGroup", "FreshWindow", "HeldCounts"]

#: A buffered write (statesnap.processor.buffer): (value or None for a delete, input offset,
#: input timestamp).
Write = tuple[bytes | None, int, int]

_INT64 = np.iinfo(np.int64)
#: The largest count an int64 column takes in: 2**40 records below int64's end, so no run of
#: records between two hand-overs can overflow it.
_HIGHEST = int(_INT64.max) - (1 << 40)


class _Columns(NamedTuple):
    """A group's columns, by slot: count, and the offset and timestamp of the last record."""

    counts: np.ndarray[Any, Any]
    offsets: np.ndarray[Any, Any]
    stamps: np.ndarray[Any, Any]

    @classmethod
    def empty(cls, size: int = 1024) -> _Columns:
        return cls(np.zeros(size, np.int64), np.zeros(size, np.int64), np.zeros(size, np.int64))

    def grown(self, needed: int) -> _Columns:
        """Columns holding at least *needed* slots (doubled: amortised one copy per slot)."""
        size = max(needed, 2 * len(self.counts))
        counts = np.zeros(size, self.counts.dtype)
        counts[: len(self.counts)] = self.counts
        offsets, stamps = np.zeros(size, np.int64), np.zeros(size, np.int64)
        offsets[: len(self.offsets)] = self.offsets
        stamps[: len(self.stamps)] = self.stamps
        return _Columns(counts, offsets, stamps)


def _machine_ints(values: list[Any]) -> bool:
    """Whether *values* are all ``int`` (not bool) an int64 column holds without overflowing."""
    if not values:
        return True
    return set(map(type, values)) == {int} and _INT64.min <= min(values) and max(values) <= _HIGHEST


class CountGroup:
    """One group of :class:`HeldCounts`: a partition's keys, or one window of them (see the
    module for its columns)."""

    __slots__ = ("columns", "prefix", "slots")

    def __init__(self, prefix: bytes) -> None:
        #: The stored keys' prefix (store, partition, and window start for a window's group).
        self.prefix = prefix
        #: Kafka key bytes → slot in :attr:`columns`.
        self.slots: dict[bytes, int] = {}
        self.columns = _Columns.empty()

    def __len__(self) -> int:
        return len(self.slots)

    def add(
        self,
        keys: list[bytes],
        last: dict[bytes, int],
        offsets: list[int],
        stamps: list[int],
        load: Callable[[list[bytes]], list[Any]],
    ) -> None:
        """Records counted: *keys* every record's, *last* the distinct ones (in their order
        *offsets* and *stamps* are those of each one's last record); *load* gives the current
        counts of keys the group does not hold yet."""
        slots = self.slots
        new = list(filterfalse(slots.__contains__, last))
        columns = self.columns
        if new:
            n = len(slots)
            if n + len(new) > len(columns.counts):
                columns = self.columns = columns.grown(n + len(new))
            values = load(new)
            if columns.counts.dtype != object and not _machine_ints(values):
                # a count the store holds outside int64 (or not an int): Python objects
                columns = self.columns = columns._replace(counts=columns.counts.astype(object))
            columns.counts[n : n + len(new)] = values
            slots.update(zip(new, range(n, n + len(new)), strict=True))  # after the columns grew
        np.add.at(columns.counts, np.fromiter(map(slots.__getitem__, keys), np.intp, len(keys)), 1)
        at = np.fromiter(map(slots.__getitem__, last), np.intp, len(last))
        columns.offsets[at] = offsets
        columns.stamps[at] = stamps

    def writes(self, encode: Callable[[list[Any]], list[bytes]]) -> tuple[list[bytes], list[Write]]:
        """(stored keys, writes) of every key held."""
        n = len(self.slots)
        columns, prefix = self.columns, self.prefix
        stored = [prefix + k for k in self.slots]
        encoded = encode(columns.counts[:n].tolist())
        origins = zip(columns.offsets[:n].tolist(), columns.stamps[:n].tolist(), strict=True)
        return stored, [(v, o, t) for v, (o, t) in zip(encoded, origins, strict=True)]

    def held(self, key: bytes) -> tuple[Any, int, int] | None:
        """(count, offset, timestamp) of *key*, or None (readers' threads: changes nothing)."""
        slot = self.slots.get(key)
        if slot is None:
            return None
        columns = self.columns  # read after the slot: columns only grow, so it holds the slot
        return columns.counts[slot].item(), int(columns.offsets[slot]), int(columns.stamps[slot])

    def items(self) -> list[tuple[bytes, Any]]:
        """(Kafka key bytes, count) of every key held (readers' threads: changes nothing)."""
        pairs = list(self.slots.items())
        counts = self.columns.counts[np.fromiter((s for _, s in pairs), np.intp, len(pairs))].tolist()
        return [(k, c) for (k, _), c in zip(pairs, counts, strict=True)]


class FreshWindow:
    """A group of :class:`HeldCounts` for a window none of whose keys the store or the held
    writes hold (a window store's index says so): its keys start at 0 without a read, are
    counted by one ``Counter.update`` a run of records, and its records' offsets and timestamps
    are kept as the batches' lists until a hand-over needs them. Most such windows expire
    before one (:meth:`HeldCounts.drop`), and never look at them; per run of records that is
    cheaper than :class:`CountGroup`'s vector operations, whose fixed cost a window's short
    runs do not amortise."""

    __slots__ = ("chunks", "counts", "prefix")

    def __init__(self, prefix: bytes) -> None:
        self.prefix = prefix
        self.counts: Counter[bytes] = Counter()
        #: The records counted: (keys, offsets, timestamps) of each run.
        self.chunks: list[tuple[list[bytes], list[int], list[int]]] = []

    def __len__(self) -> int:
        return len(self.counts)

    def add(self, keys: list[bytes], offsets: list[int], stamps: list[int]) -> None:
        """A run of records counted (*keys*, *offsets*, *stamps*: each record's)."""
        self.counts.update(keys)
        self.chunks.append((keys, offsets, stamps))

    def writes(self, encode: Callable[[list[Any]], list[bytes]]) -> tuple[list[bytes], list[Write]]:
        """(stored keys, writes) of every key held."""
        offsets: dict[bytes, int] = {}
        stamps: dict[bytes, int] = {}
        for keys, offs, sts in self.chunks:  # later records overwrite earlier ones
            offsets.update(zip(keys, offs, strict=True))
            stamps.update(zip(keys, sts, strict=True))
        prefix, counts = self.prefix, self.counts
        encoded = encode(list(counts.values()))
        writes: list[Write] = [(v, offsets[k], stamps[k]) for k, v in zip(counts, encoded, strict=True)]
        return [prefix + k for k in counts], writes

    def held(self, key: bytes) -> tuple[Any, int, int] | None:
        """(count, offset, timestamp) of *key*, or None (readers' threads: changes nothing)."""
        count = self.counts.get(key)
        if count is None:
            return None
        for keys, offsets, stamps in reversed(list(self.chunks)):
            if key in keys:
                at = len(keys) - 1 - keys[::-1].index(key)
                return count, offsets[at], stamps[at]
        return None

    def items(self) -> list[tuple[bytes, Any]]:
        """(Kafka key bytes, count) of every key held (readers' threads: changes nothing)."""
        return list(self.counts.items())


class HeldCounts:
    """A count's aggregates folded per batch and held decoded (see the module), per group: a
    partition's keys, or (a windowed count) a partition's window. A window's group that expires
    before a hand-over is dropped whole (:meth:`drop`): a window that opens and closes between
    two commit points never reaches the store."""

    __slots__ = ("_encode", "_index", "groups", "store")

    def __init__(
        self,
        store: str,
        encode: Callable[[list[Any]], list[bytes]],
        index: Callable[[int, int, list[bytes]], None] | None = None,
    ) -> None:
        """*encode*: the store's values' encoding; *index*: where a window store lists the
        stored keys of a partition's window (:meth:`WindowStore.index_many
        <statesnap.processor.stores.WindowStore.index_many>`) as they reach the store."""
        self.store = store
        self._encode = encode
        self._index = index
        #: Per (partition, window start or None): the group's counts.
        self.groups: dict[tuple[int, int | None], CountGroup | FreshWindow] = {}

    def of(self, partition: int, start: int | None = None) -> CountGroup:
        """The group of *partition*'s keys, or of its window at *start*, to fold a batch into
        (created if there is none yet; a window's must not be a :class:`FreshWindow`)."""
        group = self.groups.get((partition, start))
        if group is None:
            group = self.groups[(partition, start)] = CountGroup(self._prefix(partition, start))
        assert isinstance(group, CountGroup)
        return group

    def fresh(self, partition: int, start: int) -> FreshWindow:
        """A new group for *partition*'s window at *start*, of which nothing is stored."""
        group = self.groups[(partition, start)] = FreshWindow(self._prefix(partition, start))
        return group

    def _prefix(self, partition: int, start: int | None) -> bytes:
        prefix = partition_prefix(self.store, partition)
        return prefix if start is None else prefix + window_bytes(start)

    def group(self, partition: int, start: int | None = None) -> CountGroup | FreshWindow | None:
        """The group :meth:`of` gives, if there is one."""
        return self.groups.get((partition, start))

    def __len__(self) -> int:
        return sum(map(len, self.groups.values()))

    def hand_over(self, batches: dict[int, dict[bytes, Write]]) -> None:
        """Each count encoded into *batches* (the buffer's held writes, per partition), then
        forgotten here: written before they leave, so a reader never finds a key in neither."""
        for (partition, start), group in self.groups.items():
            if not group:
                continue
            stored, writes = group.writes(self._encode)
            batch = batches.get(partition)
            if batch is None:
                batch = batches[partition] = {}
            batch.update(zip(stored, writes, strict=True))
            if start is not None and self._index is not None:
                self._index(partition, start, stored)
        self.groups = {}  # replaced, not cleared: a reader may still be reading one

    def drop(self, partition: int, through: int) -> None:
        """*partition*'s windows starting at or before *through* expired: their counts are
        forgotten (what the store held of them is deleted by the store's expiry)."""
        for group in [g for g in self.groups if g[0] == partition and g[1] is not None and g[1] <= through]:
            del self.groups[group]

    def held(self, stored: bytes) -> Write | None:
        """The held count of the stored key *stored*, encoded, or None."""
        for group in list(self.groups.values()):
            prefix = group.prefix
            if stored.startswith(prefix):
                found = group.held(stored[len(prefix) :])
                if found is not None:
                    count, offset, timestamp = found
                    return (self._encode([count])[0], offset, timestamp)
        return None

    def held_items(self, prefix: bytes) -> list[tuple[bytes, bytes | None]]:
        """(stored key, encoded count) of the held counts under *prefix*."""
        found: list[tuple[bytes, bytes | None]] = []
        for group in list(self.groups.values()):
            mine = group.prefix
            if mine.startswith(prefix) or prefix.startswith(mine):
                items = group.items()
                encoded = self._encode([v for _, v in items])
                found += [
                    (mine + k, v)
                    for (k, _), v in zip(items, encoded, strict=True)
                    if (mine + k).startswith(prefix)
                ]
        return found
