"""A compact hash index over Arrow binary keys, built with vectorized numpy, probed from Python.

Why not a dict: a dict needs one Python bytes object per key (~50 bytes plus the slot), and
building it is a pass of Python work per row — 5+ s for 10 M keys. This index costs 8 bytes per
key plus a small directory and builds in a few numpy passes.

The hash of a key is ``int.from_bytes(key, "little") mod (2**61 - 1)``, mixed to 32 bits: one C
call from Python, and in numpy a Horner pass per 8-byte word (2**64 ≡ 8 modulo the Mersenne
prime). The index is the sorted array of ``hash32 << 32 | row`` plus a directory of bucket starts
on the hash's top bits, so a probe reads a handful of array slots; equal hashes are resolved by
comparing the full key, so collisions cost time, never correctness.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable

import numpy as np
import pyarrow as pa

_M61 = (1 << 61) - 1
_MIX = 0x9E3779B97F4A7C15  # 2**64 / golden ratio: Fibonacci hashing spreads nearby integers
_M64 = (1 << 64) - 1
_MASKS = np.array([0] + [(1 << (8 * i)) - 1 for i in range(1, 8)] + [_M64], dtype=np.uint64)
#: Directory buckets per key (a power of two near n/4): a probe scans ~4 sorted slots.
_KEYS_PER_BUCKET = 4
ROW_BITS = 32
MAX_ROWS = 1 << ROW_BITS


def key_hash(key: bytes) -> int:
    """The 32-bit hash of one key, equal to :func:`array_hashes` of it."""
    return (((int.from_bytes(key, "little") % _M61) * _MIX) & _M64) >> 32


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
    m61, u3, u58, u61 = (np.uint64(x) for x in (_M61, 3, 58, 61))
    last = np.int64(size - 8)
    for lo in range(0, n, _CHUNK):
        hi = min(lo + _CHUNK, n)
        starts = offs[lo:hi].astype(np.int64)
        lens = offs[lo + 1 : hi + 1] - starts
        h = np.zeros(hi - lo, np.uint64)
        pos = np.empty_like(starts)
        safe = np.empty_like(starts)
        w = np.empty_like(h)
        s = np.empty_like(h)
        for j in range(int((lens.max() + 7) // 8) - 1, -1, -1):
            np.add(starts, 8 * j, out=pos)
            np.minimum(pos, last, out=safe)
            w[:] = words[safe]
            # Near the end of the buffer the last full word is read and shifted down.
            np.subtract(pos, safe, out=pos)
            np.left_shift(pos.view(np.uint64), u3, out=pos.view(np.uint64))
            np.right_shift(w, pos.view(np.uint64), out=w)
            np.bitwise_and(w, _MASKS[np.clip(lens - 8 * j, 0, 8)], out=w)
            np.right_shift(w, u61, out=s)  # w mod M61, within +8
            np.bitwise_and(w, m61, out=w)
            w += s
            np.left_shift(h, u3, out=s)  # h * 2**64 mod M61 = h * 8: a rotation in 61 bits
            np.bitwise_and(s, m61, out=s)
            np.right_shift(h, u58, out=h)
            s |= h
            s += w
            np.right_shift(s, u61, out=h)
            np.bitwise_and(s, m61, out=s)
            h += s
            h[h >= m61] -= m61
        np.multiply(h, np.uint64(_MIX), out=h)
        np.right_shift(h, np.uint64(32), out=h)
        out[lo:hi] = h
    return out


class KeyIndex:
    """Sorted ``hash << 32 | row`` entries with a bucket directory; rows are the caller's ids."""

    __slots__ = ("directory_view", "entries", "entries_view", "shift")

    # find() is the lookup hot path (>= 500 k/s from Python): everything is a local, the bucket
    # is searched by C bisect, and the hash is inlined.

    def __init__(self, hashes: list[np.ndarray], first_rows: list[int]) -> None:
        n = sum(len(h) for h in hashes)
        if n >= MAX_ROWS:
            raise ValueError(f"key index holds at most {MAX_ROWS - 1} rows, got {n}")
        packed = np.empty(n, np.uint64)
        at = 0
        for h, first in zip(hashes, first_rows, strict=True):
            for lo in range(0, len(h), _CHUNK):
                part = packed[at + lo : at + min(lo + _CHUNK, len(h))]
                part[:] = h[lo : lo + len(part)]
                part <<= np.uint64(32)
                part |= np.arange(first + lo, first + lo + len(part), dtype=np.uint64)
            at += len(h)
        packed.sort()  # numpy's SIMD sort: ~0.2 s for 10 M entries
        bits = max(1, min(ROW_BITS, int(max(n // _KEYS_PER_BUCKET, 1)).bit_length()))
        self.shift = 64 - bits
        counts = np.bincount((packed >> np.uint64(self.shift)).astype(np.intp), minlength=1 << bits)
        directory = np.zeros((1 << bits) + 1, np.int64)
        np.cumsum(counts, out=directory[1:])
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
        h = (((int.from_bytes(key, "little") % _M61) * _MIX) & _M64) >> 32
        entries = self.entries_view
        top = h << 32
        b = top >> self.shift
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
