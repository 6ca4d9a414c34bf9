"""Local state stores a table keeps its rows in: ``memory`` (default) and ``rocksdb``."""

from __future__ import annotations

import tempfile
from pathlib import Path

from statesnap.errors import ConfigError
from statesnap.stores.base import StateStore
from statesnap.stores.memory import MemoryStore

__all__ = ["MemoryStore", "StateStore", "open_state_store"]

STORE_KINDS = ("memory", "rocksdb")


def open_state_store(kind: str, *, path: str | Path | None = None, name: str = "table") -> StateStore:
    """A fresh store of *kind*; ``rocksdb`` uses *path* (a temporary directory by default)."""
    if kind == "memory":
        return MemoryStore()
    if kind == "rocksdb":
        from statesnap.stores.rocksdb import RocksDBStore

        base = Path(path) if path is not None else Path(tempfile.mkdtemp(prefix=f"statesnap-{name}-"))
        return RocksDBStore(base)
    raise ConfigError(f"unknown state store {kind!r}; choose one of {', '.join(STORE_KINDS)}")
