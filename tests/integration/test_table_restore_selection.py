"""Restore selection end to end: Table.start on the real broker, with the one cluster answer
the dev broker cannot give replaced by a precise fake.

What is real here: the topic, its records, the checkpoint store, and the topic configs
(``cleanup.policy``/``delete.retention.ms`` set at creation are reported by Tansu's
describe_configs). What is faked, and why: the log-start offset (Tansu never runs retention and
``delete_records`` crashes it) and the wall clock (a checkpoint cannot be made a day old in a test).
The log start moved for real (``delete_records`` and time retention) is proven on Apache Kafka by
tests/integration/apache/test_retention.py, compaction by tests/integration/apache/test_compaction.py.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import statesnap.task.cluster
from statesnap import CheckpointOptions, Table

pytestmark = pytest.mark.integration


def _checkpointed_topic(kafka: Any, url: str, config: dict[str, str] | None = None) -> tuple[str, Any, int]:
    topic = kafka.create_topic(f"sel-{uuid.uuid4().hex[:12]}", 2, config)
    produced = kafka.produce(topic, [(0, b"a", b"1"), (1, b"b", b"1"), (0, b"a", None), (0, b"c", b"1")])
    t = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)
    t.start()
    m = t.checkpoint()
    t.close(checkpoint=False)
    assert m is not None
    return topic, produced, m.generation


def test_log_start_beyond_checkpoint_skips_it(
    kafka: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kafka behaviour: retention (cleanup.policy=delete) deleted records below offset 5 of
    partition 0, after the checkpoint (next offset 3) was taken; offsets 3 and 4 were never
    seen by it. Restore must skip that checkpoint and replay what the log still holds.
    Proven on the real broker with the low watermark faked (log_start_offsets -> {0: 5, 1: 0})."""
    url = (tmp_path / "cp").as_uri()
    topic, produced, gen = _checkpointed_topic(kafka, url)
    produced += kafka.produce(topic, [(0, b"d", b"2"), (0, b"e", b"2")])
    monkeypatch.setattr(
        statesnap.task.cluster, "log_start_offsets", lambda settings, topic, partitions: {0: 5, 1: 0}
    )
    t = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)
    report = t.start()
    try:
        assert report.checkpoint is None
        assert [s.generation for s in report.skipped] == [gen]
        assert "log now starts at 5" in report.skipped[0].reason
        # The real broker still holds every record, so the replay sees them all.
        assert dict(t.raw_items()) == kafka.truth(produced)
    finally:
        t.close(checkpoint=False)


def test_log_start_at_checkpoint_offset_uses_it(
    kafka: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kafka behaviour: retention removed only records the checkpoint already contains (log
    start 3 == its next offset on partition 0), so it is still exact. Proven on the real broker
    with the low watermark faked to {0: 3, 1: 1}."""
    url = (tmp_path / "cp").as_uri()
    topic, produced, gen = _checkpointed_topic(kafka, url)
    monkeypatch.setattr(
        statesnap.task.cluster, "log_start_offsets", lambda settings, topic, partitions: {0: 3, 1: 1}
    )
    t = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)
    report = t.start()
    try:
        assert report.checkpoint == gen
        assert report.replayed_records == 0
        assert dict(t.raw_items()) == kafka.truth(produced)
    finally:
        t.close(checkpoint=False)


def test_compacted_topic_and_old_checkpoint(kafka: Any, tmp_path: Path) -> None:
    """Kafka behaviour: on a compacted topic tombstones older than delete.retention.ms may be
    gone, so a checkpoint older than that could resurrect deleted keys and is skipped; a younger
    one is used. Proven on the real broker with a topic created with cleanup.policy=compact and
    delete.retention.ms=60000 (Tansu reports both; it never compacts) and an injected clock."""
    url = (tmp_path / "cp").as_uri()
    topic, produced, gen = _checkpointed_topic(
        kafka, url, {"cleanup.policy": "compact", "delete.retention.ms": "60000"}
    )

    def at(delta: timedelta) -> Table:
        return Table(
            topic,
            bootstrap_servers=kafka.bootstrap,
            checkpoints=CheckpointOptions(url, clock=lambda: datetime.now(UTC) + delta),
            background=False,
        )

    old = at(timedelta(minutes=2))
    report = old.start()
    try:
        assert report.checkpoint is None
        assert "delete.retention.ms=60000" in report.skipped[0].reason
        assert dict(old.raw_items()) == kafka.truth(produced)
    finally:
        old.close(checkpoint=False)
    young = at(timedelta(seconds=30))
    report = young.start()
    try:
        assert report.checkpoint == gen
        assert report.skipped == []
    finally:
        young.close(checkpoint=False)


def test_compacted_topic_with_kafka_default_delete_retention(kafka: Any, tmp_path: Path) -> None:
    """Kafka behaviour: delete.retention.ms defaults to one day when the topic does not set it
    (Tansu's describe_configs then reports nothing, like a broker that only lists overrides).
    Proven on the real broker: a 23 h old checkpoint is used, a 25 h old one skipped."""
    url = (tmp_path / "cp").as_uri()
    topic, _, gen = _checkpointed_topic(kafka, url, {"cleanup.policy": "compact"})
    for hours, expected in ((23, gen), (25, None)):

        def clock(h: int = hours) -> datetime:
            return datetime.now(UTC) + timedelta(hours=h)

        t = Table(
            topic,
            bootstrap_servers=kafka.bootstrap,
            checkpoints=CheckpointOptions(url, clock=clock),
            background=False,
        )
        try:
            assert t.start().checkpoint == expected
        finally:
            t.close(checkpoint=False)
