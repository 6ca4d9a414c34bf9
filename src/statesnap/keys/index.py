"""A compact hash index over Arrow binary keys, built with vectorized numpy, probed from Python.

Why not a dict: a dict needs one Python bytes object per key (~50 bytes plus the slot), and
building it is a pass of Python work per row — 5+ s for 10 M keys. This index costs 12.8 bytes
per key and builds in a few numpy passes.

The hash of a key is ``h**2 + ADD mod P`` where ``h = int.from_bytes(key, "little") * MIX mod P``,
for a prime P below 2**30 and MIX, ADD drawn at random (a :class:`HashSeed`): keys cannot be
crafted to collide (Python's dict seeds its hash for the same reason). An index built in memory
uses the process's seed, drawn when it starts. A *persisted* index (written beside a partition's
base file, :meth:`KeyIndex.to_bytes`, so a restore reads it instead of building it) carries its
own seed, drawn fresh for each file: a key's producer never sees it (it lives in the checkpoint
store, beside the rows themselves), and one leaked seed would only slow probes of that one file
until its base is rewritten. What matters holds either way: a probe compares the full key, so a
collision, crafted or not, costs time, never correctness.

The table below places entries by the hash's size, so hashes must spread evenly over the range.
MIX alone spreads keys whose residue would crowd one end (small little-endian integers) but keeps
sequential keys on a lattice, and for ~1 % of draws the lattice piles entries into runs (mean
probe 4-170 slots measured over 300 draws, ``key-<i>`` and integer keys); the square breaks the
lattice for sequential strings and random bytes (mean 0.86-0.99 slots in every draw). Sequential
integers are the one shape the square leaves structured: the hash of the little-endian integer i
is ``i**2 * MIX**2 + ADD mod P``, and for ~5 % of draws that quadratic piles the keys 0..n-1 into a
few regions at some sizes n (mean probe 2-38 slots). A drawn seed is tried on such keys (little-
and 4- and 8-byte big-endian, 1 Ki to 128 Ki of them) and drawn again if it piles them
(:func:`spreads`, ~15 ms a draw); kept draws gave at most 1.24 slots, up to 1 M keys.

The hash is a few cheap operations from Python (every factor fits one machine digit of a Python
int, so CPython takes its single-digit paths; a mod-2**61-1 mix measured 2.5x dearer per lookup),
and in numpy a Horner pass per 8-byte word.

The index is one array of ``hash << 32 | row`` entries, sorted by hash and laid out as an
*ordered linear-probing table*: the entry of hash h sits at or after its home slot
``h * scale >> 30`` (``scale = slots * 2**30 // P``: monotone in h, onto every slot), right after
the entries of smaller hashes, and free slots hold :data:`EMPTY` (above every entry). So a probe
reads the home slot and usually nothing more: no directory and no bisect, two array reads and a
cache line fewer than a bucketed sorted array (+15-20 % lookups at 10 M keys). Equal hashes are
resolved by comparing the full key, so collisions cost time, never correctness. Lookups read the
table as 32-bit halves, ``(row, hash)`` per slot (:attr:`KeyIndex.halves`): each half is a one-digit
Python int, cheaper to read, compare and shift than the 64-bit entry (+6 % lookups at 10 M keys).
"""

from __future__ import annotations

import secrets
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from statesnap.errors import CorruptCheckpointError

__all__ = [
    "ADD",
    "EMPTY",
    "HASH_BITS",
    "MAX_ROWS",
    "MIX",
    "ROW_BITS",
    "HashSeed",
    "KeyIndex",
    "KeyIndexBuilder",
    "P",
    "array_hashes",
    "binary_parts",
    "key_hash",
    "spreads",
]

HASH_BITS = 30


