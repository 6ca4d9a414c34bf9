"""``Table``: the latest value per key of a Kafka topic, restored from checkpoints.

Life cycle: ``Table(...)`` → ``start()`` (restore the newest valid checkpoint, replay the tail until
every partition reports EOF) → reads while it keeps consuming → ``close()`` (final checkpoint).

By default a background thread keeps consuming after ``start()``; pass ``background=False`` and
call :meth:`Table.poll` yourself to consume on your own thread (e.g. inside an event loop).

Commit points happen every ``commit_interval``: the store is flushed and, when
``checkpoint_interval`` has elapsed since the last checkpoint, one is written — so the real
checkpoint interval is a multiple of the commit interval. Writing a checkpoint is, in order:
export the store → write data files → write the manifest (write-once) → retention GC.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa

from statesnap.blob import BlobStore, open_blob_store
from statesnap.checkpoint import (
    CheckpointManifest,
    CheckpointRepository,
    RetentionPolicy,
)
from statesnap.checkpoint.layout import valid_table_name
from statesnap.checkpoint.restore import CheckpointSelector, SkippedCheckpoint
from statesnap.checkpoint.selection import TopicState, resume_offsets
from statesnap.durations import parse_duration
from statesnap.errors import (
    BlobStoreError,
    CheckpointError,
    ConfigError,
    ReadOnlyTableError,
    TableStateError,
)
from statesnap.kafka.admin import KafkaAdmin, log_start_offsets
from statesnap.kafka.config import KafkaSettings
from statesnap.kafka.reader import ChangelogReader
from statesnap.rowfilter import RowFilter
from statesnap.serde import Serde, resolve_serde
from statesnap.snapshot.api import SnapshotApi
from statesnap.snapshot.participant import SnapshotTask, TaskState
from statesnap.snapshot.store import resolve_spec
from statesnap.stores import StateStore, open_state_store

log = logging.getLogger(__name__)


@dataclass(slots=True)
class RestoreReport:
    """How ``start()`` got the table to the end of the changelog."""

    checkpoint: int | None = None
    restored_keys: int = 0
    replayed_records: int = 0
    load_seconds: float = 0.0
    replay_seconds: float = 0.0
    skipped: list[SkippedCheckpoint] = field(default_factory=list)

    @property
    def restore_seconds(self) -> float:
        return self.load_seconds + self.replay_seconds

    def to_json(self) -> dict[str, Any]:
        return {
            "checkpoint": self.checkpoint,
            "restored_keys": self.restored_keys,
            "replayed_records": self.replayed_records,
            "load_seconds": round(self.load_seconds, 3),
            "replay_seconds": round(self.replay_seconds, 3),
            "restore_seconds": round(self.restore_seconds, 3),
            "skipped": [{"generation": s.generation, "reason": s.reason} for s in self.skipped],
        }


#: Called during start() with (records replayed so far, partitions caught up, partitions total).
ProgressCallback = Callable[[int, int, int], None]


#: consume() blocks until a full batch or the timeout, so a short timeout keeps both the end of
#: catch-up and each new record's visibility prompt (a long one adds its whole length to both).
CATCH_UP_POLL = 0.05
TAIL_POLL = 0.02


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic GC during catch-up: replay allocates millions of short-lived objects and
    creates no cycles, and generation-0 collections cost ~15% of replay time (measured)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class Table:
    """A keyed table over *topic* (all partitions, assigned without a consumer group)."""

    def __init__(
        self,
        topic: str,
        *,
        bootstrap_servers: str,
        name: str | None = None,
        checkpoints: str | BlobStore | None = None,
        storage_options: Mapping[str, Any] | None = None,
        store: str = "memory",
        store_path: str | Path | None = None,
        key_serde: Serde | str | None = None,
        value_serde: Serde | str | None = None,
        kafka_config: Mapping[str, Any] | None = None,
        checkpoint_interval: str | float | timedelta = "1h",
        commit_interval: str | float | timedelta = "5s",
        retention: RetentionPolicy | None = None,
        require_checkpoint: bool = False,
        background: bool = True,
        generation: int | None = None,
        partitions: Collection[int] | None = None,
        timeout: float = 15.0,
        instance: int | None = None,
        instances: int | None = None,
        task_id: str | None = None,
        snapshot_timeout: str | float | timedelta = "60s",
        snapshot_store: str | None = None,
        read_only: bool = False,
        key_filter: Callable[[bytes], bool] | None = None,
        value_projection: Callable[[bytes], bytes | None] | None = None,
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
            store: local state store, ``memory`` or ``rocksdb``.
            kafka_config: extra librdkafka properties (TLS, SASL, …).
            checkpoint_interval: minimum time between periodic checkpoints.
            commit_interval: how often a commit point happens while consuming.
            retention: GC policy applied after each checkpoint.
            require_checkpoint: fail instead of replaying from the beginning when none verifies.
            background: keep consuming on a background thread after start().
            generation: restore exactly this generation instead of the newest valid one.
            partitions: own only these partitions (default: all).
            instance, instances: static assignment: own partitions ``p`` with ``p % instances ==
                instance``; each instance is a task of the table's snapshots.
            task_id: this task's name in snapshots (default ``instance-<i>`` or ``main``).
            snapshot_timeout: a snapshot not complete within this is marked FAILED.
            snapshot_store: where snapshot records live: ``blob`` (beside the checkpoints, the
                default) or ``topic:NAME`` (a Kafka topic on this cluster); default
                ``$STATESNAP_SNAPSHOT_STORE``. A table keeps the store it was created with.
            read_only: never write or delete checkpoints (a replica of someone else's table).
            key_filter: keep only keys for which it returns True (applied to raw key bytes).
            value_projection: rewrite raw values before storing; returning None drops the key.
        """
        self.topic = topic
        self.name = name or topic
        if not valid_table_name(self.name):
            raise ConfigError(f"invalid table name {self.name!r}: use letters, digits, '.', '_', '-'")
        self.settings = KafkaSettings(bootstrap_servers, dict(kafka_config or {}), timeout)
        if isinstance(checkpoints, str):
            self.blob: BlobStore | None = open_blob_store(checkpoints, **dict(storage_options or {}))
        else:
            self.blob = checkpoints
        self.checkpoint_interval = parse_duration(checkpoint_interval)
        self.commit_interval = parse_duration(commit_interval)
        self.retention = retention or RetentionPolicy()
        self.require_checkpoint = require_checkpoint
        self.background = background
        self.generation = generation
        self.wanted_partitions = None if partitions is None else tuple(sorted(set(partitions)))
        if (instance is None) != (instances is None):
            raise ConfigError("instance and instances go together")
        if instance is not None and instances is not None:
            if not 0 <= instance < instances:
                raise ConfigError(f"instance must be in [0, {instances}), got {instance}")
            self._instance: tuple[int, int] | None = (instance, instances)
        else:
            self._instance = None
        self.key_serde = resolve_serde(key_serde)
        self.value_serde = resolve_serde(value_serde)
        self.read_only = read_only
        self.row_filter = (
            RowFilter(key_filter, value_projection)
            if key_filter is not None or value_projection is not None
            else None
        )
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
        self.snapshot_timeout = parse_duration(snapshot_timeout)
        self.snapshot_store = snapshot_store
        self.report = RestoreReport()
        self._restored: CheckpointManifest | None = None
        self._reader: ChangelogReader | None = None
        self._state = "new"
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._thread_error: BaseException | None = None
        self._last_commit = time.monotonic()
        self._last_checkpoint_at = time.monotonic()
        self.cluster_id = ""
        self.partitions: tuple[int, ...] = ()

    # --- life cycle ----------------------------------------------------------------------------

    def start(self, *, progress: ProgressCallback | None = None) -> RestoreReport:
        """Restore from the newest valid checkpoint, then replay the tail until caught up."""
        if self._state != "new":
            raise TableStateError("start", self._state, "new")
        admin = KafkaAdmin(self.settings)
        self.cluster_id = admin.cluster_id()
        info = admin.describe_topic(self.topic)
        all_partitions = info.partitions
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
        )
        started = time.monotonic()
        manifest = self._restore_checkpoint(state)
        self.report.load_seconds = time.monotonic() - started
        self._restored = manifest
        if self.repo is not None and not self.read_only:
            spec = resolve_spec(
                self.snapshot_store,
                (self.repo.descriptor() or {}).get("snapshot_store"),
                self.name,
            )
            self.repo.ensure_descriptor(
                self.name, self.topic, self.cluster_id, len(all_partitions), str(spec)
            )
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
            )
        offsets = resume_offsets(manifest, self.partitions)
        self._reader = ChangelogReader(self.settings, self.topic, offsets)
        self._state = "restoring"
        started = time.monotonic()
        try:
            with _gc_paused():
                while not self._reader.caught_up:
                    if self._stop.is_set():
                        raise TableStateError("finish restoring", "closed", "restoring")
                    self.report.replayed_records += self._consume(CATCH_UP_POLL)
                    if progress is not None:
                        progress(self.report.replayed_records, len(self._reader.at_eof), len(self.partitions))
            self._state = "running"
        finally:
            # close() from another thread waits for this before it closes the reader.
            self._restore_done.set()
        self.report.replay_seconds = time.monotonic() - started
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

    def _restore_checkpoint(self, state: TopicState) -> CheckpointManifest | None:
        if self.repo is None:
            return None
        restorer = CheckpointSelector(self.repo, self.name, self.generation, self.require_checkpoint)
        row_filter = self.row_filter

        def load(partition: int, rows: pa.Table) -> None:
            self.store.load(partition, rows if row_filter is None else row_filter.rows(rows))

        try:
            manifest = restorer.restore(state, self.partitions, load, self.store.clear, self._clock())
        finally:
            self.report.skipped = restorer.skipped
        if manifest is not None:
            self.report.checkpoint = manifest.generation
            self.report.restored_keys = len(self.store)
        return manifest

    def _consume(self, timeout: float) -> int:
        assert self._reader is not None
        applied = 0
        with self._lock:
            for partition, messages in self._reader.poll(timeout).items():
                if self.row_filter is None:
                    self.store.apply_messages(partition, messages)
                else:
                    self.store.apply(partition, self.row_filter.records(messages))
                applied += len(messages)
                ts_type, ts = messages[-1].timestamp()
                if ts_type:
                    self._newest_ts = max(self._newest_ts, ts)
        if applied:
            self._last_applied = time.monotonic()
            with self._applied:
                self._applied.notify_all()
        return applied

    def poll(self, timeout: float = 0.5) -> int:
        """Consume one batch and run a commit point if due; returns the records applied.

        Only for ``background=False`` tables; background tables poll on their own thread.
        """
        self._require("poll", "running")
        if self._thread is not None:
            raise TableStateError("poll", "consuming in the background", "background=False")
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
            if self.snapshots is None:
                return None
            due = self._last_commit - self._last_checkpoint_at >= self.checkpoint_interval.total_seconds()
            if due:
                self._last_checkpoint_at = self._last_commit
            return self.snapshots.on_commit(self._task_state(), checkpoint_due=due)

    def checkpoint(self) -> CheckpointManifest | None:
        """Write a checkpoint now (at a commit point): a snapshot in which this table's partitions
        take part. Returns the committed manifest when the snapshot completed here (always, for a
        table owning every partition), None when nothing changed since the last one or other
        instances have yet to report."""
        if self.read_only:
            raise ReadOnlyTableError(f"table {self.name!r} is read-only: it never writes checkpoints")
        if self.snapshots is None or self._reader is None:
            return None
        with self._lock:
            self.store.flush()
            self._last_checkpoint_at = time.monotonic()
            return self.snapshots.checkpoint(self._task_state())

    def _task_state(self) -> TaskState:
        assert self._reader is not None
        return TaskState({p: self._reader.positions[p] for p in self.partitions}, self.store.export)

    @property
    def last_checkpoint(self) -> CheckpointManifest | None:
        """The newest checkpoint this table's state is known to match (restored, written here, or
        completed by the table's other tasks)."""
        if self.snapshots is not None:
            return self.snapshots.last_checkpoint
        return self._restored

    def close(self, *, checkpoint: bool = True) -> None:
        """Stop consuming; on a clean shutdown write a final checkpoint first."""
        if self._state == "closed":
            return
        self._stop.set()
        if self._state == "restoring":
            self._restore_done.wait()  # the restoring thread sees _stop and gives up the reader
        if self._thread is not None:
            self._thread.join()
        try:
            if checkpoint and self._state == "running" and self._thread_error is None and not self.read_only:
                self.checkpoint()
        finally:
            if self.snapshots is not None:
                self.snapshots.close()
            if self._reader is not None:
                self._reader.close()
            self.store.close()
            self._state = "closed"

    def __enter__(self) -> Table:
        if self._state == "new":
            self.start()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close(checkpoint=exc_type is None)

    def raise_if_failed(self) -> None:
        """Re-raise, in the caller's thread, an error that stopped the background consumer."""
        if self._thread_error is not None:
            raise self._thread_error

    # --- reads ---------------------------------------------------------------------------------

    def _require(self, action: str, *states: str) -> None:
        if self._thread_error is not None:
            raise TableStateError(action, f"failed ({self._thread_error})", "running")
        if self._state not in states:
            raise TableStateError(action, self._state, " or ".join(states))

    def get(self, key: Any, default: Any = None) -> Any:
        """The current value of *key* (deserialized), or *default*."""
        self._require("get", "running")
        raw = self.store.get(self.key_serde.serialize(key))
        return default if raw is None else self.value_serde.deserialize(raw)

    def __getitem__(self, key: Any) -> Any:
        sentinel = object()
        value = self.get(key, sentinel)
        if value is sentinel:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        self._require("look up", "running")
        return self.key_serde.serialize(key) in self.store

    def __len__(self) -> int:
        return len(self.store)

    def items(self) -> Iterator[tuple[Any, Any]]:
        """Every (key, value), deserialized, in no particular order."""
        self._require("iterate", "running")
        kd, vd = self.key_serde.deserialize, self.value_serde.deserialize
        for k, v in self.store.items():
            yield kd(k), vd(v)

    def raw_items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) as stored bytes."""
        self._require("iterate", "running")
        return self.store.items()

    @property
    def offsets(self) -> dict[int, int]:
        """Next offset to consume per owned partition (everything below is applied)."""
        return dict(self._reader.positions) if self._reader is not None else {}

    @property
    def caught_up(self) -> bool:
        """Whether every partition has reported end-of-partition since its last record."""
        return self._reader is not None and self._reader.caught_up

    # --- freshness -----------------------------------------------------------------------------

    def lag(self) -> dict[int, int]:
        """Records behind per partition: 0 at end-of-partition, else the broker's last reported
        high watermark minus our position (no extra round trip; may under-estimate on brokers
        that under-report watermarks, as the dev broker does)."""
        if self._reader is None:
            return {}
        return self._reader.lag()

    def last_update_age(self) -> float | None:
        """Seconds since a record was last applied (None if none was since start)."""
        return None if self._last_applied is None else time.monotonic() - self._last_applied

    def newest_record_age(self) -> float | None:
        """Seconds since the timestamp of the newest record applied, or None if none was."""
        if self._newest_ts < 0:
            return None
        return max(0.0, self._clock().timestamp() - self._newest_ts / 1000)

    def wait_for(
        self,
        offsets: Mapping[int, int] | None = None,
        *,
        timestamp: datetime | None = None,
        timeout: float = 30.0,
    ) -> bool:
        """Block until the record at *offsets* (partition → offset of a record someone wrote) is
        applied and, if given, a record at least as new as *timestamp* is; False on timeout.

        The read-your-writes primitive: the writer passes the offset its produce() reported.
        """
        deadline = time.monotonic() + timeout
        want_ms = None if timestamp is None else int(timestamp.timestamp() * 1000)
        if offsets and set(offsets) - set(self.partitions):
            raise ConfigError(
                f"table {self.name!r} does not own partitions {sorted(set(offsets) - set(self.partitions))}"
            )

        def done() -> bool:
            positions = self.offsets
            if offsets and any(positions.get(p, 0) <= off for p, off in offsets.items()):
                return False
            return want_ms is None or self._newest_ts >= want_ms

        with self._applied:
            while not done():
                self.raise_if_failed()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                if not self.background and self._state == "running":
                    self._applied.release()
                    try:
                        self.poll(min(remaining, 0.2))
                    finally:
                        self._applied.acquire()
                else:
                    self._applied.wait(min(remaining, 0.2))
        return True
