"""The columnar store's base: restored rows kept in their Arrow chunks, with a key index.

A :class:`Base` holds every partition's sorted rows as :class:`Segment` s (one Arrow chunk of at
most 2**20 rows each) and, built on first use, a :class:`~statesnap.stores.keyindex.KeyIndex`
over them plus the one tuple a lookup reads (:attr:`Base.probe`). :func:`merge` folds an overlay
of header+value blobs into per-partition data-file tables. See :mod:`statesnap.stores.columnar`.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statesnap.checkpoint import datafile
from statesnap.stores.base import HEADER_SIZE, header_fields
from statesnap.stores.keyindex import ADD, HASH_BITS, MIX, ROW_BITS, KeyIndex, P, array_hashes, binary_parts

__all__ = ["BATCH", "Base", "PartitionKeys", "Probe", "Segment", "merge", "no_negative_timestamps"]

#: Rows converted to Python objects at once by scans.
BATCH = 4096

#: An overlay smaller than this share of the base is matched to base rows by index probes (a
#: Python call per key); a larger one by one vectorized ``index_in`` over every base key.
_PROBE_SHARE = 16

#: A batch lookup hashes and probes with numpy from this many keys on (below it the numpy calls
#: cost more than a Python probe per key), and compares keys and takes values with Arrow for the
#: keys of one segment from _ARROW_GROUP on (a few Arrow calls per segment; fewer keys are
#: compared in Python). A restore from Parquet holds one segment per row group (10 M keys: 80).
_VECTOR_BATCH = 24
_ARROW_GROUP = 48

#: Row ids are ``segment << _LOCAL_BITS | index``, so a probe finds its segment by a shift.
_LOCAL_BITS = 20
_LOCAL_MASK = (1 << _LOCAL_BITS) - 1
_MAX_SEGMENTS = 1 << (ROW_BITS - _LOCAL_BITS)
_SEGMENT_MASK = _MAX_SEGMENTS - 1
# The probes (here and ColumnarStore.get) spell the hash's bits as a literal.
assert HASH_BITS == 30
_from_bytes = int.from_bytes


#: See Base.probe.
Probe = tuple[memoryview, int, list[tuple[memoryview, memoryview, memoryview, memoryview]], int, int, int]


@dataclass(slots=True)
class Segment:
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
    def of(cls, partition: int, number: int, table: pa.Table) -> Segment:
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


class Base:
    """Columnar rows of all partitions (immutable once built), with their key index."""

    def __init__(self, segments: list[Segment]) -> None:
        self.segments = segments
        self.rows = sum(s.table.num_rows for s in segments)
        self.partitions: dict[int, list[Segment]] = {}
        for s in segments:
            self.partitions.setdefault(s.partition, []).append(s)
        self._index: KeyIndex | None = None
        #: Everything a lookup reads, in one tuple (set with the index): the index's ``entries``
        #: and ``scale``, ``views``, local bits, local mask, segment mask, where ``views[segment]``
        #: is that segment's ``key offsets, key data, value offsets, value data``.
        self.probe: Probe | None = None
        self._lock = threading.Lock()

    @classmethod
    def empty(cls) -> Base:
        return cls([])

    def with_partition(self, partition: int, table: pa.Table) -> Base:
        """A base with *table*'s chunks added, zero-copy (small partitions are made one chunk)."""
        if table.num_rows <= _LOCAL_MASK:
            table = table.combine_chunks()
        added: list[Segment] = []
        for batch in table.to_batches(max_chunksize=_LOCAL_MASK + 1):
            if batch.num_rows:
                number = len(self.segments) + len(added)
                if number >= _MAX_SEGMENTS:
                    raise ValueError(f"columnar store holds at most {_MAX_SEGMENTS} chunks")
                added.append(Segment.of(partition, number, pa.Table.from_batches([batch])))
        return Base([*self.segments, *added])

    @property
    def index(self) -> KeyIndex:
        index = self._index
        if index is None:
            with self._lock:  # built once, by whichever reader or writer needs it first
                index = self._index
                if index is None:
                    # The restore's decode buffers go back to the OS before the index is built:
                    # the peak memory of a restore is then about its final size.
                    pa.default_memory_pool().release_unused()
                    hashes: list[np.ndarray | None] = []
                    for s in self.segments:
                        h = s.hashes if s.hashes is not None else array_hashes(s.table.column("key").chunk(0))
                        s.hashes = None  # KeyIndex drops each from the list once copied
                        hashes.append(h)
                    index = KeyIndex(hashes, [s.number << _LOCAL_BITS for s in self.segments])
                    self._index = index
                    self.probe = (
                        index.entries_view,
                        index.scale,
                        [(s.key_offsets, s.key_data, s.value_offsets, s.value_data) for s in self.segments],
                        _LOCAL_BITS,
                        _LOCAL_MASK,
                        _SEGMENT_MASK,
                    )
        return index

    def ready_probe(self) -> Probe | None:
        """:attr:`probe`, built first if need be; None when the base is empty."""
        if self.probe is None and self.rows:
            self.index  # noqa: B018 - builds the probe
        return self.probe

    def contains(self, key: bytes) -> bool:
        """Whether *key* is a base row: :meth:`ColumnarStore.get`'s probe without the value."""
        probe = self.probe
        if probe is None:
            probe = self.ready_probe()
            if probe is None:
                return False
        entries, scale, views, local_bits, local_mask, segment_mask = probe
        h = _from_bytes(key, "little") * MIX % P
        h = (h * h + ADD) % P
        i = h * scale >> 30
        top = h << 32
        e = entries[i]
        while e < top:  # entries of smaller hashes, pushed past their home slots
            i += 1
            e = entries[i]
        top += 0x100000000
        while e < top:  # the entries of hash h (a free slot is above every top)
            ko, kd, _, _ = views[e >> local_bits & segment_mask]
            j = e & local_mask
            if kd[ko[j] : ko[j + 1]] == key:
                return True
            i += 1
            e = entries[i]
        return False

    def find_many(self, keys: Sequence[bytes]) -> list[int]:
        """Row ids (``segment << 20 | index``) of *keys*, -1 for a key not in the base."""
        return cast(list[int], self._lookup(keys, values=False))

    def values_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """The base value of each of *keys*, None for a key not in the base."""
        return cast(list[bytes | None], self._lookup(keys, values=True))

    @staticmethod
    def batched(n: int) -> bool:
        """Whether a lookup of *n* keys at once beats *n* single probes."""
        return n >= _VECTOR_BATCH

    def _lookup(self, keys: Sequence[bytes], *, values: bool) -> list[int] | list[bytes | None]:
        """:meth:`contains`'s probe for a batch at once, giving each key's value (or row id). Hashing
        and probing are numpy passes, whose gathers overlap the cache misses a Python probe waits
        for one by one. The keys whose hash an entry matches are then compared (and their values
        taken) by Arrow where a segment holds many of them, in one Python pass for the rest."""
        n = len(keys)
        found: list[int] = [-1] * n
        got: list[bytes | None] = [None] * n
        probe = self.ready_probe() if n else None
        if probe is None:
            return got if values else found
        views = probe[2]
        if not self.batched(n):  # numpy's per-call costs exceed a few Python probes
            for i, key in enumerate(keys):
                located = self.locate(key)
                if located is not None:
                    seg, j = located
                    if values:
                        got[i] = seg.value(j)
                    else:
                        found[i] = seg.number << _LOCAL_BITS | j
            return got if values else found
        index = self.index
        table = index.table
        asked = pa.array(keys, pa.binary())
        h = array_hashes(asked).astype(np.uint64)
        slot = (h * np.uint64(index.scale)) >> np.uint64(HASH_BITS)  # < 2**64: see KeyIndex
        top = h << np.uint64(32)
        entry = table[slot]
        behind = np.flatnonzero(entry < top)  # entries of smaller hashes, pushed past home slots
        while behind.size:
            slot[behind] += 1
            entry[behind] = table[slot[behind]]
            behind = behind[entry[behind] < top[behind]]
        top += np.uint64(1 << 32)
        pending = np.flatnonzero(entry < top)  # an entry of the key's own hash: compare keys
        while pending.size:
            rows = (entry[pending] & np.uint64(0xFFFFFFFF)).astype(np.int64)
            segs = rows >> _LOCAL_BITS
            crowded = np.bincount(segs)[segs] >= _ARROW_GROUP
            missed: list[int] = []
            few = np.flatnonzero(~crowded)
            for i, row in zip(pending[few].tolist(), rows[few].tolist(), strict=True):
                ko, kd, vo, vd = views[row >> _LOCAL_BITS]
                j = row & _LOCAL_MASK
                if kd[ko[j] : ko[j + 1]] == keys[i]:
                    if values:
                        got[i] = vd[vo[j] : vo[j + 1]].tobytes()
                    else:
                        found[i] = row
                else:
                    missed.append(i)
            many = np.flatnonzero(crowded)
            if many.size:
                order = many[np.argsort(rows[many])]
                by_seg, at, local = segs[order], pending[order], rows[order] & _LOCAL_MASK
                cuts = (np.flatnonzero(np.diff(by_seg)) + 1).tolist()
                for lo, hi in zip([0, *cuts], [*cuts, len(order)], strict=True):
                    seg = self.segments[int(by_seg[lo])]
                    here, where = pa.array(local[lo:hi]), at[lo:hi]
                    stored = seg.table.column("key").chunk(0).take(here)
                    same = pc.equal(stored, asked.take(pa.array(where))).to_numpy(zero_copy_only=False)
                    if not same.all():
                        missed += where[~same].tolist()
                        where = where[same]
                        here = here.filter(pa.array(same))
                    if values:
                        taken = seg.table.column("value").chunk(0).take(here).to_pylist()
                        for i, value in zip(where.tolist(), taken, strict=True):
                            got[i] = value
                    else:
                        first = seg.number << _LOCAL_BITS
                        for i, j in zip(where.tolist(), here.to_pylist(), strict=True):
                            found[i] = first | j
            if not missed:
                break
            rest = np.array(missed, np.int64)  # hash collisions: try each key's next entry
            slot[rest] += 1
            entry[rest] = table[slot[rest]]
            pending = rest[entry[rest] < top[rest]]
        return got if values else found

    def locate(self, key: bytes) -> tuple[Segment, int] | None:
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

    @property
    def nbytes(self) -> int:
        index = self._index.nbytes if self._index is not None else 0
        return index + sum(int(s.table.nbytes) for s in self.segments)


