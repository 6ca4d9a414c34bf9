"""Group tables under the rebalance protocols Tansu cannot run: cooperative-sticky and KIP-848.

Tansu leaves partitions moved by a cooperative rebalance unassigned for many seconds and never
assigns under ``group.protocol=consumer``; Apache Kafka 4.1.1 does both, so these run here.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from integration.conftest import KafkaTool
from statesnap import Table
from statesnap.errors import PartitionNotOwnedError
from statesnap.kafka.partitioner import resolve_partitioner

pytestmark = pytest.mark.integration

PARTITIONS = 6
KEYS = 120
partition_of = resolve_partitioner("murmur2_random")


def _records(tag: str, n: int) -> list[tuple[int, bytes | None, bytes | None]]:
    """Upserts and tombstones, each key in the partition Kafka's default partitioner gives it
    (a group member serves a key by that partition)."""
    out: list[tuple[int, bytes | None, bytes | None]] = []
    for i in range(n):
        key = b"key-%d" % (i % KEYS)
        out.append((partition_of(key, PARTITIONS), key, None if i % 13 == 4 else f"{tag}{i}".encode()))
    return out


class Writer(threading.Thread):
    """Keeps upserting through Kafka's default partitioner until stopped."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.topic = topic
        self.stop = threading.Event()
        self.undelivered = -1

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            for p, key, value in _records(f"w{n}-", 50):
                self.producer.produce(self.topic, value, key, partition=p)
            n += 1
            self.producer.poll(0)
            time.sleep(0.02)
        self.undelivered = self.producer.flush(30)


@pytest.fixture
def tables() -> Iterator[list[Table]]:
    made: list[Table] = []
    yield made
    for t in made:
        t.close(checkpoint=False)


def _member(kafka: KafkaTool, topic: str, url: str, group: str, config: Mapping[str, Any]) -> Table:
    return Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, group=group, kafka_config=config)


def _serving(t: Table) -> bool:
    """Every key of the partitions *t* owns is readable (none still restoring)."""
    try:
        for k in range(KEYS):
            key = b"key-%d" % k
            if t.partition_for(key) in t.partitions:
                t.get(key)
    except PartitionNotOwnedError:
        return False
    return True


def _settled(a: Table, b: Table) -> bool:
    shares = set(a.partitions), set(b.partitions)
    return (
        all(shares)
        and not shares[0] & shares[1]
        and shares[0] | shares[1] == set(range(PARTITIONS))
        and _serving(a)
        and _serving(b)
    )


def test_cooperative_sticky_moves_only_what_changes_owner(
    kafka: KafkaTool, tmp_path: Path, tables: list[Table], caplog: pytest.LogCaptureFixture
) -> None:
    """Apache Kafka 4.1.1 proved it: with ``partition.assignment.strategy=cooperative-sticky``
    (through ``kafka_config``) a second member takes half the partitions; the first gives up
    only those (eager round-robin would revoke all six and reassign), keeps consuming the rest,
    and once settled (the move happened while a producer kept writing) each key is served by
    its owner and refused by the other; the union of the two tables equals a plain consumer's
    replay."""
    topic = kafka.create_topic(f"coop-{uuid.uuid4().hex[:10]}", PARTITIONS)
    url = (tmp_path / "cp").as_uri()
    group = f"g-{uuid.uuid4().hex[:8]}"
    config = {"partition.assignment.strategy": "cooperative-sticky"}
    kafka.produce(topic, _records("a", 600))
    caplog.set_level(logging.INFO, logger="statesnap.kafka.group_reader")

    a = _member(kafka, topic, url, group, config)
    tables.append(a)
    a.start()
    assert set(a.partitions) == set(range(PARTITIONS))
    writer = Writer(kafka.bootstrap, topic)  # the move happens under writes
    writer.start()
    try:
        b = _member(kafka, topic, url, group, config)
        tables.append(b)
        b.start()
        deadline = time.monotonic() + 30
        while not _settled(a, b):
            assert time.monotonic() < deadline, f"no settled split: {a.partitions} / {b.partitions}"
            time.sleep(0.1)
    finally:
        writer.stop.set()
        writer.join(30)
    assert writer.undelivered == 0

    revoked: set[int] = set()  # GroupReader logs each revocation: "group %s: revoked %s of %r"
    for r in caplog.records:
        if "revoked" in str(r.msg) and isinstance(r.args, tuple):
            revoked.update(r.args[1])  # type: ignore[arg-type]
    assert revoked == set(b.partitions), "revoked more than moved: not cooperative"

    kafka.produce(topic, _records("b", 400))  # after the move: both members tail their shares
    records = kafka.read_all(topic, range(PARTITIONS))
    truth = kafka.truth(records)
    ends = kafka.end_offsets(records, range(PARTITIONS))
    for t in (a, b):
        assert t.wait_for({p: ends[p] - 1 for p in t.partitions}, timeout=30)
    rows_a, rows_b = dict(a.raw_items()), dict(b.raw_items())
    assert not set(rows_a) & set(rows_b)
    assert {**rows_a, **rows_b} == truth
    for k in range(KEYS):
        key = b"key-%d" % k
        owner, other = (a, b) if a.partition_for(key) in a.partitions else (b, a)
        assert owner.get(key) == truth.get(key)
        with pytest.raises(PartitionNotOwnedError):
            other.get(key)


def test_the_consumer_group_protocol_shares_partitions(
    kafka: KafkaTool, tmp_path: Path, tables: list[Table]
) -> None:
    """KIP-848 on Apache Kafka 4.1.1: two members split the partitions (the broker assigns,
    incrementally) and together equal a plain replay."""
    topic = kafka.create_topic(f"kip848-{uuid.uuid4().hex[:10]}", PARTITIONS)
    url = (tmp_path / "cp").as_uri()
    group = f"g-{uuid.uuid4().hex[:8]}"
    config = {"group.protocol": "consumer"}
    kafka.produce(topic, _records("a", 300))
    a = _member(kafka, topic, url, group, config)
    tables.append(a)
    a.start()
    b = _member(kafka, topic, url, group, config)
    tables.append(b)
    b.start()
    deadline = time.monotonic() + 30
    while not _settled(a, b):
        assert time.monotonic() < deadline, f"no settled split: {a.partitions} / {b.partitions}"
        time.sleep(0.1)
    truth = kafka.truth(kafka.read_all(topic, range(PARTITIONS)))
    assert {**dict(a.raw_items()), **dict(b.raw_items())} == truth
