"""Exactly-once outputs on a broker that shows aborted records warn in one line (issue 34, item 7).

Kafka behaviour relied on: Tansu (the embedded dev broker) shows ``read_committed`` consumers the
records of aborted transactions (DESIGN.md, probed), so exactly-once outputs are not exactly once for
their readers there; Apache Kafka hides them. The broker is told from its cluster id, which every
task reads anyway: Tansu reports ``tansu_cluster``, Apache Kafka a base64 UUID. Proven on Tansu (the
session's embedded broker, warns) and on the suite's broker (Apache Kafka where Java is present:
no warning).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from integration.conftest import KafkaTool
from statesnap import ProcessingOptions, Processor, ProcessorContext, Record
from statesnap.devstack import EmbeddedBroker
from statesnap.devstack.apache import new_cluster_id
from statesnap.kafka.admin import KafkaAdmin
from statesnap.kafka.config import KafkaSettings
from statesnap.processor.running import run_processor
from statesnap.task.cluster import BrokerKind, broker_kind

WARNING = "exactly-once outputs on the embedded dev broker (Tansu"


@pytest.fixture
def tansu(broker: EmbeddedBroker) -> Iterator[KafkaTool]:
    tool = KafkaTool(broker.bootstrap_servers)
    yield tool
    tool.close()


def tally(topic: str, bootstrap: str, url: Path, *, exactly_once: bool) -> Processor:
    proc = Processor(
        "eos-trap",
        inputs=[topic],
        bootstrap_servers=bootstrap,
        checkpoints=str(url),
        stores=["balances"],
        value_serde="json",
        processing=ProcessingOptions(exactly_once=exactly_once),
        timeout=10,
    )

    @proc.handler
    def on_payment(record: Record, ctx: ProcessorContext) -> None:
        balances = ctx.stores["balances"]
        balances[record.key] = balances.get(record.key, 0) + record.value["amount"]
        ctx.emit(topic + "-out", record.key, balances[record.key])

    return proc


def run_once(
    kafka: KafkaTool, topic: str, url: Path, caplog: pytest.LogCaptureFixture, **options: bool
) -> list[str]:
    kafka.create_topic(topic, 2)
    kafka.create_topic(topic + "-out", 2)
    kafka.produce(
        topic, [(i % 2, f"a{i % 3}".encode(), json.dumps({"amount": i}).encode()) for i in range(20)]
    )
    with caplog.at_level(logging.WARNING, logger="statesnap"):
        result = run_processor(tally(topic, kafka.bootstrap, url, **options), engine="python")
    assert result.processed == 20
    return [r.getMessage() for r in caplog.records if WARNING in r.getMessage()]


def test_exactly_once_on_tansu_warns_once(
    tansu: KafkaTool, topic_name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (line,) = run_once(tansu, topic_name, tmp_path / "ckpt", caplog, exactly_once=True)
    assert "\n" not in line
    assert "read_committed consumers also see records of aborted transactions" in line
    assert line.endswith("use Apache Kafka for exactly-once")


def test_at_least_once_on_tansu_does_not_warn(
    tansu: KafkaTool, topic_name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert run_once(tansu, topic_name, tmp_path / "ckpt", caplog, exactly_once=False) == []


def test_exactly_once_on_the_suite_broker_warns_only_if_it_is_tansu(
    kafka: KafkaTool, topic_name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    warned = run_once(kafka, topic_name, tmp_path / "ckpt", caplog, exactly_once=True)
    cluster_id = KafkaAdmin(KafkaSettings(kafka.bootstrap, {}, 10)).cluster_id()
    assert bool(warned) is (broker_kind(cluster_id) is BrokerKind.TANSU)


def test_the_cluster_id_tells_the_broker() -> None:
    """Apache Kafka's ids (as ``kafka-storage random-uuid`` makes them) are never taken for Tansu's;
    ids of other implementations are neither."""
    assert {broker_kind(new_cluster_id()) for _ in range(500)} == {BrokerKind.APACHE_KAFKA}
    assert broker_kind("tansu_cluster") is BrokerKind.TANSU
    assert broker_kind("lkc-12ab3") is BrokerKind.OTHER
    assert broker_kind("redpanda.5d1e2a4b-0f4c-4c39-9c0e-5ad9e1f3f3a1") is BrokerKind.OTHER


def test_exactly_once_on_tansu_warns_once_from_the_library_too(
    tansu: KafkaTool, topic_name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``Processor.run()`` — the Python user's path, without ``statesnap run`` — says it once too."""
    tansu.create_topic(topic_name, 1)
    tansu.create_topic(topic_name + "-out", 1)
    tansu.produce(topic_name, [(0, b"a", b'{"amount": 1}')])
    proc = tally(topic_name, tansu.bootstrap, tmp_path / "ckpt", exactly_once=True)
    with caplog.at_level(logging.WARNING, logger="statesnap"):
        proc.run(follow=False)
        proc.check_broker()  # idempotent
    assert len([r for r in caplog.records if WARNING in r.getMessage()]) == 1
