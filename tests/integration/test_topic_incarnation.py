"""A checkpoint belongs to one incarnation of one topic: after the topic is deleted and recreated
under the same name, its old checkpoints are skipped with the reason logged — even when the new
topic has grown past the old offsets — and restore equals the new topic, never a mix.

Proven on the embedded broker, which reports Kafka topic IDs (KIP-516) and deletes topics; the
ground truth is an independent plain-consumer read of the new topic.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from statesnap import Follower, Table

pytestmark = pytest.mark.integration


def _recreate(bootstrap: str, topic: str, kafka: Any, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result(15)
    deadline = time.monotonic() + 15
    while topic in admin.list_topics(timeout=5).topics:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    kafka.create_topic(topic, partitions)


def test_checkpoints_of_a_deleted_topic_are_not_restored_into_its_successor(
    kafka: Any, tmp_path: Path
) -> None:
    topic = kafka.create_topic(f"inc-{uuid.uuid4().hex[:10]}", 2)
    kafka.produce(topic, [(i % 2, b"old-%d" % (i % 50), b"v%d" % i) for i in range(300)])
    url = str(tmp_path / "ckpt")
    t = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)
    t.start()
    old = t.checkpoint()
    t.close(checkpoint=False)
    assert old is not None
    assert old.topic_id

    _recreate(kafka.bootstrap, topic, kafka, 2)
    # the new topic grows past the old offsets: offsets alone could not tell them apart
    kafka.produce(topic, [(i % 2, b"new-%d" % (i % 40), b"w%d" % i) for i in range(500)])
    truth = kafka.truth(kafka.read_all(topic, [0, 1]))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "statesnap.cli",
            "dump",
            "-b",
            kafka.bootstrap,
            "-t",
            topic,
            "--checkpoints",
            url,
            "--digest",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    dumped = json.loads(out.stdout)
    assert dumped["checkpoint"] is None
    assert dumped["keys"] == len(truth)
    (skipped,) = dumped["skipped"]
    assert skipped["generation"] == old.generation
    assert "another incarnation" in skipped["reason"]


def test_without_topic_ids_a_checkpoint_past_the_end_falls_back_to_a_full_replay(
    kafka: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a broker that reports no topic IDs (older Kafka; simulated by hiding the dev broker's),
    a recreated topic shorter than the old one is detected by the fallback signal: the restored
    checkpoint resumes past a partition's end. No hang: the checkpoint is skipped with the
    reason, the table replays the new topic from the beginning."""
    monkeypatch.setattr("statesnap.task.cluster.topic_id", lambda *_a: None)
    topic = kafka.create_topic(f"inc-{uuid.uuid4().hex[:10]}", 2)
    kafka.produce(topic, [(i % 2, b"old-%d" % (i % 50), b"v%d" % i) for i in range(400)])
    url = str(tmp_path / "ckpt")
    t = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)
    t.start()
    old = t.checkpoint()
    t.close(checkpoint=False)
    assert old is not None
    assert old.topic_id is None

    _recreate(kafka.bootstrap, topic, kafka, 2)
    kafka.produce(topic, [(i % 2, b"new-%d" % (i % 10), b"w%d" % i) for i in range(60)])
    truth = kafka.truth(kafka.read_all(topic, [0, 1]))
    r = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False, timeout=10)
    started = time.monotonic()
    report = r.start()
    try:
        assert time.monotonic() - started < 30
        assert report.checkpoint is None
        assert [s.generation for s in report.skipped] == [old.generation]
        assert "another incarnation" in report.skipped[0].reason
        assert dict(r.raw_items()) == truth
    finally:
        r.close()


def test_a_key_in_two_partitions_is_reported_at_restore(
    kafka: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One key written to two partitions (two producers with different partitioners) breaks the
    one-partition-per-key contract a table relies on. A checkpoint whose partitions were folded
    apart (as the Spark bootstrap does) then holds the key twice; restore, where it is cheap to
    see (fewer keys than checkpointed rows), says so."""
    import pyarrow as pa

    from statesnap.blob import open_blob_store
    from statesnap.checkpoint import CheckpointRepository, PartitionUpdate
    from statesnap.checkpoint.datafile import SCHEMA
    from statesnap.kafka.admin import KafkaAdmin
    from statesnap.kafka.config import KafkaSettings
    from statesnap.task.write import write_checkpoint

    topic = kafka.create_topic(f"dup-{uuid.uuid4().hex[:10]}", 2)
    kafka.produce(topic, [(0, b"shared", b"from-0"), (1, b"shared", b"from-1"), (0, b"only-0", b"x")])
    cluster = KafkaAdmin(KafkaSettings(kafka.bootstrap)).cluster_id()
    url = str(tmp_path / "ckpt")
    repo = CheckpointRepository.for_table(open_blob_store(url), cluster, topic)

    def rows(items: list[tuple[bytes, bytes, int]]) -> pa.Table:
        keys, values, offsets = zip(*items, strict=True)
        return pa.table(
            {"key": keys, "value": values, "offset": offsets, "timestamp": [None] * len(items)}, schema=SCHEMA
        )

    write_checkpoint(
        repo,
        table=topic,
        topic=topic,
        cluster_id=cluster,
        updates={
            0: PartitionUpdate(0, 2, base=rows([(b"only-0", b"x", 1), (b"shared", b"from-0", 0)])),
            1: PartitionUpdate(1, 1, base=rows([(b"shared", b"from-1", 0)])),
        },
    )
    r = Follower(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url)
    with caplog.at_level("WARNING", logger="statesnap"):
        r.start()
    r.close()
    assert any("more than one partition" in rec.getMessage() for rec in caplog.records)
