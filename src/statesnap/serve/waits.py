"""Freshness waits (``min_offsets``, ``caught_up``) that hold no thread.

A request that waits for a far-future offset used to block a worker thread for up to ``wait_ms``;
with 40 threads in anyio's default pool, 60 such requests made a plain scan queue for 18 s. Here a
waiting request is a future on the event loop: one ticker coroutine samples the replica every
``tick`` seconds while anything waits and resolves every satisfied future, so the cost is one
sample per tick whatever the number of waiters, and other requests never queue behind waits.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from statesnap.errors import TableStateError
from statesnap.python.status import FollowerStatus

__all__ = [
    "DEFAULT_MAX_PENDING",
    "DEFAULT_TICK_SECONDS",
    "FreshnessWaits",
    "OwnedReplica",
    "Replica",
    "ServedReplica",
    "TooManyWaitsError",
]

#: Sampling period while requests wait. The replica applies records in batches of a consume call,
#: so a few milliseconds add little to read-your-writes latency and cost ~500 samples/s at most.
DEFAULT_TICK_SECONDS = 0.002
#: Waiting requests beyond this are refused with 503 (each holds a socket and a future).
DEFAULT_MAX_PENDING = 10_000


class Replica(Protocol):
    """What the waits read from a follower."""

    @property
    def state(self) -> str: ...

    @property
    def offsets(self) -> dict[int, int]: ...

    @property
    def caught_up(self) -> bool: ...

    def wait_for(self, offsets: Mapping[int, int], *, timeout: float) -> bool: ...

    def wait_caught_up(self, timeout: float) -> bool: ...


class ServedReplica(Replica, Protocol):
    """What the HTTP API reads from a replica: a table's :class:`~statesnap.python.follower.Follower`
    or a processor store's :class:`~statesnap.processor.store_follower.StoreFollower`."""

    @property
    def name(self) -> str: ...

    def lag(self) -> dict[int, int]: ...

    def newest_record_age(self) -> float | None: ...

    def status(self) -> FollowerStatus: ...

    def get_raw(self, key: bytes) -> bytes | None: ...

    def scan(self, after: bytes | None, limit: int) -> list[tuple[bytes, bytes]]: ...

    def keeps(self, key: bytes) -> bool: ...


class OwnedReplica(ServedReplica, Protocol):
    """A replica as ``statesnap serve`` runs it: started in the background, closed at the end,
    failed with an error it can report."""

    @property
    def error(self) -> BaseException | None: ...

    def start_in_background(self, *, on_failure: Callable[[BaseException], None] | None = None) -> None: ...

    def close(self) -> None: ...


class TooManyWaitsError(TableStateError):
    """More requests are waiting for freshness than the server accepts; retry shortly."""

    def __init__(self, pending: int) -> None:
        super().__init__("wait", f"busy ({pending} requests waiting)", "fewer waiting requests")


@dataclass(frozen=True, slots=True)
class _Sample:
    offsets: dict[int, int]
    caught_up: bool


@dataclass(slots=True)
class _Waiter:
    done: Callable[[_Sample], bool]
    future: asyncio.Future[bool]
    needs_caught_up: bool


class FreshnessWaits:
    """Async waits on one replica; create it inside the app, use it from request handlers."""

    def __init__(
        self,
        replica: Replica,
        *,
        tick: float = DEFAULT_TICK_SECONDS,
        max_pending: int = DEFAULT_MAX_PENDING,
    ) -> None:
        self.replica = replica
        self.tick = tick
        self.max_pending = max_pending
        self._waiters: list[_Waiter] = []
        self._ticker: asyncio.Task[None] | None = None

    @property
    def pending(self) -> int:
        """Requests waiting right now."""
        return len(self._waiters)

    async def offsets(self, wanted: Mapping[int, int], timeout: float) -> bool:
        """Until every record at *wanted* (partition → offset) is applied; False after *timeout*.

        The first check is the replica's own ``wait_for(timeout=0)``: it rejects partitions the
        replica does not follow (ConfigError) and re-raises a failed consumer's error.
        """
        if self.replica.wait_for(wanted, timeout=0):
            return True
        want = dict(wanted)
        return await self._until(
            lambda s: all(s.offsets.get(p, 0) > off for p, off in want.items()), timeout, caught_up=False
        )

    async def caught_up(self, timeout: float) -> bool:
        """Until every partition is at end-of-partition; False after *timeout*."""
        if self.replica.wait_caught_up(0):
            return True
        return await self._until(lambda s: s.caught_up, timeout, caught_up=True)

    async def _until(self, done: Callable[[_Sample], bool], timeout: float, *, caught_up: bool) -> bool:
        if timeout <= 0:
            return False
        if len(self._waiters) >= self.max_pending:
            raise TooManyWaitsError(len(self._waiters))
        loop = asyncio.get_running_loop()
        waiter = _Waiter(done, loop.create_future(), caught_up)
        self._waiters.append(waiter)
        if self._ticker is None or self._ticker.done():
            self._ticker = loop.create_task(self._tick(), name="statesnap-freshness-waits")
        try:
            return await asyncio.wait_for(waiter.future, timeout)
        except TimeoutError:
            return False
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)

    async def _tick(self) -> None:
        """Sample the replica while anyone waits; resolve or fail the waiters."""
        while self._waiters:
            await asyncio.sleep(self.tick)
            waiting = [w for w in self._waiters if not w.future.done()]
            if not waiting:
                continue
            state = self.replica.state
            if state != "running":
                error: BaseException = getattr(self.replica, "error", None) or TableStateError(
                    "wait", state, "running"
                )
                for w in waiting:
                    w.future.set_exception(error)
                continue
            sample = _Sample(
                self.replica.offsets,
                any(w.needs_caught_up for w in waiting) and self.replica.caught_up,
            )
            for w in waiting:
                if w.done(sample):
                    w.future.set_result(True)

    def close(self) -> None:
        """Cancel the ticker (pending waits then time out); for tests and shutdown."""
        if self._ticker is not None:
            self._ticker.cancel()
