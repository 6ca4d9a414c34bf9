"""A table digest that two restores can be compared by.

Format (version 1): SHA-256 over every (key, value) pair in ascending byte order of the key, each
pair encoded as ``len(key):uint32be || key || len(value):uint32be || value``. Length prefixes make
the encoding unambiguous; key order makes it independent of partitioning and store.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable

__all__ = ["table_digest"]

_LEN = struct.Struct(">I")


def table_digest(pairs: Iterable[tuple[bytes, bytes]]) -> tuple[str, int]:
    """(hex digest, number of keys) of a table given as (key, value) byte pairs."""
    h = hashlib.sha256()
    n = 0
    for key, value in sorted(pairs):
        h.update(_LEN.pack(len(key)))
        h.update(key)
        h.update(_LEN.pack(len(value)))
        h.update(value)
        n += 1
    return h.hexdigest(), n
