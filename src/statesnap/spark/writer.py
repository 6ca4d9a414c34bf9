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
from datetime import UTC, datetime, timedelta
from typing import Any

from statesnap.blob import BlobStore, open_blob_store
from statesnap.checkpoint import CheckpointManifest, CheckpointRepository, RetentionPolicy
from statesnap.checkpoint.layout import valid_table_name
from statesnap.checkpoint.restore import CheckpointSelector
from statesnap.checkpoint.selection import TopicState
from statesnap.errors import ConfigError
from statesnap.kafka.admin import KafkaAdmin, TopicInfo
from statesnap.kafka.identity import topic_id
from statesnap.snapshot.api import SnapshotApi
from statesnap.snapshot.participant import Participant
from statesnap.snapshot.store import resolve_spec
from statesnap.spark.java_settings import check_client_config
from statesnap.spark.kafka_io import OffsetOracle, consumer_config
from statesnap.spark.options import KafkaSourceOptions

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
    """The topic as it is now, for checkpoint selection: start offsets, ends by partition EOF
    (the dev broker's watermarks under-report), compaction settings and topic ID."""
    oracle = OffsetOracle(opts)
    try:
        earliest = oracle.earliest(info.partitions)
        ends = oracle.latest(info.partitions)
    finally:
        oracle.close()
    return TopicState(
        opts.topic,
        cluster_id,
        info.partitions,
        earliest,
        info.compacted,
        info.delete_retention_ms,
        ends,
        topic_id(opts.settings(), opts.topic),
    )


@dataclass
class SparkTableWriter:
    """One Spark writer of one table (see the module docstring)."""

    table: str
    topic: str
    opts: KafkaSourceOptions
    cluster_id: str
    partitions: tuple[int, ...]
    state: TopicState
    repo: CheckpointRepository
    participant: Participant
    previous: CheckpointManifest | None

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
        checkpoints: str,
        storage_options: Mapping[str, Any] | None,
        kafka_config: Mapping[str, Any] | None,
        retention: RetentionPolicy | None,
        task_id: str,
        snapshot_store: str | None = None,
        snapshot_timeout: timedelta = timedelta(seconds=60),
        generation: int | None = None,
        require_checkpoint: bool = False,
        timeout: float = 15.0,
        remote_executors: bool = False,
    ) -> SparkTableWriter:
        """Ask the cluster (a missing topic fails here, before any Spark job), open the store,
        write the descriptor, choose the base checkpoint (*generation*, or the newest usable)."""
        if not valid_table_name(table):
            raise ConfigError(f"invalid table name {table!r}: use letters, digits, '.', '_', '-'")
        opts = check_table_options(table_options(bootstrap_servers, topic, kafka_config, timeout))
        admin = KafkaAdmin(opts.settings())
        cluster_id = admin.cluster_id()
        info = admin.describe_topic(topic)
        store = open_blob_store(checkpoints, **dict(storage_options or {}))
        if remote_executors:
            store = for_executors(store)
        store.check(writable=True)
        repo = CheckpointRepository.for_table(store, cluster_id, table)
        state = topic_state(opts, cluster_id, info)
        spec = resolve_spec(snapshot_store, (repo.descriptor() or {}).get("snapshot_store"), table)
        repo.ensure_descriptor(table, topic, cluster_id, len(info.partitions), str(spec))
        selector = CheckpointSelector(repo, table, generation, require_checkpoint)
        previous = selector.newest_verified(state, datetime.now(UTC))
        api = SnapshotApi.for_repo(
            repo,
            table,
            snapshot_store=str(spec),
            kafka=opts.settings(),
            topic=topic,
            cluster_id=cluster_id,
            partitions=info.partitions,
        )
        participant = Participant(
            api,
            task_id=task_id,
            owned=info.partitions,
            engine="spark",
            retention=retention,
            snapshot_timeout=snapshot_timeout,
            previous=previous,
            topic_id=state.topic_id,
        )
        return cls(table, topic, opts, cluster_id, info.partitions, state, repo, participant, previous)

    def close(self) -> None:
        self.participant.close()
