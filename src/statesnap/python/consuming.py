"""The Python engine's consume → apply → commit point → checkpoint loop, and the handler that
makes a table of it.

One loop for every Python task: a batch is polled, applied through the task's handler (a table's
is :class:`UpsertHandler`: the latest value per key), and only then does the reader's position
move, so offsets, ``wait_for`` and checkpoints never claim a record that is not in the store.
Every ``commit_interval`` a commit point flushes the store and, when ``interval`` has elapsed, the
task's snapshot participant takes a checkpoint.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import ClassVar, Protocol

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
    ReadOnlyTableError,
    StatesnapError,
    TableStateError,
)
from statesnap.failure_log import FailureLog
from statesnap.kafka.reader import ChangelogReader
from statesnap.python.aio import AsyncWaiters
from statesnap.python.hooks import Change, RestoreTracker, UpdateHook, changes_of, fire_updates
from statesnap.serde import Serde
from statesnap.snapshot.participant import SnapshotTask, TaskState
from statesnap.stores import StateStore
from statesnap.stores.base import KafkaMessage
from statesnap.task.lifecycle import TaskPhase
from statesnap.task.rowfilter import RowFilter

__all__ = ["CATCH_UP_POLL", "TAIL_POLL", "Consuming", "RecordHandler", "UpsertHandler"]

log = logging.getLogger(__name__)

#: consume() blocks until a full batch or the timeout, so a short timeout keeps both the end of
#: catch-up and each new record's visibility prompt (a long one adds its whole length to both).
CATCH_UP_POLL = 0.05
TAIL_POLL = 0.02
#: A background consumer's typed failure is logged only when no caller meets it (a read,
#: ``raise_if_failed()``, ``wait_for``) within this long: a caller that meets it says it (the CLI's
#: error line), so it is said once; an unattended table still logs it.
FAILURE_LOG_GRACE = 1.0


class RecordHandler(Protocol):
    """What a task does with a batch of one partition's records (in offset order)."""

    def apply(self, partition: int, messages: Sequence[KafkaMessage], changes: list[Change] | None) -> None:
        """Apply *messages*; when *changes* is given, append each (key, old, new) first."""
        ...

    def commit_point(self, *, checkpoint: bool) -> None:
        """Make durable what the handler did outside the store (a processor's emitted records)
        and drop what the state no longer holds (expired windows): before any checkpoint may
        claim the offsets applied so far. *checkpoint*: one may be taken at this commit point, so
        nothing expired may stay in the store (a TTL sweep is otherwise spread out)."""
        ...

    def rebase_partitions(self) -> frozenset[int]:
        """Partitions whose next checkpoint must be a new base, not a delta (rows were dropped
        that must not linger in older base files: windows past retention)."""
        ...

    def checkpointed(self) -> None:
        """The last checkpoint's report covers what :meth:`rebase_partitions` named."""
        ...


class UpsertHandler:
    """A table's handler: each record upserts its key, a tombstone deletes it."""

    def __init__(self, store: StateStore, row_filter: RowFilter | None) -> None:
        self.store = store
        self.row_filter = row_filter

    def apply(self, partition: int, messages: Sequence[KafkaMessage], changes: list[Change] | None) -> None:
        if changes is not None:
            records = (self.row_filter or RowFilter()).records(messages)
            changes.extend(changes_of(self.store, records))
            self.store.apply(partition, records)
        elif self.row_filter is None:
            self.store.apply_messages(partition, messages)
        else:
            self.store.apply(partition, self.row_filter.records(messages))

    def commit_point(self, *, checkpoint: bool) -> None:
        """A table emits nothing and drops nothing."""

    def rebase_partitions(self) -> frozenset[int]:
        return frozenset()

    def checkpointed(self) -> None:
        """Nothing to forget."""


