"""A task's consuming side: poll a batch, apply it through the record handler, then move the
reader's position — so offsets, waits and checkpoints never claim a record not in the store —
and say so to whoever waits (a condition for threads, listeners for event loops).

:class:`TaskLoop` holds what the consuming thread and the readers share: the reader, the lock
a batch and a commit point hold, the failure that stopped consuming, and the freshness figures
(offsets, lag, ages). The :class:`~statesnap.task.engine.Task` owns it and decides when commit
points happen; the background thread runs here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime

from statesnap.errors import StatesnapError
from statesnap.kafka.reader import ChangelogReader
from statesnap.task.handler import RecordHandler
from statesnap.task.hooks import Change, RestoreTracker

__all__ = ["CATCH_UP_POLL", "FAILURE_LOG_GRACE", "TAIL_POLL", "TaskLoop"]

#: The logger operators know the consuming thread's lines by (it kept its name when the loop moved
#: from ``statesnap.python.consuming`` into the task engine).
log = logging.getLogger("statesnap.python.consuming")

#: consume() blocks until a full batch or the timeout, so a short timeout keeps both the end of
#: catch-up and each new record's visibility prompt (a long one adds its whole length to both).
CATCH_UP_POLL = 0.05
TAIL_POLL = 0.02
#: A background consumer's typed failure is logged only when no caller meets it (a read,
#: ``raise_if_failed()``, ``wait_for``) within this long: a caller that meets it says it (the CLI's
#: error line), so it is said once; an unattended table still logs it.
FAILURE_LOG_GRACE = 1.0

#: What a task passes to see the changes of a batch (key, old, new in stored bytes), or None.
ChangesHook = Callable[[list[Change]], None]


class TaskLoop:
    """The consuming state of one task, shared by its consuming thread and its readers."""

    def __init__(self, name: str, records: RecordHandler, clock: Callable[[], datetime]) -> None:
        self.name = name
        #: What applies each batch (replaced when the task replaces its store).
        self.records = records
        #: What is consumed; None before the restore and for a point-in-time view.
        self.reader: ChangelogReader | None = None
        #: Offsets of a point-in-time view (no reader): what the restored checkpoint holds.
        self.fixed_offsets: dict[int, int] = {}
        #: Feeds the restore listener while the task catches up; None otherwise.
        self.tracker: RestoreTracker | None = None
        #: Held by every batch and commit point: a read of several rows sees whole batches.
        self.lock = threading.RLock()
        self.stop = threading.Event()
        #: Notified after every applied batch (the threads in ``wait_for``).
        self.applied = threading.Condition()
        self._clock = clock
        self._listeners: list[Callable[[], None]] = []
        self._failure: BaseException | None = None
        #: Set once a caller met the failure (a read or raise_if_failed raised it): the background
        #: thread then leaves saying it to that caller.
        self._failure_met = threading.Event()
        self._thread: threading.Thread | None = None
        self._newest_ts = -1
        self._last_applied: float | None = None

    # --- failure -------------------------------------------------------------------------------

    @property
    def failure(self) -> BaseException | None:
        """The error that stopped consuming, if any (looking does not count as meeting it)."""
        return self._failure

    def fail(self, error: BaseException) -> None:
        """Consuming stops on *error*: the store can no longer equal a replay."""
        self._failure = error
        self.notify()

    def raise_if_failed(self) -> None:
        """Re-raise, in the caller's thread, the error that stopped consuming."""
        if self._failure is not None:
            self._failure_met.set()  # met by a caller: the consuming thread need not log it
            raise self._failure

    def met_failure(self) -> None:
        """A caller met the failure another way (a read refused with it chained)."""
        self._failure_met.set()

    # --- listeners -----------------------------------------------------------------------------

    def listen(self, callback: Callable[[], None]) -> None:
        """Call *callback* (on the consuming thread, cheap) whenever the task moved, failed or
        closed: what wakes coroutines waiting on it."""
        self._listeners.append(callback)

    def notify(self) -> None:
        for callback in self._listeners:
            callback()

    # --- consuming -----------------------------------------------------------------------------

    def consume(self, timeout: float, on_changes: ChangesHook | None) -> int:
        """Poll one batch and apply it; returns the records applied."""
        assert self.reader is not None
        applied = 0
        changes: list[Change] | None = [] if on_changes is not None else None
        with self.lock:
            reader = self.reader
            batches = reader.poll(timeout)
            try:
                for partition, messages in batches.items():
                    self.records.apply(partition, messages, changes)
                    # Only now: offsets, wait_for and checkpoints never claim a record not in the store.
                    reader.applied(partition, messages[-1].offset() + 1)
                    applied += len(messages)
                    ts_type, ts = messages[-1].timestamp()
                    if ts_type:
                        self._newest_ts = max(self._newest_ts, ts)
                    if self.tracker is not None:
                        self.tracker.batch(partition, messages[-1].offset(), len(messages))
            except BaseException as e:
                # The consumer has moved past this batch: the table can no longer equal a replay.
                self._failure = e
                raise
        if applied:
            self._last_applied = time.monotonic()
            with self.applied:
                self.applied.notify_all()
            self.notify()
        if on_changes is not None and changes:
            on_changes(changes)
        return applied

    @property
    def thread(self) -> threading.Thread | None:
        """The background consuming thread, once started."""
        return self._thread

    def start_thread(self, step: Callable[[], None], on_changes: Callable[[], ChangesHook | None]) -> None:
        """Consume on a background thread until :attr:`stop`: a batch, then *step* (the task's
        commit point when due); *on_changes* is asked per batch (a hook set while running)."""
        self._thread = threading.Thread(
            target=self._run, args=(step, on_changes), name=f"statesnap-{self.name}", daemon=True
        )
        self._thread.start()

    def _run(self, step: Callable[[], None], on_changes: Callable[[], ChangesHook | None]) -> None:
        try:
            while not self.stop.is_set():
                self.consume(TAIL_POLL, on_changes())
                step()
        except BaseException as e:
            self._failure = e
            self.notify()
            if not isinstance(e, StatesnapError):  # not one of ours: its traceback matters
                log.exception("table %s: background consumer failed; the table stopped", self.name)
                return
            deadline = time.monotonic() + FAILURE_LOG_GRACE
            while not self._failure_met.is_set() and not self.stop.is_set() and time.monotonic() < deadline:
                self._failure_met.wait(0.05)
            if not self._failure_met.is_set():
                log.error(
                    "table %s stopped: %s: %s (its reads and raise_if_failed() raise it)",
                    self.name,
                    type(e).__name__,
                    e,
                )

    # --- freshness -----------------------------------------------------------------------------

    @property
    def offsets(self) -> dict[int, int]:
        """Next offset to consume per owned partition (everything below is applied)."""
        if self.reader is None:
            return dict(self.fixed_offsets)
        return dict(self.reader.positions)

    @property
    def caught_up(self) -> bool:
        """Whether every partition has reported end-of-partition since its last record."""
        return self.reader is not None and self.reader.caught_up

    def lag(self) -> dict[int, int]:
        """Records behind per partition (see :meth:`statesnap.Table.lag`)."""
        if self.reader is None:
            return {}
        return self.reader.lag()

    @property
    def newest_timestamp(self) -> int:
        """The timestamp (ms) of the newest record applied, -1 before any."""
        return self._newest_ts

    def last_update_age(self) -> float | None:
        """Seconds since a record was last applied (None if none was since start)."""
        return None if self._last_applied is None else time.monotonic() - self._last_applied

    def newest_record_age(self) -> float | None:
        """Seconds since the timestamp of the newest record applied, or None if none was."""
        if self._newest_ts < 0:
            return None
        return max(0.0, self._clock().timestamp() - self._newest_ts / 1000)
