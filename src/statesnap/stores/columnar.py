"""Columnar state store: restored rows stay in the checkpoint's Arrow arrays.

A restore keeps each partition's sorted ``key, value, offset, timestamp`` chunks as they were
decoded (no Python object per row) with the :class:`~statesnap.keys.index.KeyIndex` the
checkpoint holds beside a partition's base (read, not built: no hashing, sorting or scattering),
or builds one over the partitions without, so loading costs about what reading the files costs.
Several partitions' persisted indexes are probed in turn while one index over all of them is
built in the background (see ``columnar_base._MAX_PROBES``). Writes since the restore go to a
dict *overlay* of header+value blobs (as in the memory store), written without looking at the
base, so a tail applies as fast as to the memory store; a tombstone blob there hides a base row,
if any, and ``len`` settles which overlay keys are base rows later, in batches.
:meth:`ColumnarStore.export` merges the two, and adopts the merge as the new base when the
overlay has grown large (a checkpoint is when that work is paid anyway).

Readers on other threads see a consistent store: the base is replaced by one attribute
assignment, and the overlay is a dict the single writer updates in place.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Collection, Iterator, Mapping, Sequence
from itertools import islice
from typing import cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statesnap.checkpoint import datafile
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
    encode_rows,
)
from statesnap.stores.columnar_base import BATCH, Base, PartitionKeys
from statesnap.stores.columnar_merge import merge

__all__ = ["ColumnarStore"]

_from_bytes = int.from_bytes

#: The overlay is merged into the base at export when it holds more than this share of the base
#: rows (or more than _MIN_MERGE rows over an empty base): below it, rebuilding the index costs
#: more than the overlay's dict entries do.
_MERGE_SHARE = 8
_MIN_MERGE = 1 << 16


class ColumnarStore:
    """Restored rows in Arrow arrays plus a dict overlay of later writes; see the module doc."""

    kind = "columnar"

    def __init__(self) -> None:
        self._base = Base.empty()
        # key → header+value blob, or a tombstone blob hiding a base row (base.tombstone_blob).
        self._over: dict[bytes, bytes] = {}
        # len() = base rows + live overlay blobs - overlay keys that are base rows. The overlay
        # only grows between folds (a deleted key keeps its tombstone), so the keys looked up in
        # the base so far are a prefix of its insertion order: _settled of them, _shadowed hits.
        self._settled = 0
        self._shadowed = 0
        self._len = (-1, 0)  # (version, len) of the last count
        self._changes = ChangeSet()
        self._over_sorted: list[bytes] | None = None
        self._version = 0  # bumped by every write batch: export adopts its merge only if unchanged

    # --- reads ---------------------------------------------------------------------------------

    def row_origin(self, key: bytes) -> tuple[int, int] | None:
        return blob_origin(self._over.get(key))

    def get(self, key: bytes) -> bytes | None:
        """The lookup hot path (>= 500 k/s): one tuple per key index holds all the probe reads
        (usually one index; one per partition restored with a persisted index), the hash is
        inlined (keys.index.key_hash), the home slot usually holds the key's entry (see
        keys.index.KeyIndex; the same probe as columnar_base.Base.contains)."""
        blob = self._over.get(key)
        if blob is not None:
            return None if blob[0] >= 0x80 else blob[HEADER_SIZE:]
        probes = self._base.probes
        if probes is None:
            probes = self._base.ready_probes()
        k = _from_bytes(key, "little")
        for halves, scale, p, mix, add, views, local_bits, local_mask in probes:
            h = k * mix % p
            h = (h * h + add) % p
            i = (h * scale >> 30) << 1
            e = halves[i + 1]
            while e < h:
                i += 2
                e = halves[i + 1]
            while e == h:
                row = halves[i]
                ko, kd, vo, vd = views[row >> local_bits]
                j = row & local_mask
                if kd[ko[j] : ko[j + 1]] == key:
                    return vd[vo[j] : vo[j + 1]].tobytes()
                i += 2
                e = halves[i + 1]
        return None

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """:meth:`get` of each key: the overlay by one C-level map, the rest by one vectorized
        base lookup (:meth:`Base.values_many`), for batches large enough to gain by it."""
        if not self._base.batched(len(keys)):
            return list(map(self.get, keys))
        blobs = list(map(self._over.get, keys))  # the overlay first, then the base, as get() reads
        out: list[bytes | None] = [None if b is None or b[0] >= 0x80 else b[HEADER_SIZE:] for b in blobs]
        base = self._base
        missing = [i for i, b in enumerate(blobs) if b is None] if base.rows else []
        if missing:
            if len(missing) == len(keys):
                return base.values_many(keys)
            for i, value in zip(missing, base.values_many([keys[i] for i in missing]), strict=True):
                out[i] = value
        return out

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, bytes):
            return False
        blob = self._over.get(key)
        if blob is not None:
            return blob[0] < 0x80
        return self._base.contains(key)

    def __len__(self) -> int:
        """Exact; after writes it costs one batched base lookup of the keys new to the overlay
        and a pass over the overlay's blobs (cached until the next write)."""
        with self._changes.lock:  # writers hold it per batch: the overlay holds still
            return self._count()

    def _count(self) -> int:
        version, size = self._len
        if version == self._version:
            return size
        over, base = self._over, self._base
        if len(over) > self._settled:
            fresh = list(islice(over, self._settled, None))
            if base.rows:
                self._shadowed += sum(1 for row in base.find_many(fresh) if row >= 0)
            self._settled += len(fresh)
        size = int(base.rows) + sum(1 for blob in over.values() if blob[0] < 0x80) - self._shadowed
        self._len = (self._version, size)
        return size

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Base rows (partition by partition, in key order) not overridden, then the overlay."""
        base, over = self._base, self._over.copy()
        for seg in base.segments:
            keys = seg.table.column("key")
            values = seg.table.column("value")
            for lo in range(0, seg.table.num_rows, BATCH):
                ks = keys.slice(lo, BATCH).to_pylist()
                vs = values.slice(lo, BATCH).to_pylist()
                if over:
                    yield from ((k, v) for k, v in zip(ks, vs, strict=True) if k not in over)
                else:
                    yield from zip(ks, vs, strict=True)
        for key, blob in over.items():
            if blob[0] < 0x80:
                yield key, blob[HEADER_SIZE:]

    def scan(
        self, after: bytes | None = None, prefix: bytes | None = None, limit: int | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """A k-way merge of each partition's sorted base (binary search to the start) and the
        overlay's sorted keys (sorted lazily, re-sorted after a batch adds keys)."""
        base, over = self._base, self._over
        ordered = self._over_sorted
        if ordered is None:
            ordered = self._over_sorted = sorted(over)

        def start(seq: PartitionKeys | list[bytes]) -> int:
            if after is not None and (prefix is None or after >= prefix):
                return bisect.bisect_right(seq, after)
            return bisect.bisect_left(seq, prefix) if prefix is not None else 0

        def base_rows(src: int, keys: PartitionKeys) -> Iterator[tuple[bytes, int, int]]:
            for key, i in keys.keys_from(start(keys)):
                yield key, src, i

        def over_rows() -> Iterator[tuple[bytes, int, int]]:
            for i in range(start(ordered), len(ordered)):
                yield ordered[i], 0, i

        parts = [PartitionKeys(segs) for segs in base.partitions.values()]
        sources = [base_rows(src, keys) for src, keys in enumerate(parts, start=1)]
        left = limit
        last: bytes | None = None
        # Equal keys (overlay and base) arrive together; the live overlay entry decides.
        for key, src, i in heapq.merge(over_rows(), *sources):
            if key == last:
                continue
            last = key
            if left is not None and left <= 0:
                return
            if prefix is not None and not key.startswith(prefix):
                return
            blob = over.get(key)
            if blob is not None:
                if blob[0] >= 0x80:
                    continue
                value = blob[HEADER_SIZE:]
            elif src:
                seg, j = parts[src - 1].locate(i)
                value = seg.value(j)
            else:
                continue  # deleted since the overlay's keys were sorted
            yield key, value
            if left is not None:
                left -= 1

    # --- writes --------------------------------------------------------------------------------

    def apply(self, partition: int, records: Sequence[Record]) -> None:
        """The records' blobs into the overlay and the change set by ``dict.update``; the keys
        neither held (overlay or base) nor changed yet are *born* (:attr:`ChangeSet.born`, for
        :meth:`expire`): found by a set difference and one batched base lookup."""
        pack = HEADER_STRUCT.pack
        over, base = self._over, self._base
        size = len(over)
        batch = dict(
            zip(
                [k for k, _, _, _ in records],
                [
                    pack(~partition, o, t) if v is None else pack(partition, o, t) + v
                    for _, v, o, t in records
                ],
                strict=True,
            )
        )
        with self._changes.lock:
            changed = self._changes.rows
            if self._changes.tracking:
                fresh = list(set(batch).difference(over).difference(changed))  # O(batch) lookups
                if fresh and base.rows:
                    fresh = [k for k, row in zip(fresh, base.find_many(fresh), strict=True) if row < 0]
                self._changes.born.update(fresh)
            over.update(batch)
            changed.update(batch)
            self._version += 1
        if len(over) != size:
            self._over_sorted = None

    def track_births(self) -> None:
        self._changes.tracking = True

    def expire(self, partition: int, keys: Sequence[bytes], offset: int, timestamp: int) -> int:
        """Delete the held ones of *keys* (see :meth:`StateStore.expire`). A key born since the
        change set began leaves the change set and the overlay (a tombstone stays only where it
        hides a base row: the key was folded in since), instead of a tombstone each that every
        later export, merge and delta would walk."""
        pack = HEADER_STRUCT.pack
        over, base = self._over, self._base
        gone = 0
        popped = False
        with self._changes.lock:
            changed, born = self._changes.rows, self._changes.born
            for key in keys:
                blob = over.get(key)
                if blob is not None and blob[0] >= 0x80:
                    continue  # deleted already
                in_base = bool(base.rows) and base.contains(key)
                if blob is None and not in_base:
                    continue  # never held
                gone += 1
                tombstone = pack(~partition, offset, timestamp)
                if key in born:
                    born.discard(key)
                    del changed[key]
                    if in_base:
                        over[key] = tombstone
                    else:
                        del over[key]
                        popped = True
                else:
                    changed[key] = over[key] = tombstone
            if popped:  # the overlay shrank: len() settles its keys again (see _count)
                self._settled = self._shadowed = 0
            self._version += 1
        if gone:
            self._over_sorted = None
        return gone

    def apply_messages(self, partition: int, messages: Sequence[KafkaMessage]) -> None:
        """The replay hot path, as cheap as the memory store's: each message decoded once into
        its key and blob, stored in the overlay and the change set. No base lookup: what a write
        does to ``len`` is settled later, for many keys at once (:meth:`__len__`)."""
        over = self._over
        pack = HEADER_STRUCT.pack
        size = len(over)
        with self._changes.lock:
            changed = self._changes.rows
            for msg in messages:
                key = msg.key()
                if key is None:
                    continue
                value = msg.value()
                ts_type, ts = msg.timestamp()
                if not ts_type:
                    ts = NO_TIMESTAMP
                if value is None:
                    changed[key] = over[key] = pack(~partition, msg.offset(), ts)
                else:
                    changed[key] = over[key] = pack(partition, msg.offset(), ts) + value
            self._version += 1
        if len(over) != size:
            self._over_sorted = None

    def load(self, partition: int, rows: pa.Table, index: KeyIndex | None = None) -> None:
        """Keep the rows' Arrow chunks as the partition's base (partitions hold disjoint keys),
        with *index*, the key index the checkpoint holds for them when the restore read one: then
        nothing is hashed or sorted."""
        if rows.num_rows == 0:
            return
        self._base = self._base.with_partition(
            partition, rows.select(datafile.SCHEMA.names).cast(datafile.SCHEMA), index
        )
        self._version += 1

    def load_split(self, partition: int, rows: pa.Table, index: KeyIndex | None, changes: pa.Table) -> int:
        """Restore a partition handed over split (see :mod:`statesnap.checkpoint.partition_files`):
        *rows* become its base with their persisted *index*, and *changes* (the deltas' newest
        row per key, tombstones as null values) go to the overlay, as a replay of them would, but
        not to the change set (the checkpoint holds them). Returns the partition's key count, for
        the restore to check against its manifest: one batched base lookup of the changed keys."""
        self.load(partition, rows, index)
        if not changes.num_rows:
            return int(rows.num_rows)
        keys = changes.column("key").to_pylist()
        blobs = _overlay_blobs(partition, changes)
        live = np.asarray(changes.column("value").is_valid())
        in_base = np.asarray(self._base.find_many(keys), dtype=np.int64) >= 0
        count = int(rows.num_rows) + int((live & ~in_base).sum()) - int((~live & in_base).sum())
        over = self._over
        with self._changes.lock:
            before, settled = len(over), self._settled == len(over)
            over.update(zip(keys, blobs, strict=True))
            if settled and len(over) == before + len(keys):  # all new: their base lookup is done
                self._settled = len(over)
                self._shadowed += int(in_base.sum())
            self._version += 1
        self._over_sorted = None
        return count

    # --- checkpoints ---------------------------------------------------------------------------

    def export(self) -> dict[int, pa.Table]:
        self._changes.snapshot()  # what mark_checkpointed() may forget once this is written
        version = self._version
        base, over = self._base, self._over.copy()
        out = merge(base, over)
        if self._outgrown(base, over):
            self._fold(out, version)
        return out

    def compact(self) -> None:
        version = self._version
        base = self._base
        if self._outgrown(base, self._over):  # checked first: most commit points copy nothing
            self._fold(merge(base, self._over.copy()), version)

    @staticmethod
    def _outgrown(base: Base, over: Mapping[bytes, bytes]) -> bool:
        return len(over) > max(_MIN_MERGE, int(base.rows) // _MERGE_SHARE)

    def _fold(self, merged_rows: dict[int, pa.Table], version: int) -> None:
        """Make *merged_rows* (the base and overlay of *version*, merged) the new base."""
        merged = Base.empty()
        for p, table in merged_rows.items():
            merged = merged.with_partition(p, table)
        merged.index  # noqa: B018 - build it here, on the checkpoint's time, not a reader's
        with self._changes.lock:  # writers hold it per batch: no write can slip in between
            if self._version == version:
                self._base = merged
                self._reset_overlay()

    def forget_changes(self) -> None:
        self._changes.clear()

    def changes(self) -> dict[int, pa.Table]:
        return decode_changes(self._changes.snapshot())

    def mark_checkpointed(self) -> None:
        self._changes.mark_checkpointed()

    def drop_partitions(self, partitions: Collection[int]) -> int:
        """Rebuild the base from the merged rows of the other partitions (the overlay folds in:
        a rebalance pays one pass over the store, as an export does)."""
        gone = set(partitions)
        with self._changes.lock:  # no write batch in between (writers hold it per batch)
            merged = merge(self._base, self._over)
            base = Base.empty()
            kept = 0
            for p, table in merged.items():
                if p not in gone and table.num_rows:
                    base = base.with_partition(p, table)
                    kept += table.num_rows
            dropped = self._count() - kept
            self._base = base
            self._reset_overlay()
            self._version += 1
        self._changes.drop_partitions(gone)
        return dropped

    def clear(self) -> None:
        self._base = Base.empty()
        self._reset_overlay()
        self._changes.clear()
        self._version += 1

    def _reset_overlay(self) -> None:
        """An empty overlay (its rows are in the base now, or gone), with nothing settled."""
        self._over = {}
        self._over_sorted = None
        self._settled = 0
        self._shadowed = 0

    def flush(self) -> None:
        """Nothing to do: memory holds no durable state."""

    def close(self) -> None:
        self.clear()

    def wait_indexed(self, timeout: float) -> bool:
        """Wait up to *timeout* seconds until lookups probe one key index: a restore from the
        persisted indexes of several partitions is ready at once, and builds one index over them
        in the background (lookups meanwhile probe each). Whether that is done."""
        return self._base.wait_merged(timeout)

    @property
    def nbytes(self) -> int:
        """Bytes held by the base (Arrow buffers and index); the overlay is not counted."""
        return self._base.nbytes


def _overlay_blobs(partition: int, rows: pa.Table) -> list[bytes]:
    """Overlay blobs of data-file rows, column-wise: header + value, or a tombstone's header (of
    ``~partition``, as :meth:`ColumnarStore.apply` writes it) where the value is null."""
    values = rows.column("value")
    blobs = encode_rows(partition, rows)
    if values.null_count:
        emptied = rows.set_column(rows.schema.get_field_index("value"), "value", pc.fill_null(values, b""))
        blobs = pc.if_else(pc.is_valid(values.combine_chunks()), blobs, encode_rows(~partition, emptied))
    return cast(list[bytes], blobs.to_pylist())
