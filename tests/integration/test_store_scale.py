"""State stores at the edges of scale and ownership, on the real broker and real files.

- A Table on the ``columnar`` store restores a checkpoint + tail to the same table as a full
  replay on the dict store (the equivalence invariant, through Table.start()).
- ``Table(store=StoreOptions("rocksdb", path=DIR))`` never deletes the user's files in DIR (issue 11).
- The RocksDB store's load holds bounded memory: a table several times larger than the peak
  RSS growth it is allowed is loaded in a subprocess (a scaled-down version of the benchmark).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from statesnap import StoreOptions, Table

pytestmark = pytest.mark.integration


def test_columnar_store_restores_like_a_full_replay(kafka: Any, tmp_path: Path) -> None:
    """Checkpoint on the dict store, then restore + tail on the columnar store: the same bytes
    as an independent read of the topic; updates and tombstones of restored keys included."""
    topic = kafka.create_topic(f"col-{uuid.uuid4().hex[:12]}", 3)
    first = kafka.produce(topic, [(i % 3, b"k%03d" % i, b"v%d" % i) for i in range(300)])
    url = (tmp_path / "cp").as_uri()
    owner = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)
    owner.start()
    owner.checkpoint()
    owner.close(checkpoint=False)
    tail = kafka.produce(
        topic,
        [(i % 3, b"k%03d" % i, None) for i in range(0, 300, 7)]
        + [(i % 3, b"k%03d" % i, b"new%d" % i) for i in range(1, 300, 11)]
        + [(1, b"fresh", b"f"), (2, None, b"no key")],
    )
    expected = kafka.truth([*first, *tail])
    t = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, store="columnar", background=False)
    try:
        report = t.start()
        assert report.checkpoint is not None
        assert report.restored_keys == 300
        assert dict(t.raw_items()) == expected
        assert len(t) == len(expected)
        assert list(t.store.scan()) == sorted(expected.items())
        for k in [b"k000", b"k001", b"k002", b"fresh", b"missing"]:
            assert t.store.get(k) == expected.get(k)
    finally:
        t.close(checkpoint=False)


def test_rocksdb_table_never_deletes_the_users_files(kafka: Any, tmp_path: Path) -> None:
    """Issue 11: store_path is the user's directory; only statesnap's own subdirectory is used
    and removed."""
    topic = kafka.create_topic(f"rdb-{uuid.uuid4().hex[:12]}", 1)
    kafka.produce(topic, [(0, b"a", b"1")])
    state = tmp_path / "state"
    state.mkdir()
    (state / "notes.txt").write_text("mine")
    t = Table(
        topic, bootstrap_servers=kafka.bootstrap, store=StoreOptions("rocksdb", path=state), background=False
    )
    assert (state / "notes.txt").read_text() == "mine"  # construction wiped nothing
    try:
        t.start()
        assert t.store.get(b"a") == b"1"
    finally:
        t.close(checkpoint=False)
    assert (state / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in state.iterdir()) == ["notes.txt"]


_BOUNDED_LOAD = textwrap.dedent(
    """
    import json, resource, sys, tempfile
    import numpy as np, pyarrow as pa, pyarrow.compute as pc
    from statesnap.stores import open_state_store

    n, batch = int(sys.argv[1]), 65536
    pad = "x" * 120
    def rows(lo, hi):
        ids = pa.array(np.arange(lo, hi, dtype=np.int64))
        digits = pc.utf8_lpad(pc.cast(ids, pa.string()), 10, "0")
        keys = pc.binary_join_element_wise(pa.scalar("key-"), digits, "")
        vals = pc.binary_join_element_wise(pc.cast(ids, pa.string()), pa.scalar(pad), "")
        return pa.table({"key": keys.cast(pa.binary()), "value": vals.cast(pa.binary()), "offset": ids,
                         "timestamp": pa.array(np.zeros(hi - lo, dtype=np.int64)).cast(pa.timestamp("ms"))})
    rows(0, 10)  # warm up pyarrow's kernels before the baseline
    with tempfile.TemporaryDirectory() as tmp:
        store = open_state_store("rocksdb", path=tmp, name="big")
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        raw = 0
        for lo in range(0, n, batch):  # streamed in row groups, as a checkpoint file is read
            t = rows(lo, min(lo + batch, n))
            raw += sum(pc.sum(pc.binary_length(t.column(c))).as_py() for c in ("key", "value"))
            store.load(0, t)
            del t
        growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
        ok = len(store) == n and store.get(b"key-%010d" % (n - 1)) is not None
        store.close()
    print(json.dumps({"raw": raw, "growth": growth, "ok": ok}))
    """
)


@pytest.mark.slow
def test_rocksdb_load_memory_is_bounded_by_the_batch_not_the_table(tmp_path: Path) -> None:
    """A table of ~200 MB raw key+value bytes loads with a peak RSS growth of under a third of
    that: the store converts one batch at a time and RocksDB ingests SST files from disk. (The
    benchmark does the same at 10 M keys.)"""
    script = tmp_path / "load.py"
    script.write_text(_BOUNDED_LOAD)
    out = subprocess.run(
        [sys.executable, str(script), "1500000"], check=True, capture_output=True, text=True, timeout=600
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["ok"]
    assert result["raw"] > 200_000_000
    assert result["growth"] < result["raw"] / 3, result


def test_a_restore_reads_a_bounded_number_of_partitions_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``iter_partitions`` keeps at most READ_AHEAD partition decodes ahead of its consumer, so a
    RocksDB restore (which does not keep the decoded tables) holds a few partitions at a time,
    not the whole table; every partition still arrives, in order, with its rows."""
    import threading
    import time

    import pyarrow as pa

    from statesnap.blob import open_blob_store
    from statesnap.checkpoint import repository as repository_module
    from statesnap.checkpoint.partition_files import DecodedPartition
    from statesnap.checkpoint.repository import CheckpointRepository
    from statesnap.checkpoint.writer import PartitionUpdate
    from statesnap.task.write import write_checkpoint

    monkeypatch.setattr(repository_module, "READ_AHEAD", 2)
    repo = CheckpointRepository.for_table(open_blob_store(tmp_path.as_uri()), "c", "t")
    updates = {}
    for p in range(8):
        keys = [b"p%d-%03d" % (p, i) for i in range(50)]
        table = pa.table(
            {
                "key": pa.array(keys, pa.binary()),
                "value": pa.array([b"v" + k for k in keys], pa.binary()),
                "offset": pa.array(range(50), pa.int64()),
                "timestamp": pa.array([1] * 50, pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
            }
        )
        updates[p] = PartitionUpdate(p, 50, base=table)
    manifest = write_checkpoint(repo, table="t", topic="t", cluster_id="c", updates=updates)
    started: list[int] = []
    lock = threading.Lock()
    decode = repo.decode_partition

    def slow_decode(m: Any, p: int, downloads: Any, index: Any) -> DecodedPartition:
        with lock:
            started.append(p)
        time.sleep(0.05)  # decodes take a while: an unbounded reader would start them all at once
        return decode(m, p, downloads, index)

    monkeypatch.setattr(repo, "decode_partition", slow_decode)
    seen = []
    for i, (p, rows) in enumerate(repo.iter_partitions(manifest)):
        with lock:
            assert len(started) <= i + 1 + 2, started  # the one taken + READ_AHEAD in flight
        assert rows.num_rows == 50
        assert rows.column("key")[0].as_py() == b"p%d-000" % p
        seen.append(p)
        time.sleep(0.02)
    assert seen == list(range(8))
