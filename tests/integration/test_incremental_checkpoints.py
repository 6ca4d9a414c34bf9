"""Python checkpoints cost what changed: a delta file of upserts and tombstones per changed
partition, merge-on-read, a new base once deltas pile up, and files shared between checkpoints
kept by GC while any retained checkpoint references them.

Ground truth: an independent plain-consumer read of the topic (``kafka.read_all`` + ``truth``).
"""

from __future__ import annotations

import hashlib
import uuid
from datetime import timedelta
from typing import Any

import pytest

from statesnap import CheckpointOptions, RetentionPolicy, StoreOptions, Table
from statesnap.checkpoint.compaction import COMPACT_AFTER
from statesnap.task.options import StoreName

pytestmark = pytest.mark.integration
PARTITIONS = 2


def _table(
    kafka: Any,
    topic: str,
    location: Any,
    *,
    store: StoreName | str = "auto",
    require_checkpoint: bool = False,
    retention: RetentionPolicy | None = None,
) -> Table:
    return Table(
        topic,
        bootstrap_servers=kafka.bootstrap,
        checkpoints=CheckpointOptions(
            location.url,
            storage_options=location.options,
            interval="1h",
            commit_interval="1h",
            require=require_checkpoint,
            retention=retention,
        ),
        store=StoreOptions(store),
        background=False,
    )


def _value(i: int, version: int) -> bytes:
    """100 incompressible bytes, so file sizes measure rows, not Parquet's fixed overhead."""
    return b"".join(hashlib.sha256(b"%d-%d-%d" % (i, version, n)).digest() for n in range(4))[:100]


@pytest.mark.parametrize("store", ["memory", "columnar", "rocksdb"])
def test_a_small_change_writes_a_small_delta_and_restores_exactly(
    kafka: Any, checkpoint_location: Any, store: str
) -> None:
    topic = kafka.create_topic(f"inc-{uuid.uuid4().hex[:10]}", PARTITIONS)
    produced = kafka.produce(topic, [(i % PARTITIONS, b"k%05d" % i, _value(i, 0)) for i in range(4000)])
    t = _table(kafka, topic, checkpoint_location, store=store)
    t.start()
    try:
        full = t.checkpoint()
        assert full is not None
        # 1 % of the keys change, one is deleted: a delta per partition, tombstone included
        changes: list[tuple[int, bytes, bytes | None]] = [
            (i % PARTITIONS, b"k%05d" % i, _value(i, 1)) for i in range(0, 4000, 100)
        ]
        changes.append((1, b"k00001", None))
        produced += kafka.produce(topic, changes)
        kafka.drain(t, kafka.end_offsets(produced, range(PARTITIONS)))
        small = t.checkpoint()
        assert small is not None
    finally:
        t.close(checkpoint=False)
    new = [f for f in small.files if f.path.startswith(f"data/{small.generation:020d}/")]
    assert [f.kind for f in new] == ["delta"] * PARTITIONS
    assert sum(f.bytes for f in new) <= 0.05 * full.total_bytes
    assert small.writer["delta_partitions"] == list(range(PARTITIONS))
    for p in range(PARTITIONS):
        assert small.partitions[p].files[0] == full.partitions[p].files[0]  # the base is shared
    truth = kafka.truth(kafka.read_all(topic, range(PARTITIONS)))
    r = _table(kafka, topic, checkpoint_location, store=store, require_checkpoint=True)
    report = r.start()
    try:
        assert report.checkpoint == small.generation
        assert report.replayed_records == 0
        assert dict(r.raw_items()) == truth
    finally:
        r.close(checkpoint=False)


def test_deltas_pile_up_into_a_new_base_and_gc_keeps_shared_files(
    kafka: Any, checkpoint_location: Any
) -> None:
    topic = kafka.create_topic(f"inc-{uuid.uuid4().hex[:10]}", PARTITIONS)
    produced = kafka.produce(topic, [(i % PARTITIONS, b"k%03d" % i, b"v") for i in range(200)])
    eager = RetentionPolicy(min_count=1, min_age=timedelta(0), orphan_grace=timedelta(0))
    t = _table(kafka, topic, checkpoint_location, retention=eager)
    t.start()
    manifests = []
    try:
        for round_no in range(COMPACT_AFTER + 2):
            m = t.checkpoint()
            assert m is not None
            manifests.append(m)
            # every checkpoint still restores exactly, though GC deleted every older manifest
            assert t.repo is not None
            assert t.repo.generations() == [m.generation]
            assert t.repo.verify(m.generation).ok
            # one key of each partition changes (a key stays in its partition: k % PARTITIONS)
            updates = [
                (p, b"k%03d" % (PARTITIONS * round_no + p), b"r%d" % round_no) for p in range(PARTITIONS)
            ]
            produced += kafka.produce(topic, updates)
            kafka.drain(t, kafka.end_offsets(produced, range(PARTITIONS)))
    finally:
        t.close(checkpoint=False)
    kinds = [[f.kind for f in m.partitions[0].files] for m in manifests]
    assert kinds[0] == ["base"]
    assert max(len(k) for k in kinds) <= COMPACT_AFTER + 1
    assert any(k == ["base"] for k in kinds[1:]), f"deltas were never compacted into a new base: {kinds}"
    truth = kafka.truth(kafka.read_all(topic, range(PARTITIONS)))
    r = _table(kafka, topic, checkpoint_location, require_checkpoint=True)
    r.start()
    try:
        assert dict(r.raw_items()) == truth
    finally:
        r.close(checkpoint=False)
