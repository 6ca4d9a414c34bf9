"""``Follower``: a read-only replica of a table that another application owns.

A follower boots from the owner's newest valid checkpoint, then tails the changelog for as long as
it runs. It is a façade over ``Table(read_only=True, background=True)`` and inherits its
guarantees:

- it **never writes**: no checkpoint, no retention GC, nothing produced, no offsets committed
  (partitions are assigned without joining a consumer group); a write attempt raises
  :class:`~statesnap.errors.ReadOnlyTableError`;
- when the owner's GC deletes the checkpoint while the follower is loading it, the restore starts
  over with the newest one; a checkpoint the owner writes later does not affect a running
  follower (it only tails the changelog), a restarted one boots from the newest;
- it may keep a subset: ``key_filter`` and ``value_projection`` are applied while restoring and
  while tailing (a key the filter rejects never enters the table).

Freshness. ``offsets`` are the next offset to consume per partition: every read reflects at least
every record below them. ``caught_up`` is decided by partition EOF (exact, also on brokers that
under-report high watermarks); ``lag()`` is an estimate from the last high watermark the broker
reported. Read-your-writes: the writer passes the offset its produce() delivery report gave to
:meth:`Follower.wait_for`, then reads.

Reads: ``Follower[K, V]`` is a typed ``Mapping`` like :class:`~statesnap.Table` (iteration in key
order, ``keys``/``values``/``items``, ``scan``; :mod:`statesnap.python.reads`). asyncio:
``await follower.start_async()`` or ``async with Follower(...)``, ``await follower.wait_for_async()``.
Hooks ``on_update`` and ``restore_listener`` follow :mod:`statesnap.python.hooks` (a follower writes no
checkpoints, so it has no ``on_checkpoint``).

A checkpoint URL under which no checkpoint exists at all (a typo, the wrong table name) is logged at
WARNING before the full replay it causes; pass ``require_checkpoint=True`` to fail instead.

Life cycle: ``new`` → ``restoring`` → ``running`` → ``closed``, or ``failed`` when the restore or
the background consumer raised (the error is kept in :attr:`Follower.error`).

Length: most of it is the public API's docstrings (each wait says what it waits for and how it
ends); the engine is :class:`ReadOnlyTable`, the status value is in :mod:`statesnap.python.status`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from datetime import datetime
from types import MappingProxyType
from typing import Any, Generic

from statesnap.blob import BlobStore
from statesnap.checkpoint import CheckpointManifest
from statesnap.errors import ConfigError, ReadOnlyTableError, TableStateError
from statesnap.python.hooks import Hooks
from statesnap.python.reads import K, SerdeName, SerdeOf, TableReads, V
from statesnap.python.status import FollowerStatus
from statesnap.python.table import ProgressCallback, RestoreReport, Table
from statesnap.serde import Serde
from statesnap.stores import StateStore
from statesnap.task.lifecycle import TaskPhase, release_locals
from statesnap.task.options import CheckpointOptions, StaticShare, StoreName, StoreOptions
from statesnap.task.rowfilter import RowFilter

log = logging.getLogger(__name__)

#: How often wait_caught_up() samples the EOF state; caught-up windows last a consume call or more.
_CAUGHT_UP_SAMPLE_SECONDS = 0.005

__all__ = ["STATES", "Follower", "FollowerStatus", "ReadOnlyTable"]

STATES = tuple(TaskPhase)


class ReadOnlyTable(Table[K, V]):
    """A table that never writes: no checkpoint, no snapshot, no GC — Kafka Streams'
    ``ReadOnlyKeyValueStore`` as a type, not a flag: its task is built without the component
    that writes (:class:`~statesnap.task.writer.TaskWriter`), so no code path of it can write. A
    :class:`Follower` runs one; tools that read a table on their own thread (``statesnap dump``)
    use it with ``background=False``.

    Takes :class:`~statesnap.Table`'s options (not ``group``: a group member writes) and *tail*:
    False gives the table exactly as ``checkpoints.generation`` holds it, never moving.
    """

    _writes = False  # read once: the task gets no writer

    def __init__(self, topic: str, *, tail: bool = True, **options: Any) -> None:
        super().__init__(topic, **options)
        self.tail = tail
        self.background = self.background and tail


class Follower(TableReads[K, V], Generic[K, V]):
    """A read-only replica of the table *topic* whose checkpoints another application writes.

    Example::

        with Follower("orders", bootstrap_servers="kafka:9092", checkpoints="s3://ckpt/prod",
                      key_serde="string", value_serde="json") as orders:
            orders.get("o-17")
            orders.wait_for({3: 1234})      # the offset the writer's delivery report gave
            orders.get("o-17")              # now reflects that write
    """

    def __init__(
        self,
        topic: str,
        *,
        bootstrap_servers: str,
        checkpoints: str | BlobStore | CheckpointOptions | None,
        name: str | None = None,
        store: StoreName | StoreOptions = "auto",
        key_serde: SerdeOf[K] | SerdeName | None = None,
        value_serde: SerdeOf[V] | SerdeName | None = None,
        kafka_config: Mapping[str, Any] | None = None,
        timeout: float = 15.0,
        partitions: Collection[int] | StaticShare | None = None,
        row_filter: RowFilter | None = None,
        hooks: Hooks | None = None,
        tail: bool = True,
    ) -> None:
        """
        Args:
            topic: the owner's changelog topic.
            bootstrap_servers: Kafka bootstrap address(es).
            checkpoints: the owner's checkpoint store (a URL, a store, or
                :class:`~statesnap.CheckpointOptions`: storage options; ``require=True`` fails
                instead of replaying the whole topic when no checkpoint verifies, e.g. when the
                URL has a typo; ``generation=G`` boots from exactly that generation), read only;
                None replays the whole topic.
            name: the owner's table name in the checkpoint store (default: the topic name).
            store: local state store, ``memory``, ``columnar`` or ``rocksdb``.
            key_serde: how reads convert keys (default: raw bytes). Filters and projections
                always see raw bytes.
            value_serde: how reads convert values (default: raw bytes).
            kafka_config: extra librdkafka properties (TLS, SASL, …), and the schema registry of
                ``avro`` / ``json_schema`` serdes (``schema.registry.url``, …), as for a Table.
            timeout: how long to wait for the cluster's first answers.
            partitions: follow only these partitions (default: all).
            row_filter: keep a subset (a key filter and a value projection).
            hooks: ``on_update`` and ``restore_listener`` (:mod:`statesnap.python.hooks`).
            tail: False gives the table exactly as ``checkpoints.generation`` holds it: restored,
                never replayed, never moving.
        """
        options = CheckpointOptions.of(checkpoints)
        if not tail and (options is None or options.generation is None):
            raise ConfigError(
                "tail=False needs generation=G (checkpoints=CheckpointOptions(url, generation=G)): it "
                "gives the table as snapshot G holds it"
            )
        self._key_filter = row_filter.key_filter if row_filter is not None else None
        self._table: Table[K, V] = ReadOnlyTable(
            topic,
            tail=tail,
            bootstrap_servers=bootstrap_servers,
            name=name,
            checkpoints=options,
            store=store,
            key_serde=key_serde,
            value_serde=value_serde,
            kafka_config=kafka_config,
            timeout=timeout,
            partitions=partitions,
            background=True,
            row_filter=row_filter,
            hooks=hooks,
        )
        self._state = TaskPhase.NEW
        self._state_lock = threading.Lock()
        self._settled = threading.Event()  # set once running or failed
        self._close_after_start = False
        self._error: BaseException | None = None
        self._boot_seconds: float | None = None
        self._restore_thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"Follower(table={self.name!r}, topic={self.topic!r}, state={self.state!r})"

    # --- identity ------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._table.name

    @property
    def topic(self) -> str:
        return self._table.topic

    @property
    def partitions(self) -> tuple[int, ...]:
        """Partitions followed (known once the restore has read the topic's metadata)."""
        return self._table.partitions

    @property
    def report(self) -> RestoreReport:
        """How the boot went: checkpoint used, keys restored, records replayed, seconds."""
        return self._table.report

    @property
    def last_checkpoint(self) -> CheckpointManifest | None:
        """The checkpoint this replica booted from (None after a full replay)."""
        return self._table.last_checkpoint

    @property
    def checkpoint_url(self) -> str | None:
        """The owner's table directory in the checkpoint store (no credentials)."""
        return self._table.repo.url if self._table.repo is not None else None

    def keeps(self, key: bytes) -> bool:
        """Whether this replica's key filter keeps *key* (raw bytes)."""
        return self._key_filter is None or bool(self._key_filter(key))

    # --- life cycle ----------------------------------------------------------------------------

    @property
    def state(self) -> TaskPhase:
        """Where the replica is: ``new``, ``restoring``, ``running``, ``failed`` or ``closed`` (a
        :class:`~statesnap.task.lifecycle.TaskPhase`, equal to its name)."""
        if self._state == TaskPhase.RUNNING and self._table_failed() is not None:
            return TaskPhase.FAILED
        return self._state

    @property
    def error(self) -> BaseException | None:
        """The error that stopped the restore or the background consumer, if any."""
        return self._error or self._table_failed()

    def _table_failed(self) -> BaseException | None:
        return self._table.failure  # a look, not a re-raise: the table still logs it unseen

    def start(self, *, progress: ProgressCallback | None = None) -> RestoreReport:
        """Boot from the owner's newest valid checkpoint and replay the tail until every partition
        reports EOF; afterwards a background thread keeps tailing. Blocks until then."""
        self._begin_restore()
        return self._restore(progress)

    def start_in_background(
        self,
        *,
        progress: ProgressCallback | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        """Run :meth:`start` on a thread and return at once; :attr:`state` says ``restoring`` until
        it is done. Use :meth:`wait_until_ready` to block until the replica is usable. A restore
        that fails is handed to *on_failure* (the caller reports it: ``statesnap serve`` stops
        with it, in one line), else logged with its traceback; either way :attr:`error` holds it."""
        self._begin_restore()

        def run() -> None:
            try:
                self._restore(progress)
            except BaseException as e:
                if on_failure is not None:
                    on_failure(e)
                else:
                    log.exception("follower %s: restore failed", self.name)

        self._restore_thread = threading.Thread(
            target=run, name=f"statesnap-restore-{self.name}", daemon=True
        )
        self._restore_thread.start()

    def _begin_restore(self) -> None:
        with self._state_lock:
            if self._state != TaskPhase.NEW:
                raise TableStateError("start", self._state, "new")
            self._state = TaskPhase.RESTORING

    def _restore(self, progress: ProgressCallback | None) -> RestoreReport:
        started = time.monotonic()
        try:
            report = self._table.start(progress=progress)
        except BaseException as e:
            self._error = e
            with self._state_lock:
                self._state = TaskPhase.CLOSED if self._close_after_start else TaskPhase.FAILED
            self._settled.set()  # the failed start closed the table (Table.start)
            if self._close_after_start:  # closed while restoring: close() left this to us
                release_locals(e)
            raise
        self._boot_seconds = time.monotonic() - started
        with self._state_lock:
            closing = self._close_after_start
            self._state = TaskPhase.RUNNING
        self._settled.set()
        if closing:
            self.close()
        return report

    def wait_until_ready(self, timeout: float | None = None) -> bool:
        """Block until the restore finished (True) or *timeout* passed (False); a failed restore
        re-raises its error here."""
        if not self._settled.wait(timeout):
            return False
        err = self.error
        if err is not None:
            raise err
        return self._state == TaskPhase.RUNNING

    def close(self) -> None:
        """Stop tailing and release the consumer and the local store. Never writes a checkpoint.

        Called during a background restore, it returns at once and the restore thread closes
        the replica as soon as the restore ends (a restore cannot be interrupted half-way).
        """
        with self._state_lock:
            if self._state == TaskPhase.CLOSED:
                return
            if self._state == TaskPhase.RESTORING:
                self._close_after_start = True
                return
            self._state = TaskPhase.CLOSED
        self._table.close(checkpoint=False)
        if self._error is not None:
            release_locals(self._error)

    def __enter__(self) -> Follower[K, V]:
        if self._state == TaskPhase.NEW:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- asyncio -------------------------------------------------------------------------------

    async def start_async(self, *, progress: ProgressCallback | None = None) -> RestoreReport:
        """:meth:`start` on a worker thread: the event loop keeps running during the restore
        (*progress* and the restore listener run on that thread). Cancelling it closes the
        replica as soon as the restore ends."""
        try:
            return await asyncio.to_thread(self.start, progress=progress)
        except asyncio.CancelledError:
            self.close()
            raise

    async def aclose(self) -> None:
        """:meth:`close` on a worker thread."""
        await asyncio.to_thread(self.close)

    async def __aenter__(self) -> Follower[K, V]:
        if self._state == TaskPhase.NEW:
            await self.start_async()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- reads (the Mapping itself is in statesnap.python.reads) --------------------------------------

    def _running(self) -> bool:
        return self._state is TaskPhase.RUNNING

    def _require_running(self, action: str) -> None:
        if self._state != TaskPhase.RUNNING:
            raise TableStateError(action, self._state, "running")

    def _store_for(self, action: str | None) -> StateStore:
        if action is not None:
            self._require_running(action)
        return self._table.readable_store(action)  # also refuses reads once the tailing thread failed

    def _serdes(self) -> tuple[Serde, Serde]:
        return self._table.key_serde, self._table.value_serde

    def _table_name(self) -> str:
        return self.name

    # --- writes: a follower has none -----------------------------------------------------------

    def _read_only(self, what: str) -> ReadOnlyTableError:
        return ReadOnlyTableError(
            f"cannot {what}: follower of table {self.name!r} is read-only; "
            f"write to topic {self.topic!r} through the table's owner"
        )

    def checkpoint(self) -> None:
        """Always raises :class:`ReadOnlyTableError`: checkpoints are the owner's job."""
        self._table.checkpoint()  # the read-only Table raises before touching anything
        raise self._read_only("write a checkpoint")  # pragma: no cover - Table raises first

    def put(self, key: Any, value: Any) -> None:
        """Always raises :class:`ReadOnlyTableError`."""
        raise self._read_only(f"put {key!r}")

    def delete(self, key: Any) -> None:
        """Always raises :class:`ReadOnlyTableError`."""
        raise self._read_only(f"delete {key!r}")

    def __setitem__(self, key: Any, value: Any) -> None:
        self.put(key, value)

    def __delitem__(self, key: Any) -> None:
        self.delete(key)

    # --- freshness -----------------------------------------------------------------------------

    @property
    def offsets(self) -> dict[int, int]:
        """Next offset to consume per partition: every record below is applied."""
        return self._table.offsets

    @property
    def caught_up(self) -> bool:
        """Whether every partition reported end-of-partition since its last record."""
        return self.state == TaskPhase.RUNNING and self._table.caught_up

    def lag(self) -> dict[int, int]:
        """Records behind per partition: 0 at end-of-partition, else an estimate from the broker's
        last reported high watermark (brokers that under-report watermarks make it too low)."""
        return self._table.lag()

    def newest_record_age(self) -> float | None:
        """Seconds since the timestamp of the newest record applied, or None if none was."""
        return self._table.newest_record_age()

    def last_update_age(self) -> float | None:
        """Seconds since this replica last applied a changelog record, or None if it never did."""
        return self._table.last_update_age()

    def wait_for(
        self,
        offsets: Mapping[int, int] | None = None,
        *,
        timestamp: datetime | None = None,
        timeout: float = 30.0,
    ) -> bool:
        """Block until the records at *offsets* (partition → offset of a record someone wrote,
        e.g. from a produce() delivery report) are applied, and/or a record at least as new as
        *timestamp* is; False on timeout.

        Raises :class:`ConfigError` for a partition this replica does not follow, and the
        consumer's error if the replica failed while waiting.
        """
        self._check_wait(offsets)
        deadline = time.monotonic() + timeout
        if self._state == TaskPhase.RESTORING:
            # Wait for the restore to finish first: Table.wait_for consumes on the caller's
            # thread if it sees the table running before its background thread exists.
            self._settled.wait(max(0.0, deadline - time.monotonic()))
            self._raise_if_failed()
            if not self._running():  # another thread settled the state meanwhile
                return False
        # Table.wait_for re-raises a consumer failure and rejects partitions it does not own.
        return self._table.wait_for(
            offsets, timestamp=timestamp, timeout=max(0.0, deadline - time.monotonic())
        )

    async def wait_for_async(
        self,
        offsets: Mapping[int, int] | None = None,
        *,
        timestamp: datetime | None = None,
        timeout: float = 30.0,
    ) -> bool:
        """:meth:`wait_for` for coroutines, never blocking the event loop: woken by the tailing
        thread as records are applied (a restore still running is awaited on a worker thread)."""
        deadline = time.monotonic() + timeout
        self._check_wait(offsets)
        if self._state == TaskPhase.RESTORING:
            await asyncio.to_thread(self._settled.wait, max(0.0, deadline - time.monotonic()))
            self._raise_if_failed()
            if not self._running():  # another thread settled the state meanwhile
                return False
        return await self._table.wait_for_async(
            offsets, timestamp=timestamp, timeout=max(0.0, deadline - time.monotonic())
        )

    async def wait_caught_up_async(self, timeout: float = 30.0) -> bool:
        """:meth:`wait_caught_up` for coroutines (samples the EOF state without blocking)."""
        deadline = time.monotonic() + timeout
        while not self.caught_up:
            self._raise_if_failed()
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(_CAUGHT_UP_SAMPLE_SECONDS)
        return True

    def wait_caught_up(self, timeout: float = 30.0) -> bool:
        """Block until every partition is at end-of-partition (running and caught up); False on
        timeout. Under a steady write load the replica is caught up between two fetches."""
        deadline = time.monotonic() + timeout
        while not self.caught_up:
            self._raise_if_failed()
            if time.monotonic() >= deadline:
                return False
            time.sleep(_CAUGHT_UP_SAMPLE_SECONDS)
        return True

    def _check_wait(self, offsets: Mapping[int, int] | None) -> None:
        if self._state in (TaskPhase.NEW, TaskPhase.CLOSED):
            raise TableStateError("wait", self._state, "restoring or running")
        self._raise_if_failed()
        if offsets and self.partitions:
            unknown = sorted(set(offsets) - set(self.partitions))
            if unknown:
                raise ConfigError(
                    f"follower of {self.topic!r} does not follow partitions {unknown} "
                    f"(it follows {list(self.partitions)})"
                )

    def _raise_if_failed(self) -> None:
        err = self.error
        if err is not None:
            raise err

    def status(self) -> FollowerStatus:
        """A consistent-enough snapshot of the replica's freshness (each field read once)."""
        err = self.error
        state = self.state
        running = state == TaskPhase.RUNNING
        return FollowerStatus(
            table=self.name,
            topic=self.topic,
            state=state,
            caught_up=running and self._table.caught_up,
            offsets=MappingProxyType(self.offsets),
            lag=MappingProxyType(self.lag()),
            keys=len(self._table),
            checkpoint_generation=self.report.checkpoint,
            restore_seconds=self._boot_seconds,
            replayed_records=self.report.replayed_records,
            last_update_age=self.last_update_age(),
            newest_record_age=self.newest_record_age(),
            error=None if err is None else f"{type(err).__name__}: {err}",
        )
