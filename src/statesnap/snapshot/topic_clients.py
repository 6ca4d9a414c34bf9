"""The Kafka side of a topic snapshot store: its topic checked (or created) and its two clients.

Apart from :mod:`statesnap.snapshot.topic_store` because the settings that make the store
correct live here and nowhere else: a topic of one partition that never loses a record, a consumer
that reads every record (``read_uncommitted``: the chain, not transaction markers, decides what
counts) and a transactional producer whose ``init_transactions`` fences every older writer.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka import KafkaError as RdKafkaError

from statesnap.errors import BrokerUnavailableError, ConfigError, KafkaError, TopicNotFoundError
from statesnap.kafka.admin import KafkaAdmin
from statesnap.kafka.config import KafkaSettings
from statesnap.kafka.fatal import is_fatal

__all__ = [
    "FETCH_WAIT_MS",
    "TOPIC_CONFIG",
    "TRANSACTION_TIMEOUT_MS",
    "aborted_for_retry",
    "check_store_topic",
    "store_consumer",
    "store_producer",
]

log = logging.getLogger(__name__)

#: A new store topic: one partition (one ordered chain), never compacted, never expired.
TOPIC_CONFIG = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}
#: Without a short fetch wait every "am I at the end?" probe costs the broker's default (500 ms+).
FETCH_WAIT_MS = 10
#: Our transactions last milliseconds; the coordinator aborts one a crashed writer left open after
#: this long (the next writer's init_transactions does so at once). Readers never wait for it.
TRANSACTION_TIMEOUT_MS = 15_000
_FENCED = frozenset({RdKafkaError._FENCED, RdKafkaError.PRODUCER_FENCED, RdKafkaError.INVALID_PRODUCER_EPOCH})


class _ProducerLog:
    """librdkafka's log lines for the store's producer. Being fenced is how writers take turns
    here, yet librdkafka logs it as an error and a fatal error: those lines go to DEBUG."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def log(self, level: int, msg: str, *args: Any) -> None:
        if level > logging.DEBUG and any("fence" in str(a) for a in args):
            level = logging.DEBUG
        self.target.log(level, msg, *args)


def check_store_topic(settings: KafkaSettings, topic: str, *, create: bool) -> None:
    """Create *topic* if *create* and it is missing, then refuse a topic that would lose records
    the chain refers to: more than one partition, compaction, or any retention."""
    admin = KafkaAdmin(settings)
    if create:
        admin.create_topic(topic, 1, config=TOPIC_CONFIG)
    deadline = time.monotonic() + settings.timeout
    while True:  # a new topic takes a moment to appear in metadata
        try:
            partitions = admin.partitions(topic)
            break
        except TopicNotFoundError:
            if not create or time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    if partitions != (0,):
        raise ConfigError(
            f"snapshot topic {topic!r} has {len(partitions)} partitions; a snapshot store "
            "needs exactly one (its records form one ordered chain)"
        )
    configs = admin.topic_configs(topic)  # {} where the broker does not say
    if "compact" in configs.get("cleanup.policy", "delete"):
        raise ConfigError(
            f"snapshot topic {topic!r} is compacted; compaction removes records the chain "
            "refers to. Use a topic with cleanup.policy=delete and retention.ms=-1"
        )
    for name in ("retention.ms", "retention.bytes"):
        value = configs.get(name)
        if value is not None and int(value) >= 0:
            raise ConfigError(
                f"snapshot topic {topic!r} has {name}={value}; the store needs every record "
                f"forever (snapshots expire by explicit delete). Set {name}=-1 on the topic"
            )


def store_consumer(settings: KafkaSettings, topic: str) -> Any:
    """The store's consumer: never joins its group (partitions are assigned), reads every record."""
    return Consumer(
        settings.consumer_config(
            **{
                "group.id": f"statesnap-snapshots.{topic}",  # never joined: assign only
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": FETCH_WAIT_MS,
                # The chain, not transaction markers, decides what counts (topic_store's docstring).
                "isolation.level": "read_uncommitted",
            }
        )
    )


def store_producer(settings: KafkaSettings, transactional_id: str, where: str) -> Any:
    """A transactional producer, initialised: a new one fences every older writer of the topic.
    *where* names the store in errors."""
    producer = Producer(
        settings.producer_config(
            **{
                "transactional.id": transactional_id,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 0,
                "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
                "logger": _ProducerLog(settings.client_config().get("logger", log)),
            }
        )
    )
    try:
        producer.init_transactions(settings.timeout)
    except KafkaException as e:
        err = e.args[0]
        if err.code() == RdKafkaError._TIMED_OUT or err.retriable():
            raise BrokerUnavailableError(
                f"no transaction coordinator answered at {settings.bootstrap_servers} "
                f"within {settings.timeout:g}s for {where}: {err.str()}"
            ) from e
        raise KafkaError(f"cannot start transactions as {transactional_id!r} for {where}: {err.str()}") from e
    return producer


def aborted_for_retry(producer: Any, e: KafkaException, *, where: str, timeout: float) -> bool:
    """After a failed transaction of *producer*: True when it was aborted and can begin the next
    attempt, False when it must be replaced (fenced, the commit's outcome unknown, or the abort
    failed: the next producer's ``init_transactions`` settles it). Raises :class:`KafkaError`
    where retrying is futile. *where* names the store in logs and errors."""
    err = e.args[0] if e.args and isinstance(e.args[0], RdKafkaError) else None
    if err is None:
        raise KafkaError(f"writing to {where}: {e}") from e
    if err.code() in _FENCED:
        log.debug("%s: fenced by another writer; retrying", where)
        return False
    if is_fatal(err):  # this producer is done for; a new one's init_transactions starts clean
        log.info("%s: the producer hit a fatal error (%s); retrying with a new one", where, err.str())
        return False
    if err.txn_requires_abort():
        log.debug("%s: transaction aborted (%s); retrying", where, err.str())
        try:
            producer.abort_transaction(timeout)
        except KafkaException:
            return False
        return True
    if err.retriable():
        log.info("%s: commit outcome unknown (%s); re-reading to settle it", where, err.str())
        return False
    raise KafkaError(f"writing to {where}: {err.str()}") from e
