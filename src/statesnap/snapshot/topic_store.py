"""``TopicSnapshotStore``: snapshot records in a single-partition Kafka topic, updated in transactions.

For deployments that would rather keep the snapshot table beside the data than beside the
checkpoints. Any thread or process may update the store; no update is lost.

Records
-------
One record per change, in partition 0 of the store topic (created if missing with one partition,
``cleanup.policy=delete`` and ``retention.ms=retention.bytes=-1``: snapshots expire by explicit
:meth:`TopicSnapshotStore.delete`, never by topic retention, and compaction would break the chain).

- key: ``<generation:020d>``, or ``<table>/<generation:020d>`` when the store has a ``table``
  (one topic may serve several tables; each table reads only its own records).
- value: a JSON envelope ``{"statesnap_record": "snapshot", "format_version": 1, "table",
  "op": "put" | "delete", "generation", "prev", "writer", "snapshot": <Snapshot.to_json()>}``.
  A delete is a record too (``op: "delete"``, no snapshot), so it can take part in the chain.

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
"""

from __future__ import annotations

import builtins
import json
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any, Literal, Self

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka import KafkaError as RdKafkaError

from statesnap.checkpoint.jsonfields import as_int, load_json
from statesnap.errors import (
    BrokerUnavailableError,
    ConfigError,
    CorruptCheckpointError,
    GenerationConflictError,
    KafkaError,
    SnapshotError,
    SnapshotNotFoundError,
    TopicNotFoundError,
)
from statesnap.kafka.admin import KafkaAdmin
from statesnap.kafka.config import KafkaSettings
from statesnap.snapshot.model import EMPTY, Snapshot
from statesnap.snapshot.store import MAX_ATTEMPTS, Update, check_successor

log = logging.getLogger(__name__)

RECORD_KIND = "snapshot"
#: Bumped on any change a reader of the previous version would misread.
FORMAT_VERSION = 1
#: A new store topic: one partition (one ordered chain), never compacted, never expired.
TOPIC_CONFIG = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}
#: Without a short fetch wait every "am I at the end?" probe costs the broker's default (500 ms+).
FETCH_WAIT_MS = 10
#: Our transactions last milliseconds; the coordinator aborts one a crashed writer left open after
#: this long (the next writer's init_transactions does so at once). Readers never wait for it.
TRANSACTION_TIMEOUT_MS = 15_000
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
_FENCED = frozenset({RdKafkaError._FENCED, RdKafkaError.PRODUCER_FENCED, RdKafkaError.INVALID_PRODUCER_EPOCH})

Op = Literal["put", "delete"]


