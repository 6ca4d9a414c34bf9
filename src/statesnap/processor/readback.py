"""Reading one store of a processor back from its checkpoint: manifest + store name → rows.

The one place that knows how a store's rows sit in a checkpoint's files, used by ``statesnap dump
--store``, ``statesnap serve --store`` and ``read_table(spark, url, table, store=)``. A processor's
data files hold every store of a task under one keyspace (:mod:`statesnap.processor.keyspace`);
reading a store is keeping the rows of its key prefix and taking the prefix off. What a store *is*
(key-value or window, and the window's size) comes from the manifest's ``writer.processor``, so a
reader needs neither the processor's code nor a broker.

A store is always read as a checkpoint holds it: unlike a table it cannot be brought up to date
from the input topic's tail without running the processor's handler.

Rows come as Arrow tables with the columns of :data:`WINDOW_SCHEMA` (window stores) or
:data:`KV_SCHEMA`: ``key`` is the user's key bytes, ``stored_key`` what the digest covers (the same
for a key-value store; the 8-byte window start followed by the key for a window store),
``window_start``/``window_end`` epoch milliseconds (the window store API's units).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statesnap.blob import BlobStore
from statesnap.checkpoint import CheckpointManifest, CheckpointRepository, locate_table
from statesnap.checkpoint.restore import CheckpointSelector, SkippedCheckpoint
from statesnap.digest import table_digest
from statesnap.errors import ConfigError
from statesnap.processor.keyspace import (
    PARTITION_BYTES,
    WINDOW_BYTES,
    partition_prefix,
    store_prefix,
    stream_time_key,
    stream_time_of,
)
from statesnap.processor.stores import StoreKind

__all__ = [
    "KV_SCHEMA",
    "WINDOW_SCHEMA",
    "StoreCheckpoint",
    "StoreInfo",
    "StoreRows",
    "processor_stores",
    "read_store",
    "spark_columns",
    "spark_sql",
    "store_digest",
    "store_info",
    "store_rows",
]

KV_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("ms")),
        ("partition", pa.int32()),
        ("stored_key", pa.binary()),
    ]
)
WINDOW_SCHEMA = pa.schema(
    [
        *KV_SCHEMA,
        ("window_start", pa.int64()),
        ("window_end", pa.int64()),
    ]
)
_OFFSET_BINARY = np.uint64(1 << 63)


@dataclass(frozen=True, slots=True)
class StoreInfo:
    """A store as a manifest describes it: its name, kind and (window stores) window size."""

    name: str
    kind: StoreKind
    window_size_ms: int | None = None
    #: A TTL store's: its values are stored after the 8-byte timestamp of their last write.
    ttl_ms: int | None = None

    @property
    def schema(self) -> pa.Schema:
        return WINDOW_SCHEMA if self.kind is StoreKind.WINDOW else KV_SCHEMA


def processor_stores(manifest: CheckpointManifest) -> dict[str, StoreInfo]:
    """The stores *manifest*'s writer declared (``writer.processor.stores``); a manifest that is
    not a processor's raises :class:`ConfigError` saying so."""
    described = manifest.writer.get("processor") if isinstance(manifest.writer, Mapping) else None
    stores = described.get("stores") if isinstance(described, Mapping) else None
    if not isinstance(stores, Mapping):
        raise ConfigError(
            f"{manifest.table!r} (generation {manifest.generation}) is a table, not a processor: it "
            "has no stores; read it without --store/store="
        )
    out = {}
    for name, described_store in stores.items():
        spec = described_store if isinstance(described_store, Mapping) else {}
        try:
            kind = StoreKind(str(spec.get("kind", StoreKind.KEY_VALUE.value)))
        except ValueError:
            raise ConfigError(
                f"store {name!r} of {manifest.table!r} is of kind {spec.get('kind')!r}, which this "
                "version of statesnap cannot read"
            ) from None
        window = spec.get("window")
        size = int(window["size_ms"]) if kind is StoreKind.WINDOW and isinstance(window, Mapping) else None
        if kind is StoreKind.WINDOW and size is None:
            raise ConfigError(
                f"window store {name!r} of {manifest.table!r}: its manifest gives no window size"
            )
        ttl = spec.get("ttl_ms")
        out[str(name)] = StoreInfo(str(name), kind, size, int(ttl) if isinstance(ttl, int) else None)
    return out


def store_info(manifest: CheckpointManifest, store: str) -> StoreInfo:
    """*store* as *manifest* describes it; a name not there raises :class:`ConfigError` listing
    the stores that are."""
    stores = processor_stores(manifest)
    info = stores.get(store)
    if info is None:
        shown = ", ".join(sorted(stores)) or "none"
        raise ConfigError(
            f"processor {manifest.table!r} has no store {store!r} at generation {manifest.generation} "
            f"(its stores: {shown})"
        )
    return info


