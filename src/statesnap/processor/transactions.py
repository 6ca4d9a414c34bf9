"""Exactly-once outputs: a processor's emitted records and its input offsets in one Kafka transaction.

Per commit point (:meth:`TransactionalOutputs.commit`), in this order: flush the records emitted
since the last one, add the input positions to the transaction as the offsets of the processor's
consumer group, commit the transaction. Only then may a checkpoint claim those positions, so a
checkpoint's offsets C never pass the group's committed offsets K.

On start (:meth:`TransactionalOutputs.open`): ``init_transactions`` with the task's stable
``transactional.id`` fences the previous incarnation (a zombie's open transaction is aborted),
then K is read with ``read_committed``. With several inputs, every input's offsets are in each
transaction and K is per input: a record is re-processed for its state only when it lies below
its own input's K. Records in [C, K) are re-processed for their state only:
their outputs are already committed (``Outputs.replay_until``). A transaction that fails to
commit is aborted and the processor stops (its state is past outputs that never committed);
a restart re-processes from the checkpoint.

In a consumer group (KIP-447) the offsets are the member's group's, sent with the member's group
metadata: the coordinator refuses them from a member a rebalance replaced (a zombie), so its
transaction aborts and it stops; the ``transactional.id`` is then per incarnation. Partitions are
handed over at their revocation by a commit point (the transaction commits, then the checkpoint),
and a member reads K of each partition it gains (:meth:`TransactionalOutputs.taken`): a previous
owner's last transaction is committed by then, or, if it died, aborted by the broker within
``transaction.timeout.ms`` (K stays unstable until then, and the gain waits).

Readers of the output topics must consume with ``isolation.level=read_committed``. The dev
broker (Tansu) shows aborted records to such readers: exactly-once needs a broker that
implements transactions (Apache Kafka).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any, NoReturn

from confluent_kafka import KafkaError as RdKafkaError
from confluent_kafka import KafkaException, TopicPartition

from statesnap.deadline import call_within
from statesnap.errors import FatalClientError, OutputError
from statesnap.kafka.clients import new_consumer
from statesnap.kafka.config import KafkaSettings
from statesnap.processor.outputs import Outputs
from statesnap.serde import Serde
from statesnap.task.lifecycle import release_locals

__all__ = ["TRANSACTION_TIMEOUT_MS", "TransactionalOutputs", "offsets_group_of", "transactional_id_of"]

log = logging.getLogger(__name__)

#: The broker aborts a transaction left open this long (a zombie that stopped mid-way).
TRANSACTION_TIMEOUT_MS = 60_000
#: A transaction open this long is committed between batches, even during catch-up (where no
#: commit point runs), well before the broker's timeout would abort it.
MAX_OPEN_SECONDS = 10.0


#: How long past its own timeout a transactional call of the producer may take before the
#: processor gives it up (see :meth:`TransactionalOutputs._bounded`).
STUCK_GRACE_SECONDS = 5.0
#: Answers of a group coordinator that is starting, moving or finishing a transaction: ask again.
_COORDINATOR_BUSY = frozenset(
    {
        RdKafkaError.NOT_COORDINATOR,
        RdKafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        RdKafkaError.COORDINATOR_NOT_AVAILABLE,
        RdKafkaError.UNSTABLE_OFFSET_COMMIT,
    }
)


def offsets_group_of(processor: str) -> str:
    """The consumer group whose committed offsets mark a processor's committed outputs."""
    return f"statesnap-{processor}"


def transactional_id_of(processor: str, task_id: str, partitions: tuple[int, ...] | None) -> str:
    """Stable per task: the same processor task, restarted, gets the same id and so fences its
    previous incarnation; two tasks owning different partitions never fence each other."""
    owned = "" if partitions is None else "-p" + "-".join(map(str, partitions))
    return f"statesnap-{processor}-{task_id}{owned}"


def _error_of(e: KafkaException) -> Any:
    return e.args[0] if e.args else None


def _said(err: Any) -> str:
    """librdkafka's words for *err* (not the ``KafkaError{FATAL,code=…}`` repr)."""
    text = getattr(err, "str", None)
    return str(text()) if callable(text) else str(err)