class Consuming:
    """The loop half of a Python task (mixed into :class:`~statesnap.Table`)."""

    name: str
    store: StateStore
    key_serde: Serde
    value_serde: Serde
    on_update: UpdateHook[object, object] | None
    snapshots: SnapshotTask | None
    background: bool
    tail: bool
    _writes: ClassVar[bool]
    _handler: RecordHandler
    _reader: ChangelogReader | None
    _tracker: RestoreTracker | None
    _lock: threading.RLock
    _stop: threading.Event
    _applied: threading.Condition
    _waiters: AsyncWaiters
    _thread: threading.Thread | None
    _thread_error: BaseException | None
    _failure_met: threading.Event
    _state: TaskPhase
    _newest_ts: int
    _last_applied: float | None
    _last_commit: float
    _last_checkpoint_at: float
    _commit_interval: timedelta
    #: A checkpoint that keeps failing (full disk, store unreachable) is said once a minute.
    _checkpoint_failures: FailureLog
    _checkpoint_interval: timedelta

    def _require(self, action: str, *states: str) -> None:
        raise NotImplementedError

    def _commit_group(self) -> None:
        """Commit the consumer group's offsets (a group member's; informational)."""

    def _checkpoint_url(self) -> str:
        raise NotImplementedError

    def _consume(self, timeout: float) -> int:
        assert self._reader is not None
        applied = 0
        hook = self.on_update if self._state is TaskPhase.RUNNING else None
        updates: list[Change] | None = [] if hook is not None else None
        with self._lock:
            reader = self._reader
            batches = reader.poll(timeout)
            try:
                for partition, messages in batches.items():
                    self._handler.apply(partition, messages, updates)
                    # Only now: offsets, wait_for and checkpoints never claim a record not in the store.
                    reader.applied(partition, messages[-1].offset() + 1)
                    applied += len(messages)
                    ts_type, ts = messages[-1].timestamp()
                    if ts_type:
                        self._newest_ts = max(self._newest_ts, ts)
                    if self._tracker is not None:
                        self._tracker.batch(partition, messages[-1].offset(), len(messages))
            except BaseException as e:
                # The consumer has moved past this batch: the table can no longer equal a replay.
                self._thread_error = e
                raise
        if applied:
            self._last_applied = time.monotonic()
            with self._applied:
                self._applied.notify_all()
            self._waiters.notify()
        if hook is not None and updates:
            fire_updates(self.name, hook, self.key_serde, self.value_serde, updates)
        return applied

    def poll(self, timeout: float = 0.5) -> int:
        """Consume one batch and run a commit point if due; returns the records applied.

        Only for ``background=False`` tables; background tables poll on their own thread.
        """
        self._require("poll", TaskPhase.RUNNING)
        if self._thread is not None:
            raise TableStateError("poll", "consuming in the background", "background=False")
        if self._reader is None:
            raise TableStateError("poll", "a point-in-time view (tail=False)", "tailing")
        applied = self._consume(timeout)
        self._maybe_commit()
        return applied

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._consume(TAIL_POLL)
                self._maybe_commit()
        except BaseException as e:
            self._thread_error = e
            self._waiters.notify()
            if not isinstance(e, StatesnapError):  # not one of ours: its traceback matters
                log.exception("table %s: background consumer failed; the table stopped", self.name)
                return
            deadline = time.monotonic() + FAILURE_LOG_GRACE
            while not self._failure_met.is_set() and not self._stop.is_set() and time.monotonic() < deadline:
                self._failure_met.wait(0.05)
            if not self._failure_met.is_set():
                log.error(
                    "table %s stopped: %s: %s (its reads and raise_if_failed() raise it)",
                    self.name,
                    type(e).__name__,
                    e,
                )

    def _maybe_commit(self) -> None:
        now = time.monotonic()
        if now - self._last_commit < self._commit_interval.total_seconds():
            return
        try:
            self.commit()
        except (OutputError, FatalClientError) as e:
            # Outputs that were not delivered (or not committed), a client that is done for: the
            # task stops here, said once by whoever reports its failure.
            self._thread_error = e
            raise
        except (CheckpointError, BlobStoreError, KafkaError) as e:
            # The table stays correct without this checkpoint (a snapshot store on a topic of a
            # cluster that does not answer, a blob store that fails): keep consuming, try again
            # at the next commit point.
            self._last_commit = time.monotonic()
            self._checkpoint_failures.failed(
                "checkpoint",
                "table %s: checkpoint failed; it keeps consuming and retries at each commit point: %s",
                self.name,
                e,
            )
        else:
            self._checkpoint_failures.recovered("checkpoint", "table %s: commit points work again", self.name)

    def commit(self) -> CheckpointManifest | None:
        """A commit point: flush the store, take part in a pending snapshot, and start one when
        the checkpoint interval has elapsed. Returns the checkpoint completed here, if any."""
        with self._lock:
            snapshots = self.snapshots
            due = (
                snapshots is not None
                and time.monotonic() - self._last_checkpoint_at >= self._checkpoint_interval.total_seconds()
            )
            self._handler.commit_point(
                checkpoint=due or (snapshots is not None and snapshots.pending() is not None)
            )
            self.store.flush()
            self._last_commit = time.monotonic()
            self._commit_group()
            if self.snapshots is None:  # never checkpointed: keep the store from growing apart
                self.store.forget_changes()
                self.store.compact()
                return None
            if due:
                self._last_checkpoint_at = self._last_commit
            return self.snapshots.on_commit(self._task_state(), checkpoint_due=due)

    def checkpoint(
        self, *, full: bool = False, timeout: str | float | timedelta | None = None
    ) -> CheckpointManifest | None:
        """Write a checkpoint now (at a commit point): a snapshot in which this table's partitions
        take part. Returns the committed manifest when the snapshot completed here (always, for a
        table owning every partition), None when nothing changed since the last one or other
        instances have yet to report. Changed partitions get a ``delta`` file of what changed
        (a new ``base`` once deltas pile up); *full* writes a new ``base`` for every changed
        partition now (compaction), so the checkpoint shares no file with older ones there.

        *timeout* bounds the wait, for a commit in progress and for the checkpoint store (None:
        as long as it takes); past it, :class:`CheckpointTimeoutError` — the previous checkpoint
        stands. A checkpoint still waiting for a commit in progress then never starts; one that
        was already writing may still commit later, whole and consistent, or not at all."""
        if not self._writes:
            why = "read-only" if self.tail else "a point-in-time view (tail=False)"
            raise ReadOnlyTableError(f"table {self.name!r} is {why}: it never writes checkpoints")
        if self.snapshots is None or self._reader is None:
            return None
        snapshots = self.snapshots

        def write(abandoned: threading.Event) -> CheckpointManifest | None:
            with self._lock:
                if abandoned.is_set():
                    return None  # the caller gave up while a commit held the lock
                return self._checkpoint_now(snapshots, full=full)

        seconds = None if timeout is None else parse_duration(timeout).total_seconds()
        return call_within(
            seconds,
            write,
            lambda: self._timed_out("the checkpoint", seconds),
            f"statesnap-checkpoint-{self.name}",
        )

    def _checkpoint_now(self, snapshots: SnapshotTask, *, full: bool = False) -> CheckpointManifest | None:
        """A checkpoint now, the lock held: the handler's commit point first (a processor's
        outputs delivered, or committed with their offsets, before a checkpoint claims them),
        then the store flushed and the snapshot task's checkpoint."""
        self._handler.commit_point(checkpoint=True)
        self.store.flush()
        self._last_checkpoint_at = time.monotonic()
        return snapshots.checkpoint(self._task_state(), full=full)

    def _timed_out(self, what: str, seconds: float | None) -> CheckpointTimeoutError:
        return CheckpointTimeoutError(
            f"table {self.name!r}: {what} did not finish within {seconds or 0:.3g}s: "
            f"{self._checkpoint_url()} is not answering; the last committed checkpoint stands"
        )

    def _task_state(self) -> TaskState:
        assert self._reader is not None
        if self._thread_error is not None:  # a batch it could not apply: no checkpoint may claim it
            raise TableStateError("checkpoint", f"failed ({self._thread_error})", "running")
        return TaskState(
            dict(self._reader.positions),
            self.store.export,
            self.store.changes,
            self._mark_checkpointed,
            self._handler.rebase_partitions(),
        )

    def _mark_checkpointed(self) -> None:
        self.store.mark_checkpointed()
        self._handler.checkpointed()
