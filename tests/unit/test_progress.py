"""Replay progress: count, estimated total, rate and ETA, on a real rich Progress with a fake clock."""

from __future__ import annotations

import io

from rich.console import Console
from rich.progress import Progress

from statesnap.cli.progress import ReplayProgress, ReplayStatus, replay_bar


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_estimate_rate_and_eta() -> None:
    clock = Clock()
    with Progress(console=Console(file=io.StringIO()), disable=True) as bar:
        replay = ReplayProgress(bar, "replaying orders", clock=clock)
        replay(0, 0, 4, 1_000_000)
        assert replay.last is not None
        assert replay.last.rate is None  # nothing measured yet
        assert replay.last.detail() == "0/~1,000,000 records (estimate)"
        clock.now += 2.0
        replay(200_000, 1, 4, 1_000_000)
        task = bar.tasks[0]
        assert (task.completed, task.total) == (200_000, 1_000_000)
        assert task.description == "replaying orders (1/4 partitions at end)"
        assert replay.last.rate == 100_000
        assert replay.last.eta_seconds == 8.0
        assert task.fields["detail"] == "200,000/~1,000,000 records (estimate) · 100.0k rec/s · ETA 0:08"


def test_past_the_estimate_the_bar_holds_and_says_so() -> None:
    """The dev broker under-reports watermarks: the count passes the estimate; the bar must not
    overflow or go back, and no ETA is invented."""
    clock = Clock()
    with Progress(console=Console(file=io.StringIO()), disable=True) as bar:
        replay = ReplayProgress(bar, "replaying t", clock=clock)
        replay(0, 0, 1, 100)
        clock.now += 1
        replay(150, 0, 1, 100)
        task = bar.tasks[0]
        assert task.total == 150
        assert task.completed == 150
        assert replay.last is not None
        assert replay.last.eta_seconds is None
        assert "past the estimate of ~100" in replay.last.detail()
        replay.finish(180, "restored t")
        assert (bar.tasks[0].completed, bar.tasks[0].total) == (180, 180)
        assert bar.tasks[0].description == "restored t"


def test_without_a_total() -> None:
    clock = Clock()
    with Progress(console=Console(file=io.StringIO()), disable=True) as bar:
        replay = ReplayProgress(bar, "replaying t", clock=clock)
        replay(10, 0, 2)
        clock.now += 0.5
        replay(2_500_010, 0, 2, None)
        assert bar.tasks[0].total is None
        assert replay.last is not None
        assert replay.last.detail() == "2,500,010 records · 5.0M rec/s"


def test_rate_follows_the_recent_window() -> None:
    clock = Clock()
    with Progress(console=Console(file=io.StringIO()), disable=True) as bar:
        replay = ReplayProgress(bar, "r", clock=clock)
        records = 0
        for _ in range(20):  # 10 s at 1,000/s …
            clock.now += 0.5
            records += 500
            replay(records, 0, 1, 10**9)
        for _ in range(20):  # … then 10 s at 10/s
            clock.now += 0.5
            records += 5
            replay(records, 0, 1, 10**9)
        assert replay.last is not None
        assert replay.last.rate is not None
        assert replay.last.rate < 20  # the old speed has left the window


def test_eta_formats() -> None:
    assert ReplayStatus(0, 0, 1, 7200 * 10, 10.0).detail().endswith("ETA 2:00:00")
    assert ReplayStatus(5, 1, 1, 5, 10.0).eta_seconds is None


def test_replay_bar_renders_the_detail() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=160)
    with replay_bar(console=console) as bar:
        replay = ReplayProgress(bar, "replaying orders", clock=Clock())
        replay(10, 0, 2, 1000)
        bar.refresh()
    assert "10/~1,000 records (estimate)" in out.getvalue()
