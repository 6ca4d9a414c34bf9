"""What every Spark writer of a table holds: the cluster's answers, the repository, the snapshot
API and the participant it commits through, and the checkpoint it continues from.

The Spark bootstrap and streaming drivers are tasks of their table's snapshots exactly like a
Python :class:`~statesnap.Table`: they find their base checkpoint with the same
:class:`~statesnap.checkpoint.restore.CheckpointSelector` and commit through the same
:class:`~statesnap.snapshot.participant.Participant` — no second commit path.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from statesnap.blob import BlobStore
from statesnap.checkpoint import CheckpointManifest, CheckpointRepository
from statesnap.checkpoint.selection import TopicState
from statesnap.kafka.admin import TopicInfo
from statesnap.snapshot.api import SnapshotApi
from statesnap.snapshot.participant import Participant
from statesnap.spark.java_settings import check_client_config
from statesnap.spark.kafka_io import consumer_config
from statesnap.spark.options import KafkaSourceOptions
from statesnap.task.cluster import cluster_facts
from statesnap.task.opening import OpenedTask, TaskEngine, check_table_name, open_checkpoint_store, open_task
from statesnap.task.options import CheckpointOptions

__all__ = ["SparkTableWriter", "check_table_options", "for_executors", "table_options", "topic_state"]

log = logging.getLogger(__name__)


def for_executors(store: BlobStore) -> BlobStore:
    """The store as executors on other machines need it: S3 settings the driver took from its
    environment (endpoint, region, credentials) written into the store's options."""
    from statesnap.blob.s3 import S3BlobStore

    return store.for_executors() if isinstance(store, S3BlobStore) else store


def table_options(
    bootstrap_servers: str, topic: str, kafka_config: Mapping[str, Any] | None, timeout: float = 15.0
) -> KafkaSourceOptions:
    """Source options for table work: ``read_committed`` like :class:`statesnap.Table`;
    *timeout* bounds every wait for the cluster's metadata."""
    config = {"isolation.level": "read_committed"}
    config.update({k: str(v) for k, v in (kafka_config or {}).items() if k != "bootstrap.servers"})
    return KafkaSourceOptions(
        bootstrap_servers, topic, kafka_config=config, metadata_timeout_ms=max(1, int(timeout * 1000))
    )


def check_table_options(opts: KafkaSourceOptions) -> KafkaSourceOptions:
    """*opts*, once librdkafka accepts the consumer settings its tasks will use: on the driver,
    settings it refuses fail in one line, not in every task after Spark started."""
    check_client_config(opts.bootstrap_servers, {k: str(v) for k, v in consumer_config(opts).items()})
    return opts


def topic_state(opts: KafkaSourceOptions, cluster_id: str, info: TopicInfo) -> TopicState:
    """The topic as it is now, for checkpoint selection (the task core's answer; see
    :mod:`statesnap.task.cluster`)."""
    del cluster_id, info  # asked again: the core's answer is the one every engine judges by
    return cluster_facts(opts.settings(), opts.topic, checkpointed=True).state


@dataclass
class SparkTableWriter:
    """One Spark writer of one table (see the module docstring): an opened task of the core."""

    task: OpenedTask
    opts: KafkaSourceOptions
    participant: Participant
    previous: CheckpointManifest | None

    @property
    def table(self) -> str:
        return self.task.table

    @property
    def topic(self) -> str:
        return self.task.topic

    @property
    def cluster_id(self) -> str:
        return self.task.cluster_id

    @property
    def partitions(self) -> tuple[int, ...]:
        return self.task.partitions

    @property
    def state(self) -> TopicState:
        return self.task.state

    @property
    def repo(self) -> CheckpointRepository:
        assert self.task.repo is not None
        return self.task.repo

    @property
    def api(self) -> SnapshotApi:
        return self.participant.api

    @classmethod
    def open(
        cls,
        *,
        bootstrap_servers: str,
        topic: str,
        table: str,
        checkpoints: CheckpointOptions,
        kafka_config: Mapping[str, Any] | None,
        task_id: str,
        timeout: float = 15.0,
        remote_executors: bool = False,
    ) -> SparkTableWriter:
        """Open the task through the core (a missing topic fails here, before any Spark job),
        and join the table's snapshots continuing from the base checkpoint (the generation asked
        for, or the newest usable)."""
        check_table_name(table)
        opts = check_table_options(table_options(bootstrap_servers, topic, kafka_config, timeout))
        store = open_checkpoint_store(checkpoints)
        if remote_executors:
            store = for_executors(store)
        task = open_task(table, topic, opts.settings(), checkpoints, writes=True, blob=store)
        previous = task.base_checkpoint()
        participant = task.join_snapshots(
            Participant, task_id=task_id, owned=task.partitions, engine=TaskEngine.SPARK, previous=previous
        )
        return cls(task, opts, participant, previous)

    def close(self) -> None:
        self.participant.close()
