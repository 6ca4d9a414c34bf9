"""``Table``: the latest value per key of a Kafka topic, restored from checkpoints.

Life cycle: ``Table(...)`` → ``start()`` (restore the newest valid checkpoint, replay the tail until
every partition reports EOF) → reads while it keeps consuming → ``close()`` (final checkpoint).
A table is the simplest task of the core (:mod:`statesnap.task`): opened by
:func:`~statesnap.task.opening.open_task`, restored by
:func:`~statesnap.task.restore.restore_into_store`, fed by the loop in
:mod:`statesnap.python.consuming` through the upsert/tombstone handler.

By default a background thread keeps consuming after ``start()``; pass ``background=False`` and
call :meth:`Table.poll` yourself to consume on your own thread. In asyncio code use
``await table.start_async()`` / ``async with Table(...)`` and ``await table.wait_for_async(...)``
(:mod:`statesnap.python.aio`): the loop keeps running while the table restores and waits.

Reads: a table is a typed ``Mapping`` (:mod:`statesnap.python.reads`). Hooks (``on_update``,
``on_checkpoint``, a :class:`~statesnap.python.hooks.RestoreListener`) and their threading rules
are in :mod:`statesnap.python.hooks`. A table exactly as snapshot G holds it (restored, never
replayed) is ``Follower(..., checkpoints=CheckpointOptions(url, generation=G), tail=False)``.

Consumer groups: ``Table(..., group="orders-svc")`` shares the topic's partitions among every
instance started with that group, with Kafka's rebalancing; what happens at a rebalance, and
which reads a member serves, is in :mod:`statesnap.python.membership`.

Commit points happen every ``commit_interval``: the store is flushed and, when the checkpoint
``interval`` has elapsed since the last checkpoint, one is written — so the real checkpoint
interval is a multiple of the commit interval. Writing a checkpoint is, in order: export the
store → write data files → write the manifest (write-once) → retention GC.

Length: the public constructor's documented options and the life cycle; the loop, the group
side, reads and freshness are mixins in their own modules.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Collection, Mapping
from dataclasses import replace
from datetime import timedelta
from typing import Any, ClassVar, Generic

from statesnap.blob import BlobStore
from statesnap.checkpoint import CheckpointManifest, CheckpointRepository
from statesnap.checkpoint.restore import SkippedCheckpoint
from statesnap.checkpoint.selection import TopicState, resume_offsets
from statesnap.deadline import Deadline
from statesnap.durations import parse_duration
from statesnap.errors import (
    CheckpointTimeoutError,
    ConfigError,
    KafkaError,
    OffsetOutOfRangeError,
    TableStateError,
)
from statesnap.failure_log import FailureLog
from statesnap.kafka.config import KafkaSettings
from statesnap.kafka.partitioner import PartitionerSpec
from statesnap.kafka.reader import ChangelogReader
from statesnap.python.aio import AsyncWaiters
from statesnap.python.consuming import CATCH_UP_POLL, TAIL_POLL, Consuming, RecordHandler, UpsertHandler
from statesnap.python.freshness import TableFreshness
from statesnap.python.hooks import (
    CheckpointHook,
    Hooks,
    RestoreListener,
    RestoreTracker,
    UpdateHook,
    call_safely,
)
from statesnap.python.membership import FIRST_ASSIGNMENT_TIMEOUT, GroupMember, GroupMembership, check_group
from statesnap.python.reads import K, SerdeName, SerdeOf, TableReads, V
from statesnap.serde import SchemaRegistry, Serde, resolve_serde
from statesnap.snapshot.participant import SnapshotTask
from statesnap.stores import StateStore, auto_store_kind, open_state_store
from statesnap.task.lifecycle import TaskPhase, release_locals
from statesnap.task.migration import Migration, StateVersion
from statesnap.task.opening import OpenedTask, TaskEngine, check_table_name, open_task
from statesnap.task.options import CheckpointOptions, GroupOptions, StaticShare, StoreName, StoreOptions
from statesnap.task.restore import ProgressCallback, RestoreReport, gc_paused, restore_into_store
from statesnap.task.rowfilter import RowFilter

__all__ = ["CATCH_UP_POLL", "TAIL_POLL", "ProgressCallback", "RestoreReport", "Table"]

log = logging.getLogger(__name__)


#: Commit points while catching up come no closer than this, whatever the intervals: a
#: checkpoint interval of 0 (tests, "every commit point") would write a checkpoint per polled
#: batch and hold the catch-up back; a second keeps what a crash loses negligible.
CATCH_UP_MIN_COMMIT_SECONDS = 1.0


class Table(Consuming, GroupMember, TableReads[K, V], TableFreshness, Generic[K, V]):
    """A keyed table over *topic*: all partitions, a static share (``StaticShare``), or the
    partitions a consumer group assigns (``group``; see the module docstring).

    ``Table[K, V]`` is a read-only ``Mapping[K, V]`` (iteration in key order, ``keys``,
    ``values``, ``items``, ``get``, ``in``, ``len``, ``scan``); see :mod:`statesnap.python.reads`.

    Example::

        with Table("orders", bootstrap_servers="kafka:9092", checkpoints="s3://ckpt/prod") as t:
            t.get(b"o-17")
    """

    #: A table writes checkpoints; its read-only sibling (a follower's replica) does not.
    _writes: ClassVar[bool] = True

    def __init__(
        self,
        topic: str,
        *,
        bootstrap_servers: str,
        name: str | None = None,
        checkpoints: str | BlobStore | CheckpointOptions | None = None,
        store: StoreName | StoreOptions = "auto",
        key_serde: SerdeOf[K] | SerdeName | None = None,
        value_serde: SerdeOf[V] | SerdeName | None = None,
        schema_registry_url: SchemaRegistry | str | Mapping[str, Any] | None = None,
        kafka_config: Mapping[str, Any] | None = None,
        timeout: float = 15.0,
        partitions: Collection[int] | StaticShare | None = None,
        group: str | GroupOptions | None = None,
        background: bool = True,
        row_filter: RowFilter | None = None,
        hooks: Hooks | None = None,
        state_version: int = 1,
        migrations: Mapping[int, Migration] | None = None,
        start_from: int | None = None,
    ) -> None:
        """
        Args:
            topic: the changelog topic.
            bootstrap_servers: Kafka bootstrap address(es).
            name: table name in the checkpoint store (default: the topic name).
            checkpoints: where checkpoints live — a URL (``file://…``, a path,
                ``s3://bucket/prefix``), a blob store, or :class:`CheckpointOptions` (storage
                options, intervals, retention, an exact generation, snapshot settings); None
                disables checkpoints (opt-in).
            store: local state store: ``auto`` (the default: ``columnar`` when the checkpoint to
                restore holds at least 10 k rows, else ``memory``), ``memory``, ``columnar`` or
                ``rocksdb`` (tables larger than memory); :class:`StoreOptions` adds its path.
            key_serde, value_serde: how reads convert keys and values (a serde, or ``bytes``
                (default), ``string``, ``json``, ``avro``, ``json_schema``); the table stores bytes.
            schema_registry_url: the schema registry of ``avro`` / ``json_schema`` serdes (a URL,
                a ``SchemaRegistry``, or a dict with ``url`` and client settings).
            kafka_config: extra librdkafka properties (TLS, SASL, …).
            timeout: how long to wait for the cluster's answers.
            partitions: own only these partitions, or a :class:`StaticShare` of them (default:
                all).
            group: take partitions from this Kafka consumer group, with rebalancing (a group id
                or :class:`GroupOptions`); not with *partitions* or an exact generation.
            background: keep consuming on a background thread after start().
            row_filter: keep a subset: a key filter and a value projection, applied while
                restoring and while tailing.
            hooks: ``on_update``, ``on_checkpoint``, ``restore_listener`` (see
                :mod:`statesnap.python.hooks` for when and on which thread each runs; also
                settable as attributes before start()).
            state_version: the version of the stored rows' format (bump it when a change to
                *row_filter*, a serde or a handler changes what is stored); recorded in every
                checkpoint. A checkpoint of another version is refused unless *migrations* bring
                it up (see :mod:`statesnap.task.migration`).
            migrations: ``{v: fn}``, ``fn(key, value) -> (key, value) | (key, value, partition)
                | None`` on stored bytes, turning version ``v`` rows into ``v + 1``; run while
                restoring, after which the next checkpoint is written at *state_version*.
            start_from: restore exactly this snapshot generation, then continue from its offsets
                (the same as ``CheckpointOptions(generation=...)``); later generations stay, new
                ones are numbered above them.
        """
        self.topic = topic
        self.name = check_table_name(name or topic)
        self.settings = KafkaSettings(bootstrap_servers, dict(kafka_config or {}), timeout)
        #: The state version of the rows this table writes, and how older ones are brought up.
        self.state = StateVersion(state_version, migrations)
        self.checkpoints = _starting_from(CheckpointOptions.of(checkpoints), start_from)
        # Without checkpoints, commit points still happen (group offsets, store upkeep): the
        # bundle's default intervals and clock apply.
        options = self.checkpoints or CheckpointOptions(location="")
        self._checkpoint_interval = options.interval
        self._commit_interval = options.commit_every
        if self.checkpoints is not None and options.commit_every < options.commit_interval:
            log.info(
                "table %s: commit points every %s, the checkpoint interval (checkpoints are taken at "
                "commit points; the commit interval was %s)",
                self.name,
                options.commit_every,
                options.commit_interval,
            )
        self._clock = options.clock
        self.group = GroupOptions.of(group)
        self._share = partitions if isinstance(partitions, StaticShare) else None
        self.wanted_partitions = (
            None
            if partitions is None or isinstance(partitions, StaticShare)
            else tuple(sorted(set(partitions)))
        )
        self.tail = True
        self.background = background
        if self.group is not None:
            check_group(self._share, self.wanted_partitions, self._writes, self.checkpoints)
        self.key_serde: Serde = resolve_serde(
            key_serde, schema_registry=schema_registry_url, topic=topic, is_key=True
        )
        self.value_serde: Serde = resolve_serde(value_serde, schema_registry=schema_registry_url, topic=topic)
        self.row_filter = row_filter
        hooks = hooks or Hooks()
        #: Hooks (see :mod:`statesnap.python.hooks`); set them before start().
        self.on_update: UpdateHook[Any, Any] | None = hooks.on_update
        self.on_checkpoint: CheckpointHook | None = hooks.on_checkpoint
        self.restore_listener: RestoreListener | None = hooks.restore_listener
        self._tracker: RestoreTracker | None = None
        self._waiters = AsyncWaiters()
        self._newest_ts = -1
        self._last_applied: float | None = None
        self._restore_done = threading.Event()
        self._applied = threading.Condition()
        self._store_options = StoreOptions.of(store)
        self.store: StateStore = open_state_store(
            self._store_options.kind, path=self._store_options.path, name=self.name
        )
        self._handler = self._new_handler()
        self.repo: CheckpointRepository | None = None
        self.snapshots: SnapshotTask | None = None
        snapshot_options = options.snapshots
        share = self._share
        self.task_id = snapshot_options.task_id or (
            f"instance-{share.instance}" if share is not None else "main"
        )
        self._membership: GroupMembership | None = None
        if self.group is not None:
            self._membership = GroupMembership(self, self.group)
            self.task_id = snapshot_options.task_id or (
                f"{self.group.group_id}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
            )
        self.report = RestoreReport()
        self._restored: CheckpointManifest | None = None
        self._reader: ChangelogReader | None = None
        self._fixed_offsets: dict[int, int] = {}
        self._state = TaskPhase.NEW
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._thread_error: BaseException | None = None
        self._checkpoint_failures = FailureLog(logging.getLogger("statesnap.python.consuming"))
        #: Set once a caller met the thread's error (a read or raise_if_failed raised it): the
        #: background thread then leaves saying it to that caller.
        self._failure_met = threading.Event()
        self._last_commit = time.monotonic()
        self._last_checkpoint_at = time.monotonic()
        self.cluster_id = ""
        self.partitions: tuple[int, ...] = ()

    def _new_handler(self) -> RecordHandler:
        """What the task does with records: a table upserts (a processor runs its handlers)."""
        return UpsertHandler(self.store, self.row_filter)

    def _new_reader(self, offsets: dict[int, int]) -> ChangelogReader:
        """The reader of the task's input from *offsets*, once the store is restored."""
        return self._read_with(ChangelogReader(self.settings, self.topic, offsets))

    def _read_with(self, reader: ChangelogReader) -> ChangelogReader:
        """What the task consumes, given the reader of its topic (from offsets, or a consumer
        group's): a table reads its topic; a processor with several inputs merges them all."""
        return reader

    def __repr__(self) -> str:
        return f"Table(name={self.name!r}, topic={self.topic!r}, state={self.phase.value!r})"

    @property
    def failure(self) -> BaseException | None:
        """The error that stopped the consumer, if any; looking does not count as meeting it
        (:meth:`raise_if_failed` does: the consuming thread then leaves saying it to the caller)."""
        return self._thread_error

    @property
    def phase(self) -> TaskPhase:
        """Where the table is: ``new``, ``restoring``, ``running``, ``failed`` (its consumer
        stopped on an error, which reads and :meth:`raise_if_failed` raise) or ``closed``."""
        if self._thread_error is not None and self._state is not TaskPhase.CLOSED:
            return TaskPhase.FAILED
        return self._state

    @property
    def read_only(self) -> bool:
        """Whether this table never writes checkpoints (a follower's replica)."""
        return not self._writes

    @property
    def commit_interval(self) -> timedelta:
        return self._commit_interval

    @property
    def checkpoint_interval(self) -> timedelta:
        return self._checkpoint_interval

    # --- life cycle ----------------------------------------------------------------------------

    def start(self, *, progress: ProgressCallback | None = None) -> RestoreReport:
        """Restore from the newest valid checkpoint, then replay the tail until caught up. A start
        that fails closes what it opened (a group member leaves its group) and re-raises."""
        if self._state is not TaskPhase.NEW:
            raise TableStateError("start", self._state, "new")
        try:
            return self._start(progress)
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
        wanted = self._share or self.wanted_partitions
        task = open_task(
            self.name,
            self.topic,
            self.settings,
            self.checkpoints,
            partitions=wanted,
            writes=False,
            offsets_later=self._membership is not None,  # each gained partition's, at its rebalance
        )
        self.repo, self.cluster_id = task.repo, task.cluster_id
        if self._membership is not None:
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
            warn_if_empty=not self._writes,
            versions=self._versions(),
            partitioner=self._partitioner(),
        )
        self.report.load_seconds = time.monotonic() - started
        self._restored = manifest
        offsets = resume_offsets(manifest, self.partitions)
        if self.restore_listener is not None:
            self._tracker = RestoreTracker(self.restore_listener, self.name, offsets)
        if not self.tail:
            return self._freeze(offsets)
        if self.repo is not None and self._writes:
            self._join_snapshots(task, manifest)
        self._reader = self._new_reader(offsets)
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
            if self._tracker is not None:
                self._tracker.at_end(self.partitions)
            self._tracker = None
            self._state = TaskPhase.RUNNING
        finally:
            # close() from another thread waits for this before it closes the reader.
            self._restore_done.set()
        self.report.replay_seconds = time.monotonic() - started
        return self._started()

    def _versions(self) -> StateVersion | None:
        """The state version restores check: a writer's (its code reads the rows), or a reader's
        given migrations; a plain reader reads any version as it is."""
        return self.state if self._writes or self.state.migrations else None

    def _partitioner(self) -> PartitionerSpec:
        return self.group.partitioner if self.group is not None else "murmur2_random"

    def restore_partitions(
        self, task: OpenedTask, state: TopicState, *, first: bool
    ) -> CheckpointManifest | None:
        """A group member's gained partitions, restored (and migrated) like a start's."""
        if task.repo is None:
            return None
        report = self.report if first else None
        return restore_into_store(
            task,
            state,
            self.store,
            self.row_filter,
            report,
            versions=self._versions(),
            partitioner=self._partitioner(),
        )

    def _catch_up(self, progress: ProgressCallback | None) -> None:
        """Consume until every partition is at its end. A writer keeps its commit points (and so
        its checkpoints, at the checkpoint interval) meanwhile: a task that crashes an hour into
        a catch-up resumes from its last checkpoint, not from where it started (before, none was
        written until the end, and a task killed more often than its catch-up lasted never got
        further)."""
        assert self._reader is not None
        reader = self._reader
        began = time.monotonic()
        checkpointing = self.snapshots is not None
        if self.snapshots is not None:
            # Watch for snapshots from now, while the store answered the restore a moment ago:
            # the watcher's first read is strict (a store that does not answer fails the start).
            self.snapshots.start()
            self._last_commit = self._last_checkpoint_at = began
        with gc_paused():
            while not reader.caught_up:
                if self._stop.is_set():
                    raise TableStateError("finish restoring", "closed", "restoring")
                group = self._membership
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
                self.report.replayed_records += self._consume(CATCH_UP_POLL)
                if checkpointing and time.monotonic() - self._last_commit >= CATCH_UP_MIN_COMMIT_SECONDS:
                    self._maybe_commit()
                if self._tracker is not None:
                    self._tracker.at_end(reader.at_eof)
                if progress is not None:
                    progress(self.report.replayed_records, len(reader.at_eof), len(reader.positions))

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
        assert self._reader is not None
        self._reader.close()
        self.store.clear()
        if self.snapshots is not None:
            self.snapshots.close()
            self._join_snapshots(task, None)
        offsets = dict.fromkeys(self.partitions, 0)
        if self.restore_listener is not None:
            self._tracker = RestoreTracker(self.restore_listener, self.name, offsets)
        self._reader = self._new_reader(offsets)

    def _pick_store(self) -> None:
        """``store="auto"``: the kind that suits the size of the checkpoint to restore."""
        if self._store_options.kind == "auto" and self.repo is not None:
            latest = self.repo.latest()
            kind = auto_store_kind(latest.total_rows if latest is not None else None)
            if kind != "memory":
                self.store.close()
                self.store = open_state_store(kind, path=self._store_options.path, name=self.name)
                self._handler = self._new_handler()
            log.info("table %s: store auto → %s", self.name, kind)

    def _start_in_group(self, task: OpenedTask, progress: ProgressCallback | None) -> RestoreReport:
        """Join the consumer group; return once the first assignment is restored and caught up."""
        assert self._membership is not None
        self._pick_store()
        if self.repo is not None:
            self._join_snapshots(task, None)
        started = time.monotonic()
        self._reader = self._read_with(self._membership.join(task))
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
        self._last_commit = self._last_checkpoint_at = time.monotonic()
        if self._reader is not None:
            self._reader.tailing = True  # an outage from now on is waited out, not fatal
        log.info(
            "table %s restored: checkpoint=%s (%d keys) + %d records replayed in %.2fs",
            self.name,
            self.report.checkpoint,
            self.report.restored_keys,
            self.report.replayed_records,
            self.report.restore_seconds,
        )
        if self.snapshots is not None:
            self.snapshots.start()
        if self.background:
            self._thread = threading.Thread(target=self._run, name=f"statesnap-{self.name}", daemon=True)
            self._thread.start()
        return self.report

    def _join_snapshots(self, task: OpenedTask, manifest: CheckpointManifest | None) -> None:
        """Become a task of the table's snapshots (writers only)."""
        self.snapshots = task.join_snapshots(
            SnapshotTask,
            task_id=self.task_id,
            owned=self.partitions,
            engine=TaskEngine.PYTHON,
            previous=manifest,
            refresh_interval=min(1.0, max(0.05, self._commit_interval.total_seconds() / 2)),
        )
        self.snapshots.state_versions = self._state_versions()
        hook = self.on_checkpoint
        if hook is not None:
            self.snapshots.on_checkpoint = lambda m: call_safely("on_checkpoint", self.name, hook, m)

    def _state_versions(self) -> dict[str, int]:
        """What every manifest this task writes records: a table is one store, its own name (a
        processor names each of its stores)."""
        return {self.name: self.state.version}

    def _freeze(self, offsets: dict[int, int]) -> RestoreReport:
        """``tail=False``: the restored checkpoint is the table; nothing is consumed."""
        self._fixed_offsets = offsets
        if self._tracker is not None:
            self._tracker.at_end(self.partitions)
            self._tracker = None
        self._state = TaskPhase.RUNNING
        self._restore_done.set()
        log.info(
            "table %s: generation %s as it is (%d keys), not tailing",
            self.name,
            self.report.checkpoint,
            self.report.restored_keys,
        )
        return self.report

    def _checkpoint_url(self) -> str:
        return self.repo.url if self.repo is not None else "the checkpoint store"

    @property
    def last_checkpoint(self) -> CheckpointManifest | None:
        """The newest checkpoint this table's state is known to match (restored, written here, or
        completed by the table's other tasks)."""
        if self.snapshots is not None:
            return self.snapshots.last_checkpoint
        return self._restored

    def close(self, *, checkpoint: bool = True, timeout: str | float | timedelta | None = "30s") -> None:
        """Stop consuming; on a clean shutdown write a final checkpoint first.

        *timeout* bounds the whole close (None: as long as it takes). A background commit stuck
        on a checkpoint store that does not answer, or a final checkpoint that does not finish,
        ends in :class:`CheckpointTimeoutError` (a warning when no final checkpoint was asked
        for): the table is closed all the same, the last committed checkpoint stands, and the
        thread still waiting keeps its clients until the process exits."""
        if self._state == "closed":
            return
        deadline = Deadline(None if timeout is None else parse_duration(timeout).total_seconds())
        self._stop.set()
        if self._state == "restoring":
            self._restore_done.wait(deadline.remaining())  # the restoring thread gives up the reader
        busy: CheckpointTimeoutError | None = None
        if self._thread is not None:
            self._thread.join(deadline.remaining())
            if self._thread.is_alive():
                busy = self._timed_out("the background commit", deadline.seconds)
        try:
            final = checkpoint and self._state == "running" and self._thread_error is None
            if busy is None and final and not self.read_only:
                try:
                    self.checkpoint(timeout=deadline.remaining())
                except CheckpointTimeoutError as e:
                    busy = e
        finally:
            if self._membership is not None:
                self._membership.closing = True  # leaving the group: no hand-over, no drops
            if busy is not None:
                log.log(logging.ERROR if checkpoint else logging.WARNING, "%s; closing without waiting", busy)
            else:  # nothing else uses them now
                if self.snapshots is not None:
                    self.snapshots.close()
                if self._reader is not None:
                    self._reader.close()
                self.store.close()
            self._state = TaskPhase.CLOSED
            self._waiters.notify()
            if self._thread_error is not None:
                release_locals(self._thread_error)
        if busy is not None and checkpoint:
            raise busy  # the final checkpoint asked for was not written

    def __enter__(self) -> Table[K, V]:
        if self._state == "new":
            self.start()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close(checkpoint=exc_type is None)

    # --- asyncio -------------------------------------------------------------------------------

    async def start_async(self, *, progress: ProgressCallback | None = None) -> RestoreReport:
        """:meth:`start` on a worker thread: the event loop keeps running during the restore.

        *progress* and the restore listener run on that worker thread. Cancelling the awaiting
        task stops the restore; the table must then be closed (:meth:`aclose`).
        """
        try:
            return await asyncio.to_thread(self.start, progress=progress)
        except asyncio.CancelledError:
            self._stop.set()
            raise

    async def aclose(
        self, *, checkpoint: bool = True, timeout: str | float | timedelta | None = "30s"
    ) -> None:
        """:meth:`close` on a worker thread (the final checkpoint may take a while)."""
        await asyncio.to_thread(self.close, checkpoint=checkpoint, timeout=timeout)

    async def __aenter__(self) -> Table[K, V]:
        if self._state == "new":
            await self.start_async()
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        await self.aclose(checkpoint=exc_type is None)

    # --- reads (the Mapping itself is in statesnap.python.reads) --------------------------------------

    def _require(self, action: str, *states: str) -> None:
        if self._thread_error is not None:
            self._failure_met.set()
            raise TableStateError(action, f"failed ({self._thread_error})", "running") from self._thread_error
        if self._state not in states:
            raise TableStateError(action, self._state, " or ".join(states))

    def _store_for(self, action: str | None) -> StateStore:
        return self.readable_store(action)

    def readable_store(self, action: str | None) -> StateStore:
        """The store, once *action* (a read; None: no check) may use it: the table is running
        and its consumer has not failed."""
        if action is not None:
            self._require(action, "running")
        return self.store

    def __getitem__(self, key: K) -> V:
        if self._membership is not None and self._state == "running":
            self._check_key(self.key_serde.serialize(key))
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        if self._membership is not None and self._state == "running":
            self._check_key(self.key_serde.serialize(key))
        return super().__contains__(key)

    def get_raw(self, key: bytes) -> bytes | None:
        if self._membership is not None and self._state == "running":
            self._check_key(key)
        return super().get_raw(key)

    def _serdes(self) -> tuple[Serde, Serde]:
        return self.key_serde, self.value_serde

    def _table_name(self) -> str:
        return self.name


def _starting_from(checkpoints: CheckpointOptions | None, start_from: int | None) -> CheckpointOptions | None:
    """``start_from=G`` as the checkpoint options' exact generation (one way to say it inside)."""
    if start_from is None:
        return checkpoints
    if checkpoints is None:
        raise ConfigError(f"start_from={start_from} needs checkpoints to start from")
    if checkpoints.generation is not None and checkpoints.generation != start_from:
        raise ConfigError(
            f"start_from={start_from} and CheckpointOptions(generation={checkpoints.generation}) disagree"
        )
    return replace(checkpoints, generation=start_from)
