"""How every store of a processor task shares one keyspace (and so one checkpoint).

A processor's named stores live in the task's single local store, each key prefixed by the store's
name and the partition it belongs to::

    key-value store:  <store> 0x00 <partition:be32> <key>
    window store:     <store> 0x00 <partition:be32> <window start:be64, offset binary> <key>

One keyspace means one set of data files per partition and one manifest per checkpoint: every
store and the input offsets commit atomically by construction, and everything a table's
checkpoints get (incremental deltas, snapshots, GC, verify, groups, the three store kinds) applies
to every store unchanged. The partition in the prefix keeps a handler's view to its own task and
makes a store's rows of one partition one contiguous key range; window starts come first in a
window store so a range of windows is a range scan (final results, ``fetch_all``). Expiry walks
no keys: each window store's view keeps an index of its windows by start (see
:class:`~statesnap.processor.stores.WindowStore`).
Store names cannot contain NUL, so the first 0x00 ends the name.
"""

from __future__ import annotations

import re
import struct

from statesnap.errors import ConfigError

__all__ = [
    "META_STORE",
    "PARTITION_BYTES",
    "WINDOW_BYTES",
    "check_store_name",
    "emitted_key",
    "input_offset_key",
    "input_offset_of",
    "input_offset_value",
    "kv_key",
    "partition_prefix",
    "split_key",
    "store_prefix",
    "stream_time_key",
    "stream_time_of",
    "stream_time_value",
    "window_bytes",
    "window_start_of",
]

_STORE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
PARTITION_BYTES = 4
WINDOW_BYTES = 8
_BE32 = struct.Struct(">I")
_BE64 = struct.Struct(">Q")
_OFFSET_BINARY = 1 << 63  # signed milliseconds → unsigned, so byte order is time order
_SIGNED64 = struct.Struct(">q")
#: The task's own bookkeeping store (user store names start with a letter or digit): the stream
#: time per partition, checkpointed with the stores so a restore resumes the same clock.
META_STORE = "_statesnap"


def check_store_name(name: str) -> str:
    """*name*, once it is a valid store name (it prefixes keys and names files' rows)."""
    if not isinstance(name, str) or not _STORE_NAME_RE.fullmatch(name):
        raise ConfigError(f"invalid store name {name!r}: use 1-100 letters, digits, '.', '_', '-'")
    return name


def store_prefix(store: str) -> bytes:
    """The prefix of every key of *store*, in every partition."""
    return store.encode() + b"\x00"


def partition_prefix(store: str, partition: int) -> bytes:
    """The prefix of *store*'s keys in *partition*: a contiguous key range."""
    return store_prefix(store) + _BE32.pack(partition)


def kv_key(prefix: bytes, key: bytes) -> bytes:
    return prefix + key


def window_bytes(start: int) -> bytes:
    """A window start (epoch ms, may be negative) as 8 bytes that sort like the number."""
    return _BE64.pack(start + _OFFSET_BINARY)


def window_start_of(encoded: bytes) -> int:
    return int(_BE64.unpack(encoded[:WINDOW_BYTES])[0]) - _OFFSET_BINARY


def split_key(stored: bytes) -> tuple[str, int, bytes]:
    """(store, partition, rest) of a key as stored; ``rest`` is the user's key (a window store's
    is prefixed by its window start)."""
    name, sep, tail = stored.partition(b"\x00")
    if not sep or len(tail) < PARTITION_BYTES:
        raise ValueError(f"not a processor store key: {stored[:40]!r}")
    return name.decode(), int(_BE32.unpack(tail[:PARTITION_BYTES])[0]), tail[PARTITION_BYTES:]


def stream_time_key(partition: int) -> bytes:
    """Where a partition's stream time is kept (in the task's keyspace, so it is checkpointed)."""
    return partition_prefix(META_STORE, partition) + b"stream_time"


def stream_time_value(stream_time: int) -> bytes:
    return _SIGNED64.pack(stream_time)


def emitted_key(store: str, partition: int) -> bytes:
    """Where a window store's final results are marked as emitted: the newest window start whose
    results went out (in the keyspace, so a restore re-emits nothing a checkpoint covers)."""
    return partition_prefix(META_STORE, partition) + b"emitted\x00" + store.encode()


def stream_time_of(raw: bytes | None) -> int:
    """A stored stream time; -1 (before any timestamp) when none is stored."""
    return -1 if raw is None else int(_SIGNED64.unpack(raw)[0])


def input_offset_key(partition: int, topic: str) -> bytes:
    """Where a task keeps the next offset to consume of another input than the first (whose
    offsets are the manifest's): in the task's keyspace, so each checkpoint holds it with the
    state it is valid for, atomically."""
    return partition_prefix(META_STORE, partition) + b"input:" + topic.encode()


def input_offset_value(next_offset: int) -> bytes:
    return _SIGNED64.pack(next_offset)


def input_offset_of(raw: bytes | None) -> int:
    """A stored next offset; 0 (the beginning) when none is stored."""
    return 0 if raw is None else int(_SIGNED64.unpack(raw)[0])
