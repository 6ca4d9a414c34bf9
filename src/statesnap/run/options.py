"""The option bundles only a materialization needs: following, and what only Spark honours.

Everything a task is told (checkpoints, store, partition share) comes from
:mod:`statesnap.task.options`; these two add what belongs to one mode or one engine.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from types import MappingProxyType
from typing import Any

from statesnap.durations import parse_duration

__all__ = ["FollowOptions", "SparkOptions", "StopRequest"]

#: The final checkpoint's default deadline: long enough for an incremental checkpoint, short
#: enough that a stop request is answered even when the checkpoint store is not.
SHUTDOWN_TIMEOUT = timedelta(seconds=20)


@dataclass(frozen=True, slots=True)
class FollowOptions:
    """Keep consuming and checkpointing (every ``CheckpointOptions.interval``) until *stop* is
    set, then write a final checkpoint within *shutdown_timeout* (past it a
    ``CheckpointTimeoutError``; the last committed checkpoint stands). A KeyboardInterrupt while
    following counts as a stop request."""

    stop: threading.Event = field(default_factory=threading.Event)
    shutdown_timeout: timedelta = SHUTDOWN_TIMEOUT

    def __post_init__(self) -> None:
        object.__setattr__(self, "shutdown_timeout", parse_duration(self.shutdown_timeout))

    @classmethod
    def of(cls, follow: bool | FollowOptions) -> FollowOptions | None:
        """What ``follow=`` means: False (a one-shot run), True (every default) or a bundle."""
        if isinstance(follow, FollowOptions):
            return follow
        return cls() if follow else None


@dataclass(frozen=True, slots=True)
class StopRequest:
    """How to stop a run early and cleanly: set *event* (from a signal handler or another thread).
    A Python run still catching up then stops between two batches, checkpoints what it read
    within *timeout* and raises :class:`~statesnap.errors.CatchUpStoppedError` (saying which
    checkpoint holds it), so the work of a long catch-up is kept; a follow run, caught up, stops
    with its final checkpoint as :class:`FollowOptions` says."""

    event: threading.Event = field(default_factory=threading.Event)
    timeout: timedelta = SHUTDOWN_TIMEOUT

    def __post_init__(self) -> None:
        object.__setattr__(self, "timeout", parse_duration(self.timeout))

    @classmethod
    def of(cls, stop: StopRequest | None, follow: FollowOptions | None) -> StopRequest | None:
        """*stop*, else a follow run's own stop request (its event and shutdown timeout)."""
        if stop is not None or follow is None:
            return stop
        return cls(follow.stop, follow.shutdown_timeout)


@dataclass(frozen=True, slots=True)
class SparkOptions:
    """What only the Spark engine honours.

    Args:
        conf: any Spark setting (``spark.executor.memory``, …) for the session it starts.
        checkpoint_location: with follow, Spark's streaming checkpoint (default: a per-user cache
            directory keyed by store and table); state that disagrees with the checkpoint store
            is moved aside.
        session: how to get a session (default: :func:`statesnap.spark.spark_session` with
            *conf*); the run stops the session it gets when it ends.
    """

    conf: Mapping[str, str] = field(default_factory=dict)
    checkpoint_location: str | None = None
    session: Callable[[], Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "conf", MappingProxyType(dict(self.conf)))
