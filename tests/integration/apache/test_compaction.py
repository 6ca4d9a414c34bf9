"""Log compaction under a table, on a broker that compacts.

Apache Kafka's cleaner drops superseded values and, ``delete.retention.ms`` after a segment was
first cleaned, the tombstones themselves. A checkpoint older than that may hold a key whose
tombstone the tail no longer delivers: restoring it would resurrect the key. Tansu never compacts,
so tests/unit/test_selection.py and tests/integration/test_table_restore_selection.py prove the
rule on a fake; here the cleaner really removes the records, the trap is shown to be real, and
statesnap is shown to stay out of it. Ground truth: a plain consumer's read of the topic.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from integration.apache.log_control import COMPACT_FAST, ROLL_KEY, compact_until
from integration.conftest import KafkaTool, Rec
from statesnap import CheckpointOptions, Table

pytestmark = pytest.mark.integration

PARTITIONS = 2


def _key(i: int) -> tuple[int, bytes]:
    """Keys stay in one partition, as a table requires."""
    return i % PARTITIONS, b"k%02d" % i


def _fully_compacted(records: list[Rec]) -> bool:
    """No tombstone left and every key (but the roll key, whose newest copy is in the active
    segment) stored once."""
    keys = [r.key for r in records if r.key != ROLL_KEY]
    return all(r.value is not None for r in records) and len(keys) == len(set(keys))


def test_an_old_checkpoint_is_refused_once_compaction_removed_its_tombstones(
    kafka: KafkaTool, tmp_path: Path
) -> None:
    """Apache Kafka 4.1.1 proved it: with delete.retention.ms=3000 the cleaner removed the
    superseded values and the tombstones of k00..k04 after checkpoint 1 was taken. Restoring
    checkpoint 1 and replaying its tail would resurrect those five keys (shown below from the
    records themselves); statesnap refuses it, naming delete.retention.ms, and replays the
    compacted topic to exactly the plain-consumer ground truth. A checkpoint taken after the
    compaction is then used and restores exactly."""
    topic = kafka.create_topic(
        f"cmp-{uuid.uuid4().hex[:10]}", PARTITIONS, {**COMPACT_FAST, "delete.retention.ms": "3000"}
    )
    kafka.produce(topic, [(*_key(i), b"v1-%d" % i) for i in range(20)])
    url = (tmp_path / "cp").as_uri()
    t = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)
    t.start()
    first = t.checkpoint()
    t.close(checkpoint=False)
    assert first is not None
    at_first = {_key(i)[1]: b"v1-%d" % i for i in range(20)}

    kafka.produce(
        topic, [(*_key(i), None) for i in range(5)] + [(*_key(i), b"v2-%d" % i) for i in range(5, 10)]
    )
    records = compact_until(kafka, topic, PARTITIONS, _fully_compacted, "tombstones removed")
    truth = kafka.truth(records)
    assert not any(k in truth for k in at_first if k < b"k05"), "the tombstoned keys are deleted"
    assert time.time() - first.created_at.timestamp() > 3, "checkpoint 1 is older than delete.retention.ms"

    # The trap is real: checkpoint 1 + its tail (what the log still holds) resurrects k00..k04.
    naive = dict(at_first)
    for r in records:
        if r.offset >= first.offsets[r.partition] and r.key is not None:
            if r.value is None:
                naive.pop(r.key, None)
            else:
                naive[r.key] = r.value
    assert naive != truth
    assert all(_key(i)[1] in naive for i in range(5))

    restored = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)
    report = restored.start()
    try:
        assert report.checkpoint is None
        assert [s.generation for s in report.skipped] == [first.generation]
        assert "delete.retention.ms=3000" in report.skipped[0].reason
        assert dict(restored.raw_items()) == truth
        fresh = restored.checkpoint()  # taken from the compacted log
    finally:
        restored.close(checkpoint=False)
    assert fresh is not None

    # Restored as a second after it was taken (the clock is pinned so that a loaded machine
    # cannot age it past delete.retention.ms=3000 first): it is used, and exact.
    again = Table(
        topic,
        bootstrap_servers=kafka.bootstrap,
        checkpoints=CheckpointOptions(url, clock=lambda: fresh.created_at + timedelta(seconds=1)),
        background=False,
    )
    report = again.start()
    try:
        assert report.checkpoint == fresh.generation, report.skipped
        assert report.replayed_records == 0
        assert dict(again.raw_items()) == truth
    finally:
        again.close(checkpoint=False)


def test_a_checkpoint_whose_resume_offsets_were_compacted_away_restores_exactly(
    kafka: KafkaTool, tmp_path: Path
) -> None:
    """Apache Kafka 4.1.1 proved it: after a checkpoint, the cleaner removed the very records at
    its resume offsets (each superseded later), leaving gaps in the offsets. Restore seeks into
    the gaps, gets the next surviving record, and equals the plain-consumer ground truth, with
    the checkpoint used (delete.retention.ms is Kafka's default day, reported by the broker)."""
    topic = kafka.create_topic(f"gap-{uuid.uuid4().hex[:10]}", PARTITIONS, COMPACT_FAST)
    kafka.produce(topic, [(*_key(i), b"v1-%d" % i) for i in range(20)])
    url = (tmp_path / "cp").as_uri()
    t = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)
    t.start()
    cp = t.checkpoint()
    t.close(checkpoint=False)
    assert cp is not None

    # First after the checkpoint, in each partition: a value superseded right away, so the record
    # at the resume offset is compacted away; then updates and tombstones (kept: a day's retention).
    after: list[tuple[int, bytes, bytes | None]] = [(*_key(p), b"doomed") for p in range(PARTITIONS)]
    after += [(*_key(i), b"v2-%d" % i) for i in range(12)]
    after += [(*_key(i), None) for i in range(12, 15)]
    produced = kafka.produce(topic, after)
    resume = {p: cp.offsets[p] for p in range(PARTITIONS)}
    assert {r.offset for r in produced if r.value == b"doomed"} == set(resume.values())

    def resume_offsets_gone(records: list[Rec]) -> bool:
        return not any(r.offset == resume[r.partition] for r in records)

    records = compact_until(
        kafka, topic, PARTITIONS, resume_offsets_gone, "records at the resume offsets removed"
    )
    truth = kafka.truth(records)
    assert any(r.value is None for r in records), "tombstones are kept for delete.retention.ms"

    r = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)
    report = r.start()
    try:
        assert report.checkpoint == cp.generation, report.skipped
        assert dict(r.raw_items()) == truth
        assert not any(_key(i)[1] in dict(r.raw_items()) for i in range(12, 15))
    finally:
        r.close(checkpoint=False)
