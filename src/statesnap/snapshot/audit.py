"""Checking what a restore or a writer reads besides the checkpoints: the table descriptor, the
generation high-water mark, the snapshot records (of either snapshot store) and the Spark journal.

``statesnap checkpoints verify`` reports these beside each generation's verdict, so "ok" means
everything was read and agreed, never "not looked at".
"""

from __future__ import annotations

import contextlib
from typing import Any

from statesnap.checkpoint.journal import verify_journal
from statesnap.checkpoint.jsonfields import as_int, as_map, load_json
from statesnap.checkpoint.layout import HIGH_WATER
from statesnap.checkpoint.manifest import CheckpointManifest, CheckpointState
from statesnap.checkpoint.repository import CheckpointRepository
from statesnap.errors import BlobNotFoundError, CorruptCheckpointError, StatesnapError
from statesnap.kafka.config import KafkaSettings
from statesnap.snapshot.factory import open_snapshot_store
from statesnap.snapshot.model import Snapshot, SnapshotState
from statesnap.snapshot.store import SnapshotStoreSpec

__all__ = ["read_high_water", "verify_table_metadata"]


def read_high_water(repo: CheckpointRepository) -> int | None:
    """The recorded generation high-water mark; None when there is none. A garbled mark raises
    :class:`CorruptCheckpointError` (writers then fall back to the generations they can list)."""
    source = f"{repo.shown}/{HIGH_WATER}"  # for messages: the location as given
    try:
        data = repo.store.read(repo.key(HIGH_WATER))
    except BlobNotFoundError:
        return None
    obj = as_map(load_json(data, source=source), source)
    try:
        return as_int(obj.get("generation"), f"{source}: generation")
    except CorruptCheckpointError as e:
        raise CorruptCheckpointError(str(e)) from None


def verify_table_metadata(
    repo: CheckpointRepository, table: str, *, kafka: KafkaSettings | None = None
) -> list[str]:
    """Problems with the descriptor, high-water mark, snapshot records and journal of *repo*.

    A table whose records live in a Kafka topic needs *kafka* to have them checked; without it the
    records are reported as not checked (a problem: verify must not say ok about what it never read).
    """
    problems = [*repo.verify_descriptor(), *verify_journal(repo)]
    try:
        read_high_water(repo)
    except CorruptCheckpointError as e:
        problems.append(str(e))
    described: dict[str, Any] = repo.descriptor() or {}
    try:
        spec = SnapshotStoreSpec.parse(described.get("snapshot_store"))
    except (StatesnapError, AttributeError) as e:
        return [*problems, f"table.json: snapshot_store is not a snapshot store ({e})"]
    if spec.kind == "topic" and kafka is None:
        return [
            *problems,
            f"snapshot records are in Kafka topic {spec.topic!r} and were not checked: "
            "pass --bootstrap-servers (and the cluster's --kafka-config)",
        ]
    # Manifests first, records after: a manifest is committed after its record's last report and
    # before the record says COMPLETED, so records read later are at least that far along.
    completed = [
        gen
        for gen, item in repo.manifests()
        if isinstance(item, CheckpointManifest) and item.state is CheckpointState.COMPLETED
    ]
    records: dict[int, Snapshot] = {}
    store = open_snapshot_store(spec, blob=repo.store, directory=repo.directory, table=table, kafka=kafka)
    try:
        verify = getattr(store, "verify", None)
        if callable(verify):
            problems.extend(verify())
        records = {s.generation: s for s in store.list()}
    except StatesnapError as e:
        problems.append(f"snapshot records in {spec}: {e}")
    finally:
        closer = getattr(store, "close", None)
        if callable(closer):
            with contextlib.suppress(StatesnapError):
                closer()
    problems.extend(_disagreements(completed, records))
    return problems


def _disagreements(completed: list[int], records: dict[int, Snapshot]) -> list[str]:
    """Generations whose manifest is COMPLETED while their snapshot record contradicts it.

    The orchestrator commits a manifest once every partition has reported, then marks the record
    COMPLETED (whoever looks next finishes a crash in between). So a record still CREATED with every
    report in is a snapshot being finished, not a contradiction; FAILED, or CREATED with reports
    missing, means one of the two was changed.
    """
    out = []
    for gen in completed:
        record = records.get(gen)
        if record is None or record.state is SnapshotState.COMPLETED:
            continue
        if record.state is SnapshotState.CREATED and record.complete:
            continue
        out.append(
            f"generation {gen}: the manifest says COMPLETED but its snapshot record says "
            f"{record.state.value}" + (" with reports missing" if not record.complete else "")
        )
    return out
