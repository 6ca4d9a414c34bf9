"""Consistent snapshots by generation: model, stores (blob, topic), orchestrator and API."""

from statesnap.snapshot.model import EMPTY, CheckpointRef, Snapshot, SnapshotState, TaskSnapshot
from statesnap.snapshot.store import BlobSnapshotStore, SnapshotStore
from statesnap.snapshot.topic_store import TopicSnapshotStore

__all__ = [
    "EMPTY",
    "BlobSnapshotStore",
    "CheckpointRef",
    "Snapshot",
    "SnapshotState",
    "SnapshotStore",
    "TaskSnapshot",
    "TopicSnapshotStore",
]
