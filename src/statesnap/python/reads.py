"""The read side of :class:`~statesnap.Table` and :class:`~statesnap.Follower`: a typed
``collections.abc.Mapping`` over the state store, and ordered range scans.

Order. Iteration, ``keys()``, ``values()``, ``items()`` and ``scan()`` go in ascending order of the
*serialized* key bytes — the order the state store keeps (for ``string`` keys that is code-point
order, for ``bytes`` byte order). ``raw_items()`` is the cheapest full pass, in no order.

Types. ``Table[K, V]`` is generic in its key and value types: a serde whose ``deserialize`` is
annotated ``-> T`` types it; named serdes (``"string"``, ``"json"``…) leave ``Any`` unless you
annotate the variable (``orders: Table[str, dict[str, Any]] = Table(...)``).

Decoding. A key or value the serde cannot decode raises
:class:`~statesnap.errors.UndecodableRowError` (a ``DeserializationError``) naming the table, the
key and the partition and offset of the record that wrote the row, with the serde's error chained —
never the value itself.

Reads while the table consumes see each batch applied whole; an iteration may or may not see rows
written after it began (it never sees a key twice).
"""

from __future__ import annotations

import heapq
from collections.abc import ItemsView, Iterator, KeysView, Mapping, ValuesView
from typing import Any, Literal, Protocol, cast, overload

from typing_extensions import TypeVar

from statesnap.errors import ConfigError, UndecodableRowError
from statesnap.serde import Serde
from statesnap.stores import StateStore
from statesnap.task.options import StoreName

__all__ = ["K", "SerdeName", "SerdeOf", "StoreName", "TableReads", "V", "ordered_rows", "row_origin"]

K = TypeVar("K", default=Any)
V = TypeVar("V", default=Any)
T = TypeVar("T")

#: Serdes by name; the registry ones also need ``schema_registry_url`` (see :mod:`statesnap.serde`).
SerdeName = Literal["bytes", "string", "str", "json", "avro", "json_schema", "protobuf"]


class SerdeOf(Protocol[T]):
    """A serde of ``T`` objects: what types ``Table[K, V]`` (any :class:`~statesnap.serde.Serde`
    matches with ``T = Any``)."""

    def serialize(self, obj: T) -> bytes: ...

    def deserialize(self, data: bytes) -> T: ...


#: How much of a key an error message shows.
_KEY_SHOWN = 100


def row_origin(store: StateStore, key: bytes) -> tuple[int, int] | None:
    """(partition, offset) of the record that wrote *key*'s live row, when the store can tell."""
    return store.row_origin(key)


def _bound(serde: Serde, key: object) -> bytes | None:
    """A scan bound as key bytes: raw bytes as given, anything else through the key serde."""
    if key is None:
        return None
    if isinstance(key, bytes | bytearray | memoryview):
        return bytes(key)
    return serde.serialize(key)


def ordered_rows(
    store: StateStore, after: bytes | None, prefix: bytes | None, limit: int | None
) -> Iterator[tuple[bytes, bytes]]:
    """Raw rows in ascending key order from the store's ordered ``scan``; a store without one is
    sorted in full (``items()`` once, O(n log n))."""
    scan = getattr(store, "scan", None)
    if scan is not None:
        rows: Iterator[tuple[bytes, bytes]] = scan(after=after, prefix=prefix, limit=limit)
        return rows
    items: Iterator[tuple[bytes, bytes]] = store.items()
    if after is not None:
        items = (kv for kv in items if kv[0] > after)
    if prefix is not None:
        items = (kv for kv in items if kv[0].startswith(prefix))
    # Keys are unique, so tuples never compare their values.
    return iter(sorted(items) if limit is None else heapq.nsmallest(limit, items))


