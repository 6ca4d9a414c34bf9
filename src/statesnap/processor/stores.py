"""A processor's named stores: what a handler reads and writes (``ctx.stores["name"]``).

Each view is scoped to the partition of the record being processed and writes through the task's
:class:`~statesnap.processor.buffer.WriteBuffer`. Reads and writes outside a handler call raise
:class:`~statesnap.errors.StoreAccessError`, and so do those of another thread while a call runs
(a thread the handler started, a web server's): state that changes other than by records breaks
the promise that a restore plus the tail equals processing everything, and a write from elsewhere
would be checkpointed under whatever record happens to be in hand. The check is one comparison
of thread idents per access (the per-record hot path): the cursor records the thread its call
runs on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from threading import get_ident
from typing import Any

from statesnap.durations import parse_duration
from statesnap.errors import ConfigError, StoreAccessError
from statesnap.processor.buffer import StoreReads, WriteBuffer
from statesnap.processor.keyspace import (
    WINDOW_BYTES,
    check_store_name,
    emitted_key,
    partition_prefix,
    stream_time_key,
    stream_time_of,
    stream_time_value,
    window_bytes,
    window_start_of,
)
from statesnap.processor.windows import Windows
from statesnap.serde import Serde

__all__ = [
    "NO_CALL",
    "Cursor",
    "KeyValueStore",
    "StoreKind",
    "StoreReader",
    "StoreSpec",
    "TtlKeyValueStore",
    "WindowStore",
    "stamped",
    "unstamped",
]


class StoreKind(StrEnum):
    KEY_VALUE = "key_value"
    WINDOW = "window"


@dataclass(frozen=True, slots=True)
class StoreSpec:
    """A named store of a processor. Serdes default to the processor's; a ``window`` makes it a
    window store (keys are (key, window start))."""

    name: str
    key_serde: Serde | str | None = None
    value_serde: Serde | str | None = None
    window: Windows | None = None
    #: A key-value store's entries expire this long after their last write, in stream time.
    ttl: str | float | timedelta | None = None

    def __post_init__(self) -> None:
        check_store_name(self.name)
        ttl_ms = self.ttl_ms
        if ttl_ms is not None:
            if self.window is not None:
                raise ConfigError(f"store {self.name!r}: a window store expires by its retention, not a ttl")
            if ttl_ms <= 0:
                raise ConfigError(f"store {self.name!r}: ttl must be positive, got {self.ttl!r}")

    @property
    def ttl_ms(self) -> int | None:
        if self.ttl is None:
            return None
        return round(parse_duration(self.ttl) / timedelta(milliseconds=1))

    @property
    def kind(self) -> StoreKind:
        return StoreKind.KEY_VALUE if self.window is None else StoreKind.WINDOW

    @classmethod
    def of(cls, spec: StoreSpec | str) -> StoreSpec:
        return spec if isinstance(spec, StoreSpec) else cls(spec)

    def describe(self) -> dict[str, Any]:
        """What a manifest records of the store (readers learn kinds and windows from it)."""
        out: dict[str, Any] = {"kind": self.kind.value}
        if self.window is not None:
            out["window"] = self.window.to_json()
        if self.ttl_ms is not None:
            out["ttl_ms"] = self.ttl_ms
        return out


#: :attr:`Cursor.thread` when no handler call runs (``threading.get_ident()`` is never 0).
NO_CALL = 0


@dataclass(slots=True)
class Cursor:
    """Where processing is: the record being handled, the task's stream time, and the thread a
    handler (or punctuator) call runs on — the only thread, and the only time, stores may be used.

    ``thread`` is ``threading.get_ident()`` of the thread running a batch's handler (or a
    punctuator) calls, :data:`NO_CALL` between batches: it is set once per batch, since no code
    but those calls runs on that thread meanwhile. One integer comparison tells "outside any
    batch" and "another thread during a batch" alike."""

    partition: int = -1
    offset: int = -1
    timestamp: int = -1
    stream_time: int = -1
    thread: int = NO_CALL
    #: A declared step skipped the record in hand (:meth:`ProcessorContext.skip`).
    skipped: bool = False

    @property
    def active(self) -> bool:
        """Whether a handler call runs on the calling thread."""
        return self.thread == get_ident()

    def enter(self) -> None:
        """A handler (or punctuator) call starts on this thread."""
        self.thread = get_ident()

    def leave(self) -> None:
        self.thread = NO_CALL


