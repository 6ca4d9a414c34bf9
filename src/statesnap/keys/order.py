"""The byte order of binary keys, by a radix sort on numpy's vectorized integer sort.

Why not Arrow's ``sort_indices``: it compares variable-length binaries one pair at a time, ~0.3 µs
a key (0.16 s for 500 k keys); every checkpoint sorts its changed keys, so that was a fifth of a
delta's CPU. Here each pass sorts one integer per key, a few key bytes above the key's position
(``bytes << bits | position``), with numpy's SIMD ``sort`` (a value sort, several times faster than
``argsort``), least significant pass first: the key's length (a key that is a prefix of another
sorts first, and trailing NUL bytes are not padding), then the key's bytes from the last chunk to
the first, then the caller's group. Each pass keeps the order of ties, so the whole sort is stable,
as Arrow's is. Keys longer than :data:`MAX_PASSES` passes are sorted by Arrow instead, where its
per-pair comparisons cost less than the passes.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statesnap.keys.index import binary_parts

__all__ = ["MAX_PASSES", "key_order"]

#: Passes over the key bytes beyond which Arrow's comparison sort is cheaper (~28 bytes a key at
#: 500 k keys, where a pass costs ~20 ms and Arrow's sort ~160 ms).
MAX_PASSES = 6


def key_order(keys: pa.Array | pa.ChunkedArray, groups: np.ndarray | None = None) -> np.ndarray:
    """Positions (int64) of *keys* in ascending byte order, ties in input order; with *groups*
    (one int per key), ascending by group first."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks() if keys.num_chunks != 1 else keys.chunk(0)
    n = len(keys)
    if n < 2:
        return np.arange(n, dtype=np.int64)
    offsets, data = binary_parts(keys)
    starts = offsets[:-1].astype(np.int64)
    lengths = np.diff(offsets).astype(np.int64)
    bits = (n - 1).bit_length()
    step = (64 - bits) // 8  # key bytes per pass, above the position's bits
    passes = -(-int(lengths.max()) // step)
    low, top = (0, 0) if groups is None else (int(groups.min()), int(groups.max()))
    if passes > MAX_PASSES or low < 0 or top >> (64 - bits):  # beyond what the passes can hold
        return _arrow_order(keys, groups)
    raw = np.frombuffer(data, np.uint8)
    raw = np.concatenate([raw, np.zeros(8, np.uint8)])  # every 8-byte read below stays inside
    words = np.ndarray(shape=(raw.size - 7,), dtype=">u8", buffer=raw, strides=(1,))
    position = np.arange(n, dtype=np.uint64)
    shift, mask = np.uint64(bits), np.uint64((1 << bits) - 1)
    order = _pass(lengths.astype(np.uint64), position, shift, mask, None)
    for j in range(passes - 1, -1, -1):
        at = np.minimum(starts[order] + j * step, words.size - 1)
        valid = np.clip(lengths[order] - j * step, 0, step)
        chunk = words[at].astype(np.uint64)
        chunk >>= np.uint64(64 - 8 * step)  # the chunk's first `step` bytes, big-endian
        drop = (8 * (step - valid)).astype(np.uint64)  # at most 56 bits: the bytes past the key
        chunk >>= drop
        chunk <<= drop
        order = _pass(chunk, position, shift, mask, order)
    if groups is not None:
        order = _pass(groups[order].astype(np.uint64), position, shift, mask, order)
    return order


def _pass(
    values: np.ndarray, position: np.ndarray, shift: np.uint64, mask: np.uint64, order: np.ndarray | None
) -> np.ndarray:
    """*order* (the identity when None) stably re-sorted by *values* (given in *order*'s order)."""
    values <<= shift
    values |= position
    values.sort()
    values &= mask
    moved = values.astype(np.int64)
    return moved if order is None else order[moved]


def _arrow_order(keys: pa.Array, groups: np.ndarray | None) -> np.ndarray:
    if groups is None:
        return np.asarray(pc.sort_indices(keys).to_numpy(), dtype=np.int64)
    table = pa.table({"group": pa.array(groups), "key": keys})
    order = pc.sort_indices(table, sort_keys=[("group", "ascending"), ("key", "ascending")])
    return np.asarray(order.to_numpy(), dtype=np.int64)
