"""call_within: a call that may never return is waited for only until its deadline."""

from __future__ import annotations

import threading
import time

import pytest

from statesnap.deadline import Deadline, call_within
from statesnap.errors import CheckpointTimeoutError


def test_a_stuck_call_ends_in_the_typed_error_and_is_told_it_was_abandoned() -> None:
    release, told = threading.Event(), threading.Event()

    def stuck(abandoned: threading.Event) -> int:
        release.wait(10)
        if abandoned.is_set():
            told.set()
        return 1

    started = time.monotonic()
    with pytest.raises(CheckpointTimeoutError, match="store"):
        call_within(0.2, stuck, lambda: CheckpointTimeoutError("store not answering"), "t")
    assert time.monotonic() - started < 2
    release.set()
    assert told.wait(5), "the abandoned call was not told"


def test_results_and_errors_pass_through() -> None:
    assert call_within(5, lambda _a: 42, lambda: CheckpointTimeoutError("x"), "t") == 42
    assert call_within(None, lambda _a: 7, lambda: CheckpointTimeoutError("x"), "t") == 7

    def boom(_a: threading.Event) -> None:
        raise KeyError("k")

    with pytest.raises(KeyError):
        call_within(5, boom, lambda: CheckpointTimeoutError("x"), "t")


def test_a_deadline_is_shared_and_never_negative() -> None:
    assert Deadline(None).remaining() is None
    d = Deadline(0.05)
    time.sleep(0.1)
    assert d.remaining() == 0.0
