"""The RocksDB store's change set, kept in the database as column families rather than in Python.

What a delta checkpoint writes is every key written since the last checkpoint, with its newest blob.
The memory stores keep that in a dict (:class:`~statesnap.stores.base.ChangeSet`); the RocksDB
store is the one meant for state larger than memory, and a dict of every changed key made its RSS
grow with the state (~290 B a key: 2.9 GB at 10 M keys during a catch-up) — the store bounded
nothing. Here each write batch puts the blob into the table *and* into the current change family,
in the same atomic ``WriteBatch``; RocksDB flushes the family to SST files like any other data, so
its memory is its memtable.

The protocol is :class:`~statesnap.stores.base.ChangeSet`'s: :meth:`snapshot` hands the current
family out and starts a fresh one for later writes; :meth:`mark_checkpointed` drops the handed-out
family (one ``DropColumnFamily``, whatever its size); a checkpoint that fails never marks, and the
next :meth:`snapshot` folds the newer family into the handed-out one (newer writes win).
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterable
from itertools import islice
from operator import itemgetter
from typing import Any, cast

import pyarrow as pa
from rocksdict import ColumnFamily, Options, Rdict, Snapshot, WriteBatch

from statesnap.stores.base import decode_rows, partition_prefixes

__all__ = ["ChangeFamilies", "decode_scan"]

#: Rows turned into Arrow arrays at once when a change family is read or folded.
_CHUNK = 256 * 1024
_PREFIX = "changes-"
#: What rocksdict's ``Snapshot[key]`` says of a key it does not hold (a bare ``Exception``).
_NOT_FOUND = "key not found"
#: A scanned (key, blob) pair's halves, taken at C speed.
_KEY, _BLOB = itemgetter(0), itemgetter(1)


def decode_scan(items: Iterable[tuple[Any, Any]]) -> dict[int, pa.Table]:
    """A RocksDB scan's (key, blob) pairs as per-partition tables sorted by key (RocksDB's order is
    the byte order data files are sorted in), turned into Arrow a chunk at a time so that a
    scan of the whole table holds one chunk of Python objects at once. The pairs are split at C
    speed (``itemgetter``), and the keys arrive sorted: only the partitions are sorted."""
    parts: dict[int, list[pa.Table]] = {}
    scan = iter(items)
    while chunk := list(islice(scan, _CHUNK)):
        keys = pa.array(list(map(_KEY, chunk)), pa.binary())
        blobs = pa.array(list(map(_BLOB, chunk)), pa.binary())
        del chunk
        for p, t in decode_rows(keys, blobs, keys_sorted=True).items():
            parts.setdefault(p, []).append(t)
    return {p: pa.concat_tables(ts) for p, ts in parts.items()}


class ChangeFamilies:
    """Keys written since the last checkpoint, in column families ``changes-<n>`` of *db*.

    Writers hold :attr:`lock` while they build and write a batch and put each blob into
    :meth:`family` too, so a snapshot never splits a batch.
    """

    def __init__(self, db: Rdict, options: Options) -> None:
        self._db = db
        self._options = options
        self._serial = 0
        self._handed_out: str | None = None
        self.lock = threading.Lock()
        self._current = self._create()
        #: The table as the current family began (a RocksDB snapshot), once births are tracked:
        #: a key it does not hold was born since, so no checkpoint holds it (see :meth:`born`).
        self._before: Snapshot | None = None

    def track_births(self) -> None:
        """From now on, tell the keys born since the current family began (:meth:`born`)."""
        with self.lock:
            self._before = self._db.snapshot()

    def births_from_now(self) -> None:
        """Count births from the table as it is now: a new family began, or rows reached the
        table outside a write batch (a restore's SST files), which count as held before it.
        Call with :attr:`lock` held."""
        if self._before is not None:
            self._before = self._db.snapshot()

    def release(self) -> None:
        """Let the snapshot go (before the database closes)."""
        with self.lock:
            self._before = None

    def born(self, keys: Iterable[bytes]) -> set[bytes]:
        """Those of *keys* the table did not hold when the current family began (none unless
        births are tracked): deleting one needs no tombstone. Call with :attr:`lock` held.

        One read per key of the snapshot, and only on expiry, not per write: RocksDB keeps for it
        only the versions rows had when the family began and that were overwritten since; for
        the window stores that track births those are the windows then live."""
        before = self._before
        if before is None:
            return set()
        born = set()
        for key in keys:
            try:
                before[key]
            except Exception as e:  # rocksdict's Snapshot raises a bare Exception for a missing key
                if _NOT_FOUND not in str(e):
                    raise  # a read that failed is no answer: guessing "born" would drop a tombstone
                born.add(key)
        return born

    def _create(self) -> str:
        self._serial += 1
        name = f"{_PREFIX}{self._serial}"
        self._db.create_column_family(name, self._options)
        return name

    def family(self) -> ColumnFamily:
        """The family writes go to now (call with :attr:`lock` held)."""
        return self._db.get_column_family_handle(self._current)

    def snapshot(self) -> str:
        """Hand out every change not yet marked as checkpointed: the name of the family holding
        them, to :meth:`read` before the next call (which may fold newer writes into it)."""
        with self.lock:
            if self._handed_out is None:
                self._handed_out = self._current
            else:
                self._fold(self._current, self._handed_out)
                self._db.drop_column_family(self._current)
            self._current = self._create()
            self.births_from_now()
            return self._handed_out

    def _fold(self, newer: str, into: str) -> None:
        target = self._db.get_column_family_handle(into)
        batch = WriteBatch(raw_mode=True)
        for n, (key, blob) in enumerate(self._db.get_column_family(newer).items(), 1):
            batch.put(key, blob, target)
            if n % _CHUNK == 0:
                self._db.write(batch)
                batch = WriteBatch(raw_mode=True)
        self._db.write(batch)

    def read(self, name: str) -> dict[int, pa.Table]:
        """The family's rows as per-partition delta tables sorted by key."""
        return decode_scan(self._db.get_column_family(name).items())

    def mark_checkpointed(self) -> None:
        """Drop what :meth:`snapshot` handed out: later writes are in the current family."""
        with self.lock:
            if self._handed_out is not None:
                self._db.drop_column_family(self._handed_out)
                self._handed_out = None

    def drop_partitions(self, partitions: Collection[int]) -> None:
        """Forget the entries of *partitions* (their rows left the store)."""
        prefixes = partition_prefixes(partitions)
        with self.lock:
            for name in (self._current, self._handed_out):
                if name is None:
                    continue
                handle = self._db.get_column_family_handle(name)
                batch = WriteBatch(raw_mode=True)
                for key, blob in self._db.get_column_family(name).items():
                    if cast(bytes, blob).startswith(prefixes):
                        batch.delete(key, handle)
                self._db.write(batch)

    def clear(self) -> None:
        """Forget every change (a new family, the old ones dropped)."""
        with self.lock:
            for name in (self._current, self._handed_out):
                if name is not None:
                    self._db.drop_column_family(name)
            self._handed_out = None
            self._current = self._create()
            self.births_from_now()
