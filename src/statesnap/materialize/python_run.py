"""Deprecated: re-exports :mod:`statesnap.run.in_python` for one release; import from there."""

from __future__ import annotations

from statesnap.run.in_python import (
    POLL_SECONDS,
    Restorable,
    TaskRun,
    open_table,
    restore_with_progress,
    run_in_python,
)

__all__ = [
    "POLL_SECONDS",
    "Restorable",
    "TaskRun",
    "open_table",
    "restore_with_progress",
    "run_in_python",
]
