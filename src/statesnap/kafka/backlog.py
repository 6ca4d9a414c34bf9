"""How many records a materialization would read: an estimate for choosing an engine.

The end of each partition comes from its high watermark, which the dev broker under-reports
(Apache Kafka's is exact): the number is labelled an estimate wherever it is shown, and nothing
correctness-related ever depends on it (catch-up is decided by partition EOF).
"""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import KafkaException, TopicPartition

from statesnap.errors import BrokerUnavailableError
from statesnap.kafka.clients import new_consumer
from statesnap.kafka.config import KafkaSettings


def high_watermarks(settings: KafkaSettings, topic: str, partitions: tuple[int, ...]) -> dict[int, int]:
    """The broker's reported end per partition (low-cost; may under-report, see module doc)."""
    consumer = new_consumer(settings, **{"group.id": "statesnap-metadata", "enable.auto.commit": False})
    try:
        return {
            p: max(
                0, int(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=settings.timeout)[1])
            )
            for p in partitions
        }
    except KafkaException as e:
        raise BrokerUnavailableError(
            f"cannot read offsets of {topic!r} from {settings.bootstrap_servers}: {e}"
        ) from e
    finally:
        consumer.close()


def estimate_backlog(ends: Mapping[int, int], starts: Mapping[int, int]) -> int:
    """Records between *starts* (a checkpoint's offsets; 0 where none) and *ends*."""
    return sum(max(0, end - starts.get(p, 0)) for p, end in ends.items())
