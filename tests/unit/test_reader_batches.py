"""A polled batch grouped by partition (statesnap.kafka.reader.group_by_partition): whole runs
of one partition sliced off at once must give what appending message by message gives — each
partition's messages in their order — however the runs interleave. The reader's path with
errors in the batch (end-of-partition events, client errors) is the message-by-message one;
both run against real brokers in every integration test."""

from __future__ import annotations

import random

import pytest

from statesnap.kafka.reader import group_by_partition


@pytest.mark.parametrize("seed", range(40))
def test_runs_of_partitions_are_grouped_as_one_message_at_a_time_groups_them(seed: int) -> None:
    rng = random.Random(seed)
    partitions: list[int] = []
    for _ in range(rng.randrange(0, 12)):
        partitions += [rng.randrange(4)] * rng.randrange(1, 30)
    messages = [(p, i) for i, p in enumerate(partitions)]
    expected: dict[int, list[tuple[int, int]]] = {}
    for m in messages:
        expected.setdefault(m[0], []).append(m)
    got = group_by_partition(list(messages), partitions)
    assert got == expected
    assert list(got) == list(expected)  # partitions in the order they first came
