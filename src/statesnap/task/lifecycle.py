"""The life cycle of a task, as values: ``new`` → ``restoring`` → ``running`` → ``closed``
(``failed`` when a restore or the consuming thread raised, for the types that report it), and
what a closed task may keep of a failure."""

from __future__ import annotations

import traceback
from enum import StrEnum

__all__ = ["TaskPhase", "release_locals"]


class TaskPhase(StrEnum):
    """Where a task is in its life; compares equal to its name (``phase == "running"``)."""

    NEW = "new"
    RESTORING = "restoring"
    RUNNING = "running"
    FAILED = "failed"
    CLOSED = "closed"


def release_locals(error: BaseException) -> None:
    """Clear the locals of the frames *error*'s tracebacks hold (of the errors it chains too).

    A task keeps its failure after close() (``error``, ``status()``, a re-raise), and the calls
    that failed held the task's Kafka clients in their locals: a closed task kept a producer or
    an admin client connected, reconnecting and logging once its broker was gone. The
    tracebacks still print; only the locals go. Frames still executing are left as they are."""
    seen: set[int] = set()
    pending: list[BaseException] = [error]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if current.__traceback__ is not None:
            traceback.clear_frames(current.__traceback__)
        pending += [e for e in (current.__cause__, current.__context__) if e is not None]