def _is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin: bases 2, 3, 5, 7 decide every n below 3,215,031,751."""
    if n < 2 or n % 2 == 0:
        return n == 2
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in (2, 3, 5, 7):
        if a % n == 0:
            continue
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _random_prime() -> int:
    rng = secrets.SystemRandom()
    while True:
        n = rng.randrange(1 << (HASH_BITS - 1), 1 << HASH_BITS) | 1
        if _is_prime(n):
            return n


_MASKS = np.array([0] + [(1 << (8 * i)) - 1 for i in range(1, 8)] + [(1 << 64) - 1], dtype=np.uint64)
#: Slots per key (load 0.625): a probe reads ~1.3 slots on average (ordered linear probing keeps
#: misses as short as hits), for 12.8 bytes a key; at load 0.7 lookups measured ~5 % slower.
_SLOTS_PER_KEY = 1.6
#: A free slot: above every entry (hash < 2**30), so a probe's scan stops on it.
EMPTY = (1 << 64) - 1
#: Free slots past the last home slot: room for the last run's spill.
_SPILL = 64
ROW_BITS = 32
MAX_ROWS = 1 << ROW_BITS
#: The persisted index's header: magic, format, hash bits, p, mix, add, scale, rows, slots.
_HEADER = struct.Struct("<8sII6Q")
_MAGIC = b"SSKEYIX\x00"
_FORMAT = 1
assert _HEADER.size == 64  # the slots start 8-aligned in the file and in a bytes object


@dataclass(frozen=True, slots=True)
class HashSeed:
    """The hash's parameters: the prime ``p`` and the random ``mix`` and ``add`` (module docstring)."""

    p: int
    mix: int
    add: int

    @classmethod
    def fresh(cls) -> HashSeed:
        """A new random seed, for one persisted index file: drawn until it :func:`spreads` the
        keys users most often give in sequence."""
        rng = secrets.SystemRandom()
        while True:
            p = _random_prime()
            seed = cls(p, rng.randrange(1 << 20, p), rng.randrange(p))
            if spreads(seed):
                return seed

    @classmethod
    def process(cls) -> HashSeed:
        """This process's seed (:data:`P`, :data:`MIX`, :data:`ADD`, read when called)."""
        return cls(P, MIX, ADD)

    def hash(self, key: bytes) -> int:
        h = int.from_bytes(key, "little") * self.mix % self.p
        return (h * h + self.add) % self.p

    def plausible(self) -> bool:
        """Whether a seed read from a file could have been drawn by :meth:`fresh`."""
        return (
            (1 << (HASH_BITS - 1)) <= self.p < (1 << HASH_BITS)
            and _is_prime(self.p)
            and (0 < self.mix < self.p and 0 <= self.add < self.p)
        )


def key_hash(key: bytes, seed: HashSeed | None = None) -> int:
    """The hash of one key (below the seed's prime), equal to :func:`array_hashes` of it."""
    if seed is not None:
        return seed.hash(key)
    h = int.from_bytes(key, "little") * MIX % P
    return (h * h + ADD) % P


def binary_parts(arr: pa.Array) -> tuple[np.ndarray, pa.Buffer]:
    """Value offsets (int32 or int64, length n+1, absolute in the data buffer) and the data."""
    wide = pa.types.is_large_binary(arr.type)
    dtype = np.int64 if wide else np.int32
    bufs = arr.buffers()
    data = bufs[2] if bufs[2] is not None else pa.py_buffer(b"")
    if bufs[1] is None:  # an empty array may have no offsets buffer
        return np.zeros(len(arr) + 1, dtype), data
    offs = np.frombuffer(bufs[1], dtype=dtype, count=len(arr) + 1, offset=arr.offset * (8 if wide else 4))
    return offs, data


#: Keys hashed per numpy pass: temporaries stay in cache and are reused, not page-faulted in.
_CHUNK = 1 << 15


