"""Opening a task: the one place every writer and reader of a table is set up.

A ``Table``, a ``Follower``, the Spark bootstrap and streaming drivers and ``write_checkpoint``
all need the same things in the same order — a valid table name, the cluster's facts about the
topic (:mod:`statesnap.task.cluster`), the checkpoint store and repository, and, for writers, the
table's descriptor and a snapshot participant continuing from the base checkpoint. They get them
here, so an engine differs only in how it reads the topic and applies records.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TypeVar

from statesnap.blob import BlobStore, open_blob_store
from statesnap.checkpoint import CheckpointManifest, CheckpointRepository
from statesnap.checkpoint.layout import valid_table_name
from statesnap.checkpoint.restore import CheckpointSelector
from statesnap.checkpoint.retention import RetentionPolicy
from statesnap.checkpoint.selection import TopicState
from statesnap.errors import ConfigError
from statesnap.kafka.admin import log_start_offsets
from statesnap.kafka.backlog import high_watermarks
from statesnap.kafka.config import KafkaSettings
from statesnap.snapshot.api import SnapshotApi
from statesnap.snapshot.participant import Participant
from statesnap.snapshot.store import resolve_spec
from statesnap.task.cluster import ClusterFacts, cluster_facts, log_ends
from statesnap.task.options import CheckpointOptions, SnapshotOptions, StaticShare

__all__ = [
    "Engine",
    "OpenedTask",
    "TaskEngine",
    "check_table_name",
    "join_snapshots",
    "open_checkpoint_store",
    "open_task",
]

log = logging.getLogger(__name__)

P = TypeVar("P", bound=Participant)


class Engine(StrEnum):
    """Who runs a task: this process (``python``), a PySpark job (``spark``), or, asked of the run
    layer (:func:`statesnap.run.engine.choose_engine`), whichever is expected to finish first
    (``auto``). A task that runs is always ``python`` or ``spark``, as its snapshots and manifests
    record it; the one enum of both, so a choice and its record cannot disagree."""

    AUTO = "auto"
    PYTHON = "python"
    SPARK = "spark"


#: The name this enum had while a second one chose engines; kept for one release.
TaskEngine = Engine


def check_table_name(name: str) -> str:
    """*name*, once it is a valid table name (it becomes a directory in the checkpoint store)."""
    if not valid_table_name(name):
        raise ConfigError(f"invalid table name {name!r}: use letters, digits, '.', '_', '-'")
    return name


def open_checkpoint_store(checkpoints: CheckpointOptions) -> BlobStore:
    """The blob store *checkpoints* names (a URL is opened with its storage options)."""
    location = checkpoints.location
    if isinstance(location, str):
        return open_blob_store(location, **dict(checkpoints.storage_options))
    return location


@dataclass(frozen=True, slots=True)
class OpenedTask:
    """A task of table *table* over *topic*, opened: what the cluster said and where its
    checkpoints are. ``partitions`` are the ones the task starts with (a group member's come
    later, by rebalance)."""

    table: str
    topic: str
    settings: KafkaSettings
    facts: ClusterFacts
    partitions: tuple[int, ...]
    checkpoints: CheckpointOptions | None
    repo: CheckpointRepository | None

    @property
    def cluster_id(self) -> str:
        return self.facts.cluster_id

    @property
    def state(self) -> TopicState:
        """The topic as the cluster described it, for the task's partitions."""
        return self.facts.state

    def state_of(self, partitions: tuple[int, ...], log_start: Mapping[int, int] | None = None) -> TopicState:
        """The topic's state for *partitions* as it is now (a group member's gained partitions:
        fresh start offsets and ends, since the ones found at open time may be old). *log_start*:
        start offsets the caller already holds (a group reader asks its own consumer)."""
        if log_start is None:
            log_start = log_start_offsets(self.settings, self.topic, partitions)
        ends = None
        if self.repo is not None:  # ends judge checkpoints; without any, none are asked for
            ends = log_ends(self.settings, self.topic, high_watermarks(self.settings, self.topic, partitions))
        return replace(self.facts.state, partitions=partitions, log_start=log_start, log_end=ends)

    def selector(self) -> CheckpointSelector:
        """The one chooser of the checkpoint to continue from (see the checkpoint options)."""
        assert self.repo is not None
        assert self.checkpoints is not None
        options = self.checkpoints
        return CheckpointSelector(self.repo, self.table, options.generation, options.require)

    def base_checkpoint(self) -> CheckpointManifest | None:
        """The newest checkpoint that verifies against the topic as it is (a writer that does not
        load it into a store itself, e.g. Spark's drivers, continues from it)."""
        if self.repo is None or self.checkpoints is None:
            return None
        return self.selector().newest_verified(self.state, self.checkpoints.clock())

    def join_snapshots(
        self,
        participant: type[P],
        *,
        task_id: str,
        owned: tuple[int, ...],
        engine: Engine,
        previous: CheckpointManifest | None,
        refresh_interval: float = 0.5,
    ) -> P:
        """Become a task of the table's snapshots (writers only): the descriptor is written or
        checked, and *participant* commits every checkpoint this task takes."""
        assert self.repo is not None
        assert self.checkpoints is not None
        return join_snapshots(
            participant,
            self.repo,
            table=self.table,
            topic=self.topic,
            cluster_id=self.cluster_id,
            partitions=self.facts.all_partitions,
            settings=self.settings,
            snapshots=self.checkpoints.snapshots,
            # A writer's orphan grace follows its checkpoint interval (the one rule, in retention.py).
            retention=self.checkpoints.retention.for_interval(self.checkpoints.interval),
            task_id=task_id,
            owned=owned,
            engine=engine,
            previous=previous,
            topic_id=self.state.topic_id,
            refresh_interval=refresh_interval,
        )


