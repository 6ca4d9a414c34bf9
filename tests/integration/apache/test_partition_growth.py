"""A topic that grows partitions (CreatePartitions, KIP-195) after a checkpoint, on a broker that
grows topics for real.

Apache Kafka 4.1.1 proved it: the partition is added to the live topic and producers write to
it; the restore resumes the old partitions from the checkpoint and reads the new one from offset
0; the next checkpoint holds all of them. Tansu rejects CreatePartitions, so
tests/integration/test_table_api.py shows the same rule there on a faked "before" topology.
Ground truth: a plain consumer's read of every partition.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from confluent_kafka.admin import NewPartitions  # type: ignore[attr-defined]  # re-exported without __all__

from integration.conftest import KafkaTool
from statesnap import CheckpointOptions, Table


def test_partitions_added_after_a_checkpoint_are_read_from_the_beginning(
    kafka: KafkaTool, tmp_path: Path
) -> None:
    topic = kafka.create_topic(f"grow-{uuid.uuid4().hex[:12]}", 2)
    url = (tmp_path / "cp").as_uri()
    kafka.produce(topic, [(0, b"a", b"1"), (1, b"b", b"1"), (0, b"c", b"1")])
    old = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)
    old.start()
    manifest = old.checkpoint()
    old.close(checkpoint=False)
    assert manifest is not None
    assert sorted(manifest.partitions) == [0, 1]

    kafka.admin.create_partitions([NewPartitions(topic, 3)])[topic].result(10)
    # The producer learns of the partition from a metadata refresh: ask for one until it has.
    KafkaTool.wait_for(
        lambda: len(kafka.producer.list_topics(topic, timeout=5).topics[topic].partitions) == 3,
        what=f"the producer to see partition 2 of {topic}",
    )
    kafka.produce(
        topic, [(2, b"n1", b"new"), (2, b"n2", b"new"), (2, b"n1", None), (2, b"n3", b"x"), (1, b"b", b"2")]
    )
    truth = KafkaTool.truth(kafka.read_all(topic, range(3)))

    t = Table(
        topic,
        bootstrap_servers=kafka.bootstrap,
        checkpoints=CheckpointOptions(url, require=True),
        background=False,
    )
    report = t.start()
    try:
        assert report.checkpoint == manifest.generation
        assert t.partitions == (0, 1, 2)
        assert report.replayed_records == 5  # 4 on the new partition from offset 0, 1 on p1
        assert t.offsets == {0: 2, 1: 2, 2: 4}
        assert dict(t.raw_items()) == truth
        grown = t.checkpoint()
        assert grown is not None
        assert grown.offsets == {0: 2, 1: 2, 2: 4}
    finally:
        t.close(checkpoint=False)
