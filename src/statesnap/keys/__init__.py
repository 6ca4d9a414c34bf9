"""How keys are hashed, indexed and ordered: the layer under both the checkpoint format (data
files are sorted by :func:`key_order`; a base's persisted key index is a :class:`KeyIndex`) and
the state stores that read and write it."""

from __future__ import annotations

from statesnap.keys.index import HashSeed, KeyIndex, KeyIndexBuilder
from statesnap.keys.order import key_order

__all__ = ["HashSeed", "KeyIndex", "KeyIndexBuilder", "key_order"]
