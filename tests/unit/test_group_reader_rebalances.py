"""A group member's bookkeeping across eager rebalances, driven through the callbacks librdkafka
calls (no broker: a consumer that is never polled, and a stand-in for the one the callbacks get).
A rebalance that moves partitions still being restored must end their restore here: CI once
waited 90 s for a member that still "restored" partitions another member owned."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka import TopicPartition

from statesnap.kafka.config import KafkaSettings
from statesnap.kafka.group_reader import GroupReader

TOPIC = "orders"


class _Listener:
    def __init__(self) -> None:
        self.dropped: list[list[int]] = []

    def partitions_gained(self, partitions: list[int]) -> Mapping[int, int]:
        return dict.fromkeys(partitions, 0)  # restored from nothing: nothing to commit yet

    def partitions_leaving(self, partitions: list[int]) -> None:
        pass

    def partitions_dropped(self, partitions: list[int]) -> None:
        self.dropped.append(partitions)


class _Assignments:
    """What the callbacks call on the consumer they are given."""

    def assign(self, _parts: Any) -> None:
        pass

    def unassign(self) -> None:
        pass


def _parts(*partitions: int) -> list[TopicPartition]:
    return [TopicPartition(TOPIC, p) for p in partitions]


def test_partitions_moved_away_mid_restore_are_not_restoring_any_more() -> None:
    listener = _Listener()
    reader = GroupReader(KafkaSettings("127.0.0.1:9"), TOPIC, "g", listener)
    consumer = _Assignments()
    try:
        reader._on_assign(consumer, _parts(0, 1, 2))  # gained: each restored until its end
        assert reader.restoring == {0, 1, 2}
        reader._on_revoke(consumer, _parts(0, 1, 2))  # eager: all suspended until the assignment
        reader._on_assign(consumer, _parts(1))
        assert reader.owned == {1}
        assert reader.restoring == {1}, "partitions another member owns now are still restoring here"
        assert listener.dropped == [[0, 2]]
        assert not reader.readable(0)
    finally:
        reader.close()
