"""Cluster metadata the table needs: cluster id, partitions, log-start offsets, topic configs.

Every confluent-kafka error is translated here, so callers only see statesnap's typed errors.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from confluent_kafka import KafkaError as RdKafkaError
from confluent_kafka import KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    ConfigResource,
    NewTopic,
    ResourceType,
)

from statesnap.deadline import Deadline
from statesnap.errors import BrokerUnavailableError, KafkaError, TopicNotFoundError
from statesnap.kafka.clients import new_consumer, new_watched_admin
from statesnap.kafka.config import KafkaSettings
from statesnap.kafka.reader import watermarks

__all__ = ["KafkaAdmin", "TopicInfo", "log_start_offsets", "watermark_offsets"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """What restore decisions depend on; ``configs`` holds only what the cluster reported."""

    name: str
    partitions: tuple[int, ...]
    configs: Mapping[str, str] = field(default_factory=dict)

    @property
    def compacted(self) -> bool:
        return "compact" in self.configs.get("cleanup.policy", "delete")

    @property
    def delete_retention_ms(self) -> int:
        # Kafka's default for delete.retention.ms is one day.
        return int(self.configs.get("delete.retention.ms", 86_400_000))


class KafkaAdmin:
    """A thin, typed wrapper around AdminClient for one cluster."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self._admin, self._errors = new_watched_admin(settings)

    def _unreachable(self, e: Exception | None = None) -> BrokerUnavailableError:
        detail = f": {_reason(e)}" if e is not None and _reason(e) else ""
        # librdkafka queues its connection errors for poll(); serve them to learn why.
        self._admin.poll(0)
        return BrokerUnavailableError(
            f"no Kafka broker answered at {self.settings.bootstrap_servers} "
            f"within {self.settings.timeout:g}s{detail}{self._errors.hint()}"
        )

    def cluster_id(self) -> str:
        try:
            result = self._admin.describe_cluster(request_timeout=self.settings.timeout)
            cid = result.result(timeout=self.settings.timeout).cluster_id
        except KafkaException as e:
            raise self._unreachable(e) from e
        except Exception as e:  # futures raise plain errors on timeout
            raise self._unreachable(e) from e
        if not cid:
            raise KafkaError(f"cluster at {self.settings.bootstrap_servers} reported no cluster id")
        return str(cid)

    def partitions(self, topic: str, *, timeout: float | None = None) -> tuple[int, ...]:
        """The topic's partition ids, asked within *timeout* seconds (else the settings')."""
        # Ask for all topics: a metadata request naming a missing topic makes brokers with
        # auto.create.topics.enable (Tansu, many Kafka defaults) create it with default settings.
        try:
            md = self._admin.list_topics(timeout=self.settings.timeout if timeout is None else timeout)
        except KafkaException as e:
            raise self._unreachable(e) from e
        tmd = md.topics.get(topic)
        if tmd is None or not tmd.partitions:
            raise TopicNotFoundError(f"topic {topic!r} does not exist on {self.settings.bootstrap_servers}")
        if tmd.error is not None:
            raise KafkaError(f"metadata for topic {topic!r}: {tmd.error.str()}")
        return tuple(sorted(tmd.partitions))

    def topic_configs(self, topic: str) -> dict[str, str]:
        """Explicit and default configs where the broker reports them; {} if it cannot say."""
        try:
            futures = self._admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)])
            entries = next(iter(futures.values())).result(timeout=self.settings.timeout)
        except Exception as e:
            log.debug("describe_configs(%s) failed: %s", topic, e)
            return {}
        return {name: entry.value for name, entry in entries.items() if entry.value is not None}

    def describe_topic(self, topic: str) -> TopicInfo:
        return TopicInfo(topic, self.partitions(topic), self.topic_configs(topic))

    def create_topic(
        self,
        topic: str,
        partitions: int,
        *,
        config: Mapping[str, str] | None = None,
        replication_factor: int = -1,
    ) -> bool:
        """Create *topic* if missing; returns whether this call created it. Returns once the
        broker's metadata shows every partition: CreateTopics answers when the controller has
        the topic, and a metadata request right after can still miss it (a produce or a
        partition lookup then fails with "does not exist")."""
        try:
            self.partitions(topic)
            return False
        except TopicNotFoundError:
            pass
        futures = self._admin.create_topics(
            [NewTopic(topic, partitions, replication_factor, config=dict(config or {}))],
            request_timeout=self.settings.timeout,
        )
        try:
            futures[topic].result(timeout=self.settings.timeout)
        except KafkaException as e:
            if e.args and e.args[0].code() == RdKafkaError.TOPIC_ALREADY_EXISTS:
                return False
            raise KafkaError(f"cannot create topic {topic!r}: {e}") from e
        self._wait_for_partitions(topic, partitions)
        return True

    def _wait_for_partitions(self, topic: str, partitions: int) -> None:
        deadline = Deadline(self.settings.timeout)
        while True:
            try:  # each lookup within what is left: the whole wait stays within the timeout
                if len(self.partitions(topic, timeout=max(0.05, deadline.remaining() or 0.0))) >= partitions:
                    return
            except BrokerUnavailableError:
                raise
            except KafkaError:  # not there yet, or there without a leader yet
                pass
            if not deadline.remaining():
                raise KafkaError(
                    f"topic {topic!r} was created, but {self.settings.bootstrap_servers} did not show its "
                    f"{partitions} partitions within {self.settings.timeout:g} s"
                )
            time.sleep(0.05)


def _reason(e: Exception) -> str:
    """librdkafka's message alone (``Local: Timed out``), not the ``KafkaError{code=…}`` repr."""
    err = e.args[0] if isinstance(e, KafkaException) and e.args else None
    return str(err.str()) if err is not None and hasattr(err, "str") else str(e)


def watermark_offsets(
    settings: KafkaSettings, topic: str, partitions: tuple[int, ...]
) -> dict[int, tuple[int, int]]:
    """(log start, reported end) per partition, asked with one short-lived consumer; a broker
    that does not answer is a :class:`BrokerUnavailableError` naming it."""
    consumer = new_consumer(settings, **{"group.id": "statesnap-metadata", "enable.auto.commit": False})
    try:
        ends = {p: watermarks(consumer, settings, topic, p) for p in partitions}
        return {p: (max(0, low), max(0, high)) for p, (low, high) in ends.items()}
    finally:
        consumer.close()


def log_start_offsets(settings: KafkaSettings, topic: str, partitions: tuple[int, ...]) -> dict[int, int]:
    """The first offset still stored per partition (the low watermark).

    Unlike the high watermark, which the dev broker under-reports, the low watermark is exact.
    """
    return {p: low for p, (low, _high) in watermark_offsets(settings, topic, partitions).items()}
