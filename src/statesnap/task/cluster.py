"""What the cluster says about a task's topic when the task opens: one answer for every engine.

A restore decision (:mod:`statesnap.checkpoint.selection`) needs the cluster's id, the topic's
partitions and settings, each partition's first offset, its true end and the topic's ID. Both
engines get them here, so a checkpoint of another incarnation of the topic (deleted and recreated)
is recognised in one place — by topic ID where the broker reports one, else by a checkpoint that
resumes past a partition's end — before anything is loaded or read. The state also carries the
way to ask where a checkpoint's leader epochs end (KIP-320), asked only of a checkpoint whose
epoch is not the one at the log's end: a log truncated below it by an unclean leader election is
told apart even once new records carried the end past it.

The cluster id also tells the embedded dev broker (Tansu) from Apache Kafka at no cost
(:func:`broker_kind`): Tansu shows ``read_committed`` consumers the records of aborted transactions,
which exactly-once outputs must warn about.

Ends are found by partition EOF (the dev broker under-reports high watermarks; EOF is exact on
every broker), starting from the reported high watermark, so on Apache Kafka the probe is one
fetch per partition.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import partial

from statesnap.checkpoint.selection import TopicState
from statesnap.errors import ConfigError
from statesnap.kafka.admin import KafkaAdmin, TopicInfo, log_start_offsets
from statesnap.kafka.backlog import high_watermarks
from statesnap.kafka.config import KafkaSettings
from statesnap.kafka.identity import topic_id
from statesnap.kafka.reader import ChangelogReader, epoch_end_offsets
from statesnap.task.options import StaticShare

__all__ = [
    "END_PROBE_POLL",
    "END_PROBE_SETTLE",
    "TANSU_CLUSTER_ID",
    "BrokerKind",
    "ClusterFacts",
    "aborted_records_warning",
    "broker_kind",
    "cluster_facts",
    "log_ends",
    "shows_aborted_records",
]

#: Poll timeout of the end probe: the reader's short fetch wait answers EOF within a few of these.
END_PROBE_POLL = 0.02
#: A partition that keeps receiving records faster than EOF can be seen settles on the last offset
#: read after this long: any offset that exists is a valid end (only a promise of records that do
#: not exist would make a checkpoint look like another incarnation's).
END_PROBE_SETTLE = 2.0


#: The cluster id Tansu reports (``describe_cluster``, metadata) unless started with another one.
TANSU_CLUSTER_ID = "tansu_cluster"
#: Apache Kafka's cluster id: a UUID as Kafka prints one (16 bytes, URL-safe base64, no padding),
#: what ``kafka-storage random-uuid`` makes and a ZooKeeper-era cluster generated alike.
_KAFKA_UUID = re.compile(r"[A-Za-z0-9_-]{21}[AQgw]")


class BrokerKind(StrEnum):
    """What the cluster id says the broker is."""

    #: A Kafka-format id: Apache Kafka (or a service running it).
    APACHE_KAFKA = "apache-kafka"
    #: The embedded dev broker: ``read_committed`` consumers see aborted transactions' records.
    TANSU = "tansu"
    #: Another Kafka-protocol implementation, nothing known against it.
    OTHER = "other"


def broker_kind(cluster_id: str) -> BrokerKind:
    """The broker behind *cluster_id*, from the id alone (asked of the cluster anyway: free).

    Tansu's id is :data:`TANSU_CLUSTER_ID` unless it was started with ``--kafka-cluster-id``
    (then it reads as another kind: nothing the id can tell); Apache Kafka's is a base64 UUID."""
    if cluster_id.lower().startswith("tansu"):
        return BrokerKind.TANSU
    if _KAFKA_UUID.fullmatch(cluster_id):
        return BrokerKind.APACHE_KAFKA
    return BrokerKind.OTHER


def shows_aborted_records(cluster_id: str) -> bool:
    """Whether the cluster is known to show ``read_committed`` consumers the records of aborted
    transactions (Tansu; see DESIGN.md), so exactly-once outputs are not exactly once for readers."""
    return broker_kind(cluster_id) is BrokerKind.TANSU


def aborted_records_warning(who: str, cluster_id: str) -> str | None:
    """The one line to log when *who*'s exactly-once outputs run on a broker that shows aborted
    records to their readers (None elsewhere): what every exactly-once entry point says."""
    if not shows_aborted_records(cluster_id):
        return None
    return (
        f"{who}: exactly-once outputs on the embedded dev broker (Tansu, cluster id {cluster_id!r}), "
        "whose read_committed consumers also see records of aborted transactions: readers of the "
        "outputs may see a record twice after a crash; use Apache Kafka for exactly-once"
    )


@dataclass(frozen=True, slots=True)
class ClusterFacts:
    """The cluster's id, the topic as described, and the state a checkpoint is judged against."""

    cluster_id: str
    info: TopicInfo
    state: TopicState

    @property
    def all_partitions(self) -> tuple[int, ...]:
        return self.info.partitions

    @property
    def broker(self) -> BrokerKind:
        return broker_kind(self.cluster_id)


def log_ends(settings: KafkaSettings, topic: str, reported: Mapping[int, int]) -> dict[int, int]:
    """The true end of each partition: read from its *reported* high watermark to partition EOF.
    An end the probe read a record (or transaction marker) before carries that record's leader
    epoch (a :class:`~statesnap.checkpoint.manifest.NextOffset`).

    Bounded by ``settings.timeout`` of silence (the reader's stall check) and
    :data:`END_PROBE_SETTLE` of constant traffic."""
    if not reported:
        return {}
    reader = ChangelogReader(settings, topic, reported)
    began = time.monotonic()
    try:
        while not reader.caught_up and time.monotonic() - began < END_PROBE_SETTLE:
            for partition, messages in reader.poll(END_PROBE_POLL).items():
                reader.applied(partition, messages[-1].offset() + 1)
        return dict(reader.positions)
    finally:
        reader.close()


def cluster_facts(
    settings: KafkaSettings,
    topic: str,
    partitions: tuple[int, ...] | StaticShare | None = None,
    *,
    checkpointed: bool = True,
    offsets_later: bool = False,
) -> ClusterFacts:
    """Ask the cluster about *topic* (all partitions, a static share of them, or *partitions*,
    which must exist).

    *checkpointed*: the task restores from or writes checkpoints, so the topic's ID and ends are
    needed to judge them; without checkpoints only start offsets are asked for. *offsets_later*:
    the partitions come later (a group member's, by rebalance), and their start offsets and ends
    are asked for then (:meth:`~statesnap.task.opening.OpenedTask.state_of`), not here."""
    admin = KafkaAdmin(settings)
    cluster_id = admin.cluster_id()
    info = admin.describe_topic(topic)
    if partitions is None:
        partitions = info.partitions
    elif isinstance(partitions, StaticShare):
        partitions = partitions.select(info.partitions)
    missing = sorted(set(partitions) - set(info.partitions))
    if missing:
        raise ConfigError(f"topic {topic!r} has no partitions {missing}")
    start = {} if offsets_later else log_start_offsets(settings, topic, partitions)
    ends = None
    if checkpointed and not offsets_later:
        ends = log_ends(settings, topic, high_watermarks(settings, topic, partitions))
    state = TopicState(
        topic,
        cluster_id,
        partitions,
        start,
        info.compacted,
        info.delete_retention_ms,
        ends,
        topic_id(settings, topic) if checkpointed else None,
        partial(epoch_end_offsets, settings, topic) if checkpointed else None,
    )
    return ClusterFacts(cluster_id, info, state)
