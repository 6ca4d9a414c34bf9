"""Waiting on a call that may never return: a blocked socket read cannot be interrupted from
Python, so the call runs on a daemon thread and the caller stops waiting at the deadline.

The abandoned call is told (its ``abandoned`` event is set) so that, should it get going later
(e.g. once a lock it waited for is free), it can give up instead of acting after its caller
moved on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["Deadline", "T", "call_within"]

T = TypeVar("T")


class Deadline:
    """A point in time that several waits share (``remaining`` never goes below zero)."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self._at = None if seconds is None else time.monotonic() + seconds

    def remaining(self) -> float | None:
        """Seconds left, or None for no deadline."""
        return None if self._at is None else max(0.0, self._at - time.monotonic())


def call_within(
    seconds: float | None, fn: Callable[[threading.Event], T], on_timeout: Callable[[], Exception], name: str
) -> T:
    """``fn(abandoned)`` with a deadline: its result or exception, or ``on_timeout()`` raised
    when it has not returned within *seconds* (None: wait as long as it takes, on this thread)."""
    abandoned = threading.Event()
    if seconds is None:
        return fn(abandoned)
    outcome: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(fn(abandoned))
        except BaseException as e:
            failure.append(e)

    worker = threading.Thread(target=run, name=name, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        abandoned.set()
        raise on_timeout()
    if failure:
        raise failure[0]
    return outcome[0]