@dataclass(frozen=True, slots=True)
class StoreCheckpoint:
    """One store at one checkpoint: the manifest chosen, the store as it describes it, and the
    checkpoints skipped on the way (with their reasons)."""

    repo: CheckpointRepository
    manifest: CheckpointManifest
    info: StoreInfo
    skipped: tuple[SkippedCheckpoint, ...] = ()

    @classmethod
    def open(
        cls,
        blob_store: BlobStore,
        table: str,
        store: str,
        *,
        generation: int | None = None,
        cluster_id: str | None = None,
    ) -> StoreCheckpoint:
        """*store* of processor *table* at *generation* or at the newest usable checkpoint,
        verified as every reader verifies one (corrupt ones skipped with a warning; none usable →
        :class:`~statesnap.errors.NoUsableCheckpointError`)."""
        repo = locate_table(blob_store, table, cluster_id)
        selector = CheckpointSelector(repo, table, generation, require_checkpoint=True)
        manifest = selector.newest_verified(None, datetime.now(UTC))
        assert manifest is not None  # require_checkpoint raises instead
        return cls(repo, manifest, store_info(manifest, store), tuple(selector.skipped))

    def partitions(self, partitions: Sequence[int] | None = None) -> Iterator[tuple[int, pa.Table]]:
        """(partition, the store's rows) per partition, files checked as a restore checks them."""
        return read_store(self.repo, self.manifest, self.info, partitions)

    def skipped_json(self) -> list[dict[str, Any]]:
        return [{"generation": s.generation, "reason": s.reason} for s in self.skipped]


class StoreRows:
    """A store as one checkpoint holds it, in memory and sorted for scans: what a store's follower
    (``serve --store``) and a read at a generation (``?generation=G``) serve. A key held by two
    partitions keeps the higher partition's value (partitions are read in order)."""

    __slots__ = ("key_filter", "keys", "newest_ms", "values")

    def __init__(
        self,
        values: dict[bytes, bytes],
        *,
        key_filter: Callable[[bytes], bool] | None = None,
        newest_ms: int | None = None,
    ) -> None:
        if key_filter is not None:
            values = {k: v for k, v in values.items() if key_filter(k)}
        self.values = values
        self.keys = sorted(values)
        self.key_filter = key_filter
        #: The newest record timestamp among the rows (ms), where the rows carry one.
        self.newest_ms = newest_ms

    @staticmethod
    def read(chosen: StoreCheckpoint) -> tuple[dict[bytes, bytes], int | None]:
        """(stored key → value, newest timestamp in ms) of *chosen*'s rows, every partition."""
        values: dict[bytes, bytes] = {}
        newest: int | None = None
        for _, rows in chosen.partitions():
            values.update(
                zip(rows.column("stored_key").to_pylist(), rows.column("value").to_pylist(), strict=True)
            )
            stamps = [s for s in rows.column("timestamp").cast("int64").to_pylist() if s is not None]
            if stamps and (newest is None or max(stamps) > newest):
                newest = max(stamps)
        return values, newest

    def keeps(self, key: bytes) -> bool:
        return self.key_filter is None or self.key_filter(key)

    def get_raw(self, key: bytes) -> bytes | None:
        return self.values.get(key)

    def scan(self, after: bytes | None, limit: int) -> list[tuple[bytes, bytes]]:
        """Up to *limit* (key, value) pairs with keys above *after*, ascending."""
        start = 0 if after is None else bisect.bisect_right(self.keys, after)
        return [(k, self.values[k]) for k in self.keys[start : start + limit]]

    def __len__(self) -> int:
        return len(self.keys)

    def close(self) -> None:
        self.values = {}
        self.keys = []


def store_rows(rows: pa.Table, partition: int, info: StoreInfo) -> pa.Table:
    """The rows of *info*'s store among *rows* (one partition's merged checkpoint rows, columns
    ``key, value, offset, timestamp``), in :attr:`StoreInfo.schema`. Rows are sorted by key, so
    a store's rows of one partition are one contiguous range; a mask finds it without a loop."""
    prefix = partition_prefix(info.name, partition)
    keys = rows.column("key")
    mask = pc.equal(pc.binary_slice(keys, 0, len(prefix)), pa.scalar(prefix, pa.binary()))
    kept = rows.filter(mask)
    stored = _from(kept.column("key"), len(prefix))
    columns: dict[str, Any] = {
        "key": stored,
        "value": kept.column("value"),
        "offset": kept.column("offset"),
        "timestamp": kept.column("timestamp"),
        "partition": pa.array(np.full(kept.num_rows, partition, np.int32)),
        "stored_key": stored,
    }
    if info.ttl_ms is not None:  # the write's timestamp first; entries expired at the checkpoint go
        written = _window_starts(kept.column("value"))
        live = pc.greater(pc.add(written, info.ttl_ms), _stream_time(rows, partition))
        columns = {name: pc.filter(column, live) for name, column in columns.items()}
        columns["value"] = _from(columns["value"], WINDOW_BYTES)
    if info.kind is StoreKind.WINDOW:
        assert info.window_size_ms is not None
        starts = _window_starts(stored)
        columns["key"] = _from(stored, WINDOW_BYTES)
        columns["window_start"] = starts
        columns["window_end"] = pc.add(starts, info.window_size_ms)
    schema = info.schema
    at = schema.get_field_index("timestamp")
    schema = schema.set(at, pa.field("timestamp", rows.schema.field("timestamp").type))  # as read
    return pa.table(columns).cast(schema)


