"""``TopicSnapshotStore``: snapshot records in a single-partition Kafka topic, updated in transactions.

For deployments that would rather keep the snapshot table beside the data than beside the
checkpoints. Any thread or process may update the store; no update is lost.

Records
-------
One record per change, in partition 0 of the store topic; their key and JSON envelope are
:mod:`statesnap.snapshot.topic_records`, the topic and its clients
:mod:`statesnap.snapshot.topic_clients`.

The chain
---------
``prev`` is the offset of the table's last *accepted* record when the writer computed this one
(-1 for the first). A reader accepts a record of its table iff its ``prev`` is the offset of the
last record it accepted, and ignores every other record. So accepted records form one chain in
which each record was computed from exactly the state it follows: a stale or duplicate write
can never be applied on top of a newer state, whatever the broker lets readers see.

Readers agree on the chain because they all see one sequence: the store reads
``read_uncommitted``, i.e. every record of the partition in offset order up to the high
watermark, whatever became of its transaction. A record, once there, stays there, so each
reader's view is a prefix of the same log and the chain is a pure function of it.
``read_committed`` would not do: the dev broker shows aborted records anyway, and with writers
racing it can leave the last stable offset stuck for good below records whose
``commit_transaction`` had returned (seen in ~1 of 30 runs of three processes racing: every
``read_committed`` reader stopped there, while the records were all in the log).

An update, step by step (:meth:`TopicSnapshotStore._transact`)
---------------------------------------------------------------
1. Hold a transactional producer whose ``transactional.id`` is shared by every writer of the
   topic; a new one runs ``init_transactions``, which fences all older writers and settles any
   transaction they (or this store's previous producer) left open.
2. Read the topic to its end (partition EOF), extending the chain.
3. If a record of an earlier attempt of *this call* (same ``writer`` token) is in the chain, it
   counts after all (a commit whose answer was lost, or an aborted transaction whose record
   chained): return it. An update is never applied twice.
4. Apply ``fn``; nothing to write → return. ``update_current`` results with a lower generation
   raise :class:`~statesnap.errors.GenerationConflictError` (``check_successor``).
5. ``begin_transaction``, produce the record with ``prev`` = the chain's head, ``commit_transaction``.
6. Read on until past the record's own offset: in the chain → return it; not in the chain
   (another record got in first) → back to 1 after a short random back-off. A fenced producer,
   an aborted transaction or a commit with an unknown outcome also go back to 1, with a fresh
   producer where the old one is unusable.

Transactions serialize the writers (a writer's commit fails once another has started since) and,
on Apache Kafka, reject every late record of a fenced producer. The chain, not the transaction
outcome, decides what counts.

Guarantees
----------
On any broker (Apache Kafka or the dev broker):

- All readers agree on the chain; generations never go backwards along it.
- A call that returns was applied exactly once, and its record stays in the chain: no update
  reported as done is lost.
- An update whose writer died, or got a Kafka error, between produce and commit may take effect
  although its transaction aborted (its record is in the log and may chain). Updates should be
  idempotent, as the orchestrator's are (a task re-reporting its offsets, a repeated
  ``COMPLETED``/``FAILED`` mark).

On Apache Kafka, also: a call that raises from ``fn`` or ``GenerationConflictError`` changed
nothing (a final round of steps 1–3 settles every earlier attempt before giving up, and fencing
rejects their late records). On the dev broker, which accepts records from fenced producers, a
late record of such a call can still land and count; and a writer fenced between produce and
commit gets no answer to ``commit_transaction``: it times out after ``commit_timeout`` and steps
1–3 settle the outcome.

Writers of different tables in one topic share the ``transactional.id``, so they fence each
other too: correct, only a little slower under contention.

Reads
-----
``current(block=True)``, ``list()`` and ``get()`` read the topic to its end first (one fetch round
trip when nothing is new: the consumer is assigned only while reading, so an idle store sends no
fetches). ``current(block=False)`` answers from the state this instance built at its *last read*
(any blocking read or update of this instance; ``EMPTY`` before the first): no broker round trip,
no lock, no background thread. Keep it fresh by calling ``current()`` periodically, as
:class:`~statesnap.snapshot.orchestrator.LocalOrchestrator`'s refresher does.

Length: about 90 lines are this design note; the store itself is one chain of records with its
fencing, and its codec and clients already live in topic_records.py and topic_clients.py.
"""