class _ProducerLog:
    """librdkafka's log lines for the store's producer. Being fenced is how writers take turns
    here, yet librdkafka logs it as an error and a fatal error: those lines go to DEBUG."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def log(self, level: int, msg: str, *args: Any) -> None:
        if level > logging.DEBUG and any("fence" in str(a) for a in args):
            level = logging.DEBUG
        self.target.log(level, msg, *args)


@dataclass(frozen=True, slots=True)
class _Record:
    """One decoded store record."""

    offset: int
    table: str | None
    op: Op
    generation: int
    prev: int
    writer: str
    snapshot: Snapshot | None


@dataclass(frozen=True, slots=True)
class _Write:
    """What one attempt of an update wants to append."""

    op: Op
    generation: int
    snapshot: Snapshot | None = None


def record_key(table: str | None, generation: int) -> bytes:
    return (f"{generation:020d}" if table is None else f"{table}/{generation:020d}").encode()


def encode_record(table: str | None, write: _Write, *, prev: int, writer: str) -> bytes:
    obj: dict[str, Any] = {
        "statesnap_record": RECORD_KIND,
        "format_version": FORMAT_VERSION,
        "table": table,
        "op": write.op,
        "generation": write.generation,
        "prev": prev,
        "writer": writer,
    }
    if write.snapshot is not None:
        obj["snapshot"] = write.snapshot.to_json()
    return json.dumps(obj, separators=(",", ":")).encode()


def decode_record(topic: str, offset: int, value: bytes | None) -> _Record | None:
    """The record at *offset*; None for anything that is not a snapshot record (skipped)."""
    if value is None:
        return None
    try:
        obj = load_json(value, source=f"offset {offset} of snapshot topic {topic!r}")
    except CorruptCheckpointError:  # not JSON, or hostile JSON: not a record of ours
        obj = None
    if not isinstance(obj, dict) or obj.get("statesnap_record") != RECORD_KIND:
        log.warning("skipping offset %d of snapshot topic %r: not a snapshot record", offset, topic)
        return None
    where = f"snapshot record at offset {offset} of topic {topic!r}"
    version = obj.get("format_version")
    if version != FORMAT_VERSION:
        raise CorruptCheckpointError(
            f"{where} has format version {version!r}; this statesnap reads version {FORMAT_VERSION} "
            "(was it written by a newer statesnap?)"
        )
    try:
        op = obj["op"]
        if op not in ("put", "delete"):
            raise ValueError(f"unknown op {op!r}")
        table = obj.get("table")
        return _Record(
            offset=offset,
            table=None if table is None else str(table),
            op=op,
            generation=as_int(obj["generation"], "generation"),
            prev=as_int(obj["prev"], "prev", lo=-1),
            writer=str(obj["writer"]),
            snapshot=Snapshot.from_json(obj["snapshot"]) if op == "put" else None,
        )
    except (AttributeError, KeyError, TypeError, ValueError, CorruptCheckpointError) as e:
        raise CorruptCheckpointError(f"{where} is malformed: {e}") from e


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
        self._check_topic()
        self._consumer = Consumer(
            self.settings.client_config(
                **{
                    "group.id": f"statesnap-snapshots.{self.topic}",  # never joined: assign only
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "enable.partition.eof": True,
                    "auto.offset.reset": "earliest",
                    "fetch.wait.max.ms": FETCH_WAIT_MS,
                    # The chain, not transaction markers, decides what counts (module docstring).
                    "isolation.level": "read_uncommitted",
                }
            )
        )

    def _check_topic(self) -> None:
        admin = KafkaAdmin(self.settings)
        if self.create:
            admin.create_topic(self.topic, 1, config=TOPIC_CONFIG)
        deadline = time.monotonic() + self.settings.timeout
        while True:  # a new topic takes a moment to appear in metadata
            try:
                partitions = admin.partitions(self.topic)
                break
            except TopicNotFoundError:
                if not self.create or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        if partitions != (0,):
            raise ConfigError(
                f"snapshot topic {self.topic!r} has {len(partitions)} partitions; a snapshot store "
                "needs exactly one (its records form one ordered chain)"
            )
        configs = admin.topic_configs(self.topic)  # {} where the broker does not say
        if "compact" in configs.get("cleanup.policy", "delete"):
            raise ConfigError(
                f"snapshot topic {self.topic!r} is compacted; compaction removes records the chain "
                "refers to. Use a topic with cleanup.policy=delete and retention.ms=-1"
            )
        for name in ("retention.ms", "retention.bytes"):
            value = configs.get(name)
            if value is not None and int(value) >= 0:
                raise ConfigError(
                    f"snapshot topic {self.topic!r} has {name}={value}; the store needs every record "
                    f"forever (snapshots expire by explicit delete). Set {name}=-1 on the topic"
                )

    def _ensure_producer(self) -> Any:
        """This store's transactional producer; a new one fences every older writer of the topic."""
        if self._producer is None:
            producer = Producer(
                self.settings.client_config(
                    **{
                        "transactional.id": self.transactional_id,
                        "enable.idempotence": True,
                        "acks": "all",
                        "linger.ms": 0,
                        "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
                        "logger": _ProducerLog(self.settings.client_config().get("logger", log)),
                    }
                )
            )
            try:
                producer.init_transactions(self.settings.timeout)
            except KafkaException as e:
                err = e.args[0]
                if err.code() == RdKafkaError._TIMED_OUT or err.retriable():
                    raise BrokerUnavailableError(
                        f"no transaction coordinator answered at {self.settings.bootstrap_servers} "
                        f"within {self.settings.timeout:g}s for {self._where()}: {err.str()}"
                    ) from e
                raise KafkaError(
                    f"cannot start transactions as {self.transactional_id!r} for {self._where()}: {err.str()}"
                ) from e
            self._producer = producer
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
                elif err.fatal():
                    raise KafkaError(f"fatal error reading {self._where()}: {err.str()}")
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

    def _transact(self, plan: Callable[[], _Write | Snapshot]) -> Snapshot | None:
        """Append what *plan* computes from the current chain, exactly once (see the module doc).

        *plan* returns a :class:`_Write`, or a snapshot to return without writing anything. It
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

    def _write(self, producer: Any, write: _Write, token: str) -> int | None:
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
        """After a failed transaction: keep, reset or drop the producer; raise if retrying is futile."""
        err = e.args[0] if e.args and isinstance(e.args[0], RdKafkaError) else None
        if err is None:
            self._drop_producer()
            raise KafkaError(f"writing to {self._where()}: {e}") from e
        if err.code() in _FENCED:
            log.debug("%s: fenced by another writer; retrying", self._where())
            self._drop_producer()
        elif err.txn_requires_abort():
            log.debug("%s: transaction aborted (%s); retrying", self._where(), err.str())
            try:
                self._producer.abort_transaction(self.commit_timeout)
            except KafkaException:
                self._drop_producer()
        elif err.retriable():
            log.info("%s: commit outcome unknown (%s); re-reading to settle it", self._where(), err.str())
            self._drop_producer()
        else:
            self._drop_producer()
            raise KafkaError(f"writing to {self._where()}: {err.str()}") from e

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
        def plan() -> _Write | Snapshot:
            current = self._newest()
            new = fn(current)
            if new is None:
                return current
            check_successor(current, new)
            if new.generation <= 0:
                raise GenerationConflictError("generation 0 is the empty snapshot; it is never written")
            version = current.version + 1 if new.generation == current.generation else 0
            return _Write("put", new.generation, replace(new, version=version))

        return self._expect(self._transact(plan))

    def update(self, generation: int, fn: Update) -> Snapshot:
        def plan() -> _Write | Snapshot:
            current = self._snapshots.get(generation)
            if current is None:
                raise SnapshotNotFoundError(f"no snapshot generation {generation} in {self._where()}")
            new = fn(current)
            if new is None:
                return current
            if new.generation != generation:
                raise GenerationConflictError("update() cannot change a record's generation")
            return _Write("put", generation, replace(new, version=current.version + 1))

        return self._expect(self._transact(plan))

    def delete(self, generation: int) -> None:
        def plan() -> _Write | Snapshot:
            if generation not in self._snapshots:
                raise SnapshotNotFoundError(f"no snapshot generation {generation} in {self._where()}")
            return _Write("delete", generation)

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
        return (
            _reopen,
            (self.settings, self.topic, self.table, self.create, self.transactional_id, self.commit_timeout),
        )

    def __repr__(self) -> str:
        return (
            f"TopicSnapshotStore(topic={self.topic!r}, table={self.table!r}, "
            f"bootstrap_servers={self.settings.bootstrap_servers!r})"
        )


def _reopen(
    settings: KafkaSettings,
    topic: str,
    table: str | None,
    create: bool,
    transactional_id: str,
    commit_timeout: float,
) -> TopicSnapshotStore:
    return TopicSnapshotStore(
        settings,
        topic,
        table=table,
        create=create,
        transactional_id=transactional_id,
        commit_timeout=commit_timeout,
    )