def _system_error(e: SystemError) -> Any:
    """What a SystemError from the producer says: a fatal producer (fenced) may run a pending
    delivery callback while its own exception is set ("returned a result with an exception set":
    the Kafka error is its cause), or return NULL with no exception set at all (its own text,
    then; the abort that follows names the producer's fatal error, e.g. fenced)."""
    cause: BaseException | None = e
    while cause is not None:
        if isinstance(cause, KafkaException):
            return _error_of(cause)
        cause = cause.__cause__ or cause.__context__
    return e


class TransactionalOutputs(Outputs):
    """Outputs in one transaction per commit point, with the input offsets."""

    def __init__(
        self,
        settings: KafkaSettings,
        key_serde: Serde,
        value_serde: Serde,
        *,
        topic: str,
        group_id: str,
        producer_config: Mapping[str, Any] | None = None,
        others: tuple[str, ...] = (),
    ) -> None:
        """*topic*: the first input; *others*: the other inputs, whose offsets go in every
        transaction too."""
        super().__init__(settings, key_serde, value_serde, producer_config=producer_config)
        self.topic = topic
        self.others = others
        #: The other inputs' offsets last committed, per topic (never move back).
        self._committed_of: dict[str, dict[int, int]] = {t: {} for t in others}
        self.group_id = group_id
        self.transactional_id: str | None = None
        self._group: Any = None  # a consumer of the group, never subscribed: its metadata, offsets
        #: A consumer-group member's metadata (:meth:`GroupReader.group_metadata`), sent with the
        #: offsets so the coordinator fences a member a rebalance replaced; None: the unsubscribed
        #: consumer's (a static task, fenced by its stable ``transactional.id`` instead).
        self.group_metadata: Callable[[], Any] | None = None
        self._in_transaction = False
        self._began = 0.0
        #: Per partition the offset last committed (never moves back, even during a replay).
        self._committed: dict[int, int] = {}
        self.transactions = 0

    @property
    def producer(self) -> Any:
        if self._producer is None:
            if self.transactional_id is None:
                raise OutputError("exactly-once outputs used before open() gave them a transactional.id")
            self._producer = self._new_producer(
                **{
                    "linger.ms": 5,
                    "enable.idempotence": True,
                    "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
                    **self._config,
                    "transactional.id": self.transactional_id,
                }
            )
        return self._producer

    def open(self, transactional_id: str, timeout: float, *, grouped: bool = False) -> dict[int, int]:
        """Fence the task's previous incarnation, then read the group's committed offsets K of
        the input (read_committed: an open transaction's offsets are not K). Returns K; records
        below it emit nothing when re-processed. A consumer-group member (*grouped*) owns no
        partition yet: it reads K of each partition as the group gives it one (:meth:`taken`)."""
        self.transactional_id = transactional_id
        producer = self.producer
        try:
            producer.init_transactions(timeout)
        except KafkaException as e:
            raise OutputError(
                f"exactly-once outputs: init_transactions({transactional_id!r}) failed: "
                f"{_said(_error_of(e))} (does the broker implement transactions? is the cluster reachable?)"
            ) from None
        self._group = new_consumer(
            self.settings,
            **{"group.id": self.group_id, "isolation.level": "read_committed", "enable.auto.commit": False},
        )
        if grouped:
            return {}
        committed = self._read_committed(self.topic, timeout)
        self._committed = dict(committed)
        self.replay_until = dict(committed)
        for topic in self.others:
            self._committed_of[topic] = self._read_committed(topic, timeout)
            self.replay_until_of[topic] = dict(self._committed_of[topic])
        log.info(
            "exactly-once outputs %s: group %s committed %s; re-processing below emits nothing",
            transactional_id,
            self.group_id,
            committed or "nothing",
        )
        return committed

    def taken(self, partitions: Collection[int], timeout: float) -> None:
        """A consumer group gave this member *partitions*: their committed offsets K (the last
        transaction of whoever owned them before) say below which re-processed records emit
        nothing. A previous owner that died mid-transaction holds K unstable until the broker
        aborts that transaction (``transaction.timeout.ms``), so the wait allows for that."""
        timeout += TRANSACTION_TIMEOUT_MS / 1000
        for topic, committed, until in (
            (self.topic, self._committed, self.replay_until),
            *((t, self._committed_of[t], self.replay_until_of.setdefault(t, {})) for t in self.others),
        ):
            found = self._read_committed(topic, timeout, partitions)
            for p in partitions:
                committed.pop(p, None)
                until.pop(p, None)
            committed.update(found)
            until.update(found)
        log.info(
            "exactly-once outputs %s: group %s gave partitions %s, committed %s",
            self.transactional_id,
            self.group_id,
            sorted(partitions),
            {p: self._committed.get(p) for p in sorted(partitions)},
        )

    def _read_committed(
        self, topic: str, timeout: float, partitions: Collection[int] | None = None
    ) -> dict[int, int]:
        if partitions is None:
            meta = self._group.list_topics(topic, timeout=timeout)
            described = meta.topics.get(topic)
            if described is None or described.error is not None:
                return {}
            partitions = described.partitions
        wanted = [TopicPartition(topic, p) for p in sorted(partitions)]
        deadline = time.monotonic() + timeout
        while True:  # a coordinator still loading (or moving) answers with a retriable error
            try:
                got = self._group.committed(wanted, timeout=max(0.1, deadline - time.monotonic()))
                break
            except KafkaException as e:
                error = _error_of(e)
                again = error is not None and (error.retriable() or error.code() in _COORDINATOR_BUSY)
                if not again or time.monotonic() >= deadline:
                    raise OutputError(
                        f"exactly-once outputs: reading group {self.group_id!r}'s committed offsets "
                        f"failed: {_said(error)}"
                    ) from None
                time.sleep(0.1)
        return {tp.partition: tp.offset for tp in got if tp.error is None and tp.offset >= 0}

    def _produce(
        self,
        producer: Any,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]] | None,
        ts: int,
    ) -> None:
        if self.failure is not None:
            raise self.failure
        if not self._in_transaction:
            self._begin(producer)
        try:
            super()._produce(producer, topic, key, value, headers, ts)
        except KafkaException as e:  # fatal, most often: fenced by a newer instance of this task
            self._abort(f"producing to {topic} failed: {_said(_error_of(e))}")
        except SystemError as e:
            self._abort(f"producing to {topic} failed: {_said(_system_error(e))}")

    def _undelivered(self, reason: str) -> OutputError:
        """Records not delivered: the commit point aborts the transaction and says what follows."""
        return OutputError(reason)

    def _begin(self, producer: Any) -> None:
        try:
            producer.begin_transaction()
        except KafkaException as e:
            self._fail(f"begin_transaction failed: {_said(_error_of(e))}")
        self._in_transaction = True
        self._began = time.monotonic()

    def due(self) -> bool:
        return self._in_transaction and time.monotonic() - self._began > MAX_OPEN_SECONDS

    def commit(
        self,
        positions: Mapping[int, int],
        timeout: float,
        others: Mapping[str, Mapping[int, int]] | None = None,
    ) -> None:
        """Flush, add *positions* (next offsets to consume) and *others* (the other inputs',
        per topic) as the group's offsets, commit. Nothing to do when nothing was emitted and no
        position moved. A failure aborts the transaction and raises :class:`OutputError`; the
        outputs then stay failed."""
        if self.failure is not None:
            raise self.failure
        offsets = {p: max(int(o), self._committed.get(p, 0)) for p, o in positions.items()}
        other_offsets = {
            topic: {p: max(int(o), self._committed_of[topic].get(p, 0)) for p, o in moved.items()}
            for topic, moved in (others or {}).items()
            if topic in self._committed_of
        }
        if (
            not self._in_transaction
            and all(self._committed.get(p) == o for p, o in offsets.items())
            and all(
                self._committed_of[t].get(p) == o
                for t, moved in other_offsets.items()
                for p, o in moved.items()
            )
        ):
            return
        producer = self.producer
        if not self._in_transaction:
            self._begin(producer)
        deadline = time.monotonic() + timeout
        try:
            self.flush(timeout)
        except (OutputError, FatalClientError) as e:
            self._abort(str(e))
        except SystemError as e:
            self._abort(f"flush failed: {_said(_system_error(e))}")
        tps = [TopicPartition(self.topic, p, o) for p, o in sorted(offsets.items())]
        tps += [
            TopicPartition(t, p, o) for t, moved in other_offsets.items() for p, o in sorted(moved.items())
        ]
        try:
            metadata = (
                self._group.consumer_group_metadata()
                if self.group_metadata is None
                else self.group_metadata()
            )
            self._bounded(
                "send_offsets_to_transaction",
                deadline,
                lambda left: producer.send_offsets_to_transaction(tps, metadata, left),
            )
            while True:
                try:
                    self._bounded("commit_transaction", deadline, producer.commit_transaction)
                    break
                except KafkaException as e:
                    error = _error_of(e)
                    if error is None or not error.retriable() or time.monotonic() >= deadline:
                        raise
        except KafkaException as e:
            self._abort(f"commit failed: {_said(_error_of(e))}")
        self._in_transaction = False
        self._committed.update(offsets)
        for topic, moved in other_offsets.items():
            self._committed_of[topic].update(moved)
        self.transactions += 1

    def _bounded(self, call: str, deadline: float, fn: Callable[[float], object]) -> None:
        """``fn(seconds left)``, a transactional call of the producer, given until *deadline*
        plus :data:`STUCK_GRACE_SECONDS` to return. librdkafka 2.16 does not always honour the
        timeout: with the node coordinating the offsets group SIGKILLed, send_offsets_to_transaction
        blocked for minutes. Past the grace the processor stops with a typed error instead of
        looking alive: the call is left to its thread, the producer is given up without an abort
        (one would conflict with the call in progress; the broker aborts the transaction within
        ``transaction.timeout.ms``, or the task's next incarnation fences it), and a restart
        re-processes from the checkpoint."""
        left = max(0.0, deadline - time.monotonic())

        def stuck() -> OutputError:
            self._in_transaction = False
            self._producer = None
            return self._failed(
                f"{call} did not return within {left + STUCK_GRACE_SECONDS:.0f} s (is the node "
                "coordinating the transaction or the offsets group down?); the broker aborts the "
                "transaction"
            )

        call_within(left + STUCK_GRACE_SECONDS, lambda _abandoned: fn(left), stuck, f"statesnap-{call}")

    def _abort(self, reason: str) -> NoReturn:
        """Abort the open transaction (its records never reach read_committed readers) and fail.
        A producer in a fatal state cannot abort (the broker aborts it: by timeout, or when the
        task's next incarnation fences it); its own error says why, e.g. fenced."""
        self._in_transaction = False
        producer = self._producer
        if producer is None:  # closed meanwhile (close() from another thread dropped it)
            self._fail(f"{reason}; the outputs were closed meanwhile: the broker aborts the transaction")
        try:
            producer.abort_transaction(10.0)
        except KafkaException as e:
            said = _said(_error_of(e))
            why = "" if said in reason else f" ({said})"  # a fatal producer says the same again
            self._fail(f"{reason}; the transaction could not be aborted{why}: the broker aborts it")
        self._fail(f"{reason}; the transaction was aborted")

    def _failed(self, reason: str) -> OutputError:
        """The outputs' failure, kept: every later use raises it."""
        self.failure = OutputError(
            f"exactly-once outputs {self.transactional_id!r}: {reason}; the processor stops (a restart "
            "re-processes from its checkpoint)"
        )
        return self.failure

    def _fail(self, reason: str) -> NoReturn:
        raise self._failed(reason)

    def close(self) -> None:
        """Abort what no commit point committed (a restart re-processes those records), close."""
        producer, self._producer = self._producer, None
        try:
            if producer is not None and self._in_transaction:
                self._in_transaction = False
                try:
                    producer.abort_transaction(10.0)
                except KafkaException as e:
                    log.warning(
                        "exactly-once outputs %s: abort at close: %s",
                        self.transactional_id,
                        _said(_error_of(e)),
                    )
        finally:
            if self._group is not None:
                self._group.close()
                self._group = None
            if self.failure is not None:
                release_locals(self.failure)  # their frames held the producer
