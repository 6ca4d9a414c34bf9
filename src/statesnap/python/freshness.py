"""How fresh a table is, and waiting for it to be fresh enough (sync and asyncio).

Offsets are the next offset to consume per partition: every read reflects every record below
them. ``caught_up`` is decided by partition EOF (exact, also on brokers that under-report high
watermarks); ``lag()`` estimates from the last high watermark the broker reported.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime

from statesnap.errors import ConfigError, TableStateError
from statesnap.kafka.reader import ChangelogReader
from statesnap.python.aio import AsyncWaiters
from statesnap.task.lifecycle import TaskPhase

__all__ = ["TableFreshness"]


class TableFreshness:
    """The freshness half of :class:`~statesnap.Table`: offsets, lag, ages and the waits.

    ``wait_for`` is the read-your-writes primitive; ``wait_for_async`` is the same for coroutines,
    woken by the consuming thread (:mod:`statesnap.python.aio`).
    """

    name: str
    tail: bool
    background: bool
    partitions: tuple[int, ...]
    _reader: ChangelogReader | None
    _fixed_offsets: dict[int, int]
    _newest_ts: int
    _last_applied: float | None
    _clock: Callable[[], datetime]
    _applied: threading.Condition
    _waiters: AsyncWaiters
    _thread: threading.Thread | None
    _thread_error: BaseException | None
    _failure_met: threading.Event
    _state: TaskPhase

    def poll(self, timeout: float = 0.5) -> int:
        """Consume one batch (the table's)."""
        raise NotImplementedError

    @property
    def offsets(self) -> dict[int, int]:
        """Next offset to consume per owned partition (everything below is applied)."""
        if self._reader is None:
            return dict(self._fixed_offsets)
        return dict(self._reader.positions)

    @property
    def caught_up(self) -> bool:
        """Whether every partition has reported end-of-partition since its last record (never, for
        a point-in-time view)."""
        return self._reader is not None and self._reader.caught_up

    def lag(self) -> dict[int, int]:
        """Records behind per partition: 0 at end-of-partition, else the broker's last reported
        high watermark minus our position (no extra round trip; may under-estimate on brokers
        that under-report watermarks, as the dev broker does)."""
        if self._reader is None:
            return {}
        return self._reader.lag()

    def last_update_age(self) -> float | None:
        """Seconds since a record was last applied (None if none was since start)."""
        return None if self._last_applied is None else time.monotonic() - self._last_applied

    def newest_record_age(self) -> float | None:
        """Seconds since the timestamp of the newest record applied, or None if none was."""
        if self._newest_ts < 0:
            return None
        return max(0.0, self._clock().timestamp() - self._newest_ts / 1000)

    def _reached(self, offsets: Mapping[int, int] | None, timestamp: datetime | None) -> Callable[[], bool]:
        """The wait condition of :meth:`wait_for` (validated here, once)."""
        want_ms = None if timestamp is None else int(timestamp.timestamp() * 1000)
        if offsets and set(offsets) - set(self.partitions):
            raise ConfigError(
                f"table {self.name!r} does not own partitions {sorted(set(offsets) - set(self.partitions))}"
            )

        def done() -> bool:
            positions = self.offsets
            if offsets and any(positions.get(p, 0) <= off for p, off in offsets.items()):
                return False
            return want_ms is None or self._newest_ts >= want_ms

        return done

    def wait_for(
        self,
        offsets: Mapping[int, int] | None = None,
        *,
        timestamp: datetime | None = None,
        timeout: float = 30.0,
    ) -> bool:
        """Block until the record at *offsets* (partition → offset of a record someone wrote) is
        applied and, if given, a record at least as new as *timestamp* is; False on timeout.

        The read-your-writes primitive: the writer passes the offset its produce() reported. A
        point-in-time view (``tail=False``) never moves: it answers at once.
        """
        deadline = time.monotonic() + timeout
        done = self._reached(offsets, timestamp)
        if not self.tail:
            return done()
        with self._applied:
            while not done():
                self.raise_if_failed()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                if not self.background and self._state == "running":
                    self._applied.release()
                    try:
                        self.poll(min(remaining, 0.2))
                    finally:
                        self._applied.acquire()
                else:
                    self._applied.wait(min(remaining, 0.2))
        return True

    async def wait_for_async(
        self,
        offsets: Mapping[int, int] | None = None,
        *,
        timestamp: datetime | None = None,
        timeout: float = 30.0,
    ) -> bool:
        """:meth:`wait_for` for coroutines: woken by the consuming thread, never blocking the loop
        (a ``background=False`` table polls on a worker thread)."""
        if not self.background or self._thread is None:
            return await asyncio.to_thread(self.wait_for, offsets, timestamp=timestamp, timeout=timeout)
        done = self._reached(offsets, timestamp)
        return await self._waiters.wait_until(done, self._check_waitable, timeout)

    def _check_waitable(self) -> None:
        self.raise_if_failed()
        if self._state == "closed":
            raise TableStateError("wait", "closed", "running")

    def raise_if_failed(self) -> None:
        """Re-raise, in the caller's thread, an error that stopped the background consumer."""
        if self._thread_error is not None:
            self._failure_met.set()  # met by a caller: the consuming thread need not log it
            raise self._thread_error
