"""``Table``: the latest value per key of a Kafka topic, restored from checkpoints.

Life cycle: ``Table(...)`` → ``start()`` (restore the newest valid checkpoint, replay the tail until
every partition reports EOF) → reads while it keeps consuming → ``close()`` (final checkpoint).
A table is the simplest task: a :class:`~statesnap.task.engine.Task` (the Python engine: open,
restore, catch up, commit points, checkpoints, consumer groups, close) handed the upsert/tombstone
handler (:mod:`statesnap.python.upsert`). ``Table`` is the façade over it: the options, the typed
``Mapping`` reads, freshness and asyncio.

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
which reads a member serves, is in :mod:`statesnap.task.group`.

Commit points happen every ``commit_interval``: the store is flushed and, when the checkpoint
``interval`` has elapsed since the last checkpoint, one is written — so the real checkpoint
interval is a multiple of the commit interval. Writing a checkpoint is, in order: export the
store → write data files → write the manifest (write-once) → retention GC.

Length: mostly the public constructor's documented options and the one-line delegations of
the façade; the engine is :mod:`statesnap.task.engine`, reads :mod:`statesnap.python.reads`,
freshness :mod:`statesnap.python.freshness`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping
from datetime import datetime, timedelta
from functools import partial
from typing import Any, ClassVar, Generic

from statesnap.blob import BlobStore
from statesnap.checkpoint import CheckpointManifest, CheckpointRepository
from statesnap.errors import TableStateError
from statesnap.kafka.config import KafkaSettings
from statesnap.python.freshness import Freshness
from statesnap.python.hooks import CheckpointHook, Hooks, RestoreListener, UpdateHook, fire_updates
from statesnap.python.reads import K, SerdeName, SerdeOf, TableReads, V
from statesnap.python.upsert import UpsertTaskHandler
from statesnap.serde import Serde, resolve_serde
from statesnap.snapshot.participant import SnapshotTask
from statesnap.stores import StateStore
from statesnap.task.engine import Task
from statesnap.task.lifecycle import TaskPhase
from statesnap.task.loop import CATCH_UP_POLL, TAIL_POLL
from statesnap.task.migration import StateVersion
from statesnap.task.opening import check_table_name
from statesnap.task.options import CheckpointOptions, GroupOptions, StaticShare, StoreName, StoreOptions
from statesnap.task.restore import ProgressCallback, RestoreReport
from statesnap.task.rowfilter import RowFilter
from statesnap.task.spec import TaskSpec

__all__ = ["CATCH_UP_POLL", "TAIL_POLL", "ProgressCallback", "RestoreReport", "Table"]


class Table(TableReads[K, V], Generic[K, V]):
    """A keyed table over *topic*: all partitions, a static share (``StaticShare``), or the
    partitions a consumer group assigns (``group``; see the module docstring).

    ``Table[K, V]`` is a read-only ``Mapping[K, V]`` (iteration in key order, ``keys``,
    ``values``, ``items``, ``get``, ``in``, ``len``, ``scan``); see :mod:`statesnap.python.reads`.

    Example::

        with Table("orders", bootstrap_servers="kafka:9092", checkpoints="s3://ckpt/prod") as t:
            t.get(b"o-17")
    """

    #: Whether the task writes checkpoints (has a writer); read once, when the task is built. Its
    #: read-only sibling (a follower's replica) builds a task without one.
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
        kafka_config: Mapping[str, Any] | None = None,
        timeout: float = 15.0,
        partitions: Collection[int] | StaticShare | None = None,
        group: str | GroupOptions | None = None,
        background: bool = True,
        row_filter: RowFilter | None = None,
        hooks: Hooks | None = None,
        state: int | StateVersion = 1,
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
            key_serde: how reads convert keys (a serde, or ``bytes`` (default), ``string``,
                ``json``, ``avro``, ``json_schema``); the table stores bytes.
            value_serde: how reads convert values, as *key_serde* does keys.
            kafka_config: extra librdkafka properties (TLS, SASL, …), and the schema registry of
                ``avro`` / ``json_schema`` serdes as Kafka Streams takes it:
                ``schema.registry.url`` and ``schema.registry.<client setting>``.
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
            state: the version of the stored rows' format (bump it when a change to
                *row_filter*, a serde or a handler changes what is stored), recorded in every
                checkpoint: an int, or ``StateVersion(2, {1: fn})`` with the migrations that
                bring older checkpoints up — ``fn(key, value) -> (key, value) | (key, value,
                partition) | None`` on stored bytes, turning version ``v`` rows into ``v + 1``,
                run while restoring (see :mod:`statesnap.task.migration`). A checkpoint of another
                version is refused unless the migrations bring it up.

        To restore an exact snapshot generation and continue from its offsets, pass
        ``checkpoints=CheckpointOptions(url, generation=G)``: later generations stay, new ones
        are numbered above them.
        """
        self.topic = topic
        self.name = check_table_name(name or topic)
        self.settings = KafkaSettings(bootstrap_servers, dict(kafka_config or {}), timeout)
        state = StateVersion.of(state)
        state.row_steps(f"table {self.name!r}")  # a processor's per-store form is refused here
        self.checkpoints = CheckpointOptions.of(checkpoints)
        self.group = GroupOptions.of(group)
        self.key_serde: Serde = resolve_serde(
            key_serde, schema_registry=self.settings.schema_registry, topic=topic, is_key=True
        )
        self.value_serde: Serde = resolve_serde(
            value_serde, schema_registry=self.settings.schema_registry, topic=topic
        )
        self.row_filter = row_filter
        spec = TaskSpec(
            name=self.name,
            topic=topic,
            settings=self.settings,
            checkpoints=self.checkpoints,
            state=state,
            store=StoreOptions.of(store),
            partitions=partitions,
            group=self.group,
            row_filter=row_filter,
            background=background,
            writes=self._writes,
        )
        self._task = Task(spec, UpsertTaskHandler(row_filter))
        self._freshness = Freshness(self._task)
        hooks = hooks or Hooks()
        self._on_update: UpdateHook[Any, Any] | None = None
        self.on_update = hooks.on_update
        self.on_checkpoint = hooks.on_checkpoint
        self.restore_listener = hooks.restore_listener

    def __repr__(self) -> str:
        return f"Table(name={self.name!r}, topic={self.topic!r}, state={self.phase.value!r})"

    # --- the task, and what it says of itself ---------------------------------------------------

    @property
    def task(self) -> Task:
        """The engine this table is the façade of (for tools and tests)."""
        return self._task

    @property
    def state(self) -> StateVersion:
        """The state version of the rows this table writes, and how older ones are brought up."""
        return self._task.state

    @property
    def store(self) -> StateStore:
        return self._task.store

    @property
    def wanted_partitions(self) -> tuple[int, ...] | None:
        """The partitions asked for by number (None: all, or a static share)."""
        return self._task.wanted_partitions

    @property
    def repo(self) -> CheckpointRepository | None:
        return self._task.repo

    @property
    def snapshots(self) -> SnapshotTask | None:
        return self._task.snapshots

    @property
    def task_id(self) -> str:
        return self._task.task_id

    @property
    def report(self) -> RestoreReport:
        return self._task.report

    @property
    def cluster_id(self) -> str:
        return self._task.cluster_id

    @property
    def partitions(self) -> tuple[int, ...]:
        return self._task.partitions

    @property
    def tail(self) -> bool:
        """False: a point-in-time view (restored, never consumed)."""
        return self._task.tail

    @tail.setter
    def tail(self, tail: bool) -> None:
        self._task.tail = tail

    @property
    def background(self) -> bool:
        """Whether a background thread keeps consuming after start()."""
        return self._task.background

    @background.setter
    def background(self, background: bool) -> None:
        self._task.background = background

    @property
    def failure(self) -> BaseException | None:
        """The error that stopped the consumer, if any; looking does not count as meeting it
        (:meth:`raise_if_failed` does: the consuming thread then leaves saying it to the caller)."""
        return self._task.failure

    @property
    def phase(self) -> TaskPhase:
        """Where the table is: ``new``, ``restoring``, ``running``, ``failed`` (its consumer
        stopped on an error, which reads and :meth:`raise_if_failed` raise) or ``closed``."""
        return self._task.phase

    @property
    def read_only(self) -> bool:
        """Whether this table never writes checkpoints (a follower's replica)."""
        return self._task.read_only

    @property
    def commit_interval(self) -> timedelta:
        return self._task.commit_interval

    @property
    def checkpoint_interval(self) -> timedelta:
        return self._task.checkpoint_interval

    @property
    def last_checkpoint(self) -> CheckpointManifest | None:
        """The newest checkpoint this table's state is known to match (restored, written here, or
        completed by the table's other tasks)."""
        return self._task.last_checkpoint

    # --- hooks (see statesnap.python.hooks) ------------------------------------------------------

    @property
    def on_update(self) -> UpdateHook[Any, Any] | None:
        return self._on_update

    @on_update.setter
    def on_update(self, hook: UpdateHook[Any, Any] | None) -> None:
        self._on_update = hook
        self._task.on_changes = (
            None if hook is None else partial(fire_updates, self.name, hook, self.key_serde, self.value_serde)
        )

    @property
    def on_checkpoint(self) -> CheckpointHook | None:
        return self._task.on_checkpoint

    @on_checkpoint.setter
    def on_checkpoint(self, hook: CheckpointHook | None) -> None:
        self._task.on_checkpoint = hook

    @property
    def restore_listener(self) -> RestoreListener | None:
        return self._task.restore_listener

    @restore_listener.setter
    def restore_listener(self, listener: RestoreListener | None) -> None:
        self._task.restore_listener = listener

    # --- life cycle ----------------------------------------------------------------------------

    def start(self, *, progress: ProgressCallback | None = None) -> RestoreReport:
        """Restore from the newest valid checkpoint, then replay the tail until caught up. A start
        that fails closes what it opened (a group member leaves its group) and re-raises."""
        return self._task.start(progress=progress)

    def stop_catching_up(self, *, timeout: float | None = 20.0) -> None:
        """Ask :meth:`start`, still catching up, to stop before its next batch, write a checkpoint
        of what it read (within *timeout* seconds) and raise
        :class:`~statesnap.errors.CatchUpStoppedError`: for a SIGTERM during a long catch-up (a
        deploy), which would otherwise lose the work back to the last periodic checkpoint. Safe
        from a signal handler or another thread; a no-op once caught up."""
        self._task.stop_catching_up(timeout=timeout)

    def poll(self, timeout: float = 0.5) -> int:
        """Consume one batch and run a commit point if due; returns the records applied.

        Only for ``background=False`` tables; background tables poll on their own thread.
        """
        return self._task.poll(timeout)

    def commit(self) -> CheckpointManifest | None:
        """A commit point: flush the store, take part in a pending snapshot, and start one when
        the checkpoint interval has elapsed. Returns the checkpoint completed here, if any."""
        return self._task.commit()

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
        return self._task.checkpoint(full=full, timeout=timeout)

    def raise_if_failed(self) -> None:
        """Re-raise, in the caller's thread, an error that stopped the background consumer."""
        self._task.raise_if_failed()

    def close(self, *, checkpoint: bool = True, timeout: str | float | timedelta | None = "30s") -> None:
        """Stop consuming; on a clean shutdown write a final checkpoint first.

        *timeout* bounds the whole close (None: as long as it takes). A background commit stuck
        on a checkpoint store that does not answer, or a final checkpoint that does not finish,
        ends in :class:`CheckpointTimeoutError` (a warning when no final checkpoint was asked
        for): the table is closed all the same, the last committed checkpoint stands, and the
        thread still waiting keeps its clients until the process exits."""
        self._task.close(checkpoint=checkpoint, timeout=timeout)

    def __enter__(self) -> Table[K, V]:
        if self.phase == "new":
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
            self._task.stop()
            raise

    async def aclose(
        self, *, checkpoint: bool = True, timeout: str | float | timedelta | None = "30s"
    ) -> None:
        """:meth:`close` on a worker thread (the final checkpoint may take a while)."""
        await asyncio.to_thread(self.close, checkpoint=checkpoint, timeout=timeout)

    async def __aenter__(self) -> Table[K, V]:
        if self.phase == "new":
            await self.start_async()
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        await self.aclose(checkpoint=exc_type is None)

    # --- freshness (statesnap.python.freshness) ---------------------------------------------------

    @property
    def offsets(self) -> dict[int, int]:
        """Next offset to consume per owned partition (everything below is applied)."""
        return self._freshness.offsets

    @property
    def caught_up(self) -> bool:
        """Whether every partition has reported end-of-partition since its last record (never, for
        a point-in-time view)."""
        return self._task.loop.caught_up

    def lag(self) -> dict[int, int]:
        """Records behind per partition: 0 at end-of-partition, else the broker's last reported
        high watermark minus our position (no extra round trip; may under-estimate on brokers
        that under-report watermarks, as the dev broker does)."""
        return self._task.loop.lag()

    def last_update_age(self) -> float | None:
        """Seconds since a record was last applied (None if none was since start)."""
        return self._task.loop.last_update_age()

    def newest_record_age(self) -> float | None:
        """Seconds since the timestamp of the newest record applied, or None if none was."""
        return self._task.loop.newest_record_age()

    def wait_for(
        self,
        offsets: Mapping[int, int] | None = None,
        *,
        timestamp: datetime | None = None,
        timeout: float = 30.0,
    ) -> bool:
        """Block until the record at *offsets* (partition → offset of a record someone wrote) is
        applied and, if given, a record at least as new as *timestamp* is; False on timeout.

        The read-your-writes primitive: the writer passes the offset its produce() reported. A
        point-in-time view (``tail=False``) never moves: it answers at once.
        """
        return self._freshness.wait_for(offsets, timestamp=timestamp, timeout=timeout)

    async def wait_for_async(
        self,
        offsets: Mapping[int, int] | None = None,
        *,
        timestamp: datetime | None = None,
        timeout: float = 30.0,
    ) -> bool:
        """:meth:`wait_for` for coroutines: woken by the consuming thread, never blocking the loop
        (a ``background=False`` table polls on a worker thread)."""
        return await self._freshness.wait_for_async(offsets, timestamp=timestamp, timeout=timeout)

    # --- reads (the Mapping itself is in statesnap.python.reads) --------------------------------

    def _store_for(self, action: str | None) -> StateStore:
        return self._task.readable_store(action)

    def readable_store(self, action: str | None) -> StateStore:
        """The store, once *action* (a read; None: no check) may use it: the table is running
        and its consumer has not failed."""
        return self._task.readable_store(action)

    # In a consumer group a key lookup first checks this member serves the key's partition.

    def __getitem__(self, key: K) -> V:
        if self._task.membership is not None:
            self._task.check_key(self.key_serde.serialize(key))
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        if self._task.membership is not None:
            self._task.check_key(self.key_serde.serialize(key))
        return super().__contains__(key)

    def get_raw(self, key: bytes) -> bytes | None:
        if self._task.membership is not None:
            self._task.check_key(key)
        return super().get_raw(key)

    def partition_for(self, key: object) -> int:
        """The partition *key* (an object for the key serde, or raw bytes) is produced to, by the
        table's ``partitioner``: for routing a read to the group member that owns it."""
        raw = bytes(key) if isinstance(key, bytes | bytearray | memoryview) else self.key_serde.serialize(key)
        membership = self._task.membership
        if membership is None:
            raise TableStateError("tell a key's partition", "not in a consumer group", "Table(group=...)")
        if not membership.partition_count:
            raise TableStateError("tell a key's partition", self.phase, "started")
        return membership.partition_for(raw)

    def _serdes(self) -> tuple[Serde, Serde]:
        return self.key_serde, self.value_serde

    def _table_name(self) -> str:
        return self.name
