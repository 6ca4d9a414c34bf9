"""The merge of co-partitioned inputs: deterministic, memoryless from any point of its path, and
independent of how the records arrive while catching up.

Pure functions and a fake of the per-input readers (its fetch chunks drawn by Hypothesis); the
broker-backed proof is tests/integration/processor/test_multiple_inputs.py (Tansu)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from statesnap.processor.inputs import MergedReader
from statesnap.processor.merge import merge, pick

timestamps = st.lists(st.integers(0, 20), max_size=12)
inputs = st.lists(timestamps, min_size=1, max_size=3)


def test_pick_waits_for_an_input_that_has_not_ended() -> None:
    assert pick([5, None], [False, False]) is None
    assert pick([5, None], [False, True]) == 0
    assert pick([5, 3], [False, False]) == 1
    assert pick([3, 3], [False, False]) == 0  # a tie goes to the input listed first
    assert pick([None, None], [True, True]) is None


@given(inputs)
def test_merge_keeps_each_input_in_order_and_takes_everything(data: list[list[int]]) -> None:
    order = merge(data)
    assert sorted(order) == sorted((i, j) for i, ts in enumerate(data) for j in range(len(ts)))
    for i in range(len(data)):
        assert [j for k, j in order if k == i] == list(range(len(data[i])))
    assert merge(data) == order


@given(inputs, st.data())
def test_merge_is_memoryless_from_any_point_of_its_path(data: list[list[int]], draw: st.DataObject) -> None:
    """A restore at a checkpoint on the path (every input's position after k steps) continues
    exactly as the full run does."""
    order = merge(data)
    k = draw.draw(st.integers(0, len(order)))
    positions = [sum(1 for i, _ in order[:k] if i == n) for n in range(len(data))]
    assert merge(data, positions) == order[k:]


@given(
    st.lists(st.lists(st.integers(0, 20), max_size=10).map(sorted), min_size=2, max_size=3),
    st.integers(0, 21),
)
def test_a_prefix_cut_at_a_time_is_on_the_full_runs_path(data: list[list[int]], cut: int) -> None:
    """Catching up with the records older than *cut* (all an input held then) and later with the
    rest equals one run over everything: what a checkpoint of a live processor whose inputs
    arrive in time order relies on."""
    prefix = [[t for t in ts if t < cut] for ts in data]
    head = merge(prefix)
    assert merge(data)[: len(head)] == head


@dataclass
class Message:
    topic_: str
    partition_: int
    offset_: int
    ts: int

    def topic(self) -> str:
        return self.topic_

    def partition(self) -> int:
        return self.partition_

    def offset(self) -> int:
        return self.offset_

    def timestamp(self) -> tuple[int, int]:
        return (1, self.ts)

    def key(self) -> bytes | None:
        return None

    def value(self) -> bytes | None:
        return None


class FakeReader:
    """A ChangelogReader of one partition that delivers its records in the drawn chunks, then
    reports the partition's end."""

    def __init__(self, topic: str, stamps: list[int], chunks: list[int]) -> None:
        self.topic = topic
        self.settings: Any = None
        self.messages = [Message(topic, 0, o, t) for o, t in enumerate(stamps)]
        self.chunks = list(chunks)
        self.positions: dict[int, int] = {0: 0}
        self.at_eof: set[int] = set()
        self.tailing = False
        self.sent = 0

    @property
    def caught_up(self) -> bool:
        return 0 in self.at_eof

    def poll(self, timeout: float) -> dict[int, list[Any]]:
        del timeout
        if self.sent >= len(self.messages):
            self.at_eof.add(0)
            return {}
        n = max(1, self.chunks.pop(0) if self.chunks else len(self.messages))
        batch = self.messages[self.sent : self.sent + n]
        self.sent += len(batch)
        return {0: batch}

    def applied(self, partition: int, next_offset: int) -> None:
        self.positions[partition] = next_offset

    def lag(self) -> dict[int, int]:
        return {0: len(self.messages) - self.sent}

    def close(self) -> None:
        pass


@settings(max_examples=60)
@given(st.lists(timestamps, min_size=2, max_size=3), st.lists(st.integers(1, 4), max_size=20))
def test_catching_up_hands_records_in_merge_order_however_they_arrive(
    data: list[list[int]], chunks: list[int]
) -> None:
    readers: list[Any] = [FakeReader(f"t{i}", ts, chunks[i::2]) for i, ts in enumerate(data)]
    merged = MergedReader(readers[0], readers[1:], max_idle=0.0)
    seen: list[tuple[int, int]] = []
    for _ in range(200):
        if merged.caught_up:
            break
        for p, messages in merged.poll(0).items():
            seen += [(int(m.topic()[1:]), m.offset()) for m in messages]
            merged.applied(p, messages[-1].offset() + 1)
    assert seen == merge(data)
    assert merged.caught_up
    assert merged.positions == {0: len(data[0])}
    assert [a[0] for a in merged.applied_at] == [len(ts) for ts in data]


class SilentReader(FakeReader):
    """An input that neither delivers nor reports its end (a fetch that does not come back)."""

    def poll(self, timeout: float) -> dict[int, list[Any]]:
        del timeout
        return {}


def test_a_following_task_goes_on_without_a_silent_input_after_max_idle() -> None:
    """Catching up, a partition waits for every input's head (determinism); following, it waits
    at most ``max_idle`` for an input that says nothing."""
    loud: Any = FakeReader("t0", [1, 2], [])
    merged = MergedReader(loud, [SilentReader("t1", [], [])], max_idle=0.05)  # type: ignore[list-item]
    for _ in range(3):
        assert merged.poll(0) == {}
    assert not merged.caught_up
    merged.tailing = True
    assert merged.poll(0) == {}  # the idle time starts now
    time.sleep(0.06)
    (batch,) = merged.poll(0).values()
    assert [m.offset() for m in batch] == [0, 1]


def test_a_following_task_waits_max_idle_for_an_input_at_its_end() -> None:
    """Kafka Streams' ``max.task.idle.ms``: following, an input at its end with nothing
    buffered holds the other input's records up to ``max_idle`` (its next record may be older:
    the other side of a live join, a batch behind), then the task goes on — and keeps going on
    while that input stays empty; once it delivers, the merge is by timestamp again. (Before, an
    input at its end was never waited for.)"""
    early: Any = FakeReader("t0", [10, 20], [])
    late: Any = FakeReader("t1", [], [])
    merged = MergedReader(early, [late], max_idle=0.1)
    merged.tailing = True
    assert merged.poll(0) == {}  # t1 reports its end on this poll; the idle time starts
    assert merged.poll(0) == {}
    late.messages.append(Message("t1", 0, 0, 5))  # t1's record arrives in time: it goes first
    (batch,) = merged.poll(0).values()
    assert [(m.topic(), m.ts) for m in batch] == [("t1", 5)]
    assert merged.poll(0) == {}  # t1 delivered and is empty again: a new wait
    time.sleep(0.12)
    (batch,) = merged.poll(0).values()
    assert [m.ts for m in batch] == [10, 20]
    early.messages.append(Message("t0", 0, 2, 30))
    (batch,) = merged.poll(0).values()  # t1 still empty: the task goes on, no new wait
    assert [m.ts for m in batch] == [30]


def test_a_catching_up_task_waits_max_idle_for_an_input_at_its_end_only() -> None:
    """A start at the live edge: catching up, an input at its end holds the other's records up
    to ``max_idle`` too (its next record may be about to arrive), then the task goes on; an
    input that has not reached its end is waited for however long it takes (its records are
    there to fetch). Before, the end of a catch-up merged in the order of arrival."""
    early: Any = FakeReader("t0", [10, 20], [])
    late: Any = FakeReader("t1", [], [])
    merged = MergedReader(early, [late], max_idle=0.1)
    assert merged.poll(0) == {}  # t1 reports its end on this poll; the idle time starts
    assert merged.poll(0) == {}
    late.messages.append(Message("t1", 0, 0, 5))  # in time: it goes first
    (batch,) = merged.poll(0).values()
    assert [(m.topic(), m.ts) for m in batch] == [("t1", 5)]
    time.sleep(0.12)
    (batch,) = merged.poll(0).values()
    assert [m.ts for m in batch] == [10, 20]

    waiting: Any = FakeReader("t0", [10], [])
    behind: Any = SilentReader("t1", [], [])  # neither delivers nor reports its end
    held = MergedReader(waiting, [behind], max_idle=0.05)
    assert held.poll(0) == {}
    time.sleep(0.06)
    assert held.poll(0) == {}, "catching up, an input not at its end is always waited for"


def test_max_idle_zero_never_waits_for_an_input_at_its_end() -> None:
    early: Any = FakeReader("t0", [10, 20], [])
    merged = MergedReader(early, [FakeReader("t1", [], [])], max_idle=0.0)  # type: ignore[list-item]
    merged.tailing = True
    (batch,) = merged.poll(0).values()
    assert [m.ts for m in batch] == [10, 20]
