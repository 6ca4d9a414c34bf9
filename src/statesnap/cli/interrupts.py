"""Ctrl-C for long-running commands: the first asks for a clean stop (a final checkpoint within
``--shutdown-timeout``), a second one exits at once, as users expect of a tool that seems stuck."""

from __future__ import annotations

import os
import signal
import sys
import threading

import click

#: ``--shutdown-timeout``'s default: long enough for a final incremental checkpoint, short enough
#: that an operator's Ctrl-C is answered even when the checkpoint store is not.
SHUTDOWN_TIMEOUT = "20s"

shutdown_timeout_option = click.option(
    "--shutdown-timeout",
    default=SHUTDOWN_TIMEOUT,
    show_default=True,
    envvar="STATESNAP_SHUTDOWN_TIMEOUT",
    help="With --follow: on Ctrl-C, how long the final checkpoint may take; past it the command "
    "exits with an error and the last committed checkpoint stands. A second Ctrl-C exits at once. "
    "[env: STATESNAP_SHUTDOWN_TIMEOUT]",
)


def stop_on_signals() -> threading.Event:
    """An event set by the first SIGINT/SIGTERM; the second ends the process (exit 130)."""
    stop = threading.Event()

    def handle(signum: int, _frame: object) -> None:
        if stop.is_set():
            sys.stderr.write("Aborted: stopped again before the final checkpoint finished\n")
            sys.stderr.flush()
            os._exit(130)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handle)
    return stop