class _View:
    __slots__ = (
        "_key_bytes",
        "_last_key",
        "_last_stored",
        "_partition",
        "_prefix_bytes",
        "buffer",
        "cursor",
        "key_serde",
        "name",
        "value_serde",
    )

    def __init__(
        self, name: str, key_serde: Serde, value_serde: Serde, buffer: WriteBuffer, cursor: Cursor
    ) -> None:
        self.name = name
        self.key_serde = key_serde
        self.value_serde = value_serde
        self.buffer = buffer
        self.cursor = cursor
        self._key_bytes = key_serde.serialize
        self._partition = -1
        self._prefix_bytes = b""
        #: The last key (bytes or str: immutable) a read turned into stored bytes, and those: the
        #: write that follows a read of the same key (``d[k] = d.get(k, 0) + 1``) reuses them.
        self._last_key: object = _NO_KEY
        self._last_stored = b""

    def _prefix(self, action: str) -> bytes:
        """The key prefix of the current record's partition (per-record hot path: cached)."""
        cursor = self.cursor
        if cursor.thread != get_ident():
            if cursor.thread == NO_CALL:
                raise StoreAccessError(
                    f"store {self.name!r}: {action} outside a handler call; stores change only as "
                    "records are processed (read them from outside with Processor.store(name))"
                )
            raise StoreAccessError(
                f"store {self.name!r}: {action} from another thread while a handler call runs; a "
                "store belongs to the call that uses it (do the work in the handler, or read from "
                "outside with Processor.store(name))"
            )
        if cursor.partition != self._partition:
            self._partition = cursor.partition
            self._prefix_bytes = partition_prefix(self.name, cursor.partition)
            self._last_key = _NO_KEY
        return self._prefix_bytes


#: :attr:`_View._last_key` before any read (no key is this object).
_NO_KEY = object()


class KeyValueStore(_View, MutableMapping[Any, Any]):
    """A key-value store of the current record's partition (a ``MutableMapping``).

    ``get`` and ``[key] =`` run once or twice per record: they check the cursor inline and call the
    buffer's bound methods directly (``_load``; ``_dump`` only where values are stored otherwise)."""

    __slots__ = ("_dump", "_load", "_value_bytes", "_value_of")

    def __init__(
        self, name: str, key_serde: Serde, value_serde: Serde, buffer: WriteBuffer, cursor: Cursor
    ) -> None:
        super().__init__(name, key_serde, value_serde, buffer, cursor)
        #: The value bytes of a stored key (None when absent), and what value bytes are stored as.
        self._load: Callable[[bytes], bytes | None] = buffer.get
        self._dump: Callable[[bytes], bytes] | None = None
        self._value_bytes = value_serde.serialize
        self._value_of = value_serde.deserialize

    def _stored(self, key: Any, action: str) -> bytes:
        cursor = self.cursor
        if cursor.thread != get_ident() or cursor.partition != self._partition:
            self._prefix(action)
        if key is self._last_key:
            return self._last_stored
        stored = self._prefix_bytes + self._key_bytes(key)
        if type(key) is bytes or type(key) is str:
            self._last_key, self._last_stored = key, stored
        return stored

    def __getitem__(self, key: Any) -> Any:
        raw = self._load(self._stored(key, "read"))
        if raw is None:
            raise KeyError(key)
        return self._value_of(raw)

    def get(self, key: Any, default: Any = None) -> Any:
        cursor = self.cursor
        if cursor.thread != get_ident() or cursor.partition != self._partition:
            self._prefix("read")
        if key is self._last_key:
            stored = self._last_stored
        else:
            stored = self._prefix_bytes + self._key_bytes(key)
            if type(key) is bytes or type(key) is str:
                self._last_key, self._last_stored = key, stored
        raw = self._load(stored)
        return default if raw is None else self._value_of(raw)

    def __contains__(self, key: object) -> bool:
        return self._load(self._stored(key, "read")) is not None

    def __setitem__(self, key: Any, value: Any) -> None:
        cursor = self.cursor
        if cursor.thread != get_ident() or cursor.partition != self._partition:
            self._prefix("write")
        raw = self._value_bytes(value)
        dump = self._dump
        self.buffer.put(
            self._last_stored if key is self._last_key else self._prefix_bytes + self._key_bytes(key),
            raw if dump is None else dump(raw),
            cursor.offset,
            cursor.timestamp,
        )

    def __delitem__(self, key: Any) -> None:
        stored = self._stored(key, "delete")
        if self._load(stored) is None:
            raise KeyError(key)
        self.buffer.put(stored, None, self.cursor.offset, self.cursor.timestamp)

    def __iter__(self) -> Iterator[Any]:
        prefix = self._prefix("iterate")
        for stored in self.buffer.keys(prefix):
            if self._load(stored) is not None:
                yield self.key_serde.deserialize(stored[len(prefix) :])

    def __len__(self) -> int:
        return sum(1 for _ in self)


