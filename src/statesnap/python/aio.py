"""asyncio support for tables and followers: waits that never block the event loop.

The blocking parts (a restore, a ``background=False`` table's polling) run on worker threads
(``asyncio.to_thread``). A coroutine waiting for records is woken by the consuming thread through
``loop.call_soon_threadsafe`` each time a batch is applied — no polling. A safety re-check every
:data:`RECHECK_SECONDS` bounds the wait should a wake-up ever be missed (a consumer that dies
between two checks, a loop that was busy).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator

__all__ = ["RECHECK_SECONDS", "AsyncWaiters"]

#: Upper bound between two checks of a waiting coroutine's condition when no batch arrives.
RECHECK_SECONDS = 0.5


class AsyncWaiters:
    """Coroutines waiting for a table to move; the consuming thread calls :meth:`notify`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()

    def notify(self) -> None:
        """Wake every waiting coroutine (from any thread; cheap when nobody waits)."""
        if not self._waiters:
            return
        with self._lock:
            waiters = list(self._waiters)
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # the loop closed since
                loop.call_soon_threadsafe(event.set)

    @contextlib.contextmanager
    def registered(self) -> Iterator[asyncio.Event]:
        """An event set on every :meth:`notify` while the block runs (call from the loop)."""
        entry = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            self._waiters.add(entry)
        try:
            yield entry[1]
        finally:
            with self._lock:
                self._waiters.discard(entry)

    async def wait_until(self, done: Callable[[], bool], check: Callable[[], None], timeout: float) -> bool:
        """Await *done()* for up to *timeout* seconds; *check()* raises when waiting is futile
        (the consumer failed, the table closed). True when done, False on timeout."""
        deadline = time.monotonic() + timeout
        with self.registered() as event:
            while True:
                event.clear()  # before the check: a notify after it is never lost
                if done():
                    return True
                check()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), min(remaining, RECHECK_SECONDS))
