"""FailureLog: a retried failure is said at once, then at most once per interval with its count,
then once when it works again (pure: a fake clock, a real logger)."""

from __future__ import annotations

import logging

import pytest

from statesnap.failure_log import FailureLog


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "test.failures"]


def test_a_failure_every_commit_point_is_one_line_a_minute_with_its_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    log = FailureLog(logging.getLogger("test.failures"), interval=60.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="test.failures"):
        said = []
        for _ in range(300):  # 5 s commit points for 25 minutes
            said.append(log.failed("checkpoint", "table %s: checkpoint failed: %s", "t", "disk full"))
            clock.now += 5.0
    assert said[0]
    assert sum(said) == 1 + 299 * 5 // 60  # the first, then one a minute
    shown = lines(caplog)
    assert shown[0] == "table t: checkpoint failed: disk full"
    assert shown[1] == (
        "table t: checkpoint failed: disk full"
        " (failing for 60 s: 13 failures, 11 not shown since the last line)"
    )
    assert log.failures("checkpoint") == 300


def test_kinds_have_their_own_streaks_and_recovery_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    log = FailureLog(logging.getLogger("test.failures"), interval=60.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="test.failures"):
        log.failed("checkpoint", "checkpoint failed")
        log.failed("refresh", "refresh failed")
        clock.now += 1
        log.failed("checkpoint", "checkpoint failed")
        clock.now += 9
        log.recovered("checkpoint", "checkpoints work again")
        log.recovered("checkpoint", "checkpoints work again")  # no streak: nothing said
        log.failed("checkpoint", "checkpoint failed")  # a new streak starts loud
    assert lines(caplog) == [
        "checkpoint failed",
        "refresh failed",
        "checkpoints work again (after 2 failures over 10 s)",
        "checkpoint failed",
    ]
    assert log.failures("refresh") == 1
    assert log.failures("checkpoint") == 1
