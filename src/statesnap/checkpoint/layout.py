"""Where things live under a checkpoint root (the contract shared by every writer and reader).

::

    <root>/<cluster-id>_<table>/
        snapshots/<generation:020d>.json                       manifest, written LAST
        data/<generation:020d>/p<partition:05d>-<kind>-<n>.parquet
"""

from __future__ import annotations

import re

__all__ = [
    "DATA_DIR",
    "DESCRIPTOR",
    "HIGH_WATER",
    "SNAPSHOTS_DIR",
    "data_generation",
    "data_key",
    "manifest_generation",
    "manifest_key",
    "record_generation",
    "table_dir",
    "valid_table_name",
]

SNAPSHOTS_DIR = "snapshots"
DATA_DIR = "data"
_MANIFEST_RE = re.compile(r"^snapshots/(\d{20})\.json$")
_DATA_GEN_RE = re.compile(r"^data/(\d{20})/")
_RECORD_GEN_RE = re.compile(r"^generations/(\d{20})/")
#: A small write-once descriptor (table, topic, cluster, partitions) that makes a table
#: discoverable before its first checkpoint exists.
DESCRIPTOR = "table.json"
#: The highest generation a writer ever used, so numbers are never reused after records or
#: manifests are deleted (``{"generation": N}``, overwritten as it grows).
HIGH_WATER = "generations/high-water.json"
_TABLE_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


def table_dir(cluster_id: str, table: str) -> str:
    """The directory of one table of one cluster, relative to the root."""
    return f"{cluster_id}_{table}"


def valid_table_name(name: str) -> bool:
    """Table names become path segments, so only a safe character set is allowed."""
    return bool(_TABLE_NAME_RE.fullmatch(name)) and name not in {".", ".."}


def manifest_key(generation: int) -> str:
    return f"{SNAPSHOTS_DIR}/{generation:020d}.json"


def data_key(generation: int, partition: int, kind: str, n: int) -> str:
    return f"{DATA_DIR}/{generation:020d}/p{partition:05d}-{kind}-{n}.parquet"


def manifest_generation(key: str) -> int | None:
    """The generation a manifest key names, or None if *key* is not a manifest."""
    match = _MANIFEST_RE.match(key)
    return int(match.group(1)) if match else None


def record_generation(key: str) -> int | None:
    """The generation a snapshot record key belongs to, or None."""
    match = _RECORD_GEN_RE.match(key)
    return int(match.group(1)) if match else None


def data_generation(key: str) -> int | None:
    """The generation directory a data key lives in, or None if *key* is not a data file."""
    match = _DATA_GEN_RE.match(key)
    return int(match.group(1)) if match else None
