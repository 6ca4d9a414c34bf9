"""Consistent snapshots by generation: model, stores (blob, topic), orchestrator, API and the
participant every writer commits through."""

from statesnap.snapshot.api import SnapshotApi
from statesnap.snapshot.model import EMPTY, CheckpointRef, Snapshot, SnapshotState, TaskSnapshot
from statesnap.snapshot.participant import Participant
from statesnap.snapshot.store import (
    BlobSnapshotStore,
    SnapshotStore,
    SnapshotStoreSpec,
    open_snapshot_store,
)
from statesnap.snapshot.topic_store import TopicSnapshotStore
from statesnap.snapshot.writer import write_checkpoint

__all__ = [
    "EMPTY",
    "BlobSnapshotStore",
    "CheckpointRef",
    "Participant",
    "Snapshot",
    "SnapshotApi",
    "SnapshotState",
    "SnapshotStore",
    "SnapshotStoreSpec",
    "TaskSnapshot",
    "TopicSnapshotStore",
    "open_snapshot_store",
    "write_checkpoint",
]
