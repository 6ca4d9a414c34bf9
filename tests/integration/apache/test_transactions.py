"""Transactions on Apache Kafka: ``read_committed`` really hides aborted records.

Tansu shows them to ``read_committed`` readers, so nothing in statesnap may depend on their being
hidden (the topic snapshot store reads ``read_uncommitted`` and lets its chain decide). Here the
broker that hides them shows (a) a table built from a topic with aborted transactions holds only
committed records, restored from a checkpoint or replayed, and (b) the snapshot store's contract
and its transaction cases hold unchanged (the Tansu module's own tests, run on this broker).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka import KafkaError as RdKafkaError

from integration.conftest import KafkaTool
from integration.test_topic_snapshot_store import (  # the same cases, on Apache Kafka here
    TestSnapshotStoreContract,
    backend,
    open_topic_store,
    settings,
    store,
    test_a_commit_whose_answer_is_lost_is_applied_once,
    test_an_aborted_attempt_that_chains_is_applied_once,
    test_creates_a_single_partition_topic_that_never_expires,
    test_records_that_do_not_chain_are_ignored_committed_or_aborted,
)
from statesnap import Table

pytestmark = pytest.mark.integration

__all__ = [
    "TestSnapshotStoreContract",
    "backend",
    "open_topic_store",
    "settings",
    "store",
    "test_a_commit_whose_answer_is_lost_is_applied_once",
    "test_an_aborted_attempt_that_chains_is_applied_once",
    "test_creates_a_single_partition_topic_that_never_expires",
    "test_records_that_do_not_chain_are_ignored_committed_or_aborted",
]


def _transaction(
    producer: Producer, topic: str, records: list[tuple[int, bytes, bytes]], commit: bool
) -> None:
    producer.begin_transaction()
    for p, k, v in records:
        producer.produce(topic, v, k, partition=p)
    producer.flush(15)
    if commit:
        producer.commit_transaction(15)
    else:
        producer.abort_transaction(15)


def _values(bootstrap: str, topic: str, isolation: str) -> list[bytes]:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "test-isolation",
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 10,
            "isolation.level": isolation,
        }
    )
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        out: list[bytes] = []
        for _ in range(200):
            m = c.poll(0.1)
            if m is None:
                continue
            err = m.error()
            if err is not None and err.code() == RdKafkaError._PARTITION_EOF:
                return out
            if err is None:
                value = m.value()
                assert value is not None
                out.append(value)
        raise AssertionError(f"no end of {topic} within 20 s")
    finally:
        c.close()


def test_a_table_holds_only_committed_records(kafka: KafkaTool, tmp_path: Path) -> None:
    """Apache Kafka 4.1.1 proved it: a read_uncommitted consumer sees the aborted transaction's
    records, a read_committed one does not, and the table — replayed, then restored from a
    checkpoint taken between the transactions plus its tail — holds only committed values."""
    topic = kafka.create_topic(f"txn-{uuid.uuid4().hex[:10]}", 1)
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": f"txn-{uuid.uuid4().hex}"})
    producer.init_transactions(15)
    _transaction(producer, topic, [(0, b"a", b"a1"), (0, b"b", b"b1")], commit=True)
    url = (tmp_path / "cp").as_uri()
    t = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)
    t.start()
    cp = t.checkpoint()
    t.close(checkpoint=False)
    assert cp is not None
    _transaction(producer, topic, [(0, b"a", b"aborted"), (0, b"c", b"aborted")], commit=False)
    _transaction(producer, topic, [(0, b"b", b"b2"), (0, b"d", b"d2")], commit=True)

    assert b"aborted" in _values(kafka.bootstrap, topic, "read_uncommitted")
    assert b"aborted" not in _values(kafka.bootstrap, topic, "read_committed")
    expected = {b"a": b"a1", b"b": b"b2", b"d": b"d2"}

    restored = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)
    report = restored.start()
    try:
        assert report.checkpoint == cp.generation
        assert dict(restored.raw_items()) == expected
    finally:
        restored.close(checkpoint=False)
    replayed = Table(topic, bootstrap_servers=kafka.bootstrap, background=False)
    replayed.start()
    try:
        assert dict(replayed.raw_items()) == expected
    finally:
        replayed.close(checkpoint=False)
