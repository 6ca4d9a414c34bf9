"""A task's commit points and checkpoints: one sequence for every Python task.

A commit point, every ``commit_interval``, in order: the record handler's commit point (a
processor's outputs delivered, or committed with their offsets; expired windows dropped), the
store flushed, the consumer group's offsets committed (informational), and then the writer's part:
report to a pending snapshot, or start one when the checkpoint interval has elapsed. A task
without a checkpoint (read-only, or no checkpoint store) only keeps its store from growing
apart. A checkpoint asked for (:meth:`CommitPoints.checkpoint`) runs the same sequence at once.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from typing import TYPE_CHECKING

from statesnap.checkpoint import CheckpointManifest
from statesnap.deadline import call_within
from statesnap.durations import parse_duration
from statesnap.errors import (
    BlobStoreError,
    CheckpointError,
    CheckpointTimeoutError,
    FatalClientError,
    KafkaError,
    OutputError,
    TableStateError,
)
from statesnap.failure_log import FailureLog
from statesnap.snapshot.participant import TaskState
from statesnap.task.writer import TaskWriter

if TYPE_CHECKING:
    from statesnap.task.engine import Task

__all__ = ["CommitPoints"]

#: Checkpoint failures keep the logger operators know them by (the loop's, before it moved).
_failures_log = logging.getLogger("statesnap.python.consuming")


class CommitPoints:
    """When *task* commits, and what a commit point and a checkpoint do (see the module)."""

    def __init__(self, task: Task) -> None:
        self.task = task
        #: ``time.monotonic()`` of the last commit point (or of the restore).
        self.last_commit = time.monotonic()
        #: A checkpoint that keeps failing (full disk, store unreachable) is said once a minute.
        self._failures = FailureLog(_failures_log)

    def maybe_commit(self) -> None:
        """A commit point if the commit interval has elapsed; a failed checkpoint is retried at
        the next one. Then, due or not, outputs that failed to commit (an aborted transaction)
        stop the task: its state is past them."""
        task = self.task
        if time.monotonic() - self.last_commit >= task.commit_interval.total_seconds():
            self._commit_or_retry()
        failure = task.handler_failure()
        if failure is not None:
            task.loop.fail(failure)
            raise failure

    def _commit_or_retry(self) -> None:
        task = self.task
        try:
            self.commit()
        except (OutputError, FatalClientError) as e:
            # Outputs that were not delivered (or not committed), a client that is done for: the
            # task stops here, said once by whoever reports its failure.
            task.loop.fail(e)
            raise
        except (CheckpointError, BlobStoreError, KafkaError) as e:
            # The task stays correct without this checkpoint (a snapshot store on a topic of a
            # cluster that does not answer, a blob store that fails): keep consuming, try again
            # at the next commit point.
            self.last_commit = time.monotonic()
            self._failures.failed(
                "checkpoint",
                "table %s: checkpoint failed; it keeps consuming and retries at each commit point: %s",
                task.name,
                e,
            )
        else:
            self._failures.recovered("checkpoint", "table %s: commit points work again", task.name)

    def commit(self) -> CheckpointManifest | None:
        """A commit point now; returns the checkpoint completed here, if any."""
        task = self.task
        with task.loop.lock:
            writer = task.writer if task.snapshots is not None else None
            due = writer is not None and writer.due(time.monotonic())
            task.handler.commit_point(checkpoint=due or (writer is not None and writer.pending()))
            task.store.flush()
            self.last_commit = time.monotonic()
            if task.membership is not None:
                task.membership.commit_offsets()  # informational, for lag tools
            if writer is None:  # never checkpointed: keep the store from growing apart
                task.store.forget_changes()
                task.store.compact()
                return None
            return writer.on_commit(self._state(), due=due, at=self.last_commit)

    def checkpoint(
        self, writer: TaskWriter, *, full: bool = False, timeout: str | float | timedelta | None = None
    ) -> CheckpointManifest | None:
        """Write a checkpoint now (see :meth:`statesnap.Table.checkpoint`): None when the task has
        no checkpoint store or no reader (a point-in-time view)."""
        task = self.task
        if not writer.joined or task.loop.reader is None:
            return None

        def write(abandoned: threading.Event) -> CheckpointManifest | None:
            with task.loop.lock:
                if abandoned.is_set():
                    return None  # the caller gave up while a commit held the lock
                return self.checkpoint_now(full=full)

        seconds = None if timeout is None else parse_duration(timeout).total_seconds()
        return call_within(
            seconds,
            write,
            lambda: self.timed_out("the checkpoint", seconds),
            f"statesnap-checkpoint-{task.name}",
        )

    def checkpoint_now(self, *, full: bool = False) -> CheckpointManifest | None:
        """A checkpoint now, the lock held: the handler's commit point first (a processor's
        outputs delivered, or committed with their offsets, before a checkpoint claims them),
        then the store flushed and the writer's checkpoint."""
        task = self.task
        assert task.writer is not None
        task.handler.commit_point(checkpoint=True)
        task.store.flush()
        return task.writer.checkpoint(self._state(), full=full)

    def timed_out(self, what: str, seconds: float | None) -> CheckpointTimeoutError:
        task = self.task
        url = task.repo.shown if task.repo is not None else "the checkpoint store"
        return CheckpointTimeoutError(
            f"table {task.name!r}: {what} did not finish within {seconds or 0:.3g}s: "
            f"{url} is not answering; the last committed checkpoint stands"
        )

    def _state(self) -> TaskState:
        task = self.task
        reader = task.loop.reader
        assert reader is not None
        failure = task.failure
        if failure is not None:  # a batch it could not apply: no checkpoint may claim it
            raise TableStateError("checkpoint", f"failed ({failure})", "running")
        return TaskState(
            dict(reader.positions),
            task.store.export,
            task.store.changes,
            self._mark_checkpointed,
            task.handler.rebase_partitions(),
        )

    def _mark_checkpointed(self) -> None:
        self.task.store.mark_checkpointed()
        self.task.handler.checkpointed()
