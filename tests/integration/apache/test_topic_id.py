"""A recreated topic is another incarnation: Kafka gives it a new topic ID (KIP-516), and the old
topic's checkpoints are refused with that reason — even when the new topic has grown past the old
offsets, where offsets alone could not tell them apart. Ground truth: a plain consumer's read of
the new topic. Where a broker reports no topic ID, the fallback signal (a resume offset past the
new partition's end, which Apache Kafka answers with OFFSET_OUT_OF_RANGE) is checked too, by the
Tansu module's own case run here."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from integration.conftest import KafkaTool
from integration.test_topic_incarnation import (  # the same case, on Apache Kafka here
    test_without_topic_ids_a_checkpoint_past_the_end_falls_back_to_a_full_replay,
)
from statesnap import CheckpointOptions, Table
from statesnap.errors import NoUsableCheckpointError
from statesnap.kafka.config import KafkaSettings
from statesnap.kafka.identity import topic_id

pytestmark = pytest.mark.integration

__all__ = ["test_without_topic_ids_a_checkpoint_past_the_end_falls_back_to_a_full_replay"]


def _recreate(kafka: KafkaTool, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    admin.delete_topics([topic])[topic].result(15)
    deadline = time.monotonic() + 30
    while True:
        try:
            kafka.create_topic(topic, partitions)
            return
        except Exception as e:  # Kafka refuses the name while the deletion is still under way
            error = e
        if time.monotonic() > deadline:
            raise AssertionError(f"could not recreate {topic}: {error}")
        time.sleep(0.2)


def test_a_recreated_topic_has_a_new_id_and_old_checkpoints_are_refused(
    kafka: KafkaTool, tmp_path: Path
) -> None:
    """Apache Kafka 4.1.1 proved it: delete + create under the same name gives a new topic ID;
    the checkpoint of the old incarnation (resume offsets below the new topic's end) is skipped
    with both IDs in the reason, the table equals the new topic, and require_checkpoint=True
    fails instead of mixing incarnations."""
    topic = kafka.create_topic(f"inc-{uuid.uuid4().hex[:10]}", 2)
    settings = KafkaSettings(kafka.bootstrap)
    kafka.produce(topic, [(i % 2, b"old-%d" % (i % 30), b"v%d" % i) for i in range(200)])
    url = (tmp_path / "cp").as_uri()
    t = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)
    t.start()
    old = t.checkpoint()
    t.close(checkpoint=False)
    assert old is not None
    assert old.topic_id == topic_id(settings, topic)

    _recreate(kafka, topic, 2)
    new_id = topic_id(settings, topic)
    assert new_id is not None
    assert new_id != old.topic_id
    kafka.produce(topic, [(i % 2, b"new-%d" % (i % 40), b"w%d" % i) for i in range(400)])
    truth = kafka.truth(kafka.read_all(topic, [0, 1]))

    with pytest.raises(NoUsableCheckpointError, match="another incarnation"):
        Table(
            topic,
            bootstrap_servers=kafka.bootstrap,
            checkpoints=CheckpointOptions(url, require=True),
            background=False,
        ).start()
    r = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)
    report = r.start()
    try:
        assert report.checkpoint is None
        (skipped,) = report.skipped
        assert skipped.generation == old.generation
        assert f"topic ID {old.topic_id}" in skipped.reason
        assert f"now has ID {new_id}" in skipped.reason
        assert dict(r.raw_items()) == truth
        assert not any(k.startswith(b"old-") for k in truth)
    finally:
        r.close(checkpoint=False)