class PartitionKeys:
    """A partition's base keys as a sequence, for :func:`bisect.bisect_left` (O(log n) reads)."""

    def __init__(self, segments: list[Segment]) -> None:
        self.segments = segments
        self.starts: list[int] = []
        size = 0
        for s in segments:
            self.starts.append(size)
            size += s.table.num_rows
        self.size = size

    def __len__(self) -> int:
        return self.size

    def locate(self, i: int) -> tuple[Segment, int]:
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
            size = min(2 * size, BATCH)


def merge(base: Base, over: dict[bytes, bytes]) -> dict[int, pa.Table]:
    """Base rows not overridden, plus the overlay's live rows, per partition sorted by key.

    Most overlay rows update a base row: they replace its value, offset and timestamp in place
    (the base is sorted, so the partition stays sorted and nothing is sorted again); tombstones
    drop their row. Only a partition that gains new keys is sorted, unless they all come after
    its last key (ever-growing ids, timestamps). Overlay rows are matched to base rows by one
    ``index_in`` over every base chunk for a large overlay (its hash set built once), by index
    probes for a small one."""
    if not over:
        return {
            p: no_negative_timestamps(pa.concat_tables([s.table for s in base.partitions[p]]))
            for p in sorted(base.partitions)
        }
    keys = pa.array(list(over), pa.binary())
    blobs = pa.array(list(over.values()), pa.binary())
    raw_part, offsets, ts = header_fields(blobs)
    dead = raw_part < 0
    partitions = np.where(dead, ~raw_part, raw_part)
    values = pc.binary_slice(blobs, HEADER_SIZE, (1 << 31) - 1)
    del blobs
    placed = np.zeros(len(keys), bool)  # overlay rows that replaced a row of their own partition
    parts: dict[int, list[pa.Table]] = {}
    for seg, rows, src in _matches(base, over, keys):
        table = seg.table
        if src.size:
            same = (partitions[src] == seg.partition) & ~dead[src]
            placed[src[same]] = True
            table = _replaced(table, rows[same], src[same], values, offsets, ts)
            if not same.all():  # deleted, or written to another partition (added there below)
                keep = np.ones(table.num_rows, bool)
                keep[rows[~same]] = False
                table = table.filter(pa.array(keep))
        if table.num_rows:
            parts.setdefault(seg.partition, []).append(table)
    added = np.flatnonzero(~dead & ~placed)
    new_rows: dict[int, pa.Table] = {}
    if added.size:
        by_part = partitions[added]
        for p in np.unique(by_part).tolist():
            pick = added[by_part == p]
            rows = pa.array(pick)
            new_rows[p] = pa.table(
                {
                    "key": keys.take(rows),
                    "value": values.take(rows),
                    "offset": pa.array(offsets[pick]),
                    "timestamp": pa.array(ts[pick], mask=ts[pick] < 0).cast(datafile.TIMESTAMP),
                },
                schema=datafile.SCHEMA,
            )
    out: dict[int, pa.Table] = {}
    for p in sorted(set(parts) | set(new_rows)):
        tables = parts.get(p, [])
        fresh = new_rows.get(p)
        if fresh is None:
            merged = pa.concat_tables(tables)
        else:
            fresh = fresh.take(pc.sort_indices(fresh.column("key")))
            last = tables[-1].column("key")[-1].as_py() if tables else None
            if last is None or fresh.column("key")[0].as_py() > last:
                merged = pa.concat_tables([*tables, fresh])  # new keys after the old: appended
            else:
                merged = pa.concat_tables([*tables, fresh]).sort_by("key")
        out[p] = no_negative_timestamps(merged.cast(datafile.SCHEMA))
    return out


