"""One broker down is said as such, not as the cluster being unreachable.

On the suite's broker (Apache Kafka; nothing here is specific to it), with a bootstrap list of the
live broker plus a loopback port nothing listens on, and ``enable.sparse.connections=false`` so
librdkafka connects to every broker it knows at once (else it may pick the live one first and never
try the other). librdkafka 2.16 then reports ``Connect to … failed: Connection refused`` for the
dead address and, before the live one has answered, even ``1/1 brokers are down``. Before the fix a
table logged "Kafka cluster at … unreachable" for that; now it names the broker that is down and
says the others answer. A cluster that is wholly down is still said to be unreachable
(``apache/test_broker_restart.py``).
"""

from __future__ import annotations

import logging
import socket
import uuid
from pathlib import Path

import pytest

from integration.conftest import KafkaTool
from statesnap import Table

pytestmark = pytest.mark.integration


@pytest.fixture
def dead_address() -> str:
    """A loopback address nothing listens on (a port bound and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"127.0.0.1:{port}"


@pytest.mark.parametrize("grouped", [False, True], ids=["assigned", "group"])
def test_one_broker_down_is_named_and_the_others_answer(
    kafka: KafkaTool,
    topic_name: str,
    tmp_path: Path,
    dead_address: str,
    grouped: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The suite's broker plus a dead address: the table serves, one warning names the dead
    broker and says the others answer, and none calls the cluster unreachable."""
    kafka.create_topic(topic_name, 2)
    kafka.produce(topic_name, [(i % 2, b"k%d" % i, b"v%d" % i) for i in range(20)])
    bootstrap = f"{dead_address},{kafka.bootstrap}"
    config = {"enable.sparse.connections": False, "session.timeout.ms": 6000}
    options = {"group": f"g-{uuid.uuid4().hex[:8]}", "checkpoints": str(tmp_path / "cp")} if grouped else {}
    table = Table(topic_name, bootstrap_servers=bootstrap, kafka_config=config, **options)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="statesnap.kafka"):
        table.start()
        try:
            KafkaTool.wait_for(lambda: table.partitions == (0, 1), 30, "the assignment")
            KafkaTool.wait_for(lambda: table.get(b"k19") == b"v19", 30, "the table to serve")
            kafka.produce(topic_name, [(1, b"late", b"x")])
            KafkaTool.wait_for(lambda: table.get(b"late") == b"x", 30, "a later record")
        finally:
            table.close(checkpoint=False)
    said = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and "unreachable" in r.getMessage()
    ]
    assert said, "the dead broker was not named"
    assert all("cluster" not in line for line in said), said
    assert len(said) == 1, said
    assert f"broker {dead_address} (" in said[0], said
    assert "Connection refused" in said[0], said
    assert "the other brokers of" in said[0], said
