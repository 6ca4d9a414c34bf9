"""asyncio on the real broker: ``await start_async()``, ``async with``, ``await wait_for_async()``
for Table and Follower, proven not to block the event loop: a ticker coroutine keeps running (no
gap above a bound) while a restore is deliberately slow and while a wait is pending; a waiter is
woken by the consuming thread, not by polling (the safety re-check is pushed out to 30 s).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import pytest

import statesnap.python.aio
from statesnap import Follower, Hooks, RestoreListener, Table
from statesnap.errors import TableStateError

pytestmark = pytest.mark.integration

T = TypeVar("T")

#: The largest gap between two ticks of a 10 ms ticker that still means "the loop kept running".
#: A healthy loop on a loaded 2-core CI machine was seen to stall 0.41 s once, late in the suite
#: (a full garbage collection or the scheduler); every delay below that a blocked loop would show
#: as one gap is kept at 0.8 s or more, so the bound still tells the two apart.
MAX_GAP = 0.6


class SlowRestore(RestoreListener):
    """Makes start() take ~0.4 s per partition, on whatever thread runs it."""

    def __init__(self) -> None:
        self.thread: str | None = None

    def on_restore_start(self, partition: int, start_offset: int) -> None:
        self.thread = threading.current_thread().name
        time.sleep(0.4)


async def ticking(work: Awaitable[T]) -> tuple[T, list[float]]:
    """Run *work* while a ticker records the loop's liveness every 10 ms."""
    ticks: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            ticks.append(time.monotonic())
            await asyncio.sleep(0.01)

    task = asyncio.create_task(ticker())
    try:
        result = await work
    finally:
        stop.set()
        await task
    return result, ticks


def max_gap(ticks: list[float]) -> float:
    return max(b - a for a, b in itertools.pairwise(ticks))


@pytest.fixture(autouse=True)
def no_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    """A waiter that is not woken by the consuming thread would now sleep 30 s."""
    monkeypatch.setattr(statesnap.python.aio, "RECHECK_SECONDS", 30.0)


def test_start_and_wait_for_keep_the_loop_running(kafka: Any, tmp_path: Path) -> None:
    topic = kafka.create_topic(f"aio-{uuid.uuid4().hex[:12]}", 3)
    produced = kafka.produce(topic, [(p, b"k%d" % p, b"v") for p in range(3)])
    slow = SlowRestore()

    async def main() -> None:
        t = Table(
            topic,
            bootstrap_servers=kafka.bootstrap,
            checkpoints=(tmp_path / "cp").as_uri(),
            hooks=Hooks(restore_listener=slow),
        )
        report, ticks = await ticking(t.start_async())
        assert report.replayed_records == 3
        assert ticks[-1] - ticks[0] >= 1.1  # the restore took its ~1.2 s...
        assert max_gap(ticks) < MAX_GAP  # ...and the loop ran all along
        assert slow.thread != threading.current_thread().name

        # A write landing 0.8 s later wakes the waiter at once (no 30 s re-check).
        end = kafka.end_offsets(produced, range(3))
        loop = asyncio.get_running_loop()
        delivered: list[float] = []

        def produce_later() -> None:
            time.sleep(0.8)
            kafka.produce(topic, [(1, b"new", b"value")])
            delivered.append(time.monotonic())

        writer = loop.run_in_executor(None, produce_later)
        ok, ticks = await ticking(t.wait_for_async({1: end[1]}, timeout=20))
        woke = time.monotonic()
        await writer
        assert ok
        assert t.get(b"new") == b"value"
        assert woke - delivered[0] < 1.0
        assert max_gap(ticks) < MAX_GAP
        assert ticks[-1] - ticks[0] >= 0.7

        # A timeout answers False on time, the loop still running.
        started = time.monotonic()
        ok, ticks = await ticking(t.wait_for_async({1: end[1] + 50}, timeout=0.8))
        assert not ok
        assert 0.8 <= time.monotonic() - started < 2.5
        assert max_gap(ticks) < MAX_GAP

        # Closing the table wakes a waiter with an error instead of leaving it hanging.
        waiter = asyncio.create_task(t.wait_for_async({1: end[1] + 50}, timeout=20))
        await asyncio.sleep(0.1)
        started = time.monotonic()
        await t.aclose()
        with pytest.raises(TableStateError, match="closed"):
            await waiter
        assert time.monotonic() - started < 5.0
        assert t.repo is not None
        assert len(t.repo.generations()) == 1  # aclose() wrote the final checkpoint

    asyncio.run(main())


def test_async_with_and_a_table_polled_on_a_worker_thread(kafka: Any, tmp_path: Path) -> None:
    topic = kafka.create_topic(f"aiow-{uuid.uuid4().hex[:12]}", 1)
    kafka.produce(topic, [(0, b"a", b"1")])
    url = (tmp_path / "cp").as_uri()

    async def main() -> None:
        async with Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False) as t:
            assert t.get(b"a") == b"1"
            loop = asyncio.get_running_loop()
            writer = loop.run_in_executor(None, lambda: kafka.produce(topic, [(0, b"b", b"2")]))
            ok, ticks = await ticking(t.wait_for_async({0: 1}, timeout=20))
            await writer
            assert ok
            assert t.get(b"b") == b"2"
            assert max_gap(ticks) < MAX_GAP
        assert t.repo is not None
        assert t.repo.generations() == [1]  # a clean async exit checkpoints, like `with`

        async def fails() -> None:
            async with Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False):
                raise RuntimeError("boom")

        with pytest.raises(RuntimeError, match="boom"):
            await fails()
        assert t.repo.generations() == [1]  # ...and an exit by exception does not

    asyncio.run(main())


def test_follower_async(kafka: Any, tmp_path: Path) -> None:
    topic = kafka.create_topic(f"aiof-{uuid.uuid4().hex[:12]}", 2)
    produced = kafka.produce(topic, [(0, b"a", b"1"), (1, b"b", b"2")])
    slow = SlowRestore()

    async def main() -> None:
        f = Follower(
            topic, bootstrap_servers=kafka.bootstrap, checkpoints=None, hooks=Hooks(restore_listener=slow)
        )
        async with f:
            assert dict(f) == {b"a": b"1", b"b": b"2"}
            writer = asyncio.get_running_loop().run_in_executor(
                None, lambda: kafka.produce(topic, [(0, b"a", b"3")])
            )
            ok, ticks = await ticking(f.wait_for_async({0: 1}, timeout=20))
            await writer
            assert ok
            assert f[b"a"] == b"3"
            assert max_gap(ticks) < MAX_GAP
            assert await f.wait_caught_up_async(timeout=20)
        assert f.state == "closed"

        # Waiting on a follower still restoring waits for the restore first, loop running.
        g = Follower(
            topic, bootstrap_servers=kafka.bootstrap, checkpoints=None, hooks=Hooks(restore_listener=slow)
        )
        g.start_in_background()
        assert g.state == "restoring"
        end = kafka.end_offsets(produced, [0, 1])
        ok, ticks = await ticking(g.wait_for_async({1: end[1] - 1}, timeout=20))
        assert ok
        assert g.state == "running"
        assert max_gap(ticks) < MAX_GAP
        assert ticks[-1] - ticks[0] >= 0.7  # its two partitions' ~0.8 s restore
        await g.aclose()

    asyncio.run(main())
