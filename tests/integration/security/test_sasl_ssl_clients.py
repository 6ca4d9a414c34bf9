"""A ``Table`` and an exactly-once ``Processor`` over SASL_SSL (SCRAM-SHA-512, a private CA), on
Apache Kafka 4.1 (the suite broker's secure listener).

What Kafka behaviour this proves: every client statesnap opens — the admin client, the table's
consumer, the processor's consumer and its transactional producer (``init_transactions``,
``send_offsets_to_transaction`` through the group coordinator, commit) — authenticates with
SCRAM over TLS, trusting only the CA given, and the broker serves it as it serves a plaintext
client: the same rows, the same committed outputs. The ground truth is read over PLAINTEXT, by a
plain consumer. No password reaches a log record (librdkafka's ``security`` debug lines
included), a manifest or a data file.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka import KafkaError as RdKafkaError

from integration.conftest import KafkaTool
from integration.security.conftest import assert_no_secret
from statesnap import CheckpointOptions, ProcessingOptions, Processor, ProcessorContext, Record, Table
from statesnap.devstack.security import SaslSslListener

pytestmark = pytest.mark.integration

PARTITIONS = 2


def test_a_table_restores_and_checkpoints_over_sasl_ssl(
    kafka: KafkaTool, sasl_ssl: SaslSslListener, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A table replays, checkpoints, and a second one boots from that checkpoint, all over
    SASL_SSL; its rows equal the plaintext ground truth."""
    caplog.set_level(logging.DEBUG)
    topic = kafka.create_topic(f"sec-table-{uuid.uuid4().hex[:10]}", PARTITIONS)
    # A key lives in one partition, as a keyed producer puts it.
    first = kafka.produce(topic, [((i % 7) % PARTITIONS, b"k%d" % (i % 7), b"v%d" % i) for i in range(40)])
    url = (tmp_path / "cp").as_uri()
    # librdkafka's security debug lines (SASL handshake, TLS) go through the table's logger too.
    config = {**sasl_ssl.client_config(), "debug": "security"}
    secure = sasl_ssl.bootstrap_servers
    table = Table(topic, bootstrap_servers=secure, kafka_config=config, checkpoints=url, background=False)
    table.start()
    try:
        assert dict(table.raw_items()) == kafka.truth(first)
    finally:
        table.close()  # a final checkpoint
    second = kafka.produce(topic, [(1, b"k1", None), (0, b"new", b"x")])
    again = Table(
        topic,
        bootstrap_servers=sasl_ssl.bootstrap_servers,
        kafka_config=sasl_ssl.client_config(),
        checkpoints=url,
        background=False,
    )
    report = again.start()
    try:
        assert report.checkpoint is not None
        assert report.replayed_records == 2
        assert dict(again.raw_items()) == kafka.truth([*first, *second])
    finally:
        again.close(checkpoint=False)
    assert "sasl" in caplog.text.lower()  # the debug lines were there to look at
    assert assert_no_secret(sasl_ssl, caplog.text, files_under=[tmp_path]) > 0


def tally(name: str, topic: str, out: str, url: str, listener: SaslSslListener) -> Processor:
    """A running total per key, one output (input partition, offset, total) per input record."""
    proc = Processor(
        name,
        inputs=[topic],
        bootstrap_servers=listener.bootstrap_servers,
        kafka_config=listener.client_config(),
        checkpoints=CheckpointOptions(url, interval="1h", commit_interval="100ms"),
        stores=["totals"],
        value_serde="json",
        partitions=range(PARTITIONS),
        processing=ProcessingOptions(exactly_once=True),
    )

    @proc.handler
    def add(record: Record, ctx: ProcessorContext) -> None:
        totals = ctx.stores["totals"]
        total = totals.get(record.key, 0) + record.value["n"]
        totals[record.key] = total
        ctx.emit(out, record.key, {"p": record.partition, "o": record.offset, "total": total})

    return proc


def committed_outputs(bootstrap: str, topic: str) -> list[tuple[int, int, int]]:
    """The output topic as a ``read_committed`` plain consumer sees it (over PLAINTEXT)."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"sec-truth-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 10,
            "isolation.level": "read_committed",
        }
    )
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        eof: set[int] = set()
        out: list[tuple[int, int, int]] = []
        while eof != set(range(PARTITIONS)):
            for m in c.consume(1000, 0.2):
                err = m.error()
                if err is not None:
                    if err.code() == RdKafkaError._PARTITION_EOF:
                        eof.add(int(m.partition() or 0))
                    continue
                v = json.loads(m.value() or b"null")
                out.append((v["p"], v["o"], v["total"]))
        return out
    finally:
        c.close()


def expected_outputs(kafka: KafkaTool, topic: str) -> tuple[dict[bytes, int], list[tuple[int, int, int]]]:
    totals: dict[bytes, int] = {}
    out: list[tuple[int, int, int]] = []
    for r in kafka.read_all(topic, range(PARTITIONS)):
        assert r.key is not None
        assert r.value is not None
        totals[r.key] = totals.get(r.key, 0) + json.loads(r.value)["n"]
        out.append((r.partition, r.offset, totals[r.key]))
    return totals, out


def test_an_exactly_once_processor_commits_its_transactions_over_sasl_ssl(
    kafka: KafkaTool, sasl_ssl: SaslSslListener, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An exactly-once processor runs, checkpoints, restarts from its checkpoint and the offsets
    its transactions committed, over SASL_SSL: the ``read_committed`` outputs are exactly one per
    input record, and its store equals the recomputation."""
    caplog.set_level(logging.DEBUG)
    tag = uuid.uuid4().hex[:10]
    topic = kafka.create_topic(f"sec-in-{tag}", PARTITIONS)
    out = kafka.create_topic(f"sec-out-{tag}", PARTITIONS)
    url = (tmp_path / "cp").as_uri()

    def amounts(start: int, n: int) -> list[tuple[int, bytes, bytes]]:
        return [
            ((i % 5) % PARTITIONS, b"acct%d" % (i % 5), json.dumps({"n": i}).encode())
            for i in range(start, start + n)
        ]

    kafka.produce(topic, amounts(0, 60))
    first: Any = tally(f"sec-eos-{tag}", topic, out, url, sasl_ssl)
    first.run(follow=False)  # restore, catch up, checkpoint, close
    kafka.produce(topic, amounts(60, 30))

    proc: Any = tally(f"sec-eos-{tag}", topic, out, url, sasl_ssl)
    report = proc.start()
    try:
        assert report.checkpoint is not None  # booted from the first run's checkpoint
        totals, expected = expected_outputs(kafka, topic)
        kafka.wait_for(lambda: dict(proc.store("totals").items()) == totals, what="the second run's tail")
    finally:
        proc.close()
    got = committed_outputs(kafka.bootstrap, out)
    assert not [o for o, n in Counter(got).items() if n > 1], "an output was committed twice"
    assert sorted(got) == sorted(expected)
    assert assert_no_secret(sasl_ssl, caplog.text, files_under=[tmp_path]) > 0
