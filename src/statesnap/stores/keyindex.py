"""A compact hash index over Arrow binary keys, built with vectorized numpy, probed from Python.

Why not a dict: a dict needs one Python bytes object per key (~50 bytes plus the slot), and
building it is a pass of Python work per row — 5+ s for 10 M keys. This index costs 8 bytes per
key plus a small directory and builds in a few numpy passes.

The hash of a key is ``int.from_bytes(key, "little") mod P``, for a prime P below 2**30 drawn at
random when the process starts: keys cannot be crafted to collide (Python's dict seeds its hash
for the same reason), and the index lives in memory only, never in a file. That is two cheap
operations from Python (the divisor fits one machine digit of a Python int, so CPython takes its
single-digit division path; a mod-2**61-1-and-multiply mix measured 2.5x dearer per lookup), and
in numpy a Horner pass per 8-byte word. The index is the sorted array of ``hash << 32 | row``
plus a directory of bucket starts on the hash's top bits, so a probe reads a handful of array
slots; equal hashes are resolved by comparing the full key, so collisions cost
time, never correctness.
"""

from __future__ import annotations

import secrets
from bisect import bisect_left
from collections.abc import Callable

import numpy as np
import pyarrow as pa

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
_C64 = (1 << 64) % P  # one 8-byte word up in the Horner pass
_MASKS = np.array([0] + [(1 << (8 * i)) - 1 for i in range(1, 8)] + [(1 << 64) - 1], dtype=np.uint64)
#: Keys per directory bucket (a power of two of buckets near n/8): a probe bisects ~8 sorted
#: slots, one or two cache lines; the directory costs 1 byte a key.
_KEYS_PER_BUCKET = 8
ROW_BITS = 32
MAX_ROWS = 1 << ROW_BITS


def key_hash(key: bytes) -> int:
    """The hash of one key (below :data:`P`), equal to :func:`array_hashes` of it."""
    return int.from_bytes(key, "little") % P


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
    p, c64, u3 = np.uint64(P), np.uint64(_C64), np.uint64(3)
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
            np.multiply(h, c64, out=h)  # h, c64 < 2**30: no overflow, nor after adding w < 2**30
            h += w
            np.remainder(h, p, out=h)
        out[lo:hi] = h
    return out


class KeyIndex:
    """Sorted ``hash << 32 | row`` entries with a bucket directory; rows are the caller's ids."""

    __slots__ = ("directory_view", "entries", "entries_view", "shift")

    # The lookup hot path (ColumnarStore.get, >= 500 k/s from Python) inlines candidates():
    # the bucket of hash h is ``h >> shift``, searched by C bisect.

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
        bits = max(1, min(HASH_BITS, int(max(n // _KEYS_PER_BUCKET, 1)).bit_length()))
        self.shift = HASH_BITS - bits
        # Bucket counts a slice at a time: whole-array temporaries would cost 2 x 8 bytes a key
        # at the restore's peak.
        directory = np.zeros((1 << bits) + 1, np.int64)
        top = np.uint64(32 + self.shift)
        for lo in range(0, n, _CHUNK * 32):
            chunk = (packed[lo : lo + _CHUNK * 32] >> top).astype(np.intp)
            directory[1:] += np.bincount(chunk, minlength=1 << bits)
        np.cumsum(directory, out=directory)
        self.entries = packed
        self.entries_view = packed.data
        self.directory_view = directory.data

    @property
    def nbytes(self) -> int:
        return self.entries_view.nbytes + self.directory_view.nbytes

    def find(self, key: bytes, matches: Callable[[int, bytes], bool]) -> int:
        """The row whose key is *key* (checked by ``matches(row, key)``), or -1."""
        for row in self.candidates(key):
            if matches(row, key):
                return row
        return -1

    def candidates(self, key: bytes) -> list[int]:
        """Rows whose key hashes like *key* (usually one, or none)."""
        h = int.from_bytes(key, "little") % P
        entries = self.entries_view
        top = h << 32
        b = h >> self.shift
        end = self.directory_view[b + 1]
        i = bisect_left(entries, top, self.directory_view[b], end)
        if i >= end:
            return []
        e = entries[i]
        if e >> 32 != h:
            return []
        if i + 1 >= end or entries[i + 1] >> 32 != h:
            return [e & 0xFFFFFFFF]
        out = []
        while i < end and (e := entries[i]) >> 32 == h:
            out.append(e & 0xFFFFFFFF)
            i += 1
        return out
