"""``snapshot diff`` of a table (no services: a file:// checkpoint store written in-process):
examples are the first keys of each kind in byte order — the order the Spark engine sorts them in
(they were the first in the join's order: partition by partition) — and ``--store`` on a table is
refused in one line. A processor's per-store diff is proven end to end in
tests/integration/snapshot/test_snapshot_diff_stores.py."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest

from statesnap.blob import open_blob_store
from statesnap.checkpoint import CheckpointRepository
from statesnap.checkpoint.manifest import CheckpointManifest
from statesnap.checkpoint.writer import PartitionUpdate, write_partition_files
from statesnap.errors import ConfigError
from statesnap.processor.diff import diff_snapshots


def rows(pairs: dict[bytes, bytes]) -> pa.Table:
    keys = sorted(pairs)
    return pa.table(
        {
            "key": pa.array(keys, pa.binary()),
            "value": pa.array([pairs[k] for k in keys], pa.binary()),
            "offset": pa.array(range(len(keys)), pa.int64()),
            "timestamp": pa.array([0] * len(keys), pa.int64()).cast(pa.timestamp("ms")),
        }
    )


def commit(repo: CheckpointRepository, generation: int, pairs: dict[bytes, bytes]) -> None:
    """Keys from k200 on in partition 0, the lower ones in partition 1: read in partition order,
    the rows are not in key order."""
    parts = {
        0: {k: v for k, v in pairs.items() if k >= b"k200"},
        1: {k: v for k, v in pairs.items() if k < b"k200"},
    }
    updates = {p: PartitionUpdate(p, 1000, base=rows(kv)) for p, kv in parts.items()}
    files = write_partition_files(repo, generation, updates)
    repo.commit(CheckpointManifest("t", "t", "c1", generation, files, datetime.now(UTC)))


def test_table_diff_examples_in_byte_order_and_store_refused(tmp_path: Path) -> None:
    repo = CheckpointRepository.for_table(open_blob_store(str(tmp_path)), "c1", "t")
    repo.ensure_descriptor("t", "t", "c1", 2)
    old = {b"k%03d" % i: b"v" for i in range(0, 400, 2)}
    new = {**dict.fromkeys(list(old)[:150], b"w"), **{b"k%03d" % i: b"v" for i in range(1, 400, 2)}}
    commit(repo, 1, old)
    commit(repo, 2, new)
    d = diff_snapshots(repo, 1, 2)
    assert (d.old, d.new, d.added, d.removed, d.changed, d.unchanged) == (200, 350, 200, 50, 150, 0)
    assert d.examples == {
        "added": ["k001", "k003", "k005", "k007", "k009"],
        "removed": ["k300", "k302", "k304", "k306", "k308"],
        "changed": ["k000", "k002", "k004", "k006", "k008"],
    }
    assert "stores" not in d.to_json()
    with pytest.raises(ConfigError, match="'t' is a table, not a processor: it has no stores"):
        diff_snapshots(repo, 1, 2, store="balances")
