"""Retention under a table, on a broker that deletes: ``delete_records`` and time retention move a
partition's log start past a checkpoint's resume offset.

Such a checkpoint never saw the deleted records and can no longer read them: restore must use a
newer checkpoint that is still within the log, or replay what the log holds (saying so), or —
with ``require_checkpoint=True`` — fail; it never resumes past records it did not apply. Tansu
never runs retention and crashes on ``delete_records``, so tests/unit/test_selection.py and
tests/integration/test_table_restore_selection.py fake the log start; here the broker moves it.
Ground truth: the producer's acknowledged records (full history) and a plain consumer's read
(what the log still holds).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

import statesnap.task.cluster
from integration.apache.log_control import wait_for_log, watermarks
from integration.conftest import KafkaTool, Rec
from statesnap import CheckpointOptions, Table
from statesnap.checkpoint.manifest import CheckpointManifest
from statesnap.errors import NoUsableCheckpointError

pytestmark = pytest.mark.integration

PARTITIONS = 2


def _batch(tag: str, n: int) -> list[tuple[int, bytes, bytes | None]]:
    """*n* records over 10 keys per partition: later batches overwrite and delete earlier keys."""
    out: list[tuple[int, bytes, bytes | None]] = []
    for i in range(n):
        p, k = i % PARTITIONS, i % 20
        out.append((p, b"k%02d" % k, None if (i % 7 == 6) else f"{tag}-{i}".encode()))
    return out


def _checkpoint(kafka: KafkaTool, topic: str, url: str) -> CheckpointManifest:
    t = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)
    t.start()
    m = t.checkpoint()
    t.close(checkpoint=False)
    assert m is not None
    return m


def _delete_records(bootstrap: str, topic: str, before: dict[int, int]) -> None:
    """Kafka's DeleteRecords: the log of each partition starts at *before* afterwards."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.delete_records([TopicPartition(topic, p, off) for p, off in before.items()])
    for f in futures.values():
        f.result(15)


def _history(kafka: KafkaTool, topic: str) -> list[Rec]:
    return kafka.read_all(topic, range(PARTITIONS))


def test_delete_records_past_an_old_checkpoint_leaves_the_newer_one_usable(
    kafka: KafkaTool, tmp_path: Path
) -> None:
    """Apache Kafka 4.1.1 proved it: DeleteRecords moved partition 0's log start between the
    resume offsets of checkpoints 1 and 2. Restore uses checkpoint 2 and equals the table of the
    full history (the plain consumer no longer can: it misses the deleted records)."""
    topic = kafka.create_topic(f"ret-{uuid.uuid4().hex[:10]}", PARTITIONS)
    url = (tmp_path / "cp").as_uri()
    produced = kafka.produce(topic, _batch("a", 100))
    first = _checkpoint(kafka, topic, url)
    produced += kafka.produce(topic, _batch("b", 100))
    second = _checkpoint(kafka, topic, url)
    produced += kafka.produce(topic, _batch("c", 60))
    cut = {0: first.offsets[0] + 10}
    assert cut[0] < second.offsets[0]
    _delete_records(kafka.bootstrap, topic, cut)
    assert watermarks(kafka.bootstrap, topic, PARTITIONS)[0][0] == cut[0]

    t = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)
    report = t.start()
    try:
        assert report.checkpoint == second.generation
        assert report.skipped == []
        assert report.replayed_records == 60
        assert dict(t.raw_items()) == kafka.truth(produced)
    finally:
        t.close(checkpoint=False)


