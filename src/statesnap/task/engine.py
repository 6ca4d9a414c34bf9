"""``Task``: the Python engine — one task of a table or a processor, in this process.

A task is handed a :class:`~statesnap.task.handler.TaskHandler` (a table's upserts, a processor's
code) and owns everything around it, in order:

1. **open** (:func:`~statesnap.task.opening.open_task`): the cluster's facts, the checkpoint
   repository, the partitions to own — all of them, a static share, or a consumer group's
   (:mod:`statesnap.task.group`);
2. **restore** (:func:`~statesnap.task.restore.restore_into_store`) the newest valid checkpoint
   into its store, then **catch up**: consume until every partition reports EOF, with commit
   points (and checkpoints) meanwhile;
3. **run**: consume → handler → commit point → checkpoint (:mod:`statesnap.task.loop`), on a
   background thread or the caller's (:meth:`Task.poll`);
4. **close**: a final checkpoint on a clean close, then every client released.

Commit points happen every ``commit_interval``: the handler's commit point, the store flushed, the
group's offsets committed and, when the checkpoint interval has elapsed, a checkpoint written by
the task's :class:`~statesnap.task.writer.TaskWriter`. A read-only task has no writer.

Reads of the store go through :meth:`Task.readable_store` (refused once consuming failed) and,
in a consumer group, :meth:`Task.check_key` (the member serves the key's partition).

A catch-up asked to stop (:meth:`Task.stop_catching_up`) stops between two batches with a
checkpoint of what it read. The module is a little over 600 lines on purpose: it is the task's
life cycle in one place (open, restore, catch up, run, close, the group's rebalance side), each
step a few lines that call the helpers beside it; split, the steps' order would be in no file.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from typing import NoReturn

from statesnap.checkpoint import CheckpointManifest, CheckpointRepository
from statesnap.checkpoint.restore import SkippedCheckpoint
from statesnap.checkpoint.selection import TopicState, resume_offsets
from statesnap.deadline import Deadline
from statesnap.durations import parse_duration
from statesnap.errors import (
    CatchUpStoppedError,
    CheckpointTimeoutError,
    KafkaError,
    OffsetOutOfRangeError,
    OutputError,
    ReadOnlyTableError,
    TableStateError,
)
from statesnap.kafka.partitioner import PartitionerSpec
from statesnap.kafka.reader import ChangelogReader
from statesnap.snapshot.participant import SnapshotTask
from statesnap.stores import StateStore, auto_store_kind, open_state_store
from statesnap.task.commits import CommitPoints
from statesnap.task.group import FIRST_ASSIGNMENT_TIMEOUT, GroupMembership, check_group
from statesnap.task.handler import RecordHandler, TaskHandler
from statesnap.task.hooks import CheckpointHook, RestoreListener, RestoreTracker
from statesnap.task.lifecycle import TaskPhase, release_locals
from statesnap.task.loop import CATCH_UP_POLL, ChangesHook, TaskLoop
from statesnap.task.migration import StateVersion
from statesnap.task.opening import OpenedTask, open_task
from statesnap.task.options import CheckpointOptions
from statesnap.task.restore import ProgressCallback, RestoreReport, gc_paused, restore_into_store
from statesnap.task.spec import TaskSpec
from statesnap.task.writer import TaskWriter

__all__ = ["CATCH_UP_MIN_COMMIT_SECONDS", "Task"]

log = logging.getLogger(__name__)

#: Commit points while catching up come no closer than this, whatever the intervals: a
#: checkpoint interval of 0 (tests, "every commit point") would write a checkpoint per polled
#: batch and hold the catch-up back; a second keeps what a crash loses negligible.
CATCH_UP_MIN_COMMIT_SECONDS = 1.0


class Task:
    """One task over *spec*'s input, running *handler*'s code (see the module docstring)."""

    def __init__(self, spec: TaskSpec, handler: TaskHandler) -> None:
        self.spec = spec
        self.name, self.topic, self.settings = spec.name, spec.topic, spec.settings
        self.checkpoints: CheckpointOptions | None = spec.checkpoints
        #: The state version of the rows this task writes, and how older ones are brought up.
        self.state: StateVersion = spec.state
        # Without checkpoints, commit points still happen (group offsets, store upkeep): the
        # bundle's default intervals and clock apply.
        options = self.checkpoints or CheckpointOptions(location="")
        self.commit_interval: timedelta = options.commit_every
        self.checkpoint_interval: timedelta = options.interval
        if self.checkpoints is not None and options.commit_every < options.commit_interval:
            log.info(
                "table %s: commit points every %s, the checkpoint interval (checkpoints are taken at "
                "commit points; the commit interval was %s)",
                self.name,
                options.commit_every,
                options.commit_interval,
            )
        self.group = spec.group
        self.share = spec.share
        self.wanted_partitions = spec.wanted_partitions
        #: False: a point-in-time view; background: consume on a thread after start().
        self.tail, self.background = spec.tail, spec.background
        if self.group is not None:
            check_group(self.share, self.wanted_partitions, spec.writes, self.checkpoints)
        self.row_filter = spec.row_filter
        #: Hooks, settable before start(): each batch's changes while running, each checkpoint
        #: completed here, the restore's progress.
        self.on_changes: ChangesHook | None = None
        self.on_checkpoint: CheckpointHook | None = None
        self.restore_listener: RestoreListener | None = None
        self.store: StateStore = open_state_store(spec.store.kind, path=spec.store.path, name=self.name)
        self._handler = handler
        #: The part that writes checkpoints; a read-only task has none.
        self.writer = (
            TaskWriter(
                self.name, checkpoint_interval=self.checkpoint_interval, commit_interval=self.commit_interval
            )
            if spec.writes
            else None
        )
        #: What restores check: a writer's version (its code reads the rows), or a reader's given
        #: migrations; a plain reader reads any version as it is.
        self._versions = self.state if spec.writes or self.state.migrations else None
        self.repo: CheckpointRepository | None = None
        #: The task's name in its table's snapshots.
        self.task_id = spec.new_task_id()
        #: The consumer group's side (None: not in a group).
        self.membership = GroupMembership(self, self.group) if self.group is not None else None
        self.report = RestoreReport()
        self.cluster_id = ""
        self.partitions: tuple[int, ...] = ()
        self._restored: CheckpointManifest | None = None
        self._state = TaskPhase.NEW
        self._loop = TaskLoop(self.name, handler.records(self), options.clock)
        self._restore_done = threading.Event()
        self._stop_catching_up = threading.Event()
        self._stop_timeout: float | None = None
        self._commits = CommitPoints(self)

    def __repr__(self) -> str:
        return f"Task(name={self.name!r}, topic={self.topic!r}, state={self.phase.value!r})"

    # --- what it is and where it is ----------------------------------------------------------

    @property
    def phase(self) -> TaskPhase:
        """``new``, ``restoring``, ``running``, ``failed`` (consuming stopped on an error) or
        ``closed``."""
        if self._loop.failure is not None and self._state is not TaskPhase.CLOSED:
            return TaskPhase.FAILED
        return self._state

    @property
    def running(self) -> bool:
        """Restored and caught up, not closed (it may have failed since)."""
        return self._state is TaskPhase.RUNNING

    @property
    def failure(self) -> BaseException | None:
        """The error that stopped consuming, if any (looking does not count as meeting it)."""
        return self._loop.failure

    def raise_if_failed(self) -> None:
        """Re-raise, in the caller's thread, an error that stopped the background consumer."""
        self._loop.raise_if_failed()

    @property
    def read_only(self) -> bool:
        """Whether the task never writes checkpoints (it has no writer)."""
        return self.writer is None

    @property
    def snapshots(self) -> SnapshotTask | None:
        """The task's part in its table's snapshots (a writer's, once joined)."""
        return None if self.writer is None else self.writer.snapshots

    @property
    def handler(self) -> RecordHandler:
        """The record handler running over the store."""
        return self._loop.records

    @property
    def offsets(self) -> dict[int, int]:
        """Next offset to consume per owned partition (everything below is applied)."""
        return self._loop.offsets

    def lag(self) -> dict[int, int]:
        """Records behind per partition (see :meth:`statesnap.Table.lag`)."""
        return self._loop.lag()

    def handler_failure(self) -> BaseException | None:
        """An error outside the store the handler reports (outputs that failed to commit)."""
        return self._handler.failure()

    @property
    def loop(self) -> TaskLoop:
        """The consuming side: reader, lock, freshness, the condition waits wait on."""
        return self._loop

    @property
    def last_checkpoint(self) -> CheckpointManifest | None:
        """The newest checkpoint the task's state is known to match (restored, written here, or
        completed by the table's other tasks)."""
        if self.snapshots is not None:
            return self.snapshots.last_checkpoint
        return self._restored

    def stop(self) -> None:
        """Ask a restore in progress (or the consuming thread) to stop (a cancelled start)."""
        self._loop.stop.set()

    # --- reads of the store ------------------------------------------------------------------

    def require(self, action: str, *states: str) -> None:
        """Raise unless *action* may run now: consuming has not failed and the task is in *states*."""
        failure = self._loop.failure
        if failure is not None:
            self._loop.met_failure()
            raise TableStateError(action, f"failed ({failure})", "running") from failure
        if self._state not in states:
            raise TableStateError(action, self._state, " or ".join(states))

    def readable_store(self, action: str | None) -> StateStore:
        """The store, once *action* (a read; None: no check) may use it: the task is running and
        its consumer has not failed."""
        if action is not None:
            self.require(action, TaskPhase.RUNNING)
        return self.store

    def check_key(self, raw_key: bytes) -> None:
        """In a consumer group, raise :class:`~statesnap.errors.PartitionNotOwnedError` unless this
        member serves *raw_key*'s partition (outside one, or before running: nothing to check)."""
        membership = self.membership
        if membership is None or self._state is not TaskPhase.RUNNING or membership.serves(raw_key):
            return
        membership.check_read(raw_key, self.store.row_origin(raw_key))

    # --- life cycle ----------------------------------------------------------------------------

    def start(self, *, progress: ProgressCallback | None = None) -> RestoreReport:
        """Restore from the newest valid checkpoint, then replay the tail until caught up. A start
        that fails closes what it opened (a group member leaves its group) and re-raises."""
        if self._state is not TaskPhase.NEW:
            raise TableStateError("start", self._state, "new")
        try:
            self._handler.starting(self)
            report = self._start(progress)
            self._handler.started(self, self._restored)
            return report
        except BaseException:
            self._close_after_failed_start()
            raise

    def _close_after_failed_start(self) -> None:
        """Close without a checkpoint; the start's own error is the one to see, so a second one
        from closing is only logged."""
        try:
            self.close(checkpoint=False)
        except Exception:
            log.warning("table %s: closing after a failed start also failed", self.name, exc_info=True)

    def _start(self, progress: ProgressCallback | None) -> RestoreReport:
        task = open_task(
            self.name,
            self.topic,
            self.settings,
            self.checkpoints,
            partitions=self.share or self.wanted_partitions,
            writes=False,
            offsets_later=self.membership is not None,  # each gained partition's, at its rebalance
        )
        self.repo, self.cluster_id = task.repo, task.cluster_id
        if self.membership is not None:
            return self._start_in_group(task, progress)
        self.partitions = task.partitions
        started = time.monotonic()
        self._pick_store()
        manifest = restore_into_store(
            task,
            task.state,
            self.store,
            self.row_filter,
            self.report,
            warn_if_empty=self.writer is None,
            versions=self._versions,
            partitioner=self._partitioner(),
        )
        self.report.load_seconds = time.monotonic() - started
        self._restored = manifest
        offsets = resume_offsets(manifest, self.partitions)
        if self.restore_listener is not None:
            self._loop.tracker = RestoreTracker(self.restore_listener, self.name, offsets)
        if not self.tail:
            return self._freeze(offsets)
        if self.repo is not None and self.writer is not None:
            self._join_snapshots(task, manifest)
        self._loop.reader = self._new_reader(offsets)
        self._state = TaskPhase.RESTORING
        started = time.monotonic()
        try:
            try:
                self._catch_up(progress)
            except OffsetOutOfRangeError as e:
                options = self.checkpoints
                if manifest is None or options is None or options.require or options.generation is not None:
                    raise
                self._replay_instead_of(task, manifest, e)
                self._catch_up(progress)
            if self._loop.tracker is not None:
                self._loop.tracker.at_end(self.partitions)
            self._loop.tracker = None
            self._state = TaskPhase.RUNNING
        finally:
            # close() from another thread waits for this before it closes the reader.
            self._restore_done.set()
        self.report.replay_seconds = time.monotonic() - started
        return self._started()

    def _new_reader(self, offsets: dict[int, int]) -> ChangelogReader:
        """The reader of the task's input from *offsets*, once the store is restored."""
        return self._handler.reading(ChangelogReader(self.settings, self.topic, offsets), self.store)

    def _partitioner(self) -> PartitionerSpec:
        return self.group.partitioner if self.group is not None else "murmur2_random"

    def _catch_up(self, progress: ProgressCallback | None) -> None:
        """Consume until every partition is at its end. A writer keeps its commit points (and so
        its checkpoints, at the checkpoint interval) meanwhile: a task that crashes an hour into
        a catch-up resumes from its last checkpoint, not from where it started."""
        loop = self._loop
        assert loop.reader is not None
        reader = loop.reader
        began = time.monotonic()
        writer = self.writer if self.snapshots is not None else None
        if writer is not None:
            # Watch for snapshots from now, while the store answered the restore a moment ago:
            # the watcher's first read is strict (a store that does not answer fails the start).
            writer.watch(at=began)
            self._commits.last_commit = began
        with gc_paused():
            while not reader.caught_up:
                if loop.stop.is_set():
                    raise TableStateError("finish restoring", "closed", "restoring")
                if self._stop_catching_up.is_set():
                    self._stop_between_batches()
                group = self.membership
                if (
                    group is not None
                    and not group.assigned
                    and time.monotonic() - began > FIRST_ASSIGNMENT_TIMEOUT
                ):
                    raise KafkaError(
                        f"consumer group {group.group!r} assigned no partitions of {self.topic!r} within "
                        f"{FIRST_ASSIGNMENT_TIMEOUT:.0f}s (is the broker's group coordinator reachable? "
                        "the dev broker never assigns under group.protocol=consumer)"
                    )
                self.report.replayed_records += loop.consume(CATCH_UP_POLL, None)
                since = time.monotonic() - self._commits.last_commit
                if writer is not None and since >= CATCH_UP_MIN_COMMIT_SECONDS:
                    self._commits.maybe_commit()
                if loop.tracker is not None:
                    loop.tracker.at_end(reader.at_eof)
                if progress is not None:
                    progress(self.report.replayed_records, len(reader.at_eof), len(reader.positions))

    def stop_catching_up(self, *, timeout: float | None = 20.0) -> None:
        """Ask a start still catching up to stop before its next batch, checkpoint what it has read
        (within *timeout* seconds) and raise :class:`CatchUpStoppedError`; a no-op once it is
        caught up. Safe from another thread or a signal handler: it only sets an event the
        catch-up loop reads between batches, where the store and the offsets agree (a
        KeyboardInterrupt may land inside a batch)."""
        self._stop_timeout = timeout
        self._stop_catching_up.set()

    def _stop_between_batches(self) -> NoReturn:
        manifest = None  # nothing read since the restore: the restored checkpoint says it all
        if self.writer is not None and self.repo is not None and self.report.replayed_records:
            manifest = self._commits.checkpoint(self.writer, timeout=self._stop_timeout)
        raise CatchUpStoppedError(
            self.name, self.report.replayed_records, manifest.generation if manifest is not None else None
        )

    def _replay_instead_of(
        self, task: OpenedTask, manifest: CheckpointManifest, error: OffsetOutOfRangeError
    ) -> None:
        """The log moved under the restored checkpoint after it was judged usable: retention
        deleted records it had yet to read (the race :class:`RecordsDeletedError` names), or the
        topic changed incarnation between the end probe and the read. Forget it and replay the
        topic from the beginning; the error's own message says which."""
        reason = str(error)
        log.warning("table %s: skipping checkpoint generation %d: %s", self.name, manifest.generation, reason)
        self.report.skipped.append(SkippedCheckpoint(manifest.generation, reason))
        self.report.checkpoint, self.report.restored_keys = None, 0
        self._restored = None
        assert self._loop.reader is not None
        self._loop.reader.close()
        self.store.clear()
        if self.writer is not None and self.writer.joined:
            self.writer.leave()
            self._join_snapshots(task, None)
        offsets = dict.fromkeys(self.partitions, 0)
        if self.restore_listener is not None:
            self._loop.tracker = RestoreTracker(self.restore_listener, self.name, offsets)
        self._loop.reader = self._new_reader(offsets)

    def _pick_store(self) -> None:
        """``store="auto"``: the kind that suits the size of the checkpoint to restore."""
        options = self.spec.store
        if options.kind == "auto" and self.repo is not None:
            latest = self.repo.latest()
            kind = auto_store_kind(latest.total_rows if latest is not None else None)
            if kind != "memory":
                self.store.close()
                self.store = open_state_store(kind, path=options.path, name=self.name)
                self._loop.records = self._handler.records(self)
            log.info("table %s: store auto → %s", self.name, kind)

    def _start_in_group(self, task: OpenedTask, progress: ProgressCallback | None) -> RestoreReport:
        """Join the consumer group; return once the first assignment is restored and caught up."""
        assert self.membership is not None
        self._pick_store()
        if self.repo is not None and self.writer is not None:
            self._join_snapshots(task, None)
        started = time.monotonic()
        self._loop.reader = self._handler.reading(self.membership.join(task), self.store)
        self._state = TaskPhase.RESTORING
        try:
            self._catch_up(progress)
            self._state = TaskPhase.RUNNING
        finally:
            self._restore_done.set()
        self.report.replay_seconds = time.monotonic() - started
        return self._started()

    def _started(self) -> RestoreReport:
        """Restored and caught up: log it, start the snapshot watcher and the consuming thread."""
        self._commits.last_commit = time.monotonic()
        if self.writer is not None:
            self.writer.restart_interval(self._commits.last_commit)
        reader = self._loop.reader
        if reader is not None:
            reader.tailing = True  # an outage from now on is waited out, not fatal
        log.info(
            "table %s restored: checkpoint=%s (%d keys) + %d records replayed in %.2fs",
            self.name,
            self.report.checkpoint,
            self.report.restored_keys,
            self.report.replayed_records,
            self.report.restore_seconds,
        )
        if self.writer is not None:
            self.writer.watch()
        if self.background:
            self._loop.start_thread(self._commits.maybe_commit, self._changes_hook)
        return self.report

    def _changes_hook(self) -> ChangesHook | None:
        return self.on_changes if self._state is TaskPhase.RUNNING else None

    def _join_snapshots(self, task: OpenedTask, manifest: CheckpointManifest | None) -> None:
        """Become a task of the table's snapshots (writers only)."""
        assert self.writer is not None
        self.writer.join(
            task,
            task_id=self.task_id,
            owned=self.partitions,
            previous=manifest,
            # One store, the task's name (a processor's stores all carry its one version).
            state_versions={self.name: self.state.version},
            describes=self._handler.describes(),
            on_checkpoint=self.on_checkpoint,
        )

    def _freeze(self, offsets: dict[int, int]) -> RestoreReport:
        """``tail=False``: the restored checkpoint is the table; nothing is consumed."""
        self._loop.fixed_offsets = offsets
        if self._loop.tracker is not None:
            self._loop.tracker.at_end(self.partitions)
            self._loop.tracker = None
        self._state = TaskPhase.RUNNING
        self._restore_done.set()
        log.info(
            "table %s: generation %s as it is (%d keys), not tailing",
            self.name,
            self.report.checkpoint,
            self.report.restored_keys,
        )
        return self.report

    def close(self, *, checkpoint: bool = True, timeout: str | float | timedelta | None = "30s") -> None:
        """Stop consuming; on a clean shutdown the handler's outputs are committed and a final
        checkpoint written first (see :meth:`statesnap.Table.close`)."""
        handler = self._handler
        if (
            checkpoint
            and handler.emits()
            and self._state is TaskPhase.RUNNING
            and self._loop.failure is None
            and self._loop.reader is not None
            and handler.failure() is None
        ):
            try:
                with self._loop.lock:
                    handler.closing()
            except OutputError:
                self._close(checkpoint=False, timeout=timeout)
                raise
        self._close(checkpoint=checkpoint and handler.failure() is None, timeout=timeout)

    def _close(self, *, checkpoint: bool, timeout: str | float | timedelta | None) -> None:
        if self._state == "closed":
            return
        loop = self._loop
        deadline = Deadline(None if timeout is None else parse_duration(timeout).total_seconds())
        loop.stop.set()
        if self._state == "restoring":
            self._restore_done.wait(deadline.remaining())  # the restoring thread gives up the reader
        busy: CheckpointTimeoutError | None = None
        thread = loop.thread
        if thread is not None:
            thread.join(deadline.remaining())
            if thread.is_alive():
                busy = self._commits.timed_out("the background commit", deadline.seconds)
        try:
            final = checkpoint and self._state == "running" and loop.failure is None
            if busy is None and final and self.writer is not None:
                try:
                    self.checkpoint(timeout=deadline.remaining())
                except CheckpointTimeoutError as e:
                    busy = e
        finally:
            if self.membership is not None:
                self.membership.closing = True  # leaving the group: no hand-over, no drops
            if busy is not None:
                log.log(logging.ERROR if checkpoint else logging.WARNING, "%s; closing without waiting", busy)
            else:  # nothing else uses them now
                if self.writer is not None:
                    self.writer.leave()
                if loop.reader is not None:
                    loop.reader.close()
                self.store.close()
            self._state = TaskPhase.CLOSED
            loop.notify()
            if loop.failure is not None:
                release_locals(loop.failure)
        if busy is not None and checkpoint:
            raise busy  # the final checkpoint asked for was not written

    # --- consuming and commit points -----------------------------------------------------------

    def poll(self, timeout: float = 0.5) -> int:
        """Consume one batch and run a commit point if due; returns the records applied.

        Only for ``background=False`` tasks; background tasks poll on their own thread.
        """
        self.require("poll", TaskPhase.RUNNING)
        if self._loop.thread is not None:
            raise TableStateError("poll", "consuming in the background", "background=False")
        if self._loop.reader is None:
            raise TableStateError("poll", "a point-in-time view (tail=False)", "tailing")
        applied = self._loop.consume(timeout, self._changes_hook())
        self._commits.maybe_commit()
        return applied

    def commit(self) -> CheckpointManifest | None:
        """A commit point now (see :class:`~statesnap.task.commits.CommitPoints`); returns the
        checkpoint completed here, if any."""
        return self._commits.commit()

    def checkpoint(
        self, *, full: bool = False, timeout: str | float | timedelta | None = None
    ) -> CheckpointManifest | None:
        """Write a checkpoint now, at a commit point (see :meth:`statesnap.Table.checkpoint`)."""
        if self.writer is None:
            why = "read-only" if self.tail else "a point-in-time view (tail=False)"
            raise ReadOnlyTableError(f"table {self.name!r} is {why}: it never writes checkpoints")
        return self._commits.checkpoint(self.writer, full=full, timeout=timeout)

    # --- a consumer group's rebalances (the GroupHost of its membership) -----------------------

    def restore_partitions(
        self, task: OpenedTask, state: TopicState, *, first: bool
    ) -> CheckpointManifest | None:
        """A group member's gained partitions, restored (and migrated) like a start's; the first
        assignment's figures go into the start report."""
        if task.repo is None:
            return None
        report = self.report if first else None
        restored = restore_into_store(
            task,
            state,
            self.store,
            self.row_filter,
            report,
            versions=self._versions,
            partitioner=self._partitioner(),
        )
        options = self.checkpoints
        if restored is None or options is None or options.require:
            return restored
        return self._handler.restored(tuple(sorted(state.partitions)), restored, report)

    def take_partitions(self, partitions: tuple[int, ...], restored: CheckpointManifest | None) -> None:
        """*partitions* are now this member's; its snapshot task reports them from now on."""
        if self.writer is not None:
            self.writer.gain(partitions, restored)
        self.partitions = tuple(sorted(set(self.partitions) | set(partitions)))
        self._handler.gained(partitions, restored)

    def hand_over(self, partitions: tuple[int, ...]) -> None:
        """Before *partitions* leave: report everything this member owns (writers only)."""
        if self.writer is not None:
            self.writer.hand_over(partitions, self._commits.checkpoint_now)

    def release_partitions(self, partitions: tuple[int, ...], *, drop_rows: bool) -> int:
        """*partitions* are no longer this member's; returns the keys dropped with them."""
        self._handler.lost(partitions)
        gone = set(partitions)
        self.partitions = tuple(p for p in self.partitions if p not in gone)
        if self.writer is not None:
            self.writer.lose(partitions)
        return self.store.drop_partitions(partitions) if drop_rows else 0
