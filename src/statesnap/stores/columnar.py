"""Columnar state store: restored rows stay in the checkpoint's Arrow arrays.

A restore keeps each partition's sorted ``key, value, offset, timestamp`` chunks as they were
decoded (no Python object per row) and builds a :class:`~statesnap.stores.keyindex.KeyIndex`
over them, so loading costs about what reading the files costs. Writes since the restore go to a
dict *overlay* of header+value blobs (as in the memory store); a tombstone blob there hides a base
row. :meth:`ColumnarStore.export` merges the two, and adopts the merge as the new base when the
overlay has grown large (a checkpoint is when that work is paid anyway).

Readers on other threads see a consistent store: the base is replaced by one attribute
assignment, and the overlay is a dict the single writer updates in place.
"""

from __future__ import annotations

import bisect
import heapq
import threading
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statesnap.checkpoint import datafile
from statesnap.stores.base import (
    HEADER_SIZE,
    HEADER_STRUCT,
    NO_TIMESTAMP,
    ChangeSet,
    KafkaMessage,
    Record,
    decode_changes,
    decode_rows,
)
from statesnap.stores.keyindex import _M64, ROW_BITS, KeyIndex, array_hashes, binary_parts

#: The overlay is merged into the base at export when it holds more than this share of the base
#: rows (or more than _MIN_MERGE rows over an empty base): below it, rebuilding the index costs
#: more than the overlay's dict entries do.
_MERGE_SHARE = 8
_MIN_MERGE = 1 << 16
#: Rows converted to Python objects at once by items() and scan().
_BATCH = 4096


#: Row ids are ``segment << _LOCAL_BITS | index``, so a probe finds its segment by a shift.
_LOCAL_BITS = 20
_LOCAL_MASK = (1 << _LOCAL_BITS) - 1
_MAX_SEGMENTS = 1 << (ROW_BITS - _LOCAL_BITS)
_SEGMENT_MASK = _MAX_SEGMENTS - 1
_from_bytes = int.from_bytes
_bisect_left = bisect.bisect_left


@dataclass(slots=True)
class _Segment:
    """One Arrow chunk (at most 2**20 rows) of one partition's base rows, sorted by key."""

    partition: int
    number: int  # its place in the base; row ids are number << _LOCAL_BITS | index
    table: pa.Table  # data-file schema, one chunk
    key_offsets: memoryview
    key_data: memoryview
    value_offsets: memoryview
    value_data: memoryview
    hashes: np.ndarray | None  # key hashes until the index is built

    @classmethod
    def of(cls, partition: int, number: int, table: pa.Table) -> _Segment:
        keys = table.column("key").chunk(0)
        values = table.column("value").chunk(0)
        ko, kd = binary_parts(keys)
        vo, vd = binary_parts(values)
        return cls(
            partition,
            number,
            table,
            ko.data,
            memoryview(kd).cast("B"),
            vo.data,
            memoryview(vd).cast("B"),
            array_hashes(keys),
        )

    def key(self, i: int) -> bytes:
        return bytes(self.key_data[self.key_offsets[i] : self.key_offsets[i + 1]])

    def value(self, i: int) -> bytes:
        return bytes(self.value_data[self.value_offsets[i] : self.value_offsets[i + 1]])