class TtlKeyValueStore(KeyValueStore):
    """A key-value store whose entries expire *ttl* after their last write, in stream time: the
    record timestamp of each write is kept before the value, an entry reads as absent once stream
    time reaches it plus the TTL, and commit points delete what expired (and so the next
    checkpoint holds it no more)."""

    __slots__ = ("ttl_ms",)

    def __init__(
        self,
        name: str,
        key_serde: Serde,
        value_serde: Serde,
        buffer: WriteBuffer,
        cursor: Cursor,
        ttl_ms: int,
    ) -> None:
        super().__init__(name, key_serde, value_serde, buffer, cursor)
        self.ttl_ms = ttl_ms
        self._load = self._load_live
        self._dump = self._stamp

    def _load_live(self, stored: bytes) -> bytes | None:
        return unstamped(self.buffer.get(stored), self.ttl_ms, self.cursor.stream_time)

    def _stamp(self, value: bytes) -> bytes:
        return stamped(value, self.cursor.timestamp)


def stamped(value: bytes, timestamp: int) -> bytes:
    """A TTL store's stored form of *value*: the write's timestamp, then the value."""
    return window_bytes(timestamp) + value


def unstamped(raw: bytes | None, ttl_ms: int, stream_time: int) -> bytes | None:
    """The value of a TTL store's stored bytes, or None when absent or expired at *stream_time*."""
    if raw is None or window_start_of(raw) + ttl_ms <= stream_time:
        return None
    return raw[WINDOW_BYTES:]


#: A window store with a retention this long or longer never expires (a join's buffers delete
#: their own buckets): it keeps no index of its live windows.
NEVER_EXPIRES_MS = 1 << 61


