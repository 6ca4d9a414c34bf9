"""Records a processor emits: held per record until its handlers return, then produced; flushed
at every commit point before a checkpoint may claim the inputs that produced them.

At least once by default: a crash after a record's outputs were sent and before the checkpoint
that covers its input sends them again when the tail is re-processed. With a transactional
producer (``exactly_once=True``) the outputs of a commit interval and the group's offsets commit
together; records re-processed from the checkpoint up to those offsets emit nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from statesnap.errors import OutputError
from statesnap.kafka.clients import new_producer
from statesnap.kafka.config import KafkaSettings
from statesnap.serde import Serde

__all__ = ["Outputs"]

log = logging.getLogger(__name__)

#: One emitted record, serialized: (topic, key, value, headers, timestamp).
_Emitted = tuple[str, bytes | None, bytes | None, list[tuple[str, bytes]] | None, int]


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
        #: Re-processing inputs whose outputs are already committed (exactly-once restore).
        self.suppressed = False
        #: Per input partition, the offset below which outputs are already committed: records
        #: below it are re-processed for their state only (exactly-once restore; empty otherwise).
        self.replay_until: dict[int, int] = {}
        #: The same for the inputs after the first: per topic, per partition.
        self.replay_until_of: dict[str, dict[int, int]] = {}
        #: Records re-processed with emission suppressed.
        self.suppressed_records = 0
        #: Set when outputs can no longer be committed (exactly-once): the processor must stop.
        self.failure: OutputError | None = None
        self.emitted = 0
        self._failure: str | None = None

    @property
    def producer(self) -> Any:
        if self._producer is None:
            self._producer = self._new_producer(
                **{"linger.ms": 5, "enable.idempotence": True, **self._config}
            )
        return self._producer

    def _new_producer(self, **config: Any) -> Any:
        return new_producer(self.settings, **config)

    def emit(
        self,
        topic: str,
        key: Any,
        value: Any,
        headers: Mapping[str, bytes] | None,
        timestamp: int,
    ) -> None:
        self.pending.append(
            (
                topic,
                None if key is None else self.key_serde.serialize(key),
                None if value is None else self.value_serde.serialize(value),
                list(headers.items()) if headers else None,
                timestamp,
            )
        )

    def reject(self) -> None:
        self.pending.clear()

    def accept(self) -> None:
        """The record's handlers returned: send what they emitted (unless suppressed)."""
        if not self.pending:
            return
        if self.suppressed:
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
        if not self.suppressed:
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
        *timeout* (seconds) passed first."""
        if self._producer is None:
            return
        deadline = time.monotonic() + timeout
        left = self._producer.flush(max(0.0, deadline - time.monotonic()))
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise OutputError(f"an emitted record was not delivered ({failure})")
        if left:
            raise OutputError(
                f"{left} emitted record(s) not delivered within {timeout:.3g}s (is the broker reachable?)"
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
