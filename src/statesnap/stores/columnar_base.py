"""The columnar store's base: restored rows kept in their Arrow chunks, with a key index.

A :class:`Base` holds every partition's sorted rows as :class:`Segment` s (one Arrow chunk of at
most 2**20 rows each) and their :class:`~statesnap.keys.index.KeyIndex` es: the persisted
index a partition was restored with (read from the checkpoint, not built), and one built on first
use over the other partitions; plus the tuples a lookup reads (:attr:`Base.probes`).
See :mod:`statesnap.stores.columnar`, and :mod:`statesnap.stores.columnar_merge` for folding an
overlay into it.
"""

from __future__ import annotations

import bisect
import logging
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statesnap.decode_memory import release_unused
from statesnap.keys.index import (
    EMPTY,
    HASH_BITS,
    ROW_BITS,
    KeyIndex,
    KeyIndexBuilder,
    array_hashes,
    binary_parts,
)

__all__ = ["BATCH", "Base", "PartitionKeys", "Probe", "Segment"]

log = logging.getLogger(__name__)

#: Rows converted to Python objects at once by scans.
BATCH = 4096

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
# The probes (here and ColumnarStore.get) spell the hash's bits as a literal.
assert HASH_BITS == 30
_from_bytes = int.from_bytes


#: See Base.probes: a key index's slots as (row, hash) halves (KeyIndex.halves) and its scale,
#: its seed's prime, multiplier and addend, the views of the segments its rows name (a row's
#: segment is ``row >> local bits``), local bits, local mask.
Probe = tuple[
    memoryview,
    int,
    int,
    int,
    int,
    list[tuple[memoryview, memoryview, memoryview, memoryview]],
    int,
    int,
]


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
    hashes: np.ndarray | None  # key hashes until the index is built (None: not hashed yet)

    @classmethod
    def of(cls, partition: int, number: int, table: pa.Table, *, hashed: bool = True) -> Segment:
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
            array_hashes(keys) if hashed else None,
        )

    def key(self, i: int) -> bytes:
        return bytes(self.key_data[self.key_offsets[i] : self.key_offsets[i + 1]])

    def value(self, i: int) -> bytes:
        return bytes(self.value_data[self.value_offsets[i] : self.value_offsets[i + 1]])

    @property
    def views(self) -> tuple[memoryview, memoryview, memoryview, memoryview]:
        return (self.key_offsets, self.key_data, self.value_offsets, self.value_data)


@dataclass(frozen=True, slots=True)
class _Prober:
    """One key index and the segments its row ids name: ``segments[row >> bits]``, row ``& mask``.
    The built index names every segment of the base by number (bits = _LOCAL_BITS); a persisted
    one names its partition's segments by position in its base file (their equal size in bits)."""

    index: KeyIndex
    segments: list[Segment]
    bits: int

    @property
    def probe(self) -> Probe:
        seed = self.index.seed
        return (
            self.index.halves,
            self.index.scale,
            seed.p,
            seed.mix,
            seed.add,
            [s.views for s in self.segments],
            self.bits,
            (1 << self.bits) - 1,
        )

    def row_id(self, row: int) -> int:
        """The base-wide id (``segment number << 20 | index``) of one of this index's rows."""
        return self.segments[row >> self.bits].number << _LOCAL_BITS | row & ((1 << self.bits) - 1)


#: Slots of a persisted index checked against the keys they name before it is trusted.
_SAMPLE = 256

#: Persisted indexes a base probes for good; with more, lookups probe each of them (the base is
#: ready at once) while one index over every partition is built on a background thread, which
#: then replaces them. A lookup probes each index until one has the key, and each probe costs a
#: hash and a cache miss from Python: 1 M keys, random present and absent keys measured 628 k
#: get/s over one index, 389 k over 2 persisted indexes, 212 k over 8 (issue 21 asks 500 k).
_MAX_PROBES = 1


