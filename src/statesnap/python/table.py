"""``Table``: the latest value per key of a Kafka topic, restored from checkpoints.

Life cycle: ``Table(...)`` → ``start()`` (restore the newest valid checkpoint, replay the tail until
every partition reports EOF) → reads while it keeps consuming → ``close()`` (final checkpoint).

By default a background thread keeps consuming after ``start()``; pass ``background=False`` and
call :meth:`Table.poll` yourself to consume on your own thread. In asyncio code use
``await table.start_async()`` / ``async with Table(...)`` and ``await table.wait_for_async(...)``
(:mod:`statesnap.python.aio`): the loop keeps running while the table restores and waits.

Reads: a table is a typed ``Mapping`` (:mod:`statesnap.python.reads`). Hooks (``on_update``,
``on_checkpoint``, a :class:`~statesnap.python.hooks.RestoreListener`) and their threading rules are in
:mod:`statesnap.python.hooks`. ``Table(..., generation=G, tail=False)`` is the table exactly as
snapshot G holds it: restored, never replayed, read-only.

Consumer groups: ``Table(..., group="orders-svc")`` shares the topic's partitions among every
instance started with that group, with Kafka's rebalancing (:mod:`statesnap.python.membership`). Each
instance holds only the partitions the group assigns it: a partition it gains is restored from
the newest checkpoint and replayed from there; one it loses is first handed over (a checkpoint of
what it owns, reported to the snapshot in progress or to a new one) and then dropped. Snapshots
name tasks by current ownership, so one completes after an instance dies and its partitions move.
Reads of a key whose partition the instance does not serve (another instance owns it, or it is
still being restored after a rebalance) raise :class:`~statesnap.errors.PartitionNotOwnedError`;
the key's partition comes from the producers' partitioner (``partitioner``, default Kafka's
``murmur2_random``) and ``partition_for(key)`` tells it, for routing. ``len``, iteration and scans
cover the rows the instance holds. The assignment strategy is librdkafka's
``partition.assignment.strategy`` (default ``roundrobin``; ``cooperative-sticky`` on brokers that
run cooperative rebalances promptly), the session timeout ``session.timeout.ms`` (default 6 s: a
dead instance's partitions move after that long), both settable through ``kafka_config``. The
offsets committed to the group are informational (lag tools); restores never read them. The
restore listener sees only the restore that ``start()`` does, not later rebalances.

Commit points happen every ``commit_interval``: the store is flushed and, when
``checkpoint_interval`` has elapsed since the last checkpoint, one is written — so the real
checkpoint interval is a multiple of the commit interval. Writing a checkpoint is, in order:
export the store → write data files → write the manifest (write-once) → retention GC.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Collection, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Generic, cast

from statesnap.blob import BlobStore, open_blob_store
from statesnap.checkpoint import (
    CheckpointManifest,
    CheckpointRepository,
    RetentionPolicy,
)
from statesnap.checkpoint.layout import valid_table_name
from statesnap.checkpoint.restore import SkippedCheckpoint
from statesnap.checkpoint.selection import TopicState, resume_offsets
from statesnap.deadline import Deadline, call_within
from statesnap.durations import parse_duration
from statesnap.errors import (
    BlobStoreError,
    CheckpointError,
    CheckpointTimeoutError,
    ConfigError,
    KafkaError,
    OffsetOutOfRangeError,
    ReadOnlyTableError,
    TableStateError,
)
from statesnap.kafka.admin import KafkaAdmin, log_start_offsets
from statesnap.kafka.config import KafkaSettings
from statesnap.kafka.identity import topic_id
from statesnap.kafka.partitioner import PartitionerSpec
from statesnap.kafka.reader import ChangelogReader
from statesnap.python.aio import AsyncWaiters
from statesnap.python.freshness import TableFreshness
from statesnap.python.hooks import (
    Change,
    CheckpointHook,
    RestoreListener,
    RestoreTracker,
    UpdateHook,
    call_safely,
    changes_of,
    fire_updates,
)
from statesnap.python.membership import FIRST_ASSIGNMENT_TIMEOUT, GroupMembership, check_group_options
from statesnap.python.reads import K, SerdeName, SerdeOf, StoreName, TableReads, V, row_origin
from statesnap.python.rowfilter import RowFilter
from statesnap.serde import SchemaRegistry, Serde, resolve_serde
from statesnap.snapshot.api import SnapshotApi
from statesnap.snapshot.participant import SnapshotTask, TaskState
from statesnap.snapshot.store import resolve_spec
from statesnap.stores import StateStore, auto_store_kind, open_state_store
from statesnap.task.restore import CheckpointLoad, ProgressCallback, RestoreReport, gc_paused, load_checkpoint

__all__ = ["CATCH_UP_POLL", "TAIL_POLL", "ProgressCallback", "RestoreReport", "Table"]

log = logging.getLogger(__name__)


#: consume() blocks until a full batch or the timeout, so a short timeout keeps both the end of
#: catch-up and each new record's visibility prompt (a long one adds its whole length to both).
CATCH_UP_POLL = 0.05
TAIL_POLL = 0.02


class Table(TableReads[K, V], TableFreshness, Generic[K, V]):
    """A keyed table over *topic*: all partitions, a static share (``instance``/``instances``),
    or the partitions a consumer group assigns (``group``; see the module docstring).

    ``Table[K, V]`` is a read-only ``Mapping[K, V]`` (iteration in key order, ``keys``,
    ``values``, ``items``, ``get``, ``in``, ``len``, ``scan``); see :mod:`statesnap.python.reads`.
    """

    def __init__(
        self,
        topic: str,
        *,
        bootstrap_servers: str,
        name: str | None = None,
        checkpoints: str | BlobStore | None = None,
        storage_options: Mapping[str, Any] | None = None,
        store: StoreName = "auto",
        store_path: str | Path | None = None,
        key_serde: SerdeOf[K] | SerdeName | None = None,
        value_serde: SerdeOf[V] | SerdeName | None = None,
        schema_registry_url: SchemaRegistry | str | Mapping[str, Any] | None = None,
        kafka_config: Mapping[str, Any] | None = None,
        checkpoint_interval: str | float | timedelta = "1h",
        commit_interval: str | float | timedelta = "5s",
        retention: RetentionPolicy | None = None,
        require_checkpoint: bool = False,
        background: bool = True,
        generation: int | None = None,
        tail: bool = True,
        partitions: Collection[int] | None = None,
        timeout: float = 15.0,
        instance: int | None = None,
        instances: int | None = None,
        group: str | None = None,
        partitioner: PartitionerSpec = "murmur2_random",
        task_id: str | None = None,
        snapshot_timeout: str | float | timedelta = "60s",
        snapshot_store: str | None = None,
        read_only: bool = False,
        key_filter: Callable[[bytes], bool] | None = None,
        value_projection: Callable[[bytes], bytes | None] | None = None,
        on_update: UpdateHook[K, V] | None = None,
        on_checkpoint: CheckpointHook | None = None,
        restore_listener: RestoreListener | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        """
        Args:
            topic: the changelog topic.
            bootstrap_servers: Kafka bootstrap address(es).
            name: table name in the checkpoint store (default: the topic name).
            checkpoints: blob store URL (``file://…``, a path, ``s3://bucket/prefix``) or store;
                None disables checkpoints (opt-in).
            storage_options: blob-store options (``endpoint_url``, ``region``, ``sse``, …).
            store: local state store: ``auto`` (the default: ``columnar`` when the checkpoint to
                restore holds at least 1 M rows, else ``memory``), ``memory`` (a dict: fastest
                lookups), ``columnar`` (restores at the speed of reading the files) or ``rocksdb``
                (tables larger than memory).
            key_serde, value_serde: how reads convert keys and values (a serde, or ``bytes``
                (default), ``string``, ``json``, ``avro``, ``json_schema``); the table stores bytes.
            schema_registry_url: the schema registry of ``avro`` / ``json_schema`` serdes (a URL,
                a ``SchemaRegistry``, or a dict with ``url`` and client settings).
            kafka_config: extra librdkafka properties (TLS, SASL, …).
            checkpoint_interval: minimum time between periodic checkpoints.
            commit_interval: how often a commit point happens while consuming.
            retention: GC policy applied after each checkpoint.
            require_checkpoint: fail instead of replaying from the beginning when none verifies.
            background: keep consuming on a background thread after start().
            generation: restore exactly this generation instead of the newest valid one
                (:class:`GenerationNotFoundError` when the store has none such).
            tail: False gives the table exactly as *generation* holds it: no replay, no
                consuming, read-only (needs *generation*).
            partitions: own only these partitions (default: all).
            instance, instances: static assignment: own partitions ``p`` with ``p % instances ==
                instance``; each instance is a task of the table's snapshots.
            group: take partitions from this Kafka consumer group, with rebalancing (see the
                module docstring); not with *instance*, *partitions*, *generation* or read-only.
            partitioner: the producers' partitioner (``murmur2_random``: Java clients' default;
                ``consistent_random``: librdkafka's; or a function ``(key_bytes, n) -> p``): in
                a group, it tells which partition a key read belongs to.
            task_id: this task's name in snapshots (default ``instance-<i>``, ``main``, or for a
                group ``<group>-<host>-<pid>-<random>``: unique per instance).
            snapshot_timeout: a snapshot not complete within this is marked FAILED.
            snapshot_store: where snapshot records live: ``blob`` (beside the checkpoints, the
                default) or ``topic:NAME`` (a Kafka topic on this cluster); default
                ``$STATESNAP_SNAPSHOT_STORE``. A table keeps the store it was created with.
            read_only: never write or delete checkpoints (a replica of someone else's table).
            key_filter: keep only keys for which it returns True (applied to raw key bytes).
            value_projection: rewrite raw values before storing; returning None drops the key.
            on_update, on_checkpoint, restore_listener: hooks, see :mod:`statesnap.python.hooks` for
                when and on which thread each runs (also settable as attributes before start()).
        """
        self.topic = topic
        self.name = name or topic
        if not valid_table_name(self.name):
            raise ConfigError(f"invalid table name {self.name!r}: use letters, digits, '.', '_', '-'")
        if generation is not None and generation < 1:
            raise ConfigError(f"generation must be >= 1, got {generation}")
        if generation is not None and checkpoints is None:
            raise ConfigError(f"generation={generation} needs checkpoints=<the store that holds it>")
        if not tail and generation is None:
            raise ConfigError("tail=False needs generation=G: it gives the table as snapshot G holds it")
        self.settings = KafkaSettings(bootstrap_servers, dict(kafka_config or {}), timeout)
        if isinstance(checkpoints, str):
            self.blob: BlobStore | None = open_blob_store(checkpoints, **dict(storage_options or {}))
        else:
            self.blob = checkpoints
        self.checkpoint_interval = parse_duration(checkpoint_interval)
        self.commit_interval = parse_duration(commit_interval)
        self.retention = retention or RetentionPolicy()
        self.require_checkpoint = require_checkpoint
        self.tail = tail
        self.background = background and tail
        self.generation = generation
        self.wanted_partitions = None if partitions is None else tuple(sorted(set(partitions)))
        if (instance is None) != (instances is None):
            raise ConfigError("instance and instances go together")
        if group is not None:
            check_group_options(group, instance, partitions, generation, read_only or not tail)
        if instance is not None and instances is not None:
            if not 0 <= instance < instances:
                raise ConfigError(f"instance must be in [0, {instances}), got {instance}")
            self._instance: tuple[int, int] | None = (instance, instances)
        else:
            self._instance = None
        self.key_serde: Serde = resolve_serde(
            key_serde, schema_registry=schema_registry_url, topic=topic, is_key=True
        )
        self.value_serde: Serde = resolve_serde(value_serde, schema_registry=schema_registry_url, topic=topic)
        self.read_only = read_only or not tail
        self.row_filter = (
            RowFilter(key_filter, value_projection)
            if key_filter is not None or value_projection is not None
            else None
        )
        #: Hooks (see :mod:`statesnap.python.hooks`); set them before start().
        self.on_update: UpdateHook[K, V] | None = on_update
        self.on_checkpoint: CheckpointHook | None = on_checkpoint
        self.restore_listener: RestoreListener | None = restore_listener
        self._tracker: RestoreTracker | None = None
        self._waiters = AsyncWaiters()
        self._newest_ts = -1
        self._last_applied: float | None = None
        self._restore_done = threading.Event()
        self._applied = threading.Condition()
        self._store_kind = store
        self._store_path = store_path
        self._clock = clock
        self.store: StateStore = open_state_store(store, path=store_path, name=self.name)
        self.repo: CheckpointRepository | None = None
        self.snapshots: SnapshotTask | None = None
        self.task_id = task_id or (f"instance-{instance}" if instance is not None else "main")
        self.group = group
        self._membership: GroupMembership | None = None
        if group is not None:
            self._membership = GroupMembership(cast("Table[object, object]", self), group, partitioner)
            self.task_id = task_id or f"{group}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.snapshot_timeout = parse_duration(snapshot_timeout)
        self.snapshot_store = snapshot_store
        self.report = RestoreReport()
        self._restored: CheckpointManifest | None = None
        self._reader: ChangelogReader | None = None
        self._fixed_offsets: dict[int, int] = {}
        self._state = "new"
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._thread_error: BaseException | None = None
        self._last_commit = time.monotonic()
        self._last_checkpoint_at = time.monotonic()
        self.cluster_id = ""
        self.partitions: tuple[int, ...] = ()

    def __repr__(self) -> str:
        return f"Table(name={self.name!r}, topic={self.topic!r}, state={self._state!r})"

    # --- life cycle ----------------------------------------------------------------------------

    def start(self, *, progress: ProgressCallback | None = None) -> RestoreReport:
        """Restore from the newest valid checkpoint, then replay the tail until caught up."""
        if self._state != "new":
            raise TableStateError("start", self._state, "new")
        admin = KafkaAdmin(self.settings)
        self.cluster_id = admin.cluster_id()
        info = admin.describe_topic(self.topic)
        all_partitions = info.partitions
        if self._membership is not None:
            return self._start_in_group(info.partitions, info.compacted, info.delete_retention_ms, progress)
        if self.wanted_partitions is not None:
            missing = set(self.wanted_partitions) - set(all_partitions)
            if missing:
                raise ConfigError(f"topic {self.topic!r} has no partitions {sorted(missing)}")
        self.partitions = self.wanted_partitions or all_partitions
        if self._instance is not None:
            i, n = self._instance
            self.partitions = tuple(p for p in self.partitions if p % n == i)
        if self.blob is not None:
            self.blob.check(writable=False)
            self.repo = CheckpointRepository.for_table(self.blob, self.cluster_id, self.name)
        state = TopicState(
            self.topic,
            self.cluster_id,
            self.partitions,
            log_start_offsets(self.settings, self.topic, self.partitions),
            info.compacted,
            info.delete_retention_ms,
            topic_id=topic_id(self.settings, self.topic) if self.repo is not None else None,
        )
        started = time.monotonic()
        self._pick_store()
        manifest = self._restore_checkpoint(state)
        self.report.load_seconds = time.monotonic() - started
        self._restored = manifest
        offsets = resume_offsets(manifest, self.partitions)
        if self.restore_listener is not None:
            self._tracker = RestoreTracker(self.restore_listener, self.name, offsets)
        if not self.tail:
            return self._freeze(offsets)
        if self.repo is not None and not self.read_only:
            self._join_snapshots(all_partitions, manifest, state.topic_id)
        self._reader = ChangelogReader(self.settings, self.topic, offsets)
        self._state = "restoring"
        started = time.monotonic()
        try:
            try:
                self._catch_up(progress)
            except OffsetOutOfRangeError as e:
                if manifest is None or self.require_checkpoint or self.generation is not None:
                    raise
                self._replay_instead_of(manifest, e, all_partitions, state.topic_id)
                self._catch_up(progress)
            if self._tracker is not None:
                self._tracker.at_end(self.partitions)
            self._tracker = None
            self._state = "running"
        finally:
            # close() from another thread waits for this before it closes the reader.
            self._restore_done.set()
        self.report.replay_seconds = time.monotonic() - started
        return self._started()

    def _catch_up(self, progress: ProgressCallback | None) -> None:
        assert self._reader is not None
        with gc_paused():
            while not self._reader.caught_up:
                if self._stop.is_set():
                    raise TableStateError("finish restoring", "closed", "restoring")
                self.report.replayed_records += self._consume(CATCH_UP_POLL)
                if self._tracker is not None:
                    self._tracker.at_end(self._reader.at_eof)
                if progress is not None:
                    progress(self.report.replayed_records, len(self._reader.at_eof), len(self.partitions))

    def _replay_instead_of(
        self,
        manifest: CheckpointManifest,
        error: OffsetOutOfRangeError,
        all_partitions: tuple[int, ...],
        tid: str | None,
    ) -> None:
        """The restored checkpoint cannot be continued: it resumes past a partition's end (another
        incarnation of the topic, the fallback signal where the broker reports no topic ID), or
        retention deleted records it had yet to read. Forget it, and every older one, and replay
        the topic from the beginning. The error's own message says which."""
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
            self.snapshots = None
            self._join_snapshots(all_partitions, None, tid)
        offsets = dict.fromkeys(self.partitions, 0)
        if self.restore_listener is not None:
            self._tracker = RestoreTracker(self.restore_listener, self.name, offsets)
        self._reader = ChangelogReader(self.settings, self.topic, offsets)

    def _pick_store(self) -> None:
        """``store="auto"``: the kind that suits the size of the checkpoint to restore."""
        if self._store_kind == "auto" and self.repo is not None:
            latest = self.repo.latest()
            kind = auto_store_kind(latest.total_rows if latest is not None else None)
            if kind != "memory":
                self.store.close()
                self.store = open_state_store(kind, path=self._store_path, name=self.name)
            log.info("table %s: store auto → %s", self.name, kind)

    def _start_in_group(
        self,
        all_partitions: tuple[int, ...],
        compacted: bool,
        delete_retention_ms: int,
        progress: ProgressCallback | None,
    ) -> RestoreReport:
        """Join the consumer group; return once the first assignment is restored and caught up."""
        assert self._membership is not None
        if self.blob is not None:
            self.blob.check(writable=False)
            self.repo = CheckpointRepository.for_table(self.blob, self.cluster_id, self.name)
        tid = topic_id(self.settings, self.topic) if self.repo is not None else None
        state = TopicState(
            self.topic, self.cluster_id, all_partitions, {}, compacted, delete_retention_ms, topic_id=tid
        )
        self._pick_store()
        if self.repo is not None:
            self._join_snapshots(all_partitions, None, tid)
        started = time.monotonic()
        reader = self._membership.join(state)
        # Duck-typed: the freshness mixin reads positions, caught_up and lag() (see freshness.py).
        self._reader = cast(ChangelogReader, reader)
        self._state = "restoring"
        try:
            with gc_paused():
                while not reader.caught_up:
                    if self._stop.is_set():
                        raise TableStateError("finish restoring", "closed", "restoring")
                    if not reader.assigned and time.monotonic() - started > FIRST_ASSIGNMENT_TIMEOUT:
                        raise KafkaError(
                            f"consumer group {self.group!r} assigned no partitions of {self.topic!r} "
                            f"within {FIRST_ASSIGNMENT_TIMEOUT:.0f}s (is the broker's group coordinator "
                            "reachable? group.protocol=consumer is not supported)"
                        )
                    self.report.replayed_records += self._consume(CATCH_UP_POLL)
                    if progress is not None:
                        progress(self.report.replayed_records, len(reader.at_eof), len(reader.positions))
            self._state = "running"
        finally:
            self._restore_done.set()
        self.report.replay_seconds = time.monotonic() - started
        return self._started()

    def _started(self) -> RestoreReport:
        """Restored and caught up: log it, start the snapshot watcher and the consuming thread."""
        self._last_commit = self._last_checkpoint_at = time.monotonic()
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

    def _join_snapshots(
        self, all_partitions: tuple[int, ...], manifest: CheckpointManifest | None, topic_id: str | None
    ) -> None:
        """Become a task of the table's snapshots (writers only)."""
        assert self.repo is not None
        spec = resolve_spec(
            self.snapshot_store,
            (self.repo.descriptor() or {}).get("snapshot_store"),
            self.name,
        )
        self.repo.ensure_descriptor(self.name, self.topic, self.cluster_id, len(all_partitions), str(spec))
        api = SnapshotApi.for_repo(
            self.repo,
            self.name,
            snapshot_store=str(spec),
            kafka=self.settings,
            topic=self.topic,
            cluster_id=self.cluster_id,
            partitions=all_partitions,
        )
        self.snapshots = SnapshotTask(
            api,
            task_id=self.task_id,
            owned=self.partitions,
            engine="python",
            retention=self.retention,
            snapshot_timeout=self.snapshot_timeout,
            refresh_interval=min(1.0, max(0.05, self.commit_interval.total_seconds() / 2)),
            previous=manifest,
            topic_id=topic_id,
        )
        hook = self.on_checkpoint
        if hook is not None:
            self.snapshots.on_checkpoint = lambda m: call_safely("on_checkpoint", self.name, hook, m)

    def _freeze(self, offsets: dict[int, int]) -> RestoreReport:
        """``tail=False``: the restored checkpoint is the table; nothing is consumed."""
        self._fixed_offsets = offsets
        if self._tracker is not None:
            self._tracker.at_end(self.partitions)
            self._tracker = None
        self._state = "running"
        self._restore_done.set()
        log.info(
            "table %s: generation %s as it is (%d keys), not tailing",
            self.name,
            self.report.checkpoint,
            self.report.restored_keys,
        )
        return self.report

    def _restore_checkpoint(self, state: TopicState) -> CheckpointManifest | None:
        if self.repo is None:
            return None
        spec = CheckpointLoad(
            self.repo,
            self.name,
            self.topic,
            self.generation,
            self.require_checkpoint,
            warn_if_empty=self.read_only,
        )
        return load_checkpoint(
            spec, state, self.partitions, self.store, self.row_filter, self._clock(), self.report
        )

    def _consume(self, timeout: float) -> int:
        assert self._reader is not None
        applied = 0
        hook = self.on_update if self._state == "running" else None
        updates: list[Change] = []
        with self._lock:
            reader = self._reader
            batches = reader.poll(timeout)
            try:
                for partition, messages in batches.items():
                    if hook is not None:
                        records = (self.row_filter or RowFilter()).records(messages)
                        updates.extend(changes_of(self.store, records))
                        self.store.apply(partition, records)
                    elif self.row_filter is None:
                        self.store.apply_messages(partition, messages)
                    else:
                        self.store.apply(partition, self.row_filter.records(messages))
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
        if hook is not None:
            fire_updates(self.name, hook, self.key_serde, self.value_serde, updates)
        return applied

    def poll(self, timeout: float = 0.5) -> int:
        """Consume one batch and run a commit point if due; returns the records applied.

        Only for ``background=False`` tables; background tables poll on their own thread.
        """
        self._require("poll", "running")
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
            log.exception("table %s: background consumer failed", self.name)
            self._waiters.notify()

    def _maybe_commit(self) -> None:
        now = time.monotonic()
        if now - self._last_commit < self.commit_interval.total_seconds():
            return
        try:
            self.commit()
        except (CheckpointError, BlobStoreError) as e:
            # The table stays correct without this checkpoint; keep consuming, try again next time.
            self._last_commit = time.monotonic()
            log.warning("table %s: checkpoint failed, will retry at the next commit point: %s", self.name, e)

    def commit(self) -> CheckpointManifest | None:
        """A commit point: flush the store, take part in a pending snapshot, and start one when
        ``checkpoint_interval`` has elapsed. Returns the checkpoint completed here, if any."""
        with self._lock:
            self.store.flush()
            self._last_commit = time.monotonic()
            if self._membership is not None and self._membership.reader is not None:
                self._membership.reader.commit()  # the group's offsets, for lag monitoring
            if self.snapshots is None:  # never checkpointed: keep the store from growing apart
                self.store.forget_changes()
                self.store.compact()
                return None
            due = self._last_commit - self._last_checkpoint_at >= self.checkpoint_interval.total_seconds()
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
        if self.read_only:
            why = "a point-in-time view (tail=False)" if not self.tail else "read-only"
            raise ReadOnlyTableError(f"table {self.name!r} is {why}: it never writes checkpoints")
        if self.snapshots is None or self._reader is None:
            return None
        snapshots = self.snapshots

        def write(abandoned: threading.Event) -> CheckpointManifest | None:
            with self._lock:
                if abandoned.is_set():
                    return None  # the caller gave up while a commit held the lock
                self.store.flush()
                self._last_checkpoint_at = time.monotonic()
                return snapshots.checkpoint(self._task_state(), full=full)

        seconds = None if timeout is None else parse_duration(timeout).total_seconds()
        return call_within(
            seconds,
            write,
            lambda: self._timed_out("the checkpoint", seconds),
            f"statesnap-checkpoint-{self.name}",
        )

    def _timed_out(self, what: str, seconds: float | None) -> CheckpointTimeoutError:
        where = self.repo.url if self.repo is not None else "the checkpoint store"
        return CheckpointTimeoutError(
            f"table {self.name!r}: {what} did not finish within {seconds or 0:.3g}s: {where} is not "
            "answering; the last committed checkpoint stands"
        )

    def _task_state(self) -> TaskState:
        assert self._reader is not None
        if self._thread_error is not None:  # a batch it could not apply: no checkpoint may claim it
            raise TableStateError("checkpoint", f"failed ({self._thread_error})", "running")
        return TaskState(
            dict(self._reader.positions),
            self.store.export,
            self.store.changes,
            self.store.mark_checkpointed,
        )

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
            self._state = "closed"
            self._waiters.notify()
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
            raise TableStateError(action, f"failed ({self._thread_error})", "running")
        if self._state not in states:
            raise TableStateError(action, self._state, " or ".join(states))

    def _store_for(self, action: str | None) -> StateStore:
        if action is not None:
            self._require(action, "running")
        return self.store

    # In a consumer group a key lookup first checks that this instance serves the key's partition.

    def _check_key(self, raw_key: bytes) -> None:
        membership = self._membership
        assert membership is not None
        reader = membership.reader
        if reader is not None and not reader.readable(membership.partition_for(raw_key)):
            membership.check_read(raw_key, row_origin(self.store, raw_key))

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

    def partition_for(self, key: K | bytes) -> int:
        """The partition *key* (an object for the key serde, or raw bytes) is produced to, by the
        table's ``partitioner``: for routing a read to the group member that owns it."""
        raw = bytes(key) if isinstance(key, bytes | bytearray | memoryview) else self.key_serde.serialize(key)
        if self._membership is None:
            raise TableStateError("tell a key's partition", "not in a consumer group", "Table(group=...)")
        if not self._membership.partition_count:
            raise TableStateError("tell a key's partition", self._state, "started")
        return self._membership.partition_for(raw)

    def _serdes(self) -> tuple[Serde, Serde]:
        return self.key_serde, self.value_serde

    def _table_name(self) -> str:
        return self.name