def _matches(
    base: Base, over: dict[bytes, bytes], keys: pa.Array
) -> Iterator[tuple[Segment, np.ndarray, np.ndarray]]:
    """Per base segment: its rows that the overlay writes again, and the overlay positions
    (in the order of *over*) that write them, both ascending by row."""
    if not base.rows:
        return
    if len(over) * _PROBE_SHARE < base.rows:
        found: dict[int, list[tuple[int, int]]] = {}
        for j, key in enumerate(over):
            located = base.locate(key)
            if located is not None:
                found.setdefault(located[0].number, []).append((located[1], j))
        for seg in base.segments:
            hits = sorted(found.get(seg.number, ()))
            rows = np.fromiter((r for r, _ in hits), np.int64, count=len(hits))
            yield seg, rows, np.fromiter((j for _, j in hits), np.int64, count=len(hits))
        return
    chunks = [seg.table.column("key").chunk(0) for seg in base.segments]
    where = pc.index_in(pa.chunked_array(chunks, pa.binary()), value_set=keys).fill_null(-1).to_numpy()
    start = 0
    for seg, chunk in zip(base.segments, chunks, strict=True):
        here = where[start : start + len(chunk)]
        start += len(chunk)
        rows = np.flatnonzero(here >= 0)
        yield seg, rows, here[rows].astype(np.int64)