def _chunk_bits(segments: list[Segment]) -> int | None:
    """log2 of the segments' common size (the last may be shorter), or None if they differ: a
    persisted index names rows by position, and a shift must find a row's segment."""
    sizes = [int(s.table.num_rows) for s in segments]
    if len(sizes) == 1:
        return max(1, sizes[0].bit_length())
    first = sizes[0]
    if first & (first - 1) or any(n != first for n in sizes[1:-1]) or sizes[-1] > first:
        return None
    return first.bit_length() - 1


def _persisted_fits(index: KeyIndex, segments: list[Segment], bits: int) -> bool:
    """Whether sampled entries name rows of these segments whose keys hash as the entry says: the
    file's checksum proved it is what its writer wrote, this that it was written for these rows."""
    table = index.table
    rows = sum(s.table.num_rows for s in segments)
    if index.rows != rows:
        return False
    picks = table[np.linspace(0, len(table) - 1, min(_SAMPLE, len(table))).astype(np.int64)]
    for e in picks[picks != np.uint64(EMPTY)].tolist():
        row = e & 0xFFFFFFFF
        if row >= rows:
            return False
        seg = segments[row >> bits]
        if index.seed.hash(seg.key(row & ((1 << bits) - 1))) != e >> 32:
            return False
    return True