from __future__ import annotations

import builtins
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from types import TracebackType
from typing import Any, Self

from confluent_kafka import KafkaError as RdKafkaError
from confluent_kafka import KafkaException, TopicPartition

from statesnap.errors import (
    BrokerUnavailableError,
    ConfigError,
    CorruptCheckpointError,
    GenerationConflictError,
    KafkaError,
    SnapshotError,
    SnapshotNotFoundError,
)
from statesnap.kafka.config import KafkaSettings
from statesnap.kafka.fatal import fatal_error, is_fatal
from statesnap.snapshot.model import EMPTY, Snapshot
from statesnap.snapshot.store import MAX_ATTEMPTS, Update, check_successor
from statesnap.snapshot.topic_clients import (
    aborted_for_retry,
    check_store_topic,
    store_consumer,
    store_producer,
)
from statesnap.snapshot.topic_records import Write, decode_record, encode_record, record_key

__all__ = ["TopicSnapshotStore"]

log = logging.getLogger(__name__)

#: Upper bound of one consumer poll; the read loop also checks its deadline this often.
_POLL_S = 0.1
#: A read that hears nothing at all (no record, no end of partition, no error) for this long
#: restarts its fetch rather than wait for its deadline: with a 10 ms fetch wait, two silent
#: seconds mean a lost fetch or connection, not a slow answer.
_STALL_S = 2.0
#: Random back-off after a lost race, doubling per attempt up to the cap, so two writers that keep
#: fencing each other fall out of step.
_BACKOFF_S = 0.01
_BACKOFF_MAX_S = 0.5


