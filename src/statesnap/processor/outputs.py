"""Records a processor emits: held per record until its handlers return, then produced; flushed
at every commit point before a checkpoint may claim the inputs that produced them.

At least once by default: a crash after a record's outputs were sent and before the checkpoint
that covers its input sends them again when the tail is re-processed. With a transactional
producer (``ProcessingOptions(exactly_once=True)``) the outputs of a commit interval and the
group's offsets commit together; records re-processed from the checkpoint up to those offsets emit nothing.

Records that were not delivered stop the processor (:class:`OutputError`, kept as
:attr:`Outputs.failure`): a later commit point would let a checkpoint claim the inputs whose
outputs were lost. Every wait for deliveries is bounded by the task's ``timeout`` (``--timeout``),
and a topic the cluster does not have (and will not create) is refused the first time a record is
emitted to it (:class:`TopicNotFoundError` naming it), instead of librdkafka's failure of the
record after ``topic.metadata.propagation.max.ms`` (30 s).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError as RdKafkaError
from confluent_kafka import KafkaException

from statesnap.errors import FatalClientError, OutputError, TopicNotFoundError
from statesnap.kafka.clients import new_producer
from statesnap.kafka.config import KafkaSettings
from statesnap.kafka.fatal import FatalErrors, FatalLogLines
from statesnap.serde import Serde

__all__ = ["Outputs"]

log = logging.getLogger(__name__)

#: One emitted record, serialized: (topic, key, value, headers, timestamp).
_Emitted = tuple[str, bytes | None, bytes | None, list[tuple[str, bytes]] | None, int]
#: A metadata answer for a topic the cluster does not have.
_NO_TOPIC = frozenset({int(RdKafkaError.UNKNOWN_TOPIC_OR_PART), int(RdKafkaError._UNKNOWN_TOPIC)})


class Outputs:
    """The processor's producer and the records of the record being processed."""

    def __init__(
        self,
        settings: KafkaSettings,
        key_serde: Serde,
        value_serde: Serde,
        *,
        producer_config: Mapping[str, Any] | None = None,
    ) -> None:
        self.settings = settings
        self.key_serde = key_serde
        self.value_serde = value_serde
        self._config = dict(producer_config or {})
        self._producer: Any = None
        self.pending: list[_Emitted] = []
        #: Re-processing inputs for their state only: their outputs are already committed (an
        #: exactly-once restore, a Spark backfill without ``emit``). Not Kafka Streams'
        #: "suppress", which holds a window's results until it closes (``emit="final"``).
        self.state_only = False
        #: Per input partition, the offset below which outputs are already committed: records
        #: below it are re-processed for their state only (exactly-once restore; empty otherwise).
        self.replay_until: dict[int, int] = {}
        #: The same for the inputs after the first: per topic, per partition.
        self.replay_until_of: dict[str, dict[int, int]] = {}
        #: Records re-processed for their state only.
        self.state_only_records = 0
        #: Set when outputs can no longer be delivered or committed: the processor must stop.
        self.failure: OutputError | FatalClientError | None = None
        self.emitted = 0
        self._failure: str | None = None
        #: Topics the cluster said it has (asked once each, at the first record emitted there).
        self._known: set[str] = set()
        #: What a topic is to the processor, in errors: "output" unless said otherwise.
        self._roles: dict[str, str] = {}
        #: A fatal error librdkafka reported to the producer's error_cb (during produce, poll or
        #: flush): the outputs fail with it.
        self.fatal = FatalErrors("producing a processor's outputs", settings.bootstrap_servers)

    @property
    def producer(self) -> Any:
        if self._producer is None:
            self._producer = self._new_producer(
                **{"linger.ms": 5, "enable.idempotence": True, **self._config}
            )
        return self._producer

    def _new_producer(self, **config: Any) -> Any:
        conf = self.settings.producer_config(**config)
        user_cb = conf.get("error_cb")

        def on_error(err: Any) -> None:
            self.fatal.note(err)
            if callable(user_cb):
                user_cb(err)

        return new_producer(self.settings, **config, error_cb=on_error, **FatalLogLines.around(conf))

    def require_topic(self, topic: str, role: str) -> None:
        """Refuse *topic* now, before any record is processed, if the cluster does not have it
        (:class:`TopicNotFoundError` naming it as *role*): a dead-letter topic is written only when
        a handler fails, which may be hours into a run."""
        self._roles.setdefault(topic, role)
        if topic not in self._known:
            self._check_topic(self.producer, topic)

    def _check_topic(self, producer: Any, topic: str) -> None:
        """Refuse *topic* at once if the cluster does not have it: asked by name, so a broker that
        creates topics on use creates it here as a produce would; one that does not answers
        UNKNOWN_TOPIC_OR_PART. No answer within the timeout: the delivery wait judges."""
        try:
            meta = producer.list_topics(topic, timeout=self.settings.timeout)
        except KafkaException:
            return
        described = meta.topics.get(topic)
        error = None if described is None else described.error
        if described is None or (error is not None and int(error.code()) in _NO_TOPIC):
            raise TopicNotFoundError(
                f"{self._roles.get(topic, 'output')} topic {topic!r} does not exist on "
                f"{self.settings.bootstrap_servers} (and the cluster does not create topics on use): "
                "create it, or fix the name"
            )
        if error is None:
            self._known.add(topic)

    def emit(
        self,
        topic: str,
        key: Any,
        value: Any,
        headers: Mapping[str, bytes] | None,
        timestamp: int,
        value_serde: Serde | None = None,
    ) -> None:
        encode = (self.value_serde if value_serde is None else value_serde).serialize
        self.pending.append(
            (
                topic,
                None if key is None else self.key_serde.serialize(key),
                None if value is None else encode(value),
                list(headers.items()) if headers else None,
                timestamp,
            )
        )

    def reject(self) -> None:
        self.pending.clear()

    def accept(self) -> None:
        """The record's handlers returned: send what they emitted (unless for state only)."""
        if not self.pending:
            return
        if self.state_only:
            self.pending.clear()
            return
        producer = self.producer
        for topic, key, value, headers, ts in self.pending:
            self._produce(producer, topic, key, value, headers, ts)
        self.emitted += len(self.pending)
        self.pending.clear()

    def send_raw(
        self, topic: str, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]], ts: int
    ) -> None:
        """Produce already-serialized bytes (the dead-letter topic's copy of an input record)."""
        if not self.state_only:
            self._roles.setdefault(topic, "dead-letter")
            self._produce(self.producer, topic, key, value, headers, ts)

    def _produce(
        self,
        producer: Any,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]] | None,
        ts: int,
    ) -> None:
        kwargs: dict[str, Any] = {"on_delivery": self._delivered}
        if headers:
            kwargs["headers"] = headers
        if ts >= 0:
            kwargs["timestamp"] = ts
        if topic not in self._known:
            self._check_topic(producer, topic)
        while True:
            try:
                producer.produce(topic, value, key, **kwargs)
                return
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.05)

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None and self._failure is None:
            self._failure = f"{msg.topic()}: {err.str() if hasattr(err, 'str') else err}"

    def flush(self, timeout: float) -> None:
        """Wait until every emitted record is delivered; :class:`OutputError` if one failed or
        *timeout* (seconds; never more than the task's ``timeout``) passed first. Either stops
        the processor: the outputs stay failed (:attr:`failure`)."""
        if self._producer is None:
            return
        if self.failure is not None:
            raise self.failure
        timeout = min(timeout, self.settings.timeout)
        left = self._producer.flush(timeout)
        fatal = self.fatal.error
        if fatal is not None:  # the producer is done for: nothing more is delivered
            self.failure = fatal
            raise fatal
        if self._failure is not None:
            failure, self._failure = self._failure, None
            self.failure = self._undelivered(f"an emitted record was not delivered ({failure})")
            raise self.failure
        if left:
            self.failure = self._undelivered(
                f"{left} emitted record(s) not delivered within {timeout:.3g}s (the task's timeout) to "
                f"{self.settings.bootstrap_servers}"
            )
            raise self.failure

    def _undelivered(self, reason: str) -> OutputError:
        """The error of records that were not delivered, saying what happens next."""
        return OutputError(
            f"{reason}; the processor stopped (a restart re-processes from its checkpoint and sends "
            "them again)"
        )

    def due(self) -> bool:
        """Whether outputs must be committed before the next batch (a long-open transaction)."""
        return False

    def commit(
        self,
        positions: Mapping[int, int],
        timeout: float,
        others: Mapping[str, Mapping[int, int]] | None = None,
    ) -> None:
        """A commit point: at least once, every emitted record is delivered (*positions*, the
        first input's offsets applied so far, and *others*, the other inputs', matter only to
        exactly-once outputs)."""
        del positions, others
        self.flush(timeout)

    def close(self) -> None:
        if self._producer is not None:
            try:
                self._producer.flush(5.0)
            finally:
                self._producer = None
