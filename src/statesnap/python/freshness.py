"""How fresh a table is, and waiting for it to be fresh enough (sync and asyncio).

Offsets are the next offset to consume per partition: every read reflects every record below
them. ``caught_up`` is decided by partition EOF (exact, also on brokers that under-report high
watermarks); ``lag()`` estimates from the last high watermark the broker reported.

:class:`Freshness` answers for a :class:`~statesnap.Table` over its task's public side (the
loop's figures and its ``applied`` condition); the table's methods of the same names call it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from datetime import datetime

from statesnap.errors import ConfigError, TableStateError
from statesnap.python.aio import AsyncWaiters
from statesnap.task.engine import Task
from statesnap.task.lifecycle import TaskPhase

__all__ = ["Freshness"]


class Freshness:
    """Offsets, lag, ages and the waits of one task.

    ``wait_for`` is the read-your-writes primitive; ``wait_for_async`` is the same for coroutines,
    woken by the consuming thread (:mod:`statesnap.python.aio`).
    """

    def __init__(self, task: Task) -> None:
        self.task = task
        self.waiters = AsyncWaiters()
        task.loop.listen(self.waiters.notify)

    @property
    def offsets(self) -> dict[int, int]:
        return self.task.loop.offsets

    def reached(self, offsets: Mapping[int, int] | None, timestamp: datetime | None) -> Callable[[], bool]:
        """The wait condition of :meth:`wait_for` (validated here, once)."""
        task = self.task
        want_ms = None if timestamp is None else int(timestamp.timestamp() * 1000)
        if offsets and set(offsets) - set(task.partitions):
            raise ConfigError(
                f"table {task.name!r} does not own partitions {sorted(set(offsets) - set(task.partitions))}"
            )
        loop = task.loop

        def done() -> bool:
            positions = loop.offsets
            if offsets and any(positions.get(p, 0) <= off for p, off in offsets.items()):
                return False
            return want_ms is None or loop.newest_timestamp >= want_ms

        return done

    def wait_for(
        self, offsets: Mapping[int, int] | None, *, timestamp: datetime | None, timeout: float
    ) -> bool:
        """See :meth:`statesnap.Table.wait_for`."""
        task = self.task
        deadline = time.monotonic() + timeout
        done = self.reached(offsets, timestamp)
        if not task.tail:
            return done()
        applied = task.loop.applied
        with applied:
            while not done():
                task.raise_if_failed()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                if not task.background and task.running:
                    applied.release()
                    try:
                        task.poll(min(remaining, 0.2))
                    finally:
                        applied.acquire()
                else:
                    applied.wait(min(remaining, 0.2))
        return True

    async def wait_for_async(
        self, offsets: Mapping[int, int] | None, *, timestamp: datetime | None, timeout: float
    ) -> bool:
        """See :meth:`statesnap.Table.wait_for_async`."""
        task = self.task
        if not task.background or task.loop.thread is None:
            return await asyncio.to_thread(self.wait_for, offsets, timestamp=timestamp, timeout=timeout)
        done = self.reached(offsets, timestamp)
        return await self.waiters.wait_until(done, self._check_waitable, timeout)

    def _check_waitable(self) -> None:
        self.task.raise_if_failed()
        if self.task.phase is TaskPhase.CLOSED:
            raise TableStateError("wait", "closed", "running")