def open_task(
    table: str,
    topic: str,
    settings: KafkaSettings,
    checkpoints: CheckpointOptions | None,
    *,
    partitions: tuple[int, ...] | StaticShare | None = None,
    writes: bool,
    blob: BlobStore | None = None,
    offsets_later: bool = False,
) -> OpenedTask:
    """Open a task: ask the cluster (a missing topic or partition fails here, before any work),
    open the checkpoint store (checked writable for a writer) and the table's repository.

    *blob* replaces the store *checkpoints* names (Spark's drivers pass the store as executors
    on other machines need it). *offsets_later*: a group member, whose partitions (and their
    offsets and ends) come by rebalance."""
    check_table_name(table)
    facts = cluster_facts(
        settings, topic, partitions, checkpointed=checkpoints is not None, offsets_later=offsets_later
    )
    repo = None
    if checkpoints is not None:
        store = blob if blob is not None else open_checkpoint_store(checkpoints)
        store.check(writable=writes)
        repo = CheckpointRepository.for_table(store, facts.cluster_id, table)
    return OpenedTask(table, topic, settings, facts, facts.state.partitions, checkpoints, repo)


def join_snapshots(
    participant: type[P],
    repo: CheckpointRepository,
    *,
    table: str,
    topic: str,
    cluster_id: str,
    partitions: tuple[int, ...],
    settings: KafkaSettings | None,
    snapshots: SnapshotOptions,
    retention: RetentionPolicy | None,
    task_id: str,
    owned: tuple[int, ...],
    engine: Engine,
    previous: CheckpointManifest | None,
    topic_id: str | None = None,
    refresh_interval: float = 0.5,
) -> P:
    """Write or check the table's descriptor, open its snapshot API and make *participant* a task
    of its snapshots. The one place a participant is made; :meth:`OpenedTask.join_snapshots` is
    the usual way in, ``write_checkpoint`` (no cluster at hand) the other."""
    if engine is Engine.AUTO:
        raise ConfigError("a task runs on the python or the spark engine: choose one to join snapshots")
    spec = resolve_spec(snapshots.store, (repo.descriptor() or {}).get("snapshot_store"), table)
    repo.ensure_descriptor(table, topic, cluster_id, len(partitions), str(spec))
    api = SnapshotApi.for_repo(
        repo,
        table,
        snapshot_store=str(spec),
        kafka=settings,
        topic=topic,
        cluster_id=cluster_id,
        partitions=partitions,
    )
    return participant(
        api,
        task_id=task_id,
        owned=owned,
        engine=str(engine),
        retention=retention,
        snapshot_timeout=snapshots.timeout,
        previous=previous,
        refresh_interval=refresh_interval,
        topic_id=topic_id,
    )
