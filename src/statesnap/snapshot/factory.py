"""Opening the snapshot store a spec names: the one place that knows every backend.

It stands beside the protocol module (:mod:`statesnap.snapshot.store`), not inside it: the
contract then imports no backend, and a backend (``topic_store``) can import the contract
without closing an import circle.
"""

from __future__ import annotations

from statesnap.blob import BlobStore
from statesnap.errors import SnapshotStoreError
from statesnap.kafka.config import KafkaSettings
from statesnap.snapshot.store import BlobSnapshotStore, SnapshotStore, SnapshotStoreSpec
from statesnap.snapshot.topic_store import TopicSnapshotStore

__all__ = ["open_snapshot_store"]


def open_snapshot_store(
    spec: str | SnapshotStoreSpec | None,
    *,
    blob: BlobStore,
    directory: str,
    table: str,
    kafka: KafkaSettings | None = None,
) -> SnapshotStore:
    """The snapshot store *spec* names, for the table in *directory* of *blob*.

    A topic store needs *kafka* (the cluster the topic lives on); without it the error says so.
    """
    parsed = spec if isinstance(spec, SnapshotStoreSpec) else SnapshotStoreSpec.parse(spec)
    if parsed.kind == "blob":
        return BlobSnapshotStore(blob, directory)
    if kafka is None:
        raise SnapshotStoreError(
            f"table {table!r} keeps its snapshots in Kafka topic {parsed.topic!r}: pass the cluster's "
            "bootstrap servers (--bootstrap-servers / STATESNAP_BOOTSTRAP_SERVERS)"
        )
    assert parsed.topic is not None
    return TopicSnapshotStore(kafka, parsed.topic, table=table)
