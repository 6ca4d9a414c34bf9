"""The snapshot model: generation records, task reports and checkpoint references as JSON."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statesnap.checkpoint.manifest import DataFile, FileKind, PartitionCheckpoint
from statesnap.errors import CorruptCheckpointError
from statesnap.snapshot.model import EMPTY, CheckpointRef, Snapshot, SnapshotState, TaskSnapshot

from .conftest import T0

BASE = DataFile("data/00000000000000000003/p00000-base-0.parquet", FileKind.BASE, 3, 1200, "a" * 64)
DELTA = DataFile("data/00000000000000000004/p00000-delta-0.parquet", FileKind.DELTA, 1, 400, "b" * 64)
REF = CheckpointRef(
    "s3://bucket/root/c1_orders",
    {0: PartitionCheckpoint(0, 42, (BASE, DELTA)), 3: PartitionCheckpoint(3, 0, ())},
)


def task(task_id: str, *partitions: int, topic: str = "orders") -> TaskSnapshot:
    return TaskSnapshot(task_id, {(topic, p): 10 * p + 1 for p in partitions}, {"orders": REF}, T0)


def snapshot(**changes: object) -> Snapshot:
    base = Snapshot(4, SnapshotState.CREATED, T0, T0 + timedelta(seconds=1), expected_partitions=(0, 1, 2))
    return base.evolve(**changes) if changes else base


# --- JSON round trips ----------------------------------------------------------------------------


def test_checkpoint_ref_round_trip_keeps_partitions_and_files() -> None:
    back = CheckpointRef.from_json(json.loads(json.dumps(REF.to_json())))
    assert back == REF
    assert back.partitions[0].files == (BASE, DELTA)
    assert list(REF.to_json()["partitions"]) == ["0", "3"]  # JSON keys are strings, sorted


def test_task_snapshot_round_trip() -> None:
    t = task("task-a", 0, 2)
    back = TaskSnapshot.from_json(json.loads(json.dumps(t.to_json())))
    assert back == t
    assert back.partitions == {0, 2}
    assert t.to_json()["offsets"] == [
        {"topic": "orders", "partition": 0, "next_offset": 1},
        {"topic": "orders", "partition": 2, "next_offset": 21},
    ]


def test_task_snapshot_without_checkpoints_or_timestamp() -> None:
    before = datetime.now(UTC)
    back = TaskSnapshot.from_json(
        {"task_id": "t", "offsets": [{"topic": "x", "partition": 1, "next_offset": 5}]}
    )
    assert back.offsets == {("x", 1): 5}
    assert back.checkpoints == {}
    assert back.reported_at >= before


def test_snapshot_round_trip_keeps_every_field() -> None:
    s = Snapshot(
        generation=7,
        state=SnapshotState.FAILED,
        created_at=T0,
        updated_at=T0 + timedelta(minutes=2),
        expected_partitions=(0, 1, 2),
        tasks={"a": task("a", 0), "b": task("b", 1, 2)},
        label="nightly",
        pinned=True,
        expires_at=T0 + timedelta(days=7),
        deadline=T0 + timedelta(minutes=5),
        error="task c failed: disk full",
        version=3,
    )
    back = Snapshot.from_bytes(s.to_bytes())
    assert back == s
    assert back.to_json() == s.to_json()


def test_snapshot_json_layout() -> None:
    obj = json.loads(snapshot(tasks={"b": task("b", 1), "a": task("a", 0)}).to_bytes())
    assert obj["generation"] == 4
    assert obj["state"] == "CREATED"
    assert obj["created_at"] == "2024-05-01T12:00:00.000+00:00"
    assert [t["task_id"] for t in obj["tasks"]] == ["a", "b"]  # sorted by task id
    assert obj["expires_at"] is None
    assert obj["version"] == 1  # evolve() advanced it


def test_timestamps_keep_milliseconds_and_become_utc() -> None:
    local = datetime(2024, 5, 1, 14, 0, 0, 123456, tzinfo=UTC).astimezone()
    back = Snapshot.from_bytes(snapshot(created_at=local).to_bytes())
    assert back.created_at == datetime(2024, 5, 1, 14, 0, 0, 123000, tzinfo=UTC)
    assert back.created_at.tzinfo is not None


def test_naive_timestamps_are_read_as_utc() -> None:
    obj = snapshot().to_json()
    obj["created_at"] = "2024-05-01T12:00:00"
    assert Snapshot.from_json(obj).created_at == T0


def test_older_records_without_optional_fields_parse() -> None:
    minimal = {"generation": 2, "state": "COMPLETED", "created_at": "2024-05-01T12:00:00+00:00"}
    s = Snapshot.from_json(minimal)
    assert (s.generation, s.state, s.version, s.pinned, s.tasks) == (2, SnapshotState.COMPLETED, 0, False, {})
    assert s.expected_partitions == ()


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json",
        b"[1, 2]",
        b"null",
        b'{"state": "CREATED"}',
        b'{"generation": 1, "state": "DONE", "created_at": null}',
        b'{"generation": "x", "state": "CREATED", "created_at": "2024-05-01T12:00:00"}',
        b'{"generation": 1, "state": "CREATED", "created_at": "yesterday"}',
        b'{"generation": 1, "state": "CREATED", "created_at": 5}',
        b'{"generation": 1, "state": "CREATED", "created_at": "2024-05-01T12:00:00", "tasks": [7]}',
        b"\xff\xfe{}",
        b"\xff",
    ],
)
def test_malformed_records_raise_corrupt_checkpoint_error(data: bytes) -> None:
    with pytest.raises(CorruptCheckpointError):
        Snapshot.from_bytes(data)


_ts = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
).map(lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000))
_tasks = st.dictionaries(
    st.text("abcxyz-0123456789", min_size=1, max_size=8),
    st.dictionaries(
        st.tuples(st.sampled_from(["orders", "users"]), st.integers(0, 63)), st.integers(0, 2**62)
    ),
    max_size=4,
)


@given(
    generation=st.integers(1, 2**62),
    state=st.sampled_from(SnapshotState),
    created=_ts,
    tasks=_tasks,
    label=st.none() | st.text(max_size=20),
    expires=st.none() | _ts,
    version=st.integers(0, 10**6),
)
def test_any_snapshot_round_trips(
    generation: int,
    state: SnapshotState,
    created: datetime,
    tasks: dict[str, dict[tuple[str, int], int]],
    label: str | None,
    expires: datetime | None,
    version: int,
) -> None:
    s = Snapshot(
        generation,
        state,
        created,
        created,
        expected_partitions=tuple(sorted({p for offs in tasks.values() for _, p in offs})),
        tasks={tid: TaskSnapshot(tid, offs, {}, created) for tid, offs in tasks.items()},
        label=label,
        expires_at=expires,
        version=version,
    )
    assert Snapshot.from_bytes(s.to_bytes()) == s


# --- EMPTY and derived properties ------------------------------------------------------------------


def test_empty_is_generation_zero_with_nothing_in_it() -> None:
    assert EMPTY.generation == 0
    assert EMPTY.state is SnapshotState.COMPLETED
    assert EMPTY.tasks == {}
    assert EMPTY.expected_partitions == ()
    assert EMPTY.missing_partitions == []
    assert not EMPTY.complete  # nothing expected: never "complete"
    assert not EMPTY.retained(T0)
    assert Snapshot.from_bytes(EMPTY.to_bytes()) == EMPTY


def test_missing_partitions_and_complete() -> None:
    s = snapshot()
    assert s.missing_partitions == [0, 1, 2]
    assert not s.complete
    s = s.evolve(tasks={"a": task("a", 0)})
    assert s.reported_partitions == {0}
    assert s.missing_partitions == [1, 2]
    assert not s.complete
    s = s.evolve(tasks={**s.tasks, "b": task("b", 1, 2)})
    assert s.missing_partitions == []
    assert s.complete


def test_extra_partitions_do_not_make_a_snapshot_incomplete() -> None:
    s = snapshot(tasks={"a": task("a", 0, 1, 2, 9)})
    assert s.complete
    assert s.missing_partitions == []


def test_partitions_of_other_topics_count_for_the_task() -> None:
    s = snapshot(tasks={"a": task("a", 0, 1, topic="users"), "b": task("b", 2)})
    assert s.complete


def test_retained_by_pin_or_by_expiry_in_the_future() -> None:
    now = T0 + timedelta(hours=1)
    assert not snapshot().retained(now)
    assert snapshot(pinned=True).retained(now)
    assert snapshot(expires_at=now + timedelta(seconds=1)).retained(now)
    assert not snapshot(expires_at=now).retained(now)  # expires exactly now: no longer retained
    assert not snapshot(expires_at=now - timedelta(days=1)).retained(now)
    assert snapshot(pinned=True, expires_at=now - timedelta(days=1)).retained(now)


def test_evolve_advances_version_and_updated_at() -> None:
    s = snapshot()
    later = s.evolve(label="x")
    assert later.version == s.version + 1
    assert later.updated_at >= s.updated_at
    assert later.label == "x"
    assert later.created_at == s.created_at
    assert s.label is None  # frozen: the original is untouched
    explicit = s.evolve(version=9, updated_at=T0)
    assert (explicit.version, explicit.updated_at) == (9, T0)