class WindowStore(_View):
    """A window store of the current record's partition: values per (key, window start).

    Windows past retention (by stream time) read as absent and take no writes, whether or not
    they have been deleted yet, so what a handler sees never depends on timing.

    The view keeps an index of the windows the store may hold, per partition and window start
    (:attr:`live`): what :meth:`expired_keys` hands the task to delete at the end of each batch,
    without walking the store. Expiry thus costs what expires, and the store — and every
    checkpoint, restore and export of it — holds only windows still live, whatever number came
    and went (a walk of the store's keys at commit points cost the ~2 M windows a catch-up
    created: 4.6 s for a store of 998 live ones). A partition's index starts with one scan of
    its rows in the store (restored ones) the first time it expires anything."""

    __slots__ = ("_indexed", "live", "windows")

    def __init__(
        self,
        name: str,
        key_serde: Serde,
        value_serde: Serde,
        buffer: WriteBuffer,
        cursor: Cursor,
        windows: Windows,
    ) -> None:
        super().__init__(name, key_serde, value_serde, buffer, cursor)
        self.windows = windows
        #: Per partition, per window start: stored keys of windows written there (a superset of
        #: the partition's windows in the store: a rejected or deleted write stays listed).
        self.live: dict[int, dict[int, set[bytes]]] = {}
        #: Partitions whose rows in the store (restored ones) are in :attr:`live`.
        self._indexed: set[int] = set()

    @property
    def expires(self) -> bool:
        return self.windows.retention_ms < NEVER_EXPIRES_MS

    def _key(self, action: str, key: Any, start: int) -> bytes:
        return self._prefix(action) + window_bytes(start) + self.key_serde.serialize(key)

    def windows_for(self, timestamp: int) -> list[int]:
        """Starts of the windows a record at *timestamp* belongs to that still take records."""
        stream_time = self.cursor.stream_time
        return [s for s in self.windows.starts(timestamp) if not self.windows.closed(s, stream_time)]

    def get(self, key: Any, window_start: int, default: Any = None) -> Any:
        if self.windows.expired(window_start, self.cursor.stream_time):
            return default
        raw = self.buffer.get(self._key("read", key, window_start))
        return default if raw is None else self.value_serde.deserialize(raw)

    def put(self, key: Any, window_start: int, value: Any) -> bool:
        """Write one window's value; False (nothing written) for a window past retention."""
        stored = self._key("write", key, window_start)
        cursor = self.cursor
        if self.windows.expired(window_start, cursor.stream_time):
            return False
        self.buffer.put(stored, self.value_serde.serialize(value), cursor.offset, cursor.timestamp)
        if self.windows.retention_ms < NEVER_EXPIRES_MS:
            self.index(cursor.partition, window_start, stored)
        return True

    def index(self, partition: int, window_start: int, stored: bytes) -> None:
        """List *stored* (a key of *partition*'s window at *window_start*) in :attr:`live`."""
        starts = self.live.get(partition)
        if starts is None:
            starts = self.live[partition] = {}
        keys = starts.get(window_start)
        if keys is None:
            starts[window_start] = {stored}
        else:
            keys.add(stored)

    def index_many(self, partition: int, window_start: int, stored: list[bytes]) -> None:
        """List *stored* (keys of *partition*'s window at *window_start*) in :attr:`live`."""
        starts = self.live.get(partition)
        if starts is None:
            starts = self.live[partition] = {}
        keys = starts.get(window_start)
        if keys is None:
            starts[window_start] = set(stored)
        else:
            keys.update(stored)

    def expired_keys(self, partition: int, stream_time: int) -> list[bytes]:
        """Stored keys of *partition*'s windows past retention at *stream_time*, taken out of the
        index (some may be gone from the store already: the caller deletes those still there).
        The first call for a partition lists its rows in the store first (one scan)."""
        if not self.expires:
            return []
        self._index_stored(partition)
        starts = self.live.get(partition)
        if not starts:
            return []
        last = stream_time - self.windows.retention_ms  # expired: start + retention <= stream time
        dead = [start for start in starts if start <= last]
        gone: list[bytes] = []
        for start in sorted(dead):
            gone += starts.pop(start)
        return gone

    def lists(self, partition: int, window_start: int) -> bool:
        """Whether the index lists keys of *partition*'s window at *window_start*: if not (and
        the store expires), neither the store nor the buffer holds any."""
        self._index_stored(partition)
        return window_start in self.live.get(partition, ())

    def _index_stored(self, partition: int) -> None:
        """The first time a partition is asked about: its rows in the store (restored ones)
        listed in :attr:`live` (one scan)."""
        if partition not in self._indexed:
            self._indexed.add(partition)
            prefix = partition_prefix(self.name, partition)
            for stored, _ in self.buffer.store.scan(prefix=prefix):
                rest = stored[len(prefix) :]
                if len(rest) >= WINDOW_BYTES:
                    self.index(partition, window_start_of(rest), stored)

    def forget(self, partitions: Iterable[int]) -> None:
        """The task no longer owns *partitions*: drop their index (gained again, they are
        listed again from the store)."""
        for p in partitions:
            self.live.pop(p, None)
            self._indexed.discard(p)

    def delete(self, key: Any, window_start: int) -> None:
        stored = self._key("delete", key, window_start)
        cursor = self.cursor
        self.buffer.put(stored, None, cursor.offset, cursor.timestamp)
        if self.expires:  # the index lists every write the buffer holds (see fetch_all)
            self.index(cursor.partition, window_start, stored)

    def fetch_all(self, time_from: int, time_to: int, *, expired: bool = False) -> list[tuple[Any, int, Any]]:
        """(key, window start, value) of this partition's windows starting in [time_from,
        time_to], across keys, by start then key bytes (Kafka Streams' ``fetchAll(from, to)``):
        a range scan, since a window store's keys begin with the window start. *expired*: include
        windows past retention the store still holds (a final result is read the moment its
        window closes, which with the default retention is the moment it expires)."""
        prefix = self._prefix("read")
        low = prefix + window_bytes(max(time_from, 0))
        high = prefix + window_bytes(time_to + 1)
        found: dict[bytes, bytes | None] = {}
        before = prefix + window_bytes(max(time_from, 0) - 1) + b"\xff" * 64  # scan from near low
        for stored, held in self.buffer.store.scan(after=before, prefix=prefix):
            if stored >= high:
                break
            if stored >= low:
                found[stored] = held
        writes = self.buffer.batch  # the writes not in the store yet win
        if writes and self.expires:
            # Held across batches, they may be many: the index lists every one of them (and
            # more), by window start, so only those in range are looked up.
            starts = self.live.get(self.cursor.partition, {})
            first, last = max(time_from, 0), time_to
            for start in [s for s in starts if first <= s <= last]:
                for stored in starts[start]:
                    write = writes.get(stored)
                    if write is not None and low <= stored < high:
                        found[stored] = write[0]
        else:
            for stored, (written, _offset, _ts) in writes.items():
                if low <= stored < high:
                    found[stored] = written
        stream_time = self.cursor.stream_time
        out = []
        for stored in sorted(found):
            raw = found[stored]
            rest = stored[len(prefix) :]
            start = window_start_of(rest)
            if raw is None or (not expired and self.windows.expired(start, stream_time)):
                continue
            key = self.key_serde.deserialize(rest[WINDOW_BYTES:])
            out.append((key, start, self.value_serde.deserialize(raw)))
        return out

    def emitted_through(self) -> int:
        """The newest window start of this partition whose final results were emitted (-1: none)."""
        return stream_time_of(self.buffer.get(emitted_key(self.name, self.cursor.partition)))

    def mark_emitted(self, start: int) -> None:
        """Final results of the windows up to *start* went out (checkpointed with the store)."""
        cursor = self.cursor
        stored = emitted_key(self.name, cursor.partition)
        self.buffer.put(stored, stream_time_value(start), cursor.offset, cursor.timestamp)

    def fetch(self, key: Any, time_from: int, time_to: int) -> list[tuple[int, Any]]:
        """(window start, value) of *key*'s live windows starting in [time_from, time_to]."""
        advance = self.windows.advance_ms
        first = -(-time_from // advance) * advance
        found = []
        for start in range(first, time_to + 1, advance):
            value = self.get(key, start)
            if value is not None:
                found.append((start, value))
        return found


class StoreReader(Mapping[Any, Any]):
    """A store read from outside handlers: every partition the task owns, read-only (the way
    ``Processor.store(name)``, ``dump --store`` and followers see it). A window store's keys are
    ``(key, window_start)`` pairs."""

    def __init__(
        self,
        spec: StoreSpec,
        key_serde: Serde,
        value_serde: Serde,
        store: StoreReads,
        partitions: Sequence[int],
    ) -> None:
        self.spec = spec
        self.key_serde = key_serde
        self.value_serde = value_serde
        self._store = store
        self._prefixes = [partition_prefix(spec.name, p) for p in partitions]
        self._clocks = {
            prefix: stream_time_key(p) for prefix, p in zip(self._prefixes, partitions, strict=True)
        }

    def _stream_time(self, prefix: bytes) -> int:
        """The partition's stream time now: its windows past retention read as absent (a commit
        point deletes them; until then they must not show either)."""
        return stream_time_of(self._store.get(self._clocks[prefix]))

    def _raw_keys(self, key: Any) -> list[bytes]:
        if self.spec.window is not None:
            user, start = key
            tail = window_bytes(int(start)) + self.key_serde.serialize(user)
        else:
            tail = self.key_serde.serialize(key)
        return [prefix + tail for prefix in self._prefixes]

    def get_raw(self, key: Any) -> bytes | None:
        """The stored value bytes of *key* (None when absent)."""
        window, ttl = self.spec.window, self.spec.ttl_ms
        for prefix, raw in zip(self._prefixes, self._store.get_many(self._raw_keys(key)), strict=True):
            if raw is not None:
                if window is not None and window.expired(int(key[1]), self._stream_time(prefix)):
                    return None
                return raw if ttl is None else unstamped(raw, ttl, self._stream_time(prefix))
        return None

    def __getitem__(self, key: Any) -> Any:
        raw = self.get_raw(key)
        if raw is None:
            raise KeyError(key)
        return self.value_serde.deserialize(raw)

    def raw_items(self) -> Iterator[tuple[bytes, bytes]]:
        """(stored key, value bytes) in key order per partition: a window store's stored key is
        the 8-byte window start followed by the key."""
        window, ttl = self.spec.window, self.spec.ttl_ms
        for prefix in self._prefixes:
            stream_time = self._stream_time(prefix)
            for stored, raw in self._store.scan(prefix=prefix):
                rest = stored[len(prefix) :]
                if window is not None and window.expired(window_start_of(rest), stream_time):
                    continue
                value = raw if ttl is None else unstamped(raw, ttl, stream_time)
                if value is not None:
                    yield rest, value

    def _decode_key(self, stored: bytes) -> Any:
        if self.spec.window is not None:
            return (self.key_serde.deserialize(stored[WINDOW_BYTES:]), window_start_of(stored))
        return self.key_serde.deserialize(stored)

    def __iter__(self) -> Iterator[Any]:
        for stored, _ in self.raw_items():
            yield self._decode_key(stored)

    def items(self) -> Iterator[tuple[Any, Any]]:  # type: ignore[override]
        for stored, value in self.raw_items():
            yield self._decode_key(stored), self.value_serde.deserialize(value)

    def __len__(self) -> int:
        return sum(1 for _ in self.raw_items())
