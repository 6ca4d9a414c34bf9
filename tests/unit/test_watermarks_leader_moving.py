"""A watermark query answered "not leader" (a topic just created: the metadata named a leader the
broker had not taken up yet, a CI run's test_verify_reports_the_corruption[s3] on Apache Kafka;
or a failover) is asked again within the settings' timeout, as the Java client does, and past it
is a typed error saying the leader was still moving. Any other failure raises at once. A fake
consumer: the real broker's side is every integration test that opens a task on a topic it has
just created (Apache Kafka and Tansu), and the failover tests of tests/integration/cluster/."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError as RdKafkaError
from confluent_kafka import KafkaException, TopicPartition

from statesnap.errors import BrokerUnavailableError
from statesnap.kafka.config import KafkaSettings
from statesnap.kafka.reader import watermarks


class FakeConsumer:
    """Fails the first *failures* watermark queries with *code*, then answers (3, 9)."""

    def __init__(self, failures: int, code: int) -> None:
        self.failures = failures
        self.code = code
        self.asked = 0

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float, cached: bool) -> tuple[int, int]:
        assert not cached
        assert timeout > 0
        self.asked += 1
        if self.asked <= self.failures:
            raise KafkaException(RdKafkaError(self.code))
        return 3, 9


def test_a_moving_leader_is_asked_again_until_it_answers() -> None:
    consumer = FakeConsumer(3, RdKafkaError.NOT_LEADER_FOR_PARTITION)
    assert watermarks(consumer, KafkaSettings("127.0.0.1:1", timeout=5.0), "t", 0) == (3, 9)
    assert consumer.asked == 4


def test_a_leader_still_moving_at_the_timeout_is_a_typed_error_naming_the_wait() -> None:
    consumer = FakeConsumer(10_000, RdKafkaError.LEADER_NOT_AVAILABLE)
    began = time.monotonic()
    moving = r"'t' \[2\] from 127.0.0.1:1 \(its leader still moving after 0.5 s\)"
    with pytest.raises(BrokerUnavailableError, match=moving):
        watermarks(consumer, KafkaSettings("127.0.0.1:1", timeout=0.5), "t", 2)
    assert time.monotonic() - began < 2.0
    assert consumer.asked > 1


def test_any_other_failure_raises_at_once() -> None:
    consumer = FakeConsumer(1, RdKafkaError._TIMED_OUT)
    with pytest.raises(BrokerUnavailableError, match="cannot read the offsets of 't' \\[0\\]") as info:
        watermarks(consumer, KafkaSettings("127.0.0.1:1", timeout=5.0), "t", 0)
    assert "leader" not in str(info.value)
    assert consumer.asked == 1