def array_hashes(arr: pa.Array, seed: HashSeed | None = None) -> np.ndarray:
    """:func:`key_hash` of every value of a binary array, as uint32 (vectorized)."""
    seed = seed if seed is not None else HashSeed.process()
    n = len(arr)
    offs, data = binary_parts(arr)
    out = np.empty(n, np.uint32)
    if n == 0:
        return out
    raw = np.frombuffer(data, dtype=np.uint8)
    if raw.size < 8:  # the unaligned 8-byte view below needs at least one full word
        raw = np.concatenate([raw, np.zeros(8, np.uint8)])
    size = raw.size
    words = np.ndarray(shape=(size - 7,), dtype="<u8", buffer=raw, strides=(1,))
    # (1 << 64) % P moves one 8-byte word up in the Horner pass.
    p, c64, u3, mix, add = (np.uint64(x) for x in (seed.p, (1 << 64) % seed.p, 3, seed.mix, seed.add))
    last = np.int64(size - 8)
    for lo in range(0, n, _CHUNK):
        hi = min(lo + _CHUNK, n)
        starts = offs[lo:hi].astype(np.int64)
        lens = offs[lo + 1 : hi + 1] - starts
        h = np.zeros(hi - lo, np.uint64)
        pos = np.empty_like(starts)
        safe = np.empty_like(starts)
        w = np.empty_like(h)
        for j in range(int((lens.max() + 7) // 8) - 1, -1, -1):  # the most significant word first
            np.add(starts, 8 * j, out=pos)
            np.minimum(pos, last, out=safe)
            w[:] = words[safe]
            # Near the end of the buffer the last full word is read and shifted down.
            np.subtract(pos, safe, out=pos)
            np.left_shift(pos.view(np.uint64), u3, out=pos.view(np.uint64))
            np.right_shift(w, pos.view(np.uint64), out=w)
            np.bitwise_and(w, _MASKS[np.clip(lens - 8 * j, 0, 8)], out=w)
            np.remainder(w, p, out=w)
            np.multiply(w, mix, out=w)  # each word times MIX: the sum is the key times MIX
            np.multiply(h, c64, out=h)  # h, c64, w, MIX < 2**30: the sum stays below 2**61
            h += w
            np.remainder(h, p, out=h)
        np.multiply(h, h, out=h)  # h < 2**30: the square and ADD stay below 2**61
        h += add
        np.remainder(h, p, out=h)
        out[lo:hi] = h
    return out


#: The keys :func:`spreads` tries: sequential integers as 4-byte little-endian, 4-byte and
#: 8-byte big-endian (Kafka's own integer serializers) keys, each at every prefix size below.
_TRIAL_KINDS = ("<u4", ">u4", ">u8")
_TRIAL_SIZES = tuple(1 << b for b in range(10, 18))
#: Mean slots an entry sits past its home that :func:`spreads` allows: uniform hashes give
#: 0.75-0.95 at these sizes (0.87 at 20,000); a seed that piles sequential keys gave 2-38.
_TRIAL_MEAN_SHIFT = 1.25


def _trial_hashes(n: int, dtype: str, seed: HashSeed) -> np.ndarray:
    """:func:`array_hashes` of the keys 0..n-1 encoded as *dtype*, from their one 8-byte word
    (a key of at most 8 bytes is its little-endian integer): a tenth of the general pass's time."""
    words = np.arange(n, dtype=dtype).view(np.dtype(dtype).newbyteorder("<"))
    p, mix, add = (np.uint64(x) for x in (seed.p, seed.mix, seed.add))
    h = words.astype(np.uint64) % p * mix % p
    return ((h * h + add) % p).astype(np.uint32)


def _mean_shift(hashes: np.ndarray, p: int) -> float:
    """The mean distance past its home slot of each entry of an index of *hashes* (below *p*),
    without building it: in an ordered linear-probing table the k-th smallest hash sits at
    ``max(home_k, slot_{k-1} + 1)``, a running maximum of ``home_k - k``, plus k."""
    n = len(hashes)
    slots = max(1, int(n * _SLOTS_PER_KEY))
    scale = np.uint64((slots << HASH_BITS) // p)
    homes = ((np.sort(hashes).astype(np.uint64) * scale) >> np.uint64(HASH_BITS)).astype(np.int64)
    k = np.arange(n, dtype=np.int64)
    return float(np.mean(np.maximum.accumulate(homes - k) + k - homes))


def spreads(seed: HashSeed) -> bool:
    """Whether *seed* spreads sequential integer keys evenly over an index's slots, at every size
    tried. For ~5 % of random seeds the hash's polynomial (a square of a multiple: module
    docstring) piles a run of sequential keys into a few regions of the table at some sizes (mean
    probes 2-38 slots where uniform hashes give 0.87): a probe stays correct, only slower, and a
    drawn seed that does so is drawn again (~15 ms a draw)."""
    for kind in _TRIAL_KINDS:
        hashes = _trial_hashes(_TRIAL_SIZES[-1], kind, seed)
        for n in _TRIAL_SIZES:  # the keys 0..n-1 are a prefix of the largest trial's
            if _mean_shift(hashes[:n], seed.p) > _TRIAL_MEAN_SHIFT:
                return False
    return True


_PROCESS_SEED = HashSeed.fresh()
#: The hash modulus: a random prime in [2**29, 2**30) (one 30-bit digit of a Python int).
P = _PROCESS_SEED.p
#: The hash's multiplier, in [2**20, P), and the addend of its square: see the module docstring.
MIX = _PROCESS_SEED.mix
ADD = _PROCESS_SEED.add


class KeyIndexBuilder:
    """A :class:`KeyIndex` built a block of rows at a time, straight into the memory of its table.

    The entries of the blocks are packed into the table's tail, sorted there, then moved forward
    into their slots, in order: entry k's slot is k or later, and the tail starts 0.6 slots a key
    further on, so a move lands on a free slot; a run that would reach entries not moved yet (rare)
    moves them out of its way first. The table is then the only allocation that grows with the
    rows. A separate array of entries cost 8 bytes a key more at a restore's peak, and hashing
    every key first 4 more: :meth:`add` takes a block at a time (hash as you add, and stop
    between blocks if need be)."""

    def __init__(self, rows: int, seed: HashSeed | None = None) -> None:
        if rows >= MAX_ROWS:
            raise ValueError(f"key index holds at most {MAX_ROWS - 1} rows, got {rows}")
        self.seed = seed if seed is not None else HashSeed.process()
        self.rows = rows
        self._slots = max(1, int(rows * _SLOTS_PER_KEY))
        self._table = np.full(self._slots + _SPILL, EMPTY, np.uint64)
        self._added = 0

    def add(self, first_row: int, hashes: np.ndarray) -> None:
        """The rows ``first_row, first_row + 1, …`` whose keys hash (with :attr:`seed`) to *hashes*."""
        n = len(hashes)
        if self._added + n > self.rows:
            raise ValueError(f"key index of {self.rows} rows given {self._added + n}")
        packed = self._table[len(self._table) - self.rows + self._added :]
        for lo in range(0, n, _CHUNK):
            part = packed[lo : min(lo + _CHUNK, n)]
            part[:] = hashes[lo : lo + len(part)]
            part <<= np.uint64(32)
            part |= np.arange(first_row + lo, first_row + lo + len(part), dtype=np.uint64)
        self._added += n

    def build(self) -> KeyIndex:
        """The index of every row added (all :attr:`rows` of them)."""
        n = self.rows
        if self._added != n:
            raise ValueError(f"key index of {n} rows given {self._added}")
        table = self._table
        off = len(table) - n
        source, first = table[off:], 0  # entry k is source[k - first]
        source.sort()  # numpy's SIMD sort, in place: ~0.2 s for 10 M entries
        # Hashes are below P, not 2**30: scale them onto the slots by P itself.
        scale = (self._slots << HASH_BITS) // self.seed.p
        # Entry k goes to max(home_k, slot_{k-1} + 1): slot_k - k is a running maximum of
        # home_k - k, computed a slice at a time in reused cache-sized arrays. Slots only grow,
        # so the moves go in order; the last run may spill past the slots (then the table grows).
        carry = -1  # slot of the previous entry minus its position
        step = _CHUNK * 2
        local = np.arange(step, dtype=np.int64)
        buf = np.empty(step, np.int64)
        moving = np.empty(step, np.uint64)
        scale64, u32, u30 = np.uint64(scale), np.uint64(32), np.uint64(HASH_BITS)
        for lo in range(0, n, step):
            m = min(step, n - lo)
            pos, ks, upos, entries = buf[:m], local[:m], buf[:m].view(np.uint64), moving[:m]
            entries[:] = source[lo - first : lo - first + m]
            if first == 0:  # read from the table's tail: those slots are free now
                table[off + lo : off + lo + m] = EMPTY
            np.right_shift(entries, u32, out=upos)
            np.multiply(upos, scale64, out=upos)  # < 2**64: hash < 2**30, scale < 2**34 (rows < 2**32)
            np.right_shift(upos, u30, out=upos)  # the home slot
            pos -= ks  # home - position + lo
            np.maximum.accumulate(pos, out=pos)
            np.maximum(pos, carry + lo, out=pos)
            carry = int(pos[-1]) - lo
            pos += ks  # the slot
            last = int(pos[-1])
            if first == 0 and last >= off + lo + m and lo + m < n:
                # A run crowded onto entries not moved yet (rare): they move out of the way first.
                source, first = table[off + lo + m :].copy(), lo + m
                table[off + lo + m :] = EMPTY
            if last + 1 >= len(table):  # past the tail: every entry not moved yet is in source
                table = np.concatenate([table, np.full(last + 1 - len(table) + _SPILL, EMPTY, np.uint64)])
            table[pos] = entries
        self._table = np.empty(0, np.uint64)
        return KeyIndex(table, self.seed, rows=n, scale=scale)


class KeyIndex:
    """``hash << 32 | row`` entries in an ordered linear-probing table; rows are the caller's ids."""

    __slots__ = ("halves", "rows", "scale", "seed", "table")

    # The lookup hot path (ColumnarStore.get, >= 500 k/s from Python) inlines candidates().

    def __init__(self, table: np.ndarray, seed: HashSeed, *, rows: int, scale: int) -> None:
        """The index whose slots are *table* (uint64, laid out by :class:`KeyIndexBuilder`)."""
        self.seed: HashSeed = seed
        self.rows: int = rows
        self.scale: int = scale
        self.table: np.ndarray = table.view(np.uint64)
        self.halves: memoryview = _halves(self.table)

    @classmethod
    def of_keys(cls, keys: pa.Array | pa.ChunkedArray, seed: HashSeed) -> KeyIndex:
        """The index of *keys* whose rows are their positions (0, 1, …): a base file's index."""
        chunks = keys.chunks if isinstance(keys, pa.ChunkedArray) else [keys]
        builder = KeyIndexBuilder(len(keys), seed)
        at = 0
        for chunk in chunks:
            builder.add(at, array_hashes(chunk, seed))
            at += len(chunk)
        return builder.build()

    def to_bytes(self) -> bytes:
        """The persisted form: a 64-byte header (magic, version, seed, scale, rows, slots), then the
        table's slots as little-endian uint64, read back without a copy by :meth:`from_bytes`."""
        header = _HEADER.pack(
            _MAGIC,
            _FORMAT,
            HASH_BITS,
            self.seed.p,
            self.seed.mix,
            self.seed.add,
            self.scale,
            self.rows,
            len(self.table),
        )
        return header + self.table.astype("<u8", copy=False).tobytes()

    @classmethod
    def from_bytes(cls, data: bytes, *, rows: int, source: str = "key index") -> KeyIndex:
        """The index :meth:`to_bytes` wrote, for a base of *rows* rows, its slots a view of *data*
        (no copy). Raises :class:`CorruptCheckpointError` when the file cannot be that index: every
        probe stays inside the table (homes below its length, a free slot last) whatever the
        entries say; rows an entry names are checked by the store that adopts it."""
        if len(data) < _HEADER.size:
            raise CorruptCheckpointError(f"{source}: {len(data)} bytes, shorter than a key index header")
        magic, fmt, bits, p, mix, add, scale, n, slots = _HEADER.unpack_from(data)
        if magic != _MAGIC or fmt != _FORMAT or bits != HASH_BITS:
            raise CorruptCheckpointError(f"{source}: not a key index of format {_FORMAT}")
        seed = HashSeed(p, mix, add)
        if not seed.plausible():
            raise CorruptCheckpointError(f"{source}: implausible hash parameters")
        if n != rows:
            raise CorruptCheckpointError(f"{source}: indexes {n} rows, its base file holds {rows}")
        if len(data) != _HEADER.size + 8 * slots or slots < 1 or (p - 1) * scale >> HASH_BITS >= slots:
            raise CorruptCheckpointError(
                f"{source}: {slots} slots do not fit {len(data)} bytes or scale {scale}"
            )
        table = np.frombuffer(data, dtype="<u8", count=slots, offset=_HEADER.size)
        if int(table[-1]) != EMPTY:
            raise CorruptCheckpointError(f"{source}: the table does not end with a free slot")
        return cls(table, seed, rows=n, scale=scale)

    @property
    def nbytes(self) -> int:
        return int(self.table.nbytes)

    def find(self, key: bytes, matches: Callable[[int, bytes], bool]) -> int:
        """The row whose key is *key* (checked by ``matches(row, key)``), or -1."""
        for row in self.candidates(key):
            if matches(row, key):
                return row
        return -1

    def candidates(self, key: bytes) -> list[int]:
        """Rows whose key hashes like *key* (usually one, or none)."""
        seed = self.seed
        h = int.from_bytes(key, "little") * seed.mix % seed.p
        h = (h * h + seed.add) % seed.p
        halves = self.halves
        i = (h * self.scale >> HASH_BITS) << 1
        e = halves[i + 1]
        while e < h:  # entries of smaller hashes pushed past their home slots
            i += 2
            e = halves[i + 1]
        out = []
        while e == h:  # a free slot's hash half is above every hash
            out.append(halves[i])
            i += 2
            e = halves[i + 1]
        return out


def _halves(table: np.ndarray) -> memoryview:
    """*table*'s slots as native 32-bit ints, row then hash (a copy only on a big-endian machine)."""
    little = table.astype("<u8", copy=False).view("<u4")
    return (little if sys.byteorder == "little" else little.astype(np.uint32)).data