class TableReads(Mapping[K, V]):
    """Mapping reads over a state store; subclasses say which store and serdes, and when."""

    __slots__ = ()

    # --- what a subclass provides --------------------------------------------------------------

    def _store_for(self, action: str | None) -> StateStore:
        """The store to read, after checking the life-cycle state allows *action* (None: any
        state, for a size)."""
        raise NotImplementedError

    def _serdes(self) -> tuple[Serde, Serde]:
        """(key serde, value serde)."""
        raise NotImplementedError

    def _table_name(self) -> str:
        raise NotImplementedError

    # --- decoding with context -----------------------------------------------------------------

    def _undecodable(self, what: str, store: StateStore, key: bytes, err: Exception) -> UndecodableRowError:
        origin = row_origin(store, key)
        where = (
            "partition and offset unknown" if origin is None else f"partition {origin[0]}, offset {origin[1]}"
        )
        shown = repr(key[:_KEY_SHOWN]) + ("…" if len(key) > _KEY_SHOWN else "")
        detail = str(err)[:300] or type(err).__name__
        return UndecodableRowError(
            f"table {self._table_name()!r}: cannot decode the {what} of key {shown} ({where}): {detail}",
            table=self._table_name(),
            key=key,
            partition=None if origin is None else origin[0],
            offset=None if origin is None else origin[1],
        )

    def _decode_key(self, store: StateStore, serde: Serde, key: bytes) -> K:
        try:
            return cast(K, serde.deserialize(key))
        except Exception as e:
            raise self._undecodable("key", store, key, e) from e

    def _decode_value(self, store: StateStore, serde: Serde, key: bytes, value: bytes) -> V:
        try:
            return cast(V, serde.deserialize(value))
        except Exception as e:
            raise self._undecodable("value", store, key, e) from e

    def _decoded(self, store: StateStore, rows: Iterator[tuple[bytes, bytes]]) -> Iterator[tuple[K, V]]:
        ks, vs = self._serdes()
        for k, v in rows:
            yield self._decode_key(store, ks, k), self._decode_value(store, vs, k, v)

    # --- Mapping -------------------------------------------------------------------------------

    def get_raw(self, key: bytes) -> bytes | None:
        """The stored value bytes of the raw *key*, or None."""
        return self._store_for("get").get(key)

    def __getitem__(self, key: K) -> V:
        store = self._store_for("get")
        ks, vs = self._serdes()
        raw_key = ks.serialize(key)
        raw = store.get(raw_key)
        if raw is None:
            raise KeyError(key)
        return self._decode_value(store, vs, raw_key, raw)

    @overload
    def get(self, key: K, /) -> V | None: ...

    @overload
    def get(self, key: K, /, default: V | T) -> V | T: ...

    def get(self, key: K, /, default: object = None) -> object:
        """The current value of *key* (deserialized), or *default*."""
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key: object) -> bool:
        store = self._store_for("look up")
        return self._serdes()[0].serialize(key) in store

    def __len__(self) -> int:
        return len(self._store_for(None))

    def __iter__(self) -> Iterator[K]:
        """Keys in ascending key-byte order."""
        store = self._store_for("iterate")
        ks = self._serdes()[0]
        for k, _v in ordered_rows(store, None, None, None):
            yield self._decode_key(store, ks, k)

    def keys(self) -> KeysView[K]:
        """The keys, in key order."""
        return KeysView(self)

    def values(self) -> ValuesView[V]:
        """The values, in key order."""
        return _Values(self)

    def items(self) -> ItemsView[K, V]:
        """(key, value) pairs, deserialized, in key order."""
        return _Items(self)

    def _ordered_items(self) -> Iterator[tuple[K, V]]:
        store = self._store_for("iterate")
        return self._decoded(store, ordered_rows(store, None, None, None))

    def raw_items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) as stored bytes, in no particular order (the cheapest full pass)."""
        return self._store_for("iterate").items()

    def scan(
        self, after: K | bytes | None = None, limit: int | None = None, *, prefix: K | bytes | None = None
    ) -> list[tuple[K, V]]:
        """Up to *limit* (key, value) pairs, deserialized, in key order: keys greater than *after*
        and starting with *prefix*. One page of a scan: pass the last key as the next *after*.

        *after* and *prefix* are keys (serialized by the key serde) or raw key bytes; a prefix
        matches serialized bytes (natural for ``string`` and ``bytes`` keys). Costs
        O(log n + page) on stores with ordered reads.
        """
        store, raw_after, raw_prefix = self._scan_args("scan", after, limit, prefix)
        return list(self._decoded(store, ordered_rows(store, raw_after, raw_prefix, limit)))

    def raw_scan(
        self, after: bytes | None = None, limit: int | None = None, *, prefix: bytes | None = None
    ) -> list[tuple[bytes, bytes]]:
        """:meth:`scan` on stored bytes: keys, bounds and values are raw."""
        store, raw_after, raw_prefix = self._scan_args("scan", after, limit, prefix)
        return list(ordered_rows(store, raw_after, raw_prefix, limit))

    def _scan_args(
        self, action: str, after: object, limit: int | None, prefix: object
    ) -> tuple[StateStore, bytes | None, bytes | None]:
        if limit is not None and limit < 1:
            raise ConfigError(f"scan limit must be >= 1, got {limit}")
        store = self._store_for(action)
        ks = self._serdes()[0]
        return store, _bound(ks, after), _bound(ks, prefix)

    # A live table equals only itself: comparing contents would read two whole tables.
    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    __hash__ = object.__hash__


class _Items(ItemsView[K, V]):
    """Items in key order from one ordered pass (not one lookup per key)."""

    _mapping: TableReads[K, V]

    def __iter__(self) -> Iterator[tuple[K, V]]:
        return self._mapping._ordered_items()


class _Values(ValuesView[V]):
    _mapping: TableReads[Any, V]

    def __iter__(self) -> Iterator[V]:
        for _k, v in self._mapping._ordered_items():
            yield v
