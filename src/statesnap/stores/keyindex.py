"""A compact hash index over Arrow binary keys, built with vectorized numpy, probed from Python.

Why not a dict: a dict needs one Python bytes object per key (~50 bytes plus the slot), and
building it is a pass of Python work per row — 5+ s for 10 M keys. This index costs 12.8 bytes
per key and builds in a few numpy passes.

The hash of a key is ``h**2 + ADD mod P`` where ``h = int.from_bytes(key, "little") * MIX mod P``,
for a prime P below 2**30 and MIX, ADD drawn at random when the process starts: keys cannot be
crafted to collide (Python's dict seeds its hash for the same reason), and the index lives in
memory only, never in a file. The table below places entries by the hash's size, so hashes must
spread evenly over the range. MIX alone spreads keys whose residue would crowd one end (small
little-endian integers) but keeps sequential keys on a lattice, and for ~1 % of draws the lattice
piles entries into runs (mean probe 4-170 slots measured over 300 draws, ``key-<i>`` and integer
keys); the square breaks the lattice (mean 0.86-0.99 slots in every draw, for sequential strings,
little- and big-endian integers and random bytes alike). That is a few cheap operations from
Python (every factor fits one machine digit of a Python int, so CPython takes its single-digit
paths; a mod-2**61-1 mix measured 2.5x dearer per lookup), and in numpy a Horner pass per 8-byte
word.

The index is one array of ``hash << 32 | row`` entries, sorted by hash and laid out as an
*ordered linear-probing table*: the entry of hash h sits at or after its home slot
``h * scale >> 30`` (``scale = slots * 2**30 // P``: monotone in h, onto every slot), right after
the entries of smaller hashes, and free slots hold :data:`EMPTY` (above every entry). So a probe
reads the home slot and usually nothing more: no directory and no bisect, two array reads and a
cache line fewer than a bucketed sorted array (+15-20 % lookups at 10 M keys). Equal hashes are
resolved by comparing the full key, so collisions cost time, never correctness.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

import numpy as np
import pyarrow as pa

__all__ = [
    "ADD",
    "EMPTY",
    "HASH_BITS",
    "MAX_ROWS",
    "MIX",
    "ROW_BITS",
    "KeyIndex",
    "P",
    "array_hashes",
    "binary_parts",
    "key_hash",
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


#: The hash modulus: a random prime in [2**29, 2**30) (one 30-bit digit of a Python int).
P = _random_prime()
#: The hash's multiplier, in [2**20, P), and the addend of its square: see the module docstring.
MIX = secrets.SystemRandom().randrange(1 << 20, P)
ADD = secrets.SystemRandom().randrange(P)
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


def key_hash(key: bytes) -> int:
    """The hash of one key (below :data:`P`), equal to :func:`array_hashes` of it."""
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


def array_hashes(arr: pa.Array) -> np.ndarray:
    """:func:`key_hash` of every value of a binary array, as uint32 (vectorized)."""
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
    p, c64, u3, mix, add = (np.uint64(x) for x in (P, (1 << 64) % P, 3, MIX, ADD))
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


class KeyIndex:
    """``hash << 32 | row`` entries in an ordered linear-probing table; rows are the caller's ids."""

    __slots__ = ("entries_view", "scale", "table")

    # The lookup hot path (ColumnarStore.get, >= 500 k/s from Python) inlines candidates().

    def __init__(self, hashes: list[np.ndarray | None], first_rows: list[int]) -> None:
        """*hashes*: per block of rows; each is dropped from the list once copied, so a restore's
        peak memory holds the entries and at most one block's hashes, not both in full."""
        n = sum(len(h) for h in hashes if h is not None)
        if n >= MAX_ROWS:
            raise ValueError(f"key index holds at most {MAX_ROWS - 1} rows, got {n}")
        packed = np.empty(n, np.uint64)
        at = 0
        for k, first in enumerate(first_rows):
            h = hashes[k]
            assert h is not None
            hashes[k] = None
            for lo in range(0, len(h), _CHUNK):
                part = packed[at + lo : at + min(lo + _CHUNK, len(h))]
                part[:] = h[lo : lo + len(part)]
                part <<= np.uint64(32)
                part |= np.arange(first + lo, first + lo + len(part), dtype=np.uint64)
            at += len(h)
            del h
        packed.sort()  # numpy's SIMD sort, in place: ~0.2 s for 10 M entries
        slots = max(1, int(n * _SLOTS_PER_KEY))
        # Hashes are below P, not 2**30: scale them onto the slots by P itself.
        self.scale = scale = (slots << HASH_BITS) // P
        # Entry k goes to max(home_k, slot_{k-1} + 1): slot_k - k is a running maximum of
        # home_k - k, computed a slice at a time (whole-array temporaries would cost 3 x 8 bytes
        # a key at the restore's peak). Slots only grow, so the scatter writes in order; the
        # last run may spill past ``slots`` (then the table grows), and a free slot ends it.
        table = np.full(slots + _SPILL, EMPTY, np.uint64)
        carry = -1  # slot of the previous entry minus its position
        step = _CHUNK * 2  # cache-sized slices, computed in place in two reused arrays
        local = np.arange(step, dtype=np.int64)
        buf = np.empty(step, np.int64)
        scale64, u32, u30 = np.uint64(scale), np.uint64(32), np.uint64(HASH_BITS)
        for lo in range(0, n, step):
            m = min(step, n - lo)
            pos, ks, upos = buf[:m], local[:m], buf[:m].view(np.uint64)
            np.right_shift(packed[lo : lo + m], u32, out=upos)
            np.multiply(upos, scale64, out=upos)  # < 2**64: hash < 2**30, scale < 2**34 (rows < 2**32)
            np.right_shift(upos, u30, out=upos)  # the home slot
            pos -= ks  # home - position + lo
            np.maximum.accumulate(pos, out=pos)
            np.maximum(pos, carry + lo, out=pos)
            carry = int(pos[-1]) - lo
            pos += ks  # the slot
            if int(pos[-1]) + 1 >= len(table):
                grow = np.full(int(pos[-1]) + 1 - len(table) + _SPILL, EMPTY, np.uint64)
                table = np.concatenate([table, grow])
            table[pos] = packed[lo : lo + m]
        del packed
        self.table = table
        self.entries_view = table.data

    @property
    def nbytes(self) -> int:
        return int(self.entries_view.nbytes)

    def find(self, key: bytes, matches: Callable[[int, bytes], bool]) -> int:
        """The row whose key is *key* (checked by ``matches(row, key)``), or -1."""
        for row in self.candidates(key):
            if matches(row, key):
                return row
        return -1

    def candidates(self, key: bytes) -> list[int]:
        """Rows whose key hashes like *key* (usually one, or none)."""
        h = int.from_bytes(key, "little") * MIX % P
        h = (h * h + ADD) % P
        entries = self.entries_view
        i = h * self.scale >> HASH_BITS
        top = h << 32
        e = entries[i]
        while e < top:  # entries of smaller hashes pushed past their home slots
            i += 1
            e = entries[i]
        top += 1 << 32
        out = []
        while e < top:
            out.append(e & 0xFFFFFFFF)
            i += 1
            e = entries[i]
        return out
