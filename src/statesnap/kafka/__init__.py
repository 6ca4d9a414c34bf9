"""The thin layer over confluent-kafka: client settings, clients, admin answers and readers.

Every Kafka client statesnap opens is made here (:mod:`~statesnap.kafka.clients`), so a bad
``kafka_config`` is one typed error and confluent-kafka's errors are translated in one place;
the rest of the package sees :class:`KafkaSettings`, typed answers and statesnap's errors.
"""

from statesnap.kafka.admin import KafkaAdmin, TopicInfo, log_start_offsets
from statesnap.kafka.backlog import estimate_backlog, high_watermarks
from statesnap.kafka.clients import config_error, new_admin, new_consumer, new_producer, new_watched_admin
from statesnap.kafka.config import KafkaSettings, config_from_env, parse_properties, redact
from statesnap.kafka.group_reader import GroupReader
from statesnap.kafka.identity import topic_id
from statesnap.kafka.partitioner import PartitionerSpec, resolve_partitioner
from statesnap.kafka.reader import ChangelogReader

__all__ = [
    "ChangelogReader",
    "GroupReader",
    "KafkaAdmin",
    "KafkaSettings",
    "PartitionerSpec",
    "TopicInfo",
    "config_error",
    "config_from_env",
    "estimate_backlog",
    "high_watermarks",
    "log_start_offsets",
    "new_admin",
    "new_consumer",
    "new_producer",
    "new_watched_admin",
    "parse_properties",
    "redact",
    "resolve_partitioner",
    "topic_id",
]
