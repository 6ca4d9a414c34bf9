"""The life cycle of a task, as values: ``new`` → ``restoring`` → ``running`` → ``closed``
(``failed`` when a restore or the consuming thread raised, for the types that report it)."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["TaskPhase"]


class TaskPhase(StrEnum):
    """Where a task is in its life; compares equal to its name (``phase == "running"``)."""

    NEW = "new"
    RESTORING = "restoring"
    RUNNING = "running"
    FAILED = "failed"
    CLOSED = "closed"
