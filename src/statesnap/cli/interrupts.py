"""Ctrl-C for long-running commands: the first asks for a clean stop (a final checkpoint within
``--shutdown-timeout``), a second one exits at once, as users expect of a tool that seems stuck.

One stop request often arrives twice: ``timeout -s INT`` and process managers signal the command
and then its whole process group, which holds the command too. A repeat within
:data:`REPEAT_WINDOW_SECONDS` of the first signal is that same request, not a second Ctrl-C (it
used to end a Spark ``--follow`` with "Aborted", exit 130, in the middle of its final checkpoint).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import click

from statesnap.durations import format_duration

__all__ = [
    "REPEAT_WINDOW_SECONDS",
    "SHUTDOWN_TIMEOUT",
    "Interrupted",
    "StoppedEarly",
    "cancel_spark_jobs_on_signals",
    "shutdown_timeout_option",
    "stop_on_signals",
    "wait_on_signals",
]

#: A signal this soon after the first is the same request delivered twice (to the process, then to
#: its group); a person pressing Ctrl-C again because the command seems stuck does it later.
REPEAT_WINDOW_SECONDS = 1.0

#: ``--shutdown-timeout``'s default (the library's): long enough for a final incremental
#: checkpoint, short enough that an operator's Ctrl-C is answered even when the checkpoint store
#: is not. statesnap.run.options.SHUTDOWN_TIMEOUT, repeated so that loading the CLI does not
#: import the engines (~0.3 s on every `statesnap` command); a unit test keeps them equal.
SHUTDOWN_TIMEOUT = format_duration(timedelta(seconds=20))

shutdown_timeout_option = click.option(
    "--shutdown-timeout",
    default=SHUTDOWN_TIMEOUT,
    show_default=True,
    envvar="STATESNAP_SHUTDOWN_TIMEOUT",
    help="On Ctrl-C, how long the final checkpoint (with --follow) or the checkpoint of what a "
    "catch-up read (the python engine) may take; past it the command "
    "exits with an error and the last committed checkpoint stands. A second Ctrl-C exits at once. "
    "[env: STATESNAP_SHUTDOWN_TIMEOUT]",
)


def _on_signals(
    event: threading.Event, again: str | Callable[[], str], first: Callable[[], None] | None = None
) -> None:
    """SIGINT/SIGTERM: the first sets *event* (and runs *first*); a repeat within
    :data:`REPEAT_WINDOW_SECONDS` is ignored; a later one prints *again* (or what it returns) and
    ends the process (exit 130)."""
    first_at: list[float] = []

    def handle(signum: int, _frame: object) -> None:
        if event.is_set():
            if first_at and time.monotonic() - first_at[0] < REPEAT_WINDOW_SECONDS:
                return  # the same stop request, delivered to the process and to its group
            sys.stderr.write(f"Aborted: {again if isinstance(again, str) else again()}\n")
            sys.stderr.flush()
            os._exit(130)
        first_at.append(time.monotonic())
        event.set()
        if first is not None:
            first()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handle)


def stop_on_signals(
    again: str | Callable[[], str] = "stopped again before the final checkpoint finished",
    stop: threading.Event | None = None,
) -> threading.Event:
    """An event (*stop*, or a new one) set by the first SIGINT/SIGTERM; the second ends the
    process (exit 130) with *again* (a callable says what the command was doing at that
    moment)."""
    stop = stop if stop is not None else threading.Event()
    _on_signals(stop, again)
    return stop


def wait_on_signals(interrupted: threading.Event, again: str) -> None:
    """Before there is anything to cancel (a Spark session starting): the first SIGINT/SIGTERM
    sets *interrupted*, the second ends the process (exit 130) with *again*."""
    _on_signals(interrupted, again)


def cancel_spark_jobs_on_signals(spark: Any, interrupted: threading.Event, *, verbose: bool) -> None:
    """A batch run on Spark: the first SIGINT/SIGTERM cancels the running jobs and every job
    started after it, so the blocking call returns with a cancelled job (PySpark's own handler
    raises KeyboardInterrupt inside a py4j call instead, which prints pages of py4j tracebacks);
    the second ends the process. Cancelling runs on a thread of its own: the main thread is
    inside a py4j call. *interrupted* is set by the first signal.

    Unless *verbose*, Spark's own logging goes off at the first signal: tearing down a cancelled
    job, its scheduler logs ERROR lines (a task result rejected by a pool already shut down) that
    describe the cancel the CLI reports in its one line, not a failure."""

    def keep_cancelling() -> None:
        if not verbose:
            with contextlib.suppress(Exception):  # the session stopped: nothing left to log
                spark.sparkContext.setLogLevel("OFF")
        while True:  # a daemon thread: it ends with the process, or with the session
            try:
                spark.sparkContext.cancelAllJobs()
            except Exception:  # the session stopped: nothing left to cancel
                return
            time.sleep(0.2)

    def start_cancelling() -> None:
        threading.Thread(target=keep_cancelling, name="statesnap-cancel", daemon=True).start()

    _on_signals(interrupted, "stopped again while Spark was cancelling", start_cancelling)


class Interrupted(click.ClickException):
    """Ctrl-C ended a run before it committed anything: one line, exit 130."""

    exit_code = 130

    def __init__(self, what: str) -> None:
        super().__init__(f"interrupted: {what}; the last committed checkpoint stands")


class StoppedEarly(click.ClickException):
    """Ctrl-C stopped a catch-up, which checkpointed what it had read: the library's one line
    (which checkpoint holds it), exit 130 as for any interrupted command."""

    exit_code = 130

    def show(self, file: Any = None) -> None:
        """The line as it is: a stop that was asked for is not an error."""
        click.echo(self.format_message(), err=True, file=file)
