"""Progress bars on stderr, so stdout stays clean for ``--json`` and piping.

:class:`ReplayProgress` shows a replay as ``records / ~total (estimate)``, the rate and an ETA. The
total comes from high watermarks, which only estimate it (the dev broker under-reports them; even
Apache Kafka's exact end offsets over-count records where transaction markers, aborted records or
compaction hold offsets; and records keep arriving), so it is always shown as an estimate, and the
bar never goes back when the count passes it. Without a total the count and rate are shown alone.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)

from statesnap.run.engine import EngineChoice
from statesnap.run.progress import MaterializeProgress, Stage

__all__ = [
    "RATE_WINDOW_SECONDS",
    "ConsoleProgress",
    "ReplayProgress",
    "ReplayStatus",
    "activity_bar",
    "progress_bar",
    "replay_bar",
    "stderr",
    "stderr_as_it_is",
]

stderr = Console(stderr=True)

#: The rate is measured over this many recent seconds, so it follows changes in speed.
RATE_WINDOW_SECONDS = 5.0


@contextmanager
def progress_bar(quiet: bool = False) -> Iterator[Progress]:
    """A rich progress display on stderr; disabled when *quiet* or stderr is not a terminal."""
    with Progress(
        SpinnerColumn(),
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        console=stderr,
        disable=quiet,
        transient=False,
    ) as progress:
        yield progress


@contextmanager
def replay_bar(quiet: bool = False, console: Console | None = None) -> Iterator[Progress]:
    """A progress display for :class:`ReplayProgress`: description, bar, counts/rate/ETA, time
    (on stderr unless *console* says otherwise)."""
    with Progress(
        SpinnerColumn(),
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
        console=console or stderr,
        disable=quiet,
        transient=False,
    ) as progress:
        yield progress


@contextmanager
def activity_bar(
    quiet: bool = False, *, transient: bool = False, console: Console | None = None
) -> Iterator[Progress]:
    """Spinner, description, a ``detail`` field and the elapsed time, on stderr: for work whose
    size is not known up front (a Spark session starting, a streaming query running). Off a
    terminal only the final state is printed (nothing at all when *transient*)."""
    with Progress(
        SpinnerColumn(),
        TextColumn("[progress.description]{task.description}"),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
        console=console or stderr,
        disable=quiet,
        transient=transient,
    ) as progress:
        yield progress


@contextmanager
def stderr_as_it_is() -> Iterator[Console]:
    """A console on a duplicate of stderr as it is now: it stays on the terminal while the
    descriptor is swapped for a pipe (the Spark launcher does so while the JVM starts, and a
    display writing to a pipe stops refreshing)."""
    try:
        fd = os.dup(stderr.file.fileno())
    except (OSError, ValueError, AttributeError):  # no real stderr (captured): use it as it is
        yield stderr
        return
    with os.fdopen(fd, "w", buffering=1, encoding="utf-8", errors="replace") as file:
        yield Console(file=file)


def _count(n: float) -> str:
    return f"{n:,.0f}"


def _rate(per_second: float) -> str:
    if per_second >= 1e6:
        return f"{per_second / 1e6:.1f}M rec/s"
    if per_second >= 1e3:
        return f"{per_second / 1e3:.1f}k rec/s"
    return f"{per_second:.0f} rec/s"


def _duration(seconds: float) -> str:
    s = int(seconds + 0.5)
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


@dataclass(frozen=True, slots=True)
class ReplayStatus:
    """One moment of a replay, and how to say it."""

    records: int
    partitions_done: int
    partitions_total: int
    estimated_total: int | None
    rate: float | None  # records per second, None until measurable

    @property
    def eta_seconds(self) -> float | None:
        """Seconds left at the current rate; None without a total or a rate, or past the total."""
        if self.estimated_total is None or not self.rate or self.records >= self.estimated_total:
            return None
        return (self.estimated_total - self.records) / self.rate

    def detail(self) -> str:
        """``120,000/~1,000,000 records (estimate) · 85.0k rec/s · ETA 0:10``."""
        parts = []
        if self.estimated_total is None:
            parts.append(f"{_count(self.records)} records")
        elif self.records > self.estimated_total:
            parts.append(
                f"{_count(self.records)} records (past the estimate of ~{_count(self.estimated_total)})"
            )
        else:
            parts.append(f"{_count(self.records)}/~{_count(self.estimated_total)} records (estimate)")
        if self.rate is not None:
            parts.append(_rate(self.rate))
        eta = self.eta_seconds
        if eta is not None:
            parts.append(f"ETA {_duration(eta)}")
        return " · ".join(parts)


class ReplayProgress:
    """Feeds a rich task from replay callbacks: ``progress(records, partitions_done,
    partitions_total, estimated_total)``; *estimated_total* (None when unknown) may change
    between calls as high watermarks are refreshed."""

    def __init__(
        self,
        bar: Progress,
        label: str,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bar = bar
        self.label = label
        self.clock = clock
        self.task: TaskID = bar.add_task(label, total=None, detail="")
        self._samples: deque[tuple[float, int]] = deque()
        self.last: ReplayStatus | None = None

    def _measure(self, records: int) -> float | None:
        now = self.clock()
        self._samples.append((now, records))
        while len(self._samples) > 2 and now - self._samples[1][0] >= RATE_WINDOW_SECONDS:
            self._samples.popleft()
        t0, r0 = self._samples[0]
        if now - t0 < 0.2:  # too short to say anything
            return None
        return max(0.0, (records - r0) / (now - t0))

    def __call__(
        self, records: int, partitions_done: int, partitions_total: int, estimated_total: int | None = None
    ) -> None:
        status = ReplayStatus(
            records, partitions_done, partitions_total, estimated_total, self._measure(records)
        )
        self.last = status
        total = None if estimated_total is None else max(estimated_total, records)
        self.bar.update(
            self.task,
            completed=records,
            total=total,
            description=f"{self.label} ({partitions_done}/{partitions_total} partitions at end)",
            detail=status.detail(),
        )

    def finish(self, records: int, label: str) -> None:
        """The replay ended: a full bar with the exact count."""
        self.bar.update(
            self.task,
            total=max(records, 1),
            completed=max(records, 1),
            description=label,
            detail=f"{_count(records)} records",
        )


class ConsoleProgress(MaterializeProgress):
    """A materialization's progress on stderr: the engine line, the replay bar, the Spark job's
    activity line, status lines; nothing when *quiet*. *on_stage* hears every stage (the CLI's
    signal handling follows them). Use it as a context manager: a bar still open when the run
    fails is closed."""

    def __init__(
        self, quiet: bool, on_stage: Callable[[Stage], None] | None = None, *, engine_line: bool = True
    ) -> None:
        self.quiet = quiet
        self.engine_line = engine_line
        self.on_stage = on_stage
        self.stage_now: Stage | None = None
        self._bars = ExitStack()
        self._replay: ReplayProgress | None = None
        self._job: tuple[Progress, TaskID] | None = None

    def __enter__(self) -> ConsoleProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self._bars.close()

    def engine_chosen(self, choice: EngineChoice) -> None:
        if self.engine_line:
            self.status(f"engine: {choice.engine} ({choice.reason})")

    def stage(self, stage: Stage) -> None:
        self.stage_now = stage
        if self.on_stage is not None:
            self.on_stage(stage)

    def status(self, line: str) -> None:
        if not self.quiet:
            click.echo(line, err=True)

    def replay_started(self, label: str) -> None:
        bar = self._bars.enter_context(replay_bar(self.quiet))
        self._replay = ReplayProgress(bar, label)

    def replay(
        self, records: int, partitions_done: int, partitions_total: int, estimated_total: int | None
    ) -> None:
        if self._replay is not None:
            self._replay(records, partitions_done, partitions_total, estimated_total)

    def replay_finished(self, records: int, label: str) -> None:
        if self._replay is not None:
            self._replay.finish(records, label)
            self._replay = None
            self._bars.close()

    def job_started(self, label: str) -> None:
        bar = self._bars.enter_context(activity_bar(self.quiet))
        self._job = (bar, bar.add_task(label, total=None, detail=""))

    def job(self, detail: str) -> None:
        if self._job is not None:
            bar, task = self._job
            bar.update(task, detail=detail)

    def job_finished(self) -> None:
        self._job = None
        self._bars.close()
