"""Repeated failures said once per interval, with a count, instead of once per retry.

A task retries what fails without stopping it — a checkpoint at every commit point, a store
follower's refresh at every poll — and logging every try buries the operator: a full disk gave 123
warning lines in 26 s and an unreachable S3 about 5 a second. A :class:`FailureLog` says the first
failure of a kind at once, counts the ones that follow, says them again at most once per
``interval`` as one line with the count, and says once when the kind works again.

The library only logs (``logging``, %-style); what is shown and how is the CLI's business.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["DEFAULT_REPEAT_INTERVAL", "FailureLog"]

#: One line a minute for a failure that goes on: often enough to see it persists, rarely enough
#: that a terminal or a log pipeline is not flooded by a fault nobody can fix within seconds.
DEFAULT_REPEAT_INTERVAL = 60.0


@dataclass(slots=True)
class _Streak:
    """The failures of one kind since it last worked."""

    first_at: float
    said_at: float
    failures: int = 1
    unsaid: int = 0


class FailureLog:
    """Rate-limited warnings for failures that are retried (thread-safe).

    ``kind`` names what fails ("checkpoint", "refresh"); each kind has its own streak. *clock*
    is for tests (monotonic seconds)."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        interval: float = DEFAULT_REPEAT_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._streaks: dict[str, _Streak] = {}

    def failed(self, kind: str, message: str, *args: object) -> bool:
        """A failure of *kind*: logged at WARNING now if it is the first of its streak or the
        last line about it is *interval* old (then with the count since), else only counted.
        Whether a line was written."""
        now = self._clock()
        with self._lock:
            streak = self._streaks.get(kind)
            if streak is None:
                self._streaks[kind] = _Streak(first_at=now, said_at=now)
                self.logger.warning(message, *args)
                return True
            streak.failures += 1
            if now - streak.said_at < self.interval:
                streak.unsaid += 1
                return False
            unsaid, streak.unsaid, streak.said_at = streak.unsaid, 0, now
            span = now - streak.first_at
        self.logger.warning(
            message + " (failing for %.0f s: %d failures, %d not shown since the last line)",
            *args,
            span,
            streak.failures,
            unsaid,
        )
        return True

    def recovered(self, kind: str, message: str, *args: object) -> None:
        """*kind* worked again: ends its streak, logged once (at WARNING, as the failures were)
        when there was one; a call without a streak says nothing."""
        now = self._clock()
        with self._lock:
            streak = self._streaks.pop(kind, None)
        if streak is None:
            return
        self.logger.warning(
            message + " (after %d failures over %.0f s)", *args, streak.failures, now - streak.first_at
        )

    def failures(self, kind: str) -> int:
        """Failures of *kind* since it last worked (0: it works)."""
        with self._lock:
            streak = self._streaks.get(kind)
            return 0 if streak is None else streak.failures
