"""Reading a changelog from given offsets, without a consumer group, until partition EOF.

"Caught up" is decided by librdkafka's partition-EOF event, not by the high watermark: the dev
broker under-reports watermarks, and EOF is also exact on Apache Kafka.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition
from confluent_kafka import KafkaError as RdKafkaError

from statesnap.errors import BrokerUnavailableError, KafkaError
from statesnap.kafka.config import KafkaSettings
from statesnap.stores.base import NO_TIMESTAMP, Record

log = logging.getLogger(__name__)

#: Records fetched per consume() call; large batches amortize the Python per-call cost.
BATCH_SIZE = 10_000
#: Without a short fetch wait, every end-of-data probe costs the broker's default (500 ms+).
FETCH_WAIT_MS = 10


class ChangelogReader:
    """Consumes *topic* from per-partition next offsets; never commits, never joins a group."""

    def __init__(self, settings: KafkaSettings, topic: str, offsets: Mapping[int, int]) -> None:
        self.settings = settings
        self.topic = topic
        self.positions: dict[int, int] = dict(offsets)
        self.at_eof: set[int] = set()
        self._consumer = Consumer(
            settings.client_config(
                **{
                    "group.id": f"statesnap-reader-{topic}",
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "enable.partition.eof": True,
                    "auto.offset.reset": "earliest",
                    "fetch.wait.max.ms": FETCH_WAIT_MS,
                    "fetch.max.bytes": 64 * 1024 * 1024,
                    "max.partition.fetch.bytes": 16 * 1024 * 1024,
                    "queued.max.messages.kbytes": 256 * 1024,
                    "isolation.level": "read_committed",
                }
            )
        )
        self._consumer.assign(
            [
                TopicPartition(topic, p, off if off > 0 else OFFSET_BEGINNING)
                for p, off in sorted(self.positions.items())
            ]
        )

    @property
    def caught_up(self) -> bool:
        return self.at_eof >= set(self.positions)

    def poll(self, timeout: float = 0.5) -> dict[int, list[Record]]:
        """The next batch of records grouped by partition, in offset order."""
        try:
            messages = self._consumer.consume(BATCH_SIZE, timeout)
        except KafkaException as e:
            raise KafkaError(f"consuming {self.topic!r}: {e}") from e
        batches: dict[int, list[Record]] = defaultdict(list)
        for msg in messages:
            err = msg.error()
            if err is not None:
                self._handle_error(err, msg)
                continue
            p = msg.partition()
            off = msg.offset()
            if off < self.positions.get(p, 0):
                continue  # re-delivered below our position after a reassign
            self.positions[p] = off + 1
            key = msg.key()
            if key is None:
                continue  # a table is keyed: like Kafka Streams, records without a key are skipped
            ts_type, ts = msg.timestamp()
            batches[p].append((key, msg.value(), off, ts if ts_type else NO_TIMESTAMP))
            self.at_eof.discard(p)
        return batches

    def _handle_error(self, err: Any, msg: Any) -> None:
        code = err.code()
        if code == RdKafkaError._PARTITION_EOF:
            self.at_eof.add(msg.partition())
            # EOF's offset is the end of the log; an empty partition's position stays where it is.
            return
        if code in (RdKafkaError._TRANSPORT, RdKafkaError._ALL_BROKERS_DOWN):
            if err.fatal() or code == RdKafkaError._ALL_BROKERS_DOWN:
                raise BrokerUnavailableError(
                    f"lost the Kafka cluster at {self.settings.bootstrap_servers}: {err.str()}"
                )
            log.warning("transient Kafka error on %s: %s", self.topic, err.str())
            return
        if err.fatal():
            raise KafkaError(f"fatal error consuming {self.topic!r}: {err.str()}")
        log.warning("Kafka error on %s: %s", self.topic, err.str())

    def close(self) -> None:
        self._consumer.close()