class Base:
    """Columnar rows of all partitions (immutable once built), with their key indexes: a persisted
    one per partition that was restored with one, and one built over the other partitions."""

    def __init__(self, segments: list[Segment], persisted: dict[int, _Prober] | None = None) -> None:
        self.segments = segments
        self.rows = sum(s.table.num_rows for s in segments)
        self.partitions: dict[int, list[Segment]] = {}
        for s in segments:
            self.partitions.setdefault(s.partition, []).append(s)
        self.persisted: dict[int, _Prober] = dict(persisted or {})
        self._index: KeyIndex | None = None
        self._probers: list[_Prober] = []
        #: Everything lookups read, one tuple per key index (set when they are ready): see
        #: :data:`Probe`. Usually one; a restore from persisted indexes has one per partition.
        self.probes: list[Probe] | None = None
        self._merging: threading.Thread | None = None
        self._lock = threading.Lock()

    @classmethod
    def empty(cls) -> Base:
        return cls([])

    def with_partition(self, partition: int, table: pa.Table, index: KeyIndex | None = None) -> Base:
        """A base with *table*'s chunks added, zero-copy (small partitions are made one chunk).
        *index*: the persisted index of *table*'s rows, used when its layout lets a shift find a
        row's chunk and sampled entries match their keys; else the partition is hashed."""
        if table.num_rows <= _LOCAL_MASK:
            table = table.combine_chunks()
        use = index is not None and partition not in self.partitions
        added: list[Segment] = []
        for batch in table.to_batches(max_chunksize=_LOCAL_MASK + 1):
            if batch.num_rows:
                number = len(self.segments) + len(added)
                if number >= _MAX_SEGMENTS:
                    raise ValueError(f"columnar store holds at most {_MAX_SEGMENTS} chunks")
                added.append(Segment.of(partition, number, pa.Table.from_batches([batch]), hashed=not use))
        persisted = {p: pr for p, pr in self.persisted.items() if p != partition}
        if index is not None and use and added:
            bits = _chunk_bits(added)
            if bits is not None and _persisted_fits(index, added, bits):
                persisted[partition] = _Prober(index, added, bits)
            else:
                log.warning(
                    "partition %d: its persisted key index does not fit its rows; building one", partition
                )
        return Base([*self.segments, *added], persisted)

    @property
    def index(self) -> KeyIndex:
        """The index built over the partitions without a persisted one (built here if need be)."""
        self.ready_probes()
        if self._index is None:
            raise ValueError("every partition of this base has a persisted key index")
        return self._index

    def ready_probes(self) -> list[Probe]:
        """:attr:`probes`, the built index built first if need be (by whichever reader or writer
        needs it first); empty when the base is."""
        probes = self.probes
        if probes is not None:
            return probes
        with self._lock:
            if self.probes is not None:
                return self.probes
            probers = list(self.persisted.values())
            covered = {id(s) for pr in probers for s in pr.segments}
            rest = [s for s in self.segments if id(s) not in covered]
            if rest or not probers:
                # The pools are asked for the restore's freed buffers before an index is built
                # (here, or by _merge), so a restore's peak is about its final size; jemalloc's
                # come back by its own decay (see decode_memory.release_unused).
                release_unused()
                self._index = _build_index(rest)
                assert self._index is not None
                probers.append(_Prober(self._index, self.segments, _LOCAL_BITS))
            self._probers = probers
            self.probes = [pr.probe for pr in probers] if self.rows else []
            if len(probers) > _MAX_PROBES:
                self._merging = threading.Thread(
                    target=_merge,
                    args=(weakref.ref(self), self.segments),
                    name="statesnap-keyindex",
                    daemon=True,
                )
                self._merging.start()
            return self.probes

    def _adopt(self, index: KeyIndex) -> None:
        """Make lookups probe *index* (built over every segment) alone."""
        prober = _Prober(index, self.segments, _LOCAL_BITS)
        with self._lock:
            self._index = index
            self._probers = [prober]
            self.probes = [prober.probe]
            self.persisted = {}

    def wait_merged(self, timeout: float) -> bool:
        """Wait up to *timeout* seconds for :func:`_merge` (if it runs); whether lookups now probe
        one index."""
        merging = self._merging
        if merging is not None:
            merging.join(timeout)
            return not merging.is_alive()
        return True

    def contains(self, key: bytes) -> bool:
        """Whether *key* is a base row: :meth:`ColumnarStore.get`'s probe without the value."""
        probes = self.probes
        if probes is None:
            probes = self.ready_probes()
        k = _from_bytes(key, "little")
        for halves, scale, p, mix, add, views, local_bits, local_mask in probes:
            h = k * mix % p
            h = (h * h + add) % p
            i = (h * scale >> 30) << 1
            e = halves[i + 1]
            while e < h:  # entries of smaller hashes, pushed past their home slots
                i += 2
                e = halves[i + 1]
            while e == h:  # the entries of hash h (a free slot's hash is above every hash)
                row = halves[i]
                ko, kd, _, _ = views[row >> local_bits]
                j = row & local_mask
                if kd[ko[j] : ko[j + 1]] == key:
                    return True
                i += 2
                e = halves[i + 1]
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
        """:meth:`contains`'s probe for a batch at once, giving each key's value (or row id), one
        key index after the other for the keys not found yet (see :meth:`_lookup_in`)."""
        n = len(keys)
        found: list[int] = [-1] * n
        got: list[bytes | None] = [None] * n
        if not n or not self.ready_probes():
            return got if values else found
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
        todo = list(range(n))
        for prober in self._probers:
            asked = [keys[i] for i in todo]
            self._lookup_in(prober, asked, todo, found, got, values=values)
            todo = [i for i in todo if (got[i] is None if values else found[i] < 0)]
            if not todo:
                break
        return got if values else found

    def _lookup_in(
        self,
        prober: _Prober,
        keys: Sequence[bytes],
        at: Sequence[int],
        found: list[int],
        got: list[bytes | None],
        *,
        values: bool,
    ) -> None:
        """One index's batch probe of *keys* (whose answers go to positions *at*). Hashing and
        probing are numpy passes, whose gathers overlap the cache misses a Python probe waits for
        one by one. The keys whose hash an entry matches are then compared (and their values
        taken) by Arrow where a segment holds many of them, in one Python pass for the rest."""
        index, segments, bits = prober.index, prober.segments, prober.bits
        mask = (1 << bits) - 1
        views = [s.views for s in segments]
        table = index.table
        asked = pa.array(keys, pa.binary())
        h = array_hashes(asked, index.seed).astype(np.uint64)
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
            segs = rows >> bits
            crowded = np.bincount(segs)[segs] >= _ARROW_GROUP
            missed: list[int] = []
            few = np.flatnonzero(~crowded)
            for i, row in zip(pending[few].tolist(), rows[few].tolist(), strict=True):
                ko, kd, vo, vd = views[row >> bits]
                j = row & mask
                if kd[ko[j] : ko[j + 1]] == keys[i]:
                    if values:
                        got[at[i]] = vd[vo[j] : vo[j + 1]].tobytes()
                    else:
                        found[at[i]] = prober.row_id(row)
                else:
                    missed.append(i)
            many = np.flatnonzero(crowded)
            if many.size:
                order = many[np.argsort(rows[many])]
                by_seg, where_all, local = segs[order], pending[order], rows[order] & mask
                cuts = (np.flatnonzero(np.diff(by_seg)) + 1).tolist()
                for lo, hi in zip([0, *cuts], [*cuts, len(order)], strict=True):
                    seg = segments[int(by_seg[lo])]
                    here, where = pa.array(local[lo:hi]), where_all[lo:hi]
                    stored = seg.table.column("key").chunk(0).take(here)
                    same = pc.equal(stored, asked.take(pa.array(where))).to_numpy(zero_copy_only=False)
                    if not same.all():
                        missed += where[~same].tolist()
                        where = where[same]
                        here = here.filter(pa.array(same))
                    if values:
                        taken = seg.table.column("value").chunk(0).take(here).to_pylist()
                        for i, value in zip(where.tolist(), taken, strict=True):
                            got[at[i]] = value
                    else:
                        first = seg.number << _LOCAL_BITS
                        for i, j in zip(where.tolist(), here.to_pylist(), strict=True):
                            found[at[i]] = first | j
            if not missed:
                break
            rest = np.array(missed, np.int64)  # hash collisions: try each key's next entry
            slot[rest] += 1
            entry[rest] = table[slot[rest]]
            pending = rest[entry[rest] < top[rest]]

    def locate(self, key: bytes) -> tuple[Segment, int] | None:
        """The segment and index holding *key*, or None."""
        if not self.rows:
            return None
        self.ready_probes()
        for prober in self._probers:
            bits = prober.bits
            for row in prober.index.candidates(key):
                s = prober.segments[row >> bits]
                i = row & ((1 << bits) - 1)
                ko = s.key_offsets
                if s.key_data[ko[i] : ko[i + 1]] == key:
                    return s, i
        return None

    @property
    def nbytes(self) -> int:
        indexes = sum(pr.index.nbytes for pr in self.persisted.values())
        if self._index is not None:
            indexes += self._index.nbytes
        return indexes + sum(int(s.table.nbytes) for s in self.segments)


