"""Local state stores a table keeps its rows in: ``memory``, ``columnar``, ``rocksdb`` (``auto``, the
default, picks ``columnar`` for a checkpoint of 10 k rows or more, else ``memory``)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from statesnap.errors import ConfigError
from statesnap.stores.base import StateStore
from statesnap.stores.memory import MemoryStore

__all__ = ["AUTO_COLUMNAR_ROWS", "MemoryStore", "StateStore", "auto_store_kind", "open_state_store"]

STORE_KINDS = ("auto", "memory", "columnar", "rocksdb")
#: ``auto`` restores a checkpoint of at least this many rows into the columnar store and smaller
#: ones into the dict store: where columnar restore + tail + first read overtakes the dict store's
#: (benchmarks/auto_store.py, medians of 3, 2 cores at load 2-5, 200 k-record tail: 3 k rows
#: 0.157 s columnar vs 0.134 s memory; 10 k rows 0.189 vs 0.216 s; 100 k 0.305 vs 0.420 s; 1 M
#: 0.376 vs 0.873 s; with a 20 k tail from 3-10 k rows on). Below it the dict store's restore is
#: as fast and its single ``get`` 1.5-2.5x faster (benchmarks/scale.py).
AUTO_COLUMNAR_ROWS = 10_000


def auto_store_kind(checkpoint_rows: int | None) -> str:
    """The store ``auto`` picks for a table about to restore *checkpoint_rows* rows."""
    return "columnar" if (checkpoint_rows or 0) >= AUTO_COLUMNAR_ROWS else "memory"


def open_state_store(kind: str, *, path: str | Path | None = None, name: str = "table") -> StateStore:
    if kind == "auto":  # decided at restore time (see auto_store_kind); a dict store until then
        kind = "memory"
    return _open(kind, path=path, name=name)


def _open(kind: str, *, path: str | Path | None = None, name: str = "table") -> StateStore:
    """A fresh store of *kind*. ``rocksdb`` works in ``path/statesnap-<name>/`` (a directory it
    creates, marks and alone deletes) or, without *path*, in a temporary directory."""
    if kind == "memory":
        return MemoryStore()
    if kind == "columnar":
        from statesnap.stores.columnar import ColumnarStore

        return ColumnarStore()
    if kind == "rocksdb":
        from statesnap.stores.rocksdb import RocksDBStore

        if path is None:
            return RocksDBStore(tempfile.mkdtemp(prefix="statesnap-rocksdb-"), temporary=True)
        # The user's directory: the store works in a subdirectory it creates and marks.
        return RocksDBStore(path, name=name)
    raise ConfigError(f"unknown state store {kind!r}; choose one of {', '.join(STORE_KINDS)}")
