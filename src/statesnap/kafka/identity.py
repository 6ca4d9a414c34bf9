"""Which incarnation of a topic this is: Kafka's topic ID (KIP-516).

A topic deleted and recreated under the same name gets a new ID, so a checkpoint that records the
ID it was taken from can be told apart from the new topic's, even when the new topic has grown
past the old offsets. Brokers that report no ID (older Kafka) answer None; then the fallback
signal is a checkpoint offset beyond a partition's end.
"""

from __future__ import annotations

import logging

from confluent_kafka import KafkaException, TopicCollection

from statesnap.kafka.clients import new_admin
from statesnap.kafka.config import KafkaSettings

__all__ = ["topic_id"]

log = logging.getLogger(__name__)
_NO_ID = {"AAAAAAAAAAAAAAAAAAAAAA", "", "None"}


def topic_id(settings: KafkaSettings, topic: str) -> str | None:
    """The topic's ID as Kafka prints it (base64), or None where the broker reports none."""
    admin = new_admin(settings)
    try:
        description = admin.describe_topics(TopicCollection([topic]), request_timeout=settings.timeout)[
            topic
        ].result(timeout=settings.timeout)
    except (KafkaException, ValueError, TypeError) as e:
        log.debug("no topic id for %r: %s", topic, e)
        return None
    found = getattr(description, "topic_id", None)
    text = str(found) if found is not None else ""
    return None if text in _NO_ID else text