class TopicSnapshotStore:
    """A :class:`~statesnap.snapshot.store.SnapshotStore` kept in a single-partition Kafka topic.

    ``table`` separates the records of several tables sharing one topic. ``create`` creates a
    missing topic (otherwise :class:`~statesnap.errors.TopicNotFoundError`). ``transactional_id``
    defaults to ``statesnap-snapshots.<topic>``; every writer of the topic must use the same one
    (it is what fences older writers), so set it only where ACLs demand a given prefix.
    ``commit_timeout`` bounds one ``commit_transaction``; an unanswered commit is resolved by
    reading the topic, never assumed to have failed.

    The constructor does no I/O: the topic is checked (and created) on first use, and the
    Kafka clients are created then. Thread-safe; close it (or use it as a context manager) to
    release the producer and consumer. Pickles by configuration, never by live clients.
    """

    def __init__(
        self,
        settings: KafkaSettings,
        topic: str,
        *,
        table: str | None = None,
        create: bool = True,
        transactional_id: str | None = None,
        commit_timeout: float = 5.0,
    ) -> None:
        if not topic or not topic.strip():
            raise ConfigError("the snapshot store topic name is empty")
        if table is not None and not table.strip():
            raise ConfigError("the snapshot store table name is empty")
        self.settings = settings
        self.topic = topic
        self.table = table
        self.create = create
        self.transactional_id = transactional_id or f"statesnap-snapshots.{topic}"
        self.commit_timeout = commit_timeout
        self._lock = threading.RLock()
        self._consumer: Any = None
        self._producer: Any = None
        self._closed = False
        # Writer tokens of calls in progress, and the ones whose record the chain accepted.
        self._pending: set[str] = set()
        self._landed: dict[str, Snapshot | None] = {}
        #: What ``current(block=False)`` answers: replaced (never mutated) after every read.
        self._current: Snapshot = EMPTY
        self._reset_chain()

    # --- the chain ----------------------------------------------------------------------------

    def _reset_chain(self) -> None:
        self._position = 0  # next offset to read
        self._first_offset: int | None = None  # lowest offset seen: older records are gone
        self._head = -1  # offset of the last accepted record of our table
        self._snapshots: dict[int, Snapshot] = {}

    def _newest(self) -> Snapshot:
        return self._snapshots[max(self._snapshots)] if self._snapshots else EMPTY

    def _where(self) -> str:
        table = "" if self.table is None else f" (table {self.table!r})"
        return f"snapshot topic {self.topic!r}{table}"

    def _apply(self, offset: int, value: bytes | None) -> None:
        if offset < self._position:
            self._rewound(offset)
        self._position = offset + 1
        if self._first_offset is None:
            self._first_offset = offset
        rec = decode_record(self.topic, offset, value)
        if rec is None or rec.table != self.table:
            return
        if rec.prev != self._head:
            if self._head < 0 and 0 <= rec.prev < self._first_offset:
                raise CorruptCheckpointError(
                    f"{self._where()} lost its oldest records: offset {offset} follows offset "
                    f"{rec.prev}, but the topic starts at {self._first_offset}. Snapshot topics "
                    "need retention.ms=-1 and no compaction."
                )
            log.debug(
                "%s: ignoring offset %d (generation %d): it follows offset %d, the chain is at %d",
                self._where(),
                offset,
                rec.generation,
                rec.prev,
                self._head,
            )
            return
        self._head = offset
        if rec.op == "put" and rec.snapshot is not None:
            self._snapshots[rec.generation] = rec.snapshot
        else:
            self._snapshots.pop(rec.generation, None)
        if rec.writer in self._pending:
            self._landed[rec.writer] = rec.snapshot

    def _rewound(self, offset: int) -> None:
        log.warning(
            "%s restarts at offset %d, below the %d already read (deleted and re-created?); "
            "re-reading it from the beginning",
            self._where(),
            offset,
            self._position,
        )
        self._reset_chain()

    # --- Kafka clients ------------------------------------------------------------------------

    def _ensure_started(self) -> None:
        if self._closed:
            raise SnapshotError(f"{self._where()}: the store is closed")
        if self._consumer is not None:
            return
        check_store_topic(self.settings, self.topic, create=self.create)
        self._consumer = store_consumer(self.settings, self.topic)

    def _ensure_producer(self) -> Any:
        """This store's transactional producer; a new one fences every older writer of the topic."""
        if self._producer is None:
            self._producer = store_producer(self.settings, self.transactional_id, self._where())
        return self._producer

    def _drop_producer(self) -> None:
        # No close(): it would try to abort, and a fenced or stuck producer cannot. The next
        # producer's init_transactions settles whatever this one left open.
        self._producer = None

    # --- reading ------------------------------------------------------------------------------

    def _assign(self, offset: int) -> None:
        """(Re)start fetching partition 0 at *offset*; a new assignment reports its own EOF."""
        try:
            self._consumer.unassign()  # assign() alone may keep a partition's old fetch state
            self._consumer.assign([TopicPartition(self.topic, 0, offset)])
        except KafkaException as e:
            raise KafkaError(f"cannot read {self._where()}: {e}") from e

    def _sync(self, until: int | None = None) -> None:
        """Read the topic to its end (partition EOF); with *until*, only until past that offset.

        The consumer is assigned only while reading, so each call fetches afresh from the broker
        and an idle store sends no fetches.
        """
        consumer = self._consumer
        self._assign(self._position)
        deadline = time.monotonic() + self.settings.timeout
        last_error = "no answer"
        eof_at: int | None = None
        rebuilt = False
        heard = time.monotonic()
        try:
            while until is None or self._position <= until:
                if time.monotonic() > deadline:
                    seen = "no end of partition seen" if eof_at is None else f"end of partition at {eof_at}"
                    want = "" if until is None else f", waiting for offset {until}"
                    raise BrokerUnavailableError(
                        f"could not read {self._where()} to its end from {self.settings.bootstrap_servers} "
                        f"within {self.settings.timeout:g}s (read up to offset {self._position}, {seen}"
                        f"{want}): {last_error}"
                    )
                try:
                    msg = consumer.poll(_POLL_S)
                except KafkaException as e:
                    if e.args and is_fatal(e.args[0]):
                        raise fatal_error(
                            e.args[0], f"reading {self._where()}", self.settings.bootstrap_servers
                        ) from e
                    raise KafkaError(f"reading {self._where()}: {e}") from e
                if msg is None:
                    if time.monotonic() - heard > _STALL_S:
                        log.info(
                            "%s: no answer for %gs at offset %d; restarting the fetch",
                            self._where(),
                            _STALL_S,
                            self._position,
                        )
                        self._assign(self._position)
                        heard = time.monotonic()
                    continue
                heard = time.monotonic()
                err = msg.error()
                if err is None:
                    self._apply(msg.offset(), msg.value())
                elif err.code() == RdKafkaError._PARTITION_EOF:
                    eof_at = msg.offset()
                    if msg.offset() < self._position and not rebuilt:
                        self._rewound(msg.offset())
                        rebuilt = True
                        self._assign(0)
                    elif until is None:
                        break
                    # else: our own record is not fetchable yet; keep reading
                elif is_fatal(err):  # by flag or by code: this consumer reads nothing more
                    raise fatal_error(err, f"reading {self._where()}", self.settings.bootstrap_servers)
                else:
                    last_error = err.str()
                    log.debug("reading %s: %s", self._where(), last_error)
        finally:
            try:
                consumer.unassign()
            except KafkaException as e:
                log.debug("unassign %s: %s", self._where(), e)
            self._current = self._newest()

    # --- writing ------------------------------------------------------------------------------

    def _transact(self, plan: Callable[[], Write | Snapshot]) -> Snapshot | None:
        """Append what *plan* computes from the current chain, exactly once (see the module doc).

        *plan* returns a :class:`Write`, or a snapshot to return without writing anything. It
        may run several times (once per lost race) and may raise to abandon the update.
        """
        token = uuid.uuid4().hex
        with self._lock:
            self._ensure_started()
            self._pending.add(token)
            try:
                for attempt in range(MAX_ATTEMPTS):
                    producer = self._ensure_producer()
                    self._sync()
                    if token in self._landed:
                        log.info("%s: an earlier attempt of this update landed after all", self._where())
                        return self._landed[token]
                    step = plan()
                    if isinstance(step, Snapshot):
                        return step
                    offset = self._write(producer, step, token)
                    if offset is not None:
                        self._sync(until=offset if offset >= 0 else None)
                        if token in self._landed:
                            return self._landed[token]
                        log.debug("%s: lost a race at offset %d; retrying", self._where(), offset)
                    time.sleep(random.uniform(0, min(_BACKOFF_MAX_S, _BACKOFF_S * 2**attempt)))
                # Settle the last attempt before giving up: a new producer fences it, and its
                # record, if visible at all, is visible now and either in the chain or never.
                self._drop_producer()
                self._ensure_producer()
                self._sync()
                if token in self._landed:
                    return self._landed[token]
                raise GenerationConflictError(
                    f"could not update {self._where()} after {MAX_ATTEMPTS} attempts; nothing was written"
                )
            finally:
                self._pending.discard(token)
                self._landed.pop(token, None)

    def _write(self, producer: Any, write: Write, token: str) -> int | None:
        """Produce one record in one transaction: its offset (-1 if committed but not reported),
        or None when the transaction failed and the next attempt must settle the outcome."""
        value = encode_record(self.table, write, prev=self._head, writer=token)
        delivered: list[int] = []

        def on_delivery(err: Any, msg: Any) -> None:
            if err is None:
                delivered.append(msg.offset())

        try:
            producer.begin_transaction()
            producer.produce(
                self.topic,
                value=value,
                key=record_key(self.table, write.generation),
                partition=0,
                on_delivery=on_delivery,
            )
            producer.commit_transaction(self.commit_timeout)
        except KafkaException as e:
            self._recover(e)
            return None
        producer.poll(0)
        return delivered[-1] if delivered else -1

    def _recover(self, e: KafkaException) -> None:
        """After a failed transaction: keep or drop the producer; raise if retrying is futile."""
        usable = False
        try:
            usable = aborted_for_retry(self._producer, e, where=self._where(), timeout=self.commit_timeout)
        finally:
            if not usable:
                self._drop_producer()

    # --- the SnapshotStore protocol -----------------------------------------------------------

    def current(self, block: bool = True) -> Snapshot:
        """The newest generation (``EMPTY`` before any). ``block=False`` answers from this
        instance's last read, without a broker round trip and without waiting for a lock."""
        if not block:
            return self._current
        with self._lock:
            self._ensure_started()
            self._sync()
            return self._current

    def list(self) -> builtins.list[Snapshot]:
        with self._lock:
            self._ensure_started()
            self._sync()
            return [self._snapshots[g] for g in sorted(self._snapshots, reverse=True) if g > 0]

    def get(self, generation: int) -> Snapshot:
        if generation == 0:
            return EMPTY
        with self._lock:
            self._ensure_started()
            self._sync()
            found = self._snapshots.get(generation)
        if found is None:
            raise SnapshotNotFoundError(f"no snapshot generation {generation} in {self._where()}")
        return found

    def update_current(self, fn: Update) -> Snapshot:
        def plan() -> Write | Snapshot:
            current = self._newest()
            new = fn(current)
            if new is None:
                return current
            check_successor(current, new)
            if new.generation <= 0:
                raise GenerationConflictError("generation 0 is the empty snapshot; it is never written")
            version = current.version + 1 if new.generation == current.generation else 0
            return Write("put", new.generation, replace(new, version=version))

        return self._expect(self._transact(plan))

    def update(self, generation: int, fn: Update) -> Snapshot:
        def plan() -> Write | Snapshot:
            current = self._snapshots.get(generation)
            if current is None:
                raise SnapshotNotFoundError(f"no snapshot generation {generation} in {self._where()}")
            new = fn(current)
            if new is None:
                return current
            if new.generation != generation:
                raise GenerationConflictError("update() cannot change a record's generation")
            return Write("put", generation, replace(new, version=current.version + 1))

        return self._expect(self._transact(plan))

    def delete(self, generation: int) -> None:
        def plan() -> Write | Snapshot:
            if generation not in self._snapshots:
                raise SnapshotNotFoundError(f"no snapshot generation {generation} in {self._where()}")
            return Write("delete", generation)

        self._transact(plan)

    def _expect(self, result: Snapshot | None) -> Snapshot:
        if result is None:  # a put always lands with its snapshot
            raise SnapshotError(f"{self._where()}: an update landed without a snapshot")
        return result

    # --- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Release the consumer and producer (idempotent). ``current(block=False)`` still answers."""
        with self._lock:
            self._closed = True
            consumer, self._consumer = self._consumer, None
            self._drop_producer()
            if consumer is not None:
                try:
                    consumer.close()
                except (KafkaException, RuntimeError) as e:
                    log.debug("closing the consumer of %s: %s", self._where(), e)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, ...]:
        """By configuration (a new instance opens its own clients), never by live clients."""
        reopen = partial(
            TopicSnapshotStore,
            self.settings,
            self.topic,
            table=self.table,
            create=self.create,
            transactional_id=self.transactional_id,
            commit_timeout=self.commit_timeout,
        )
        return (reopen, ())

    def __repr__(self) -> str:
        return (
            f"TopicSnapshotStore(topic={self.topic!r}, table={self.table!r}, "
            f"bootstrap_servers={self.settings.bootstrap_servers!r})"
        )