class _Base:
    """Columnar rows of all partitions (immutable once built), with their key index."""

    def __init__(self, segments: list[_Segment]) -> None:
        self.segments = segments
        self.rows = sum(s.table.num_rows for s in segments)
        self.partitions: dict[int, list[_Segment]] = {}
        for s in segments:
            self.partitions.setdefault(s.partition, []).append(s)
        self._index: KeyIndex | None = None
        self._lock = threading.Lock()

    @classmethod
    def empty(cls) -> _Base:
        return cls([])

    def with_partition(self, partition: int, table: pa.Table) -> _Base:
        """A base with *table*'s chunks added, zero-copy (small partitions are made one chunk)."""
        if table.num_rows <= _LOCAL_MASK:
            table = table.combine_chunks()
        added: list[_Segment] = []
        for batch in table.to_batches(max_chunksize=_LOCAL_MASK + 1):
            if batch.num_rows:
                number = len(self.segments) + len(added)
                if number >= _MAX_SEGMENTS:
                    raise ValueError(f"columnar store holds at most {_MAX_SEGMENTS} chunks")
                added.append(_Segment.of(partition, number, pa.Table.from_batches([batch])))
        return _Base([*self.segments, *added])

    @property
    def index(self) -> KeyIndex:
        index = self._index
        if index is None:
            with self._lock:  # built once, by whichever reader or writer needs it first
                index = self._index
                if index is None:
                    hashes = [
                        s.hashes if s.hashes is not None else array_hashes(s.table.column("key").chunk(0))
                        for s in self.segments
                    ]
                    index = KeyIndex(hashes, [s.number << _LOCAL_BITS for s in self.segments])
                    self._index = index
                    for s in self.segments:
                        s.hashes = None
        return index

    def locate(self, key: bytes) -> tuple[_Segment, int] | None:
        """The segment and index holding *key*, or None."""
        if not self.rows:
            return None
        segments = self.segments
        for row in self.index.candidates(key):
            s = segments[row >> _LOCAL_BITS]
            i = row & _LOCAL_MASK
            ko = s.key_offsets
            if s.key_data[ko[i] : ko[i + 1]] == key:
                return s, i
        return None

    def find(self, key: bytes) -> int:
        """Row id of *key*, or -1."""
        found = self.locate(key)
        return -1 if found is None else found[0].number << _LOCAL_BITS | found[1]

    @property
    def nbytes(self) -> int:
        index = self._index.nbytes if self._index is not None else 0
        return index + sum(int(s.table.nbytes) for s in self.segments)


class _PartitionKeys:
    """A partition's base keys as a sequence, for :func:`bisect.bisect_left` (O(log n) reads)."""

    def __init__(self, segments: list[_Segment]) -> None:
        self.segments = segments
        self.starts: list[int] = []
        size = 0
        for s in segments:
            self.starts.append(size)
            size += s.table.num_rows
        self.size = size

    def __len__(self) -> int:
        return self.size

    def locate(self, i: int) -> tuple[_Segment, int]:
        k = bisect.bisect_right(self.starts, i) - 1
        return self.segments[k], i - self.starts[k]

    def __getitem__(self, i: int) -> bytes:
        seg, j = self.locate(i)
        return seg.key(j)

    def keys_from(self, i: int) -> Iterator[tuple[bytes, int]]:
        """(key, position) from position *i* on, converting a batch at a time; batches start
        small and double, so a page of a scan costs about its own size."""
        size = 32
        while i < self.size:
            seg, j = self.locate(i)
            batch = seg.table.column("key").slice(j, size).to_pylist()
            yield from zip(batch, range(i, i + len(batch)), strict=True)
            i += len(batch)
            size = min(2 * size, _BATCH)