def test_delete_records_past_every_checkpoint_replays_what_is_left_or_fails_if_required(
    kafka: KafkaTool, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Apache Kafka 4.1.1 proved it: DeleteRecords moved partition 1's log start past both
    checkpoints' resume offsets. Each is skipped with the offsets in the reason; the table
    replays what the log holds (the plain-consumer ground truth) and says it does; with
    require_checkpoint=True the restore fails naming the reason instead."""
    topic = kafka.create_topic(f"ret-{uuid.uuid4().hex[:10]}", PARTITIONS)
    url = (tmp_path / "cp").as_uri()
    kafka.produce(topic, _batch("a", 100))
    first = _checkpoint(kafka, topic, url)
    kafka.produce(topic, _batch("b", 100))
    second = _checkpoint(kafka, topic, url)
    kafka.produce(topic, _batch("c", 60))
    cut = {1: second.offsets[1] + 5}
    _delete_records(kafka.bootstrap, topic, cut)

    with pytest.raises(NoUsableCheckpointError, match=f"log now starts at {cut[1]}"):
        Table(
            topic,
            bootstrap_servers=kafka.bootstrap,
            checkpoints=CheckpointOptions(url, require=True),
            background=False,
        ).start()

    t = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)
    with caplog.at_level(logging.WARNING, logger="statesnap"):
        report = t.start()
    try:
        assert report.checkpoint is None
        assert [s.generation for s in report.skipped] == [second.generation, first.generation]
        assert all(f"log now starts at {cut[1]}" in s.reason for s in report.skipped)
        assert any("replaying from the beginning" in r.getMessage() for r in caplog.records)
        assert dict(t.raw_items()) == kafka.truth(_history(kafka, topic))
    finally:
        t.close(checkpoint=False)


def test_time_retention_moves_the_log_start_past_a_checkpoint(kafka: KafkaTool, tmp_path: Path) -> None:
    """Apache Kafka 4.1.1 proved it: retention.ms=1000 with 100 ms segments deleted, on its own,
    the segments below a checkpoint's resume offsets. The checkpoint is skipped ("retention
    deleted records this checkpoint never saw") and the table equals what the log holds."""
    topic = kafka.create_topic(
        f"ttl-{uuid.uuid4().hex[:10]}", PARTITIONS, {"retention.ms": "1000", "segment.ms": "100"}
    )
    url = (tmp_path / "cp").as_uri()
    kafka.produce(topic, _batch("a", 100))
    cp = _checkpoint(kafka, topic, url)

    def past_checkpoint(marks: Mapping[int, tuple[int, int]]) -> bool:
        kafka.produce(topic, [(p, b"late", b"x") for p in range(PARTITIONS)])  # rolls the segment
        return any(low > cp.offsets[p] for p, (low, _high) in marks.items())

    wait_for_log(kafka.bootstrap, topic, PARTITIONS, past_checkpoint, "retention past the checkpoint")
    # Stop retention here, or it goes on emptying the log while the test compares.
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", "-1", incremental_operation=AlterConfigOpType.SET)
    ])  # fmt: skip
    for f in admin.incremental_alter_configs([resource]).values():
        f.result(15)
    time.sleep(1)  # a retention pass already under way finishes
    kafka.produce(topic, _batch("b", 20))
    truth = kafka.truth(_history(kafka, topic))
    t = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)
    report = t.start()
    try:
        assert report.checkpoint is None
        assert "retention deleted records this checkpoint never saw" in report.skipped[0].reason
        assert dict(t.raw_items()) == truth == kafka.truth(_history(kafka, topic))
    finally:
        t.close(checkpoint=False)


