"""Watching what Apache Kafka does to a log on its own schedule: the cleaner and retention."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from confluent_kafka import Consumer, TopicPartition

from integration.conftest import KafkaTool, Rec


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
    bootstrap: str,
    topic: str,
    partitions: int,
    done: Callable[[Mapping[int, tuple[int, int]]], bool],
    what: str,
    timeout: float = 60.0,
) -> Mapping[int, tuple[int, int]]:
    """Poll the watermarks until ``done(watermarks)`` holds: the log cleaner and retention run on
    the broker's schedule, not the test's."""
    deadline = time.monotonic() + timeout
    while True:
        marks = watermarks(bootstrap, topic, partitions)
        if done(marks):
            return marks
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {marks}"
        time.sleep(0.2)


#: The key of the records :func:`compact_until` writes to roll the active segment.
ROLL_KEY = b"__roll__"

#: Topic settings under which the broker's cleaner acts within a second (segments roll after 100 ms
#: once a record arrives; any dirty ratio qualifies; no compaction lag).
COMPACT_FAST = {
    "cleanup.policy": "compact",
    "segment.ms": "100",
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
}


def compact_until(
    kafka: KafkaTool,
    topic: str,
    partitions: int,
    done: Callable[[list[Rec]], bool],
    what: str,
    timeout: float = 60.0,
) -> list[Rec]:
    """Let the log cleaner work until ``done(records)`` holds for a plain read of the whole topic.

    Kafka never cleans the active segment and rolls a segment only when a record arrives after
    ``segment.ms``: so every round writes one :data:`ROLL_KEY` record to each partition. Returns
    the records as they stand (the ground truth includes the roll key)."""
    deadline = time.monotonic() + timeout
    while True:
        time.sleep(0.3)
        kafka.produce(topic, [(p, ROLL_KEY, b"") for p in range(partitions)])
        records = kafka.read_all(topic, range(partitions))
        if done(records):
            return records
        assert time.monotonic() < deadline, f"timed out waiting for the log cleaner: {what}"
