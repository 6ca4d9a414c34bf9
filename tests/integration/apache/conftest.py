"""Tests in this directory run on a real Apache Kafka broker (the session's ``apache_kafka``).

``kafka`` and ``bootstrap`` are overridden here: the same :class:`KafkaTool` (producer to explicit
partitions, plain-consumer ground truth) and the same address fixture as the Tansu tests use,
bound to Apache Kafka, so a Tansu test module's cases can run here unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping

import pytest
from confluent_kafka import Consumer, TopicPartition

from integration.conftest import KafkaTool
from statesnap.devstack import ApacheKafkaBroker

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def kafka(apache_kafka: ApacheKafkaBroker) -> Iterator[KafkaTool]:
    tool = KafkaTool(apache_kafka.bootstrap_servers)
    yield tool
    tool.close()


@pytest.fixture
def bootstrap(apache_kafka: ApacheKafkaBroker) -> str:
    return apache_kafka.bootstrap_servers


def watermarks(bootstrap: str, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
    """(log start, high watermark) per partition, asked of the broker."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "test-watermarks"})
    try:
        return {
            p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)
            for p in range(partitions)
        }
    finally:
        c.close()


def wait_for_log(
    bootstrap: str, topic: str, partitions: int, done: object, what: str, timeout: float = 60.0
) -> Mapping[int, tuple[int, int]]:
    """Poll the watermarks until ``done(watermarks)`` holds: the log cleaner and retention run on
    the broker's schedule, not the test's."""
    assert callable(done)
    deadline = time.monotonic() + timeout
    while True:
        marks = watermarks(bootstrap, topic, partitions)
        if done(marks):
            return marks
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {marks}"
        time.sleep(0.2)