class ColumnarStore:
    """Restored rows in Arrow arrays plus a dict overlay of later writes; see the module doc."""

    kind = "columnar"

    def __init__(self) -> None:
        self._base = _Base.empty()
        # key → header+value blob, or a tombstone blob hiding a base row (base.tombstone_blob).
        self._over: dict[bytes, bytes] = {}
        self._count = 0
        self._changes = ChangeSet()
        self._over_sorted: list[bytes] | None = None
        self._version = 0  # bumped by every write batch: export adopts its merge only if unchanged

    # --- reads ---------------------------------------------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        """The lookup hot path (>= 500 k/s): the index probe is inlined, no call per step."""
        blob = self._over.get(key)
        if blob is not None:
            return None if blob[0] >= 0x80 else blob[HEADER_SIZE:]
        base = self._base
        index = base._index
        if index is None:
            if not base.rows:
                return None
            index = base.index
        # keyindex.key_hash, inlined: a call costs as much as the arithmetic.
        h = (((_from_bytes(key, "little") % 0x1FFFFFFFFFFFFFFF) * 0x9E3779B97F4A7C15) & _M64) >> 32
        entries = index.entries_view
        directory = index.directory_view
        top = h << 32
        b = top >> index.shift
        end = directory[b + 1]
        i = _bisect_left(entries, top, directory[b], end)
        top += 0x100000000
        segments = base.segments
        while i < end:
            e = entries[i]
            if e >= top:
                return None
            s = segments[(e >> _LOCAL_BITS) & _SEGMENT_MASK]
            j = e & _LOCAL_MASK
            ko = s.key_offsets
            if s.key_data[ko[j] : ko[j + 1]] == key:
                vo = s.value_offsets
                return s.value_data[vo[j] : vo[j + 1]].tobytes()
            i += 1
        return None

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, bytes):
            return False
        blob = self._over.get(key)
        if blob is not None:
            return blob[0] < 0x80
        return self._base.locate(key) is not None

    def __len__(self) -> int:
        return self._count

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Base rows (partition by partition, in key order) not overridden, then the overlay."""
        base, over = self._base, self._over.copy()
        for seg in base.segments:
            keys = seg.table.column("key")
            values = seg.table.column("value")
            for lo in range(0, seg.table.num_rows, _BATCH):
                ks = keys.slice(lo, _BATCH).to_pylist()
                vs = values.slice(lo, _BATCH).to_pylist()
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

        def start(seq: _PartitionKeys | list[bytes]) -> int:
            if after is not None and (prefix is None or after >= prefix):
                return bisect.bisect_right(seq, after)
            return bisect.bisect_left(seq, prefix) if prefix is not None else 0

        def base_rows(src: int, keys: _PartitionKeys) -> Iterator[tuple[bytes, int, int]]:
            for key, i in keys.keys_from(start(keys)):
                yield key, src, i

        def over_rows() -> Iterator[tuple[bytes, int, int]]:
            for i in range(start(ordered), len(ordered)):
                yield ordered[i], 0, i

        parts = [_PartitionKeys(segs) for segs in base.partitions.values()]
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
        pack = HEADER_STRUCT.pack
        self._write(((k, v, pack(partition, o, t), pack(~partition, o, t)) for k, v, o, t in records))

    def apply_messages(self, partition: int, messages: Sequence[KafkaMessage]) -> None:
        """The replay hot path: one overlay and one change-set store per record; a base lookup
        only the first time a key is written after a restore (to keep ``len`` exact)."""
        over = self._over
        base = self._base
        find = base.find if base.rows else None
        pack = HEADER_STRUCT.pack
        count = self._count
        new_keys = False
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
                prev = over.get(key)
                if prev is None:
                    in_base = find is not None and find(key) >= 0
                    was = in_base
                    new_keys = True
                else:
                    in_base = None
                    was = prev[0] < 0x80
                if value is None:
                    blob = pack(~partition, msg.offset(), ts)
                    count -= was
                    if in_base is None:
                        in_base = find is not None and find(key) >= 0
                    if in_base:
                        over[key] = blob
                    elif prev is not None:
                        del over[key]
                        new_keys = True
                else:
                    blob = over[key] = pack(partition, msg.offset(), ts) + value
                    count += not was
                changed[key] = blob
            self._count = count
            self._version += 1
        if new_keys:
            self._over_sorted = None

    def _write(self, rows: Iterator[tuple[bytes, bytes | None, bytes, bytes]]) -> None:
        over = self._over
        base = self._base
        find = base.find if base.rows else None
        count = self._count
        new_keys = False
        with self._changes.lock:
            changed = self._changes.rows
            for key, value, header, dead in rows:
                prev = over.get(key)
                in_base = find is not None and find(key) >= 0 if prev is None else None
                was = in_base if prev is None else prev[0] < 0x80
                new_keys = new_keys or prev is None
                if value is None:
                    count -= bool(was)
                    if in_base is None:
                        in_base = find is not None and find(key) >= 0
                    if in_base:
                        over[key] = dead
                    elif prev is not None:
                        del over[key]
                        new_keys = True
                    changed[key] = dead
                else:
                    changed[key] = over[key] = header + value
                    count += not was
            self._count = count
            self._version += 1
        if new_keys:
            self._over_sorted = None

    def load(self, partition: int, rows: pa.Table) -> None:
        """Keep the rows' Arrow chunks as the partition's base (partitions hold disjoint keys)."""
        if rows.num_rows == 0:
            return
        self._base = self._base.with_partition(partition, rows.select(datafile.SCHEMA.names))
        self._count += rows.num_rows
        self._version += 1

    # --- checkpoints ---------------------------------------------------------------------------

    def export(self) -> dict[int, pa.Table]:
        self._changes.snapshot()  # what mark_checkpointed() may forget once this is written
        version = self._version
        base, over = self._base, self._over.copy()
        out = _merge(base, over)
        if len(over) > max(_MIN_MERGE, base.rows // _MERGE_SHARE):
            merged = _Base.empty()
            for p, table in out.items():
                merged = merged.with_partition(p, table)
            merged.index  # noqa: B018 - build it here, on the checkpoint's time, not a reader's
            with self._changes.lock:  # writers hold it per batch: no write can slip in between
                if self._version == version:
                    self._base = merged
                    self._over = {}
                    self._over_sorted = None
        return out

    def changes(self) -> dict[int, pa.Table]:
        return decode_changes(self._changes.snapshot())

    def mark_checkpointed(self) -> None:
        self._changes.mark_checkpointed()

    def drop_partitions(self, partitions: Collection[int]) -> int:
        """Rebuild the base from the merged rows of the other partitions (the overlay folds in:
        a rebalance pays one pass over the store, as an export does)."""
        gone = set(partitions)
        with self._changes.lock:  # no write batch in between (writers hold it per batch)
            merged = _merge(self._base, self._over)
            base = _Base.empty()
            kept = 0
            for p, table in merged.items():
                if p not in gone and table.num_rows:
                    base = base.with_partition(p, table)
                    kept += table.num_rows
            dropped = self._count - kept
            self._base = base
            self._over = {}
            self._over_sorted = None
            self._count = kept
            self._version += 1
        self._changes.drop_partitions(gone)
        return dropped

    def clear(self) -> None:
        self._base = _Base.empty()
        self._over = {}
        self._over_sorted = None
        self._count = 0
        self._changes.clear()
        self._version += 1

    def flush(self) -> None:
        """Nothing to do: memory holds no durable state."""

    def close(self) -> None:
        self.clear()

    @property
    def nbytes(self) -> int:
        """Bytes held by the base (Arrow buffers and index); the overlay is not counted."""
        return self._base.nbytes


def _merge(base: _Base, over: dict[bytes, bytes]) -> dict[int, pa.Table]:
    """Base rows not overridden, plus the overlay's live rows, per partition sorted by key."""
    hidden: dict[int, list[int]] = {}
    if over and base.rows:
        if len(over) * 16 < base.rows:
            for key in over:
                found = base.locate(key)
                if found is not None:
                    hidden.setdefault(found[0].number, []).append(found[1])
        else:
            value_set = pa.array(list(over), pa.binary())
            for k, seg in enumerate(base.segments):
                mask = pc.is_in(seg.table.column("key"), value_set=value_set).to_numpy(zero_copy_only=False)
                if mask.any():
                    hidden[k] = np.flatnonzero(mask).tolist()
    live = {k: b for k, b in over.items() if b[0] < 0x80}
    overlay = decode_rows(pa.array(list(live), pa.binary()), pa.array(list(live.values()), pa.binary()))
    out: dict[int, pa.Table] = {}
    parts: dict[int, list[pa.Table]] = {}
    for k, seg in enumerate(base.segments):
        table = seg.table
        if k in hidden:
            keep = np.ones(table.num_rows, bool)
            keep[np.asarray(hidden[k])] = False
            table = table.filter(pa.array(keep))
        if table.num_rows:
            parts.setdefault(seg.partition, []).append(table)
    for p in sorted(set(parts) | set(overlay)):
        tables = parts.get(p, [])
        if p in overlay:
            merged = pa.concat_tables([*tables, overlay[p]]).sort_by("key")
        else:
            merged = pa.concat_tables(tables)
        out[p] = _no_negative_timestamps(merged.cast(datafile.SCHEMA))
    return out


def _no_negative_timestamps(table: pa.Table) -> pa.Table:
    """Timestamps before 1970 become null, as the header's ``-1 = none`` makes them elsewhere."""
    ts = table.column("timestamp")
    low = pc.min(ts.cast(pa.int64())).as_py()
    if low is None or low >= 0:
        return table
    ints = ts.cast(pa.int64())
    fixed = pc.if_else(pc.less(ints, 0), pa.scalar(None, pa.int64()), ints).cast(datafile.TIMESTAMP)
    return table.set_column(table.schema.get_field_index("timestamp"), "timestamp", fixed)