def spark_sql(info: StoreInfo) -> tuple[str, list[str]]:
    """(filter, select list) in Spark SQL that turn checkpoint rows (``key, value, offset,
    timestamp, partition``) into the store's rows, in :func:`spark_columns` order — the keyspace
    layout spelled for Spark, so a read needs no Python worker (nor pandas) per row. A row belongs
    to the store when its key starts with the store's name, a NUL and its own partition (4 bytes
    big-endian); a window start is 8 bytes, big-endian offset-binary."""
    name = store_prefix(info.name)
    after = len(name) + PARTITION_BYTES  # 0-based start of the user's (or window's) bytes
    where = (
        f"substring(key, 1, {len(name)}) = X'{name.hex()}' AND "
        f"hex(substring(key, {len(name) + 1}, {PARTITION_BYTES})) = lpad(hex(partition), 8, '0')"
    )
    rest = f"substring(key, {after + 1})"
    # A TTL store's values follow the 8-byte timestamp of their last write (expired entries are
    # swept before every checkpoint, so none is left to filter here).
    value = f"substring(value, {WINDOW_BYTES + 1}) AS value" if info.ttl_ms is not None else "value"
    columns = {"key": f"{rest} AS key", "value": value}
    if info.kind is StoreKind.WINDOW:
        start = (
            f"CAST(CAST(conv(hex(substring(key, {after + 1}, {WINDOW_BYTES})), 16, 10) AS DECIMAL(20, 0)) "
            f"- {1 << 63} AS BIGINT)"
        )
        columns["key"] = f"substring(key, {after + WINDOW_BYTES + 1}) AS key"
        columns["window_start"] = f"{start} AS window_start"
        columns["window_end"] = f"{start} + {info.window_size_ms} AS window_end"
    columns.update(offset="offset", timestamp="timestamp", partition="partition")
    return where, [columns[c] for c in spark_columns(info)]


def spark_columns(info: StoreInfo) -> list[str]:
    """A store's columns in a DataFrame: the user's key, the value, (window stores) the window,
    then where the row came from."""
    window = ["window_start", "window_end"] if info.kind is StoreKind.WINDOW else []
    return ["key", "value", *window, "offset", "timestamp", "partition"]


def _stream_time(rows: pa.Table, partition: int) -> int:
    """The partition's stream time as its checkpoint holds it (-1 when it has none)."""
    key = stream_time_key(partition)
    found = rows.filter(pc.equal(rows.column("key"), pa.scalar(key, pa.binary()))).column("value").to_pylist()
    return stream_time_of(found[0] if found else None)


def _from(keys: pa.ChunkedArray, start: int) -> pa.ChunkedArray:
    """Every key from byte *start* on. The stop is explicit: pyarrow 26's ``binary_slice`` without
    one fails with "Negative buffer resize" on some arrays (found on a 4-row partition)."""
    longest = pc.max(pc.binary_length(keys)).as_py() if len(keys) else None
    return pc.binary_slice(keys, start, max(start, longest or 0))


def _window_starts(stored: pa.ChunkedArray | pa.Array) -> pa.Array:
    """The first 8 bytes of every stored key as the window start (offset-binary big-endian)."""
    heads = pc.binary_slice(stored, 0, WINDOW_BYTES)
    if isinstance(heads, pa.ChunkedArray):
        heads = heads.combine_chunks() if heads.num_chunks else pa.array([], pa.binary())
    if len(heads) and pc.min(pc.binary_length(heads)).as_py() < WINDOW_BYTES:  # not a window store's
        bad = next(k for k in heads.to_pylist() if len(k) < WINDOW_BYTES)
        raise ValueError(f"not a window store key: {bad!r}")
    fixed = heads.cast(pa.binary(WINDOW_BYTES))
    if not len(fixed):
        return pa.array([], pa.int64())
    data = fixed.buffers()[1]
    raw = np.frombuffer(data, dtype=">u8", count=len(fixed) + fixed.offset)[fixed.offset :]
    return pa.array((raw.astype(np.uint64) - _OFFSET_BINARY).astype(np.int64))


def read_store(
    repo: CheckpointRepository,
    manifest: CheckpointManifest,
    info: StoreInfo,
    partitions: Sequence[int] | None = None,
) -> Iterator[tuple[int, pa.Table]]:
    """(partition, the store's rows) for every partition of *manifest* (or *partitions*), files
    verified against the manifest as a restore loads them."""
    wanted = sorted(manifest.partitions) if partitions is None else list(partitions)
    for partition, rows in repo.iter_partitions(manifest, wanted):
        yield partition, store_rows(rows, partition, info)


def store_digest(tables: Iterable[pa.Table]) -> tuple[str, int]:
    """The README's digest (and row count) over the stored key and value bytes of a store's rows:
    the user's key for a key-value store, window start + key for a window store."""

    def pairs() -> Iterator[tuple[bytes, bytes]]:
        for table in tables:
            yield from zip(
                table.column("stored_key").to_pylist(), table.column("value").to_pylist(), strict=True
            )

    return table_digest(pairs())