def _build_index(segments: list[Segment], stop: Callable[[], bool] | None = None) -> KeyIndex | None:
    """One index over *segments* (row ids ``number << 20 | index``), hashing a segment at a time
    into it (or taking the hashes its load computed, then dropping them); None when *stop* says
    so between segments."""
    builder = KeyIndexBuilder(sum(s.table.num_rows for s in segments))
    for s in segments:
        if stop is not None and stop():
            return None
        hashes = s.hashes if s.hashes is not None else array_hashes(s.table.column("key").chunk(0))
        s.hashes = None
        builder.add(s.number << _LOCAL_BITS, hashes)
        del hashes
    return builder.build()


def _merge(ref: weakref.ref[Base], segments: list[Segment]) -> None:
    """Build one index over every segment of a base and make its lookups probe that alone (see
    _MAX_PROBES). Off the restore's path: the tail's replay, which never looks up the base, runs
    meanwhile. Stops when the base is gone (a fold or a rebalance replaced it)."""
    try:
        release_unused()
        index = _build_index(segments, lambda: ref() is None)
        if index is None:
            return
    except Exception:  # lookups keep probing each index: slower, still right
        log.warning("building one key index over %d chunks failed", len(segments), exc_info=True)
        return
    base = ref()
    if base is not None:
        base._adopt(index)


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