def _replaced(
    table: pa.Table, rows: np.ndarray, src: np.ndarray, values: pa.Array, offsets: np.ndarray, ts: np.ndarray
) -> pa.Table:
    """*table* with rows *rows* taking value, offset and timestamp of overlay rows *src*."""
    if not rows.size:
        return table
    mask = np.zeros(table.num_rows, bool)
    mask[rows] = True
    hit = pa.array(mask)
    stamps = ts[src]
    columns = {
        "key": table.column("key"),
        "value": pc.replace_with_mask(table.column("value").chunk(0), hit, values.take(pa.array(src))),
        "offset": pc.replace_with_mask(table.column("offset").chunk(0), hit, pa.array(offsets[src])),
        "timestamp": pc.replace_with_mask(
            table.column("timestamp").chunk(0),
            hit,
            pa.array(stamps, mask=stamps < 0).cast(datafile.TIMESTAMP),
        ),
    }
    return pa.table(columns, schema=datafile.SCHEMA)


def no_negative_timestamps(table: pa.Table) -> pa.Table:
    """Timestamps before 1970 become null, as the header's ``-1 = none`` makes them elsewhere."""
    ts = table.column("timestamp")
    low = pc.min(ts.cast(pa.int64())).as_py()
    if low is None or low >= 0:
        return table
    ints = ts.cast(pa.int64())
    fixed = pc.if_else(pc.less(ints, 0), pa.scalar(None, pa.int64()), ints).cast(datafile.TIMESTAMP)
    return table.set_column(table.schema.get_field_index("timestamp"), "timestamp", fixed)
