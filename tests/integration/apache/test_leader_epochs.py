"""Leader epochs kept with a checkpoint's offsets (KIP-320), on a real Apache Kafka 4.1.1 broker.

A checkpoint records, per partition, the leader epoch of the last record it applied; a restore
has the broker check its log still holds that epoch up to the checkpoint's offset. Truncating a
log needs a broker restart (tests/integration/apache/test_broker_restart.py, long); here, on the
session broker, a checkpoint whose epoch the log never had stands for one whose log diverged: the
broker's OffsetForLeaderEpoch answers "no such epoch" to it exactly as librdkafka then reports a
truncation. Tansu writes epoch 0 and checks nothing: the Tansu checkpoint and restore tests passing
unchanged prove the epochs are harmless there.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer

import statesnap.checkpoint.selection
from integration.conftest import KafkaTool
from statesnap import CheckpointOptions, Table
from statesnap.blob import open_blob_store
from statesnap.checkpoint import CheckpointRepository
from statesnap.checkpoint.manifest import CheckpointManifest, NextOffset, leader_epoch_of
from statesnap.checkpoint.selection import TopicState
from statesnap.checkpoint.writer import PartitionUpdate
from statesnap.errors import NoUsableCheckpointError, OffsetOutOfRangeError
from statesnap.kafka.config import KafkaSettings
from statesnap.kafka.reader import ChangelogReader
from statesnap.task.write import write_checkpoint

pytestmark = pytest.mark.integration

#: An epoch no partition of the session broker reaches: it restarts at most a few times.
UNSEEN_EPOCH = 999


def _topic_with_records(kafka: KafkaTool) -> tuple[str, dict[bytes, bytes]]:
    topic = kafka.create_topic(f"epochs-{uuid.uuid4().hex[:10]}", 2)
    kafka.produce(topic, [(i % 2, b"k%d" % (i % 30), b"v%d" % i) for i in range(200)])
    return topic, kafka.truth(kafka.read_all(topic, [0, 1]))


def test_a_checkpoint_keeps_the_leader_epoch_and_a_restore_validated_by_it_equals_a_replay(
    kafka: KafkaTool, tmp_path: Path
) -> None:
    """Apache Kafka 4.1.1: the manifest holds each partition's leader epoch (0 on a fresh topic);
    a restore assigned with it is validated by the broker, found intact and continues."""
    topic, truth = _topic_with_records(kafka)
    url = (tmp_path / "cp").as_uri()
    writer = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)
    writer.start()
    cp = writer.checkpoint()
    writer.close(checkpoint=False)
    assert cp is not None
    assert {p: pc.leader_epoch for p, pc in cp.partitions.items()} == {0: 0, 1: 0}
    (manifest,) = (tmp_path / "cp").glob("*/snapshots/*.json")
    assert {p: pc["leader_epoch"] for p, pc in json.loads(manifest.read_text())["partitions"].items()} == {
        "0": 0,
        "1": 0,
    }

    kafka.produce(topic, [(i % 2, b"k%d" % (i % 30), b"w%d" % i) for i in range(40)])
    restored = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)
    try:
        report = restored.start()
        assert report.checkpoint == cp.generation
        assert report.replayed_records == 40
        assert dict(restored.raw_items()) == kafka.truth(kafka.read_all(topic, [0, 1]))
    finally:
        restored.close(checkpoint=False)
    assert truth  # the first 200 records were there to checkpoint


def test_a_checkpoint_whose_epoch_the_log_never_had_is_skipped_for_the_older_one(
    kafka: KafkaTool, tmp_path: Path
) -> None:
    """Apache Kafka 4.1.1: generation 2 claims leader epoch 999 at the same offsets as generation
    1 (epoch 0). The broker has no such epoch (OffsetForLeaderEpoch answers -1), so the log cannot
    hold the records it claims: it is skipped with the reason, generation 1 is used, and the table
    equals a replay. Pinned to generation 2, the restore fails in one typed line."""
    topic, truth = _topic_with_records(kafka)
    url = (tmp_path / "cp").as_uri()
    writer = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)
    writer.start()
    cp = writer.checkpoint()
    cluster_id = writer.cluster_id
    writer.close(checkpoint=False)
    assert cp is not None
    assert cluster_id is not None
    repo = CheckpointRepository.for_table(open_blob_store(url), cluster_id, topic)
    diverged = write_checkpoint(
        repo,
        table=topic,
        topic=topic,
        cluster_id=cluster_id,
        updates={p: PartitionUpdate(p, NextOffset(off, UNSEEN_EPOCH)) for p, off in cp.offsets.items()},
        previous=cp,
    )
    assert diverged.partitions[0].leader_epoch == UNSEEN_EPOCH

    restored = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)
    try:
        report = restored.start()
        assert report.checkpoint == cp.generation
        assert [s.generation for s in report.skipped] == [diverged.generation]
        assert f"knows no leader epoch {UNSEEN_EPOCH}" in report.skipped[0].reason
        assert dict(restored.raw_items()) == truth
    finally:
        restored.close(checkpoint=False)

    pinned = Table(
        topic,
        bootstrap_servers=kafka.bootstrap,
        checkpoints=CheckpointOptions(url, generation=diverged.generation),
        background=False,
    )
    try:
        with pytest.raises(NoUsableCheckpointError, match="leader epoch") as refused:
            pinned.start()
        assert "\n" not in str(refused.value)
    finally:
        pinned.close(checkpoint=False)


def _poll_for(reader: ChangelogReader, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        reader.poll(0.1)


def test_a_reader_at_a_position_the_log_does_not_lead_to_fails_in_one_line(kafka: KafkaTool) -> None:
    """Apache Kafka 4.1.1: a reader assigned at an offset inside the log, but after a record of an
    epoch the log never had (what a restore meets when the log is truncated after its checkpoint
    was chosen), raises :class:`OffsetOutOfRangeError` saying the log was truncated, within a
    second, instead of reading records that are not the ones the position followed."""
    topic, _truth = _topic_with_records(kafka)
    settings = KafkaSettings(kafka.bootstrap, {}, 10.0)
    reader = ChangelogReader(settings, topic, {0: NextOffset(50, UNSEEN_EPOCH), 1: NextOffset(50, 0)})
    started = time.monotonic()
    try:
        with pytest.raises(OffsetOutOfRangeError) as refused:
            _poll_for(reader, 20)
        assert time.monotonic() - started < 5
        assert refused.value.partition == 0
        text = str(refused.value)
        assert "truncated below next offset 50" in text
        assert f"knows no leader epoch {UNSEEN_EPOCH}" in text
        assert kafka.bootstrap in text
        assert "\n" not in text
    finally:
        reader.close()


def test_a_group_member_restores_a_partition_again_when_the_log_turns_out_truncated_under_it(
    kafka: KafkaTool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Apache Kafka 4.1.1: the race a selector cannot close — the log is truncated after the
    checkpoint was chosen — stood for by a first choice that asks nothing about epochs (so a
    member of a consumer group restores generation 2, epoch 999, the log never had). The group
    reader, assigned there with the epoch, is told the log does not lead to it, drops the
    partitions' rows and restores them again: the second choice asks, skips generation 2 for
    generation 1, and the table equals a replay."""
    topic, truth = _topic_with_records(kafka)
    url = (tmp_path / "cp").as_uri()
    writer = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)
    writer.start()
    cp = writer.checkpoint()
    cluster_id = writer.cluster_id
    writer.close(checkpoint=False)
    assert cp is not None
    assert cluster_id is not None
    repo = CheckpointRepository.for_table(open_blob_store(url), cluster_id, topic)
    write_checkpoint(
        repo,
        table=topic,
        topic=topic,
        cluster_id=cluster_id,
        updates={p: PartitionUpdate(p, NextOffset(off, UNSEEN_EPOCH)) for p, off in cp.offsets.items()},
        previous=cp,
    )
    asked: list[int] = []
    real_diverged = statesnap.checkpoint.selection.diverged

    def blind_first(manifest: CheckpointManifest, state: TopicState | None) -> str | None:
        asked.append(manifest.generation)
        return None if len(asked) == 1 else real_diverged(manifest, state)

    kafka.produce(topic, [(i % 2, b"k%d" % (i % 30), b"w%d" % i) for i in range(40)])  # a tail to read
    truth = kafka.truth(kafka.read_all(topic, [0, 1]))
    monkeypatch.setattr("statesnap.checkpoint.restore.diverged", blind_first)
    member = Table(
        topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, group=f"g-{uuid.uuid4().hex[:8]}"
    )
    try:
        member.start()
        deadline = time.monotonic() + 30
        while dict(member.raw_items()) != truth:
            assert time.monotonic() < deadline, f"{len(dict(member.raw_items()))} of {len(truth)} keys"
            time.sleep(0.1)
        assert asked[0] == cp.generation + 1  # restored blind first, then asked again
        assert len(asked) >= 2
    finally:
        member.close(checkpoint=False)


def test_a_position_past_a_transaction_marker_keeps_the_markers_epoch(kafka: KafkaTool) -> None:
    """Apache Kafka 4.1.1: a committed transaction ends with a marker that takes an offset of its
    own; a reader at the marker moves past it without a record (partition EOF). That position
    still carries a leader epoch (librdkafka's fetch position has the marker's), so a checkpoint
    taken there keeps one and is checked on restore like any other."""
    topic = kafka.create_topic(f"epochs-tx-{uuid.uuid4().hex[:10]}", 1)
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": f"txn-{uuid.uuid4().hex}"})
    producer.init_transactions(15)
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic, key=b"k%d" % i, value=b"v", partition=0)
    producer.commit_transaction(15)
    reader = ChangelogReader(KafkaSettings(kafka.bootstrap, {}, 10.0), topic, {0: 10})  # at the marker
    try:
        deadline = time.monotonic() + 20
        while not reader.caught_up:
            assert time.monotonic() < deadline
            assert reader.poll(0.1) == {}
        assert reader.positions == {0: 11}
        assert leader_epoch_of(reader.positions[0]) == 0
    finally:
        reader.close()
