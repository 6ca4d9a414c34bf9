"""RocksDB SST files (block-based table, format 2) written column-wise from Arrow arrays.

Why not rocksdict's ``SstFileWriter``: it takes one Python call per row and never releases the GIL,
so a 10 M-row restore spent most of its 5.8-6.7 s in those calls. Here chunks of rows are encoded
with numpy and pyarrow on two threads (Arrow, numpy and snappy release the GIL for most of it):
keys become RocksDB internal keys (sequence 0, a put), values the store's header + value blobs;
blocks hold 16 entries per restart point, snappy-compressed, without block checksums (the store
is scratch space, rebuilt from checkpoints at every start); then the index block, the properties
ingestion requires, the metaindex and the footer. The store ingests the file and falls back to
rocksdict's writer should a RocksDB release refuse it.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from statesnap.stores.base import HEADER, HEADER_SIZE, NO_TIMESTAMP

__all__ = ["COMPRESS", "Ints", "encoder_pool", "write_sst"]

Ints = npt.NDArray[np.int64]
#: Data blocks of 16 KiB (RocksDB's default is 4): a quarter of the per-block Python calls, 0.36 ->
#: 0.30 s per 1.25 M rows. Compactions rewrite them at the database's own block size.
_BLOCK_BYTES = 16384
_RESTART_INTERVAL = 16
#: Rows are encoded a chunk at a time: at most this many rows (64 k: ~100 MB less peak RSS than
#: 128 k at 10 M keys, same CPU) and key+value bytes (int32 Arrow offsets).
_ENCODE_ROWS = 64 * 1024
_CHUNK_BYTES = 64 << 20
#: The internal-key suffix SstFileWriter gives every row: sequence number 0, type kTypeValue.
_SEQ0_PUT = pa.scalar(b"\x01" + bytes(7), pa.binary())
_TABLE_MAGIC = 0x88E241B785F4CFF7  # kBlockBasedTableMagicNumber
#: Format 2: full (not delta-encoded) index handles and internal index keys; every RocksDB reads it.
_FORMAT_VERSION = 2
_BLOCK_TRAILER = 5  # compression type + checksum (0: kNoChecksum, as the footer says)
#: Blocks are snappy-compressed (RocksDB's default codec): 7x fewer bytes to write and sync.
COMPRESS = pa.Codec.is_available("snappy")
_SNAPPY = pa.Codec("snappy") if COMPRESS else None
_ENCODE_THREADS = 2
_ENCODE_AHEAD = 2


def encoder_pool() -> ThreadPoolExecutor:
    """The threads :func:`write_sst` encodes on: a store keeps one for its lifetime (threads made
    per load kept ~30 MB more peak RSS, each new thread's allocator heap)."""
    return ThreadPoolExecutor(_ENCODE_THREADS, thread_name_prefix="statesnap-sst")


def write_sst(path: str, partition: int, rows: pa.Table, pool: ThreadPoolExecutor) -> None:
    """Write *rows* (sorted by key, live) as a RocksDB block-based table.

    Chunks of rows are encoded by *pool*'s threads (Arrow, numpy and snappy release the GIL for
    most of it) and written in order; at most :data:`_ENCODE_AHEAD` encoded chunks wait at a time.
    """
    sst = _SstFile(path)
    pending: deque[Future[_Chunk]] = deque()
    try:
        for chunk in _chunks(rows):
            pending.append(pool.submit(_encode_chunk, partition, chunk, COMPRESS))
            if len(pending) > _ENCODE_AHEAD:
                sst.add(pending.popleft().result())
        while pending:
            sst.add(pending.popleft().result())
        sst.finish()
    finally:
        for f in pending:
            f.cancel()
        with contextlib.suppress(Exception):
            for f in pending:
                f.result()  # an encoder still running must not outlive the file it feeds
        sst.close()


def _chunks(rows: pa.Table) -> Iterator[pa.Table]:
    """Zero-copy slices of at most :data:`_ENCODE_ROWS` rows and about :data:`_CHUNK_BYTES`."""
    for batch in rows.to_batches(_ENCODE_ROWS):
        size = batch.column(0).nbytes + batch.column(1).nbytes
        pieces = max(1, -(-size // _CHUNK_BYTES))
        step = -(-batch.num_rows // pieces)
        for lo in range(0, batch.num_rows, step):
            yield pa.Table.from_batches([batch.slice(lo, step)])


@dataclass(frozen=True, slots=True)
class _Chunk:
    """Consecutive data blocks, encoded, with what the index and the properties need of them."""

    data: bytes | pa.Buffer
    #: Each block's size without its trailer (as its handle gives it).
    sizes: Ints
    last_keys: pa.Array
    rows: int
    key_bytes: int
    value_bytes: int


def _encode_chunk(partition: int, rows: pa.Table, compress: bool) -> _Chunk:
    keys = rows.column("key").combine_chunks()
    values = rows.column("value").combine_chunks()
    if values.null_count:
        raise ValueError("a checkpoint's base rows hold no tombstones")
    n = len(keys)
    header = np.empty(n, dtype=HEADER)
    header["partition"] = partition
    header["offset"] = rows.column("offset").to_numpy()
    header["timestamp"] = rows.column("timestamp").cast(pa.int64()).fill_null(NO_TIMESTAMP).to_numpy()
    headers = pa.FixedSizeBinaryArray.from_buffers(pa.binary(HEADER_SIZE), n, [None, pa.py_buffer(header)])
    key_len = _lengths(keys)
    value_len = _lengths(values) + HEADER_SIZE
    data: bytes | pa.Buffer
    data, sizes, lasts = _blocks(
        [keys, _SEQ0_PUT],
        key_len + 8,
        [headers.cast(pa.binary()), values],
        value_len,
        _BLOCK_BYTES,
        _RESTART_INTERVAL,
    )
    if compress:
        data, sizes = _compress(data, sizes)
    return _Chunk(
        data, sizes, keys.take(pa.array(lasts)), n, int(key_len.sum()) + 8 * n, int(value_len.sum())
    )


class _SstFile:
    """A block-based table file as ``SstFileWriter`` would write it, built with Arrow and numpy.

    The layout (RocksDB's ``table/block_based``, format version 2): data blocks of entries
    ``varint shared=0 | varint key length | varint value length | key+seq/type | value``, then the
    block's restart offsets and their count, then a trailer (compression type, no checksum); one
    index block (the last key of each data block → its handle), a properties block with the
    ``rocksdb.external_sst_file.*`` properties ingestion requires, a metaindex block and the footer.
    """

    def __init__(self, path: str) -> None:
        self._file = open(path, "wb", buffering=0)  # noqa: SIM115 - closed by close()
        self._pos = 0
        self._index_keys: list[pa.Array] = []
        self._index_handles: list[pa.Array] = []
        self._entries = 0
        self._blocks = 0
        self._raw_keys = 0
        self._raw_values = 0

    def add(self, chunk: _Chunk) -> None:
        self._file.write(chunk.data)
        starts = self._pos + np.concatenate([[0], np.cumsum(chunk.sizes + _BLOCK_TRAILER)[:-1]])
        self._pos += len(chunk.data)
        self._index_keys.append(chunk.last_keys)
        self._index_handles.append(pc.binary_join_element_wise(_varints(starts), _varints(chunk.sizes), b""))
        self._entries += chunk.rows
        self._blocks += len(chunk.sizes)
        self._raw_keys += chunk.key_bytes
        self._raw_values += chunk.value_bytes

    def finish(self) -> None:
        data_size = self._pos
        keys = pa.concat_arrays(self._index_keys)
        handles = pa.concat_arrays(self._index_handles)
        data, sizes, _ = _blocks([keys, _SEQ0_PUT], _lengths(keys) + 8, [handles], _lengths(handles), 0, 1)
        index = self._block(data, int(sizes[0]))
        v = _varint
        props = {
            b"rocksdb.block.based.table.index.type": (0).to_bytes(4, "little"),  # binary search
            b"rocksdb.comparator": b"leveldb.BytewiseComparator",
            b"rocksdb.data.size": v(data_size),
            b"rocksdb.deleted.keys": v(0),
            b"rocksdb.external_sst_file.global_seqno": bytes(8),
            b"rocksdb.external_sst_file.version": (2).to_bytes(4, "little"),
            b"rocksdb.format.version": v(_FORMAT_VERSION),
            b"rocksdb.index.key.is.user.key": v(0),
            b"rocksdb.index.size": v(index[1] + _BLOCK_TRAILER),
            b"rocksdb.index.value.is.delta.encoded": v(0),
            b"rocksdb.merge.operands": v(0),
            b"rocksdb.num.data.blocks": v(self._blocks),
            b"rocksdb.num.entries": v(self._entries),
            b"rocksdb.num.range-deletions": v(0),
            b"rocksdb.raw.key.size": v(self._raw_keys),
            b"rocksdb.raw.value.size": v(self._raw_values),
        }
        properties = self._block(*_small_block(sorted(props.items())))
        metaindex = self._block(*_small_block([(b"rocksdb.properties", v(properties[0]) + v(properties[1]))]))
        handles_bytes = v(metaindex[0]) + v(metaindex[1]) + v(index[0]) + v(index[1])
        footer = b"\x00" + handles_bytes.ljust(40, b"\x00")  # checksum type 0: kNoChecksum
        footer += _FORMAT_VERSION.to_bytes(4, "little") + _TABLE_MAGIC.to_bytes(8, "little")
        self._file.write(footer)

    def close(self) -> None:
        self._file.close()

    def _block(self, data: pa.Buffer, size: int) -> tuple[int, int]:
        handle = (self._pos, size)
        self._file.write(data)
        self._pos += data.size
        return handle


def _lengths(array: pa.Array) -> Ints:
    return cast(Ints, pc.binary_length(array).to_numpy().astype(np.int64))


def _varint(x: int) -> bytes:
    out = bytearray()
    while x >= 0x80:
        out.append(x & 0x7F | 0x80)
        x >>= 7
    out.append(x)
    return bytes(out)


def _varint_matrix(values: Ints) -> tuple[npt.NDArray[np.uint8], Ints]:
    """LEB128 encodings of non-negative *values*, one row each (as wide as the longest), and
    each one's length."""
    v = values.astype(np.uint64)
    width = 1
    nbytes = np.ones(len(v), np.int64)
    while width < 10:
        more = v >= np.uint64(1 << (7 * width))
        if not more.any():
            break
        nbytes += more
        width += 1
    shifts = np.arange(0, 7 * width, 7, dtype=np.uint64)
    out = ((v[:, None] >> shifts) & np.uint64(0x7F)).astype(np.uint8)
    if width > 1:
        out |= (np.arange(width)[None, :] < nbytes[:, None] - 1).astype(np.uint8) << 7
    return out, nbytes


def _ragged(rows: npt.NDArray[np.uint8], mask: npt.NDArray[np.bool_], nbytes: Ints) -> pa.Array:
    """A binary array of each row's bytes where *mask* is set (all of them when it is full)."""
    n = len(rows)
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(nbytes, out=offsets[1:])
    data = rows.reshape(-1) if int(offsets[-1]) == rows.size else rows[mask]
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _varints(values: Ints) -> pa.Array:
    rows, nbytes = _varint_matrix(values)
    return _ragged(rows, np.arange(rows.shape[1])[None, :] < nbytes[:, None], nbytes)


def _blocks(
    key_parts: list[pa.Array | pa.Scalar],
    key_len: Ints,
    value_parts: list[pa.Array],
    value_len: Ints,
    block_bytes: int,
    restart_interval: int,
) -> tuple[pa.Buffer, Ints, Ints]:
    """Entries (sorted keys, each the concatenation of its parts) as consecutive blocks of about
    *block_bytes* (0: one block), each with its restart array and trailer.

    Returns the bytes, each block's size without its trailer (its handle's size) and the index of
    each block's last entry. Every entry stores its whole key (shared = 0), so any entry may be a
    restart point and the blocks are cut wherever the byte count says.
    """
    n = len(key_len)
    key_var, key_n = _varint_matrix(key_len)
    value_var, value_n = _varint_matrix(value_len)
    head_rows = np.concatenate([np.zeros((n, 1), np.uint8), key_var, value_var], axis=1)
    head_mask = np.concatenate(
        [
            np.ones((n, 1), np.bool_),
            np.arange(key_var.shape[1])[None, :] < key_n[:, None],
            np.arange(value_var.shape[1])[None, :] < value_n[:, None],
        ],
        axis=1,
    )
    head_n = 1 + key_n + value_n
    entry_start = np.zeros(n + 1, np.int64)
    np.cumsum(head_n + key_len + value_len, out=entry_start[1:])
    window = entry_start[:-1] // block_bytes if block_bytes else np.zeros(n, np.int64)
    first = np.ones(n, np.bool_)
    first[1:] = window[1:] != window[:-1]
    block = np.cumsum(first) - 1
    firsts = np.flatnonzero(first)
    lasts = np.append(firsts[1:] - 1, n - 1)
    in_block = np.arange(n) - firsts[block]
    restart = np.flatnonzero(in_block % restart_interval == 0)
    restarts = np.bincount(block[restart], minlength=len(firsts))
    # The tail of each block (restart offsets, their count, the trailer) rides on its last entry.
    tail_len = 4 * restarts + 4 + _BLOCK_TRAILER
    tail_start = np.zeros(len(firsts) + 1, np.int64)
    np.cumsum(tail_len, out=tail_start[1:])
    tails = np.zeros(int(tail_start[-1]), np.uint8)
    word = np.arange(4)
    rank = np.arange(len(restart)) - (np.cumsum(restarts) - restarts)[block[restart]]
    at = tail_start[:-1][block[restart]] + 4 * rank
    offset_in_block = entry_start[restart] - entry_start[firsts][block[restart]]
    tails[at[:, None] + word] = offset_in_block.astype("<u4").view(np.uint8).reshape(-1, 4)
    at = tail_start[:-1] + 4 * restarts
    tails[at[:, None] + word] = restarts.astype("<u4").view(np.uint8).reshape(-1, 4)
    tail_offsets = np.zeros(n + 1, np.int32)
    tail_offsets[lasts + 1] = tail_len
    np.cumsum(tail_offsets, out=tail_offsets)
    tail = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(tail_offsets), pa.py_buffer(tails)])
    joined = pc.binary_join_element_wise(
        _ragged(head_rows, head_mask, head_n), *key_parts, *value_parts, tail, b""
    )
    offsets = np.frombuffer(joined.buffers()[1], np.int32)[joined.offset : joined.offset + n + 1]
    data = joined.buffers()[2].slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    sizes = entry_start[lasts + 1] - entry_start[firsts] + 4 * restarts + 4
    return data, sizes, lasts


def _compress(data: pa.Buffer, sizes: Ints) -> tuple[bytes, Ints]:
    """Snappy-compress each block that shrinks by at least 1/8 (RocksDB's own rule); the others
    stay as they are. Returns the new bytes and block sizes (trailers included, as in *data*)."""
    codec = _SNAPPY
    assert codec is not None
    out: list[bytes | pa.Buffer] = []
    new_sizes = sizes.copy()
    compressed_trailer = b"\x01" + bytes(_BLOCK_TRAILER - 1)  # kSnappyCompression, no checksum
    start = 0
    for i, size in enumerate(sizes.tolist()):
        block = data.slice(start, size)
        packed = codec.compress(block)
        if len(packed) < size - size // 8:
            out += (packed, compressed_trailer)
            new_sizes[i] = len(packed)
        else:
            out.append(data.slice(start, size + _BLOCK_TRAILER))
        start += size + _BLOCK_TRAILER
    return b"".join(out), new_sizes


def _small_block(pairs: list[tuple[bytes, bytes]]) -> tuple[pa.Buffer, int]:
    """A metadata block (properties, metaindex) of plain sorted keys, with its handle's size."""
    keys = pa.array([k for k, _ in pairs], pa.binary())
    values = pa.array([v for _, v in pairs], pa.binary())
    data, sizes, _ = _blocks([keys], _lengths(keys), [values], _lengths(values), 0, 1)
    return data, int(sizes[0])
