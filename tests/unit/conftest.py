"""Builders shared by the unit tests (no services: everything here runs in milliseconds)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from statesnap.checkpoint.datafile import SCHEMA
from statesnap.checkpoint.manifest import (
    CheckpointManifest,
    CheckpointState,
    DataFile,
    PartitionCheckpoint,
)

#: A fixed instant: unit tests never read the wall clock.
T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)


def rows(items: Iterable[tuple[bytes, bytes | None, int]]) -> pa.Table:
    """A data-file table from (key, value-or-None, offset) triples (timestamp = offset ms)."""
    items = list(items)
    return pa.table(
        {
            "key": pa.array([k for k, _, _ in items], pa.binary()),
            "value": pa.array([v for _, v, _ in items], pa.binary()),
            "offset": pa.array([o for _, _, o in items], pa.int64()),
            "timestamp": pa.array([o for _, _, o in items], pa.int64()).cast(pa.timestamp("ms")),
        },
        schema=SCHEMA,
    )


def make_manifest(
    generation: int = 1,
    *,
    table: str = "orders",
    topic: str = "orders-changelog",
    cluster_id: str = "cluster-a",
    offsets: dict[int, int] | None = None,
    files: dict[int, tuple[DataFile, ...]] | None = None,
    created_at: datetime = T0,
    state: CheckpointState = CheckpointState.COMPLETED,
) -> CheckpointManifest:
    offsets = {0: 10, 1: 20} if offsets is None else offsets
    files = files or {}
    return CheckpointManifest(
        table=table,
        topic=topic,
        cluster_id=cluster_id,
        generation=generation,
        partitions={p: PartitionCheckpoint(p, off, files.get(p, ())) for p, off in offsets.items()},
        created_at=created_at,
        state=state,
        writer={"name": "statesnap", "version": "test"},
    )


@pytest.fixture
def manifest_factory() -> Callable[..., CheckpointManifest]:
    return make_manifest
