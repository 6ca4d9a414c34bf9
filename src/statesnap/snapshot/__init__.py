"""Consistent snapshots by generation: model, stores (blob, topic), orchestrator, API and the
participant every writer commits through."""

from statesnap.snapshot.api import SnapshotApi
from statesnap.snapshot.factory import open_snapshot_store
from statesnap.snapshot.model import EMPTY, CheckpointRef, Snapshot, SnapshotState, TaskSnapshot
from statesnap.snapshot.participant import Participant
from statesnap.snapshot.store import BlobSnapshotStore, SnapshotStore, SnapshotStoreSpec
from statesnap.snapshot.topic_store import TopicSnapshotStore

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
]