def test_retention_between_choosing_and_reading_a_checkpoint_is_not_skipped_over(
    kafka: KafkaTool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Apache Kafka 4.1.1 proved it: DeleteRecords moved the log start past the checkpoint's resume
    offset after restore judged the checkpoint usable (the race is pinned by answering the
    log-start query with its earlier value). The broker then answers the fetch at the resume
    offset with OFFSET_OUT_OF_RANGE. Continuing at the new log start would build checkpoint +
    a tail with a hole in it — a table no replay could produce; statesnap drops the checkpoint
    and replays what the log holds instead."""
    topic = kafka.create_topic(f"race-{uuid.uuid4().hex[:10]}", PARTITIONS)
    url = (tmp_path / "cp").as_uri()
    kafka.produce(topic, _batch("a", 100))
    cp = _checkpoint(kafka, topic, url)
    kafka.produce(topic, _batch("b", 100))
    before = {p: low for p, (low, _high) in watermarks(kafka.bootstrap, topic, PARTITIONS).items()}
    _delete_records(kafka.bootstrap, topic, {0: cp.offsets[0] + 20})
    monkeypatch.setattr(statesnap.task.cluster, "log_start_offsets", lambda *_a: before)

    t = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)
    report = t.start()
    try:
        assert report.checkpoint is None
        assert [s.generation for s in report.skipped] == [cp.generation]
        assert f"retention deleted offsets {cp.offsets[0]}..{cp.offsets[0] + 19}" in report.skipped[0].reason
        assert dict(t.raw_items()) == kafka.truth(_history(kafka, topic))
    finally:
        t.close(checkpoint=False)

    with pytest.raises(statesnap.errors.StatesnapError, match="partition 0"):
        Table(
            topic,
            bootstrap_servers=kafka.bootstrap,
            checkpoints=CheckpointOptions(url, require=True),
            background=False,
        ).start()


@pytest.mark.timeout(120)  # the failure this guards against is a member that waits forever
def test_a_group_member_restores_a_partition_again_when_retention_passes_its_checkpoint(
    kafka: KafkaTool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Apache Kafka 4.1.1 proved it: as above, for a consumer-group member. DeleteRecords moved
    partition 0's log start past the checkpoint after the member chose it (pinned by answering
    the member's first log-start query with the earlier value). The member drops partition 0's
    rows and restores it again — now by replaying what the log holds — while partition 1 stays
    restored from the checkpoint; the table equals the plain-consumer ground truth."""
    from statesnap.kafka.group_reader import GroupReader

    topic = kafka.create_topic(f"grp-{uuid.uuid4().hex[:10]}", PARTITIONS)
    url = (tmp_path / "cp").as_uri()
    kafka.produce(topic, [(p, b"old-%d-%d" % (p, i % 10), b"a%d" % i) for i in range(50) for p in (0, 1)])
    cp = _checkpoint(kafka, topic, url)
    kafka.produce(topic, [(p, b"new-%d-%d" % (p, i % 10), b"b%d" % i) for i in range(50) for p in (0, 1)])
    _delete_records(kafka.bootstrap, topic, {0: cp.offsets[0] + 20})

    real = GroupReader.log_start
    calls: list[list[int]] = []

    def stale_once(self: GroupReader, partitions: list[int]) -> dict[int, int]:
        calls.append(list(partitions))
        return dict.fromkeys(partitions, 0) if len(calls) == 1 else real(self, partitions)

    monkeypatch.setattr(GroupReader, "log_start", stale_once)
    t = Table(
        topic,
        bootstrap_servers=kafka.bootstrap,
        checkpoints=CheckpointOptions(url, interval="1h"),
        group=f"g-{uuid.uuid4().hex[:8]}",
        background=False,
    )
    try:
        t.start()
        assert calls[0] == [0, 1]
        assert calls[1:] == [[0]], "partition 0 alone was restored again"
        table = dict(t.raw_items())
        assert table == kafka.truth(_history(kafka, topic))
        assert not any(k.startswith(b"old-0-") for k in table)
        assert all(b"old-1-%d" % i in table for i in range(10))  # partition 1: from the checkpoint
    finally:
        t.close(checkpoint=False)


@pytest.mark.parametrize("group", [False, True], ids=["assigned", "group-member"])
def test_a_running_table_whose_unread_records_retention_deleted_continues_at_the_log_start(
    kafka: KafkaTool, tmp_path: Path, caplog: pytest.LogCaptureFixture, group: bool
) -> None:
    """Apache Kafka 4.1.1 proved it: a caught-up table falls behind, and DeleteRecords removes
    records it had not read yet (its fetcher is paused meanwhile, as a consumer whose queue is
    full would be). The broker answers its fetch with OFFSET_OUT_OF_RANGE; the
    table continues at the new log start, as a full replay of the log would, and says which
    offsets it never saw. A consumer-group member used to wait forever here (librdkafka refuses
    to seek a partition after that error); it now catches up like the assigned reader."""
    topic = kafka.create_topic(f"lag-{uuid.uuid4().hex[:10]}", PARTITIONS)
    produced = kafka.produce(topic, _batch("a", 40))
    t = Table(
        topic,
        bootstrap_servers=kafka.bootstrap,
        background=False,
        group=f"g-{uuid.uuid4().hex[:8]}" if group else None,
    )
    try:
        t.start()
        # Falling behind, made deterministic: librdkafka prefetches whatever arrives, so its
        # fetcher for partition 0 is paused while records arrive and are deleted.
        consumer = t.task.loop.reader._consumer  # type: ignore[union-attr]
        consumer.pause([TopicPartition(topic, 0)])
        produced += kafka.produce(topic, _batch("b", 100))
        cut = {0: 20 + 30}  # partition 0 holds offsets 0..69; the table has read up to 20
        _delete_records(kafka.bootstrap, topic, cut)
        consumer.resume([TopicPartition(topic, 0)])
        end = kafka.end_offsets(produced, range(PARTITIONS))
        with caplog.at_level(logging.WARNING, logger="statesnap"):
            deadline = time.monotonic() + 30
            while any(t.offsets.get(p, 0) < end[p] for p in range(PARTITIONS)):
                assert time.monotonic() < deadline, f"stuck at {t.offsets}, the log ends at {end}"
                t.poll(0.1)
        assert any("offsets 20..49 were deleted by retention" in r.getMessage() for r in caplog.records)
        assert dict(t.raw_items()) == kafka.truth(
            [r for r in produced if r.partition == 1 or r.offset < 20 or r.offset >= cut[0]]
        )
    finally:
        t.close(checkpoint=False)


def test_a_record_timestamped_30_days_ago_survives_on_the_dev_broker(kafka: KafkaTool) -> None:
    """Apache Kafka 4.1.1 (the dev broker's settings, ``TEST_SETTINGS``) proved it: a topic that
    does not ask for retention keeps a record whose timestamp is 30 days old, through many
    retention checks (every 200 ms) and segment rolls. Kafka's default, 7 days, deleted it within
    a second: the dev broker emptied event-time test data (issue 34)."""
    topic = f"old-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config={"segment.ms": "100"})])[topic].result(15)
    resource = ConfigResource(ResourceType.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(15)
    assert configs["retention.ms"].value == "-1", "no retention unless the topic asks for it"
    month_ago = int((time.time() - 30 * 86400) * 1000)
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "acks": "all"})
    producer.produce(topic, key=b"event", value=b"old", timestamp=month_ago)
    assert producer.flush(15) == 0
    deadline = time.monotonic() + 3  # ~15 retention checks; 7-day retention deleted it in < 1 s
    while time.monotonic() < deadline:
        producer.produce(topic, key=b"late", value=b"x")  # rolls the 100 ms segment below it
        producer.flush(15)
        time.sleep(0.2)
    assert watermarks(kafka.bootstrap, topic, 1)[0][0] == 0, "the log start moved: records were deleted"
    first = kafka.read_all(topic, [0])[0]
    assert (first.offset, first.key, first.value) == (0, b"event", b"old")
