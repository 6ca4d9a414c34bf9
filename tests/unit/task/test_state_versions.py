"""State versions and migrations without a broker: the version check, the chain, the per-row
rules (drop, collisions, keys that leave their partition) and the manifest field (#20)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from statesnap.checkpoint.manifest import CheckpointManifest
from statesnap.errors import (
    CheckpointMismatchError,
    ConfigError,
    CorruptCheckpointError,
    MigrationError,
    StateVersionError,
)
from statesnap.task.migration import MigrationCounts, RowMigrator, StateVersion, migrate_rows


def rows(*pairs: tuple[bytes, bytes], offsets: list[int] | None = None) -> pa.Table:
    return pa.table(
        {
            "key": pa.array([k for k, _ in pairs], pa.binary()),
            "value": pa.array([v for _, v in pairs], pa.binary()),
            "offset": pa.array(offsets or list(range(len(pairs))), pa.int64()),
        }
    )


def manifest(versions: dict[str, int] | None = None) -> CheckpointManifest:
    return CheckpointManifest("t", "t", "c", 4, {}, datetime.now(UTC), state_versions=versions or {})


def test_same_version_needs_nothing_and_unversioned_manifests_are_version_1() -> None:
    assert StateVersion().steps(1, store="t") == ()
    assert manifest().state_version("t") == 1
    assert StateVersion(1).migrator(manifest(), "t", partitions=3) is None


def test_another_version_without_migration_is_refused_naming_both() -> None:
    with pytest.raises(StateVersionError) as e:
        StateVersion(3, {2: lambda k, v: (k, v)}).migrator(manifest(), "orders", partitions=3)
    text = str(e.value)
    assert "\n" not in text
    assert "state version 1" in text
    assert "version 3" in text
    assert "1→2" in text
    assert "generation 4" in text
    with pytest.raises(StateVersionError, match="newer than this code's version 1"):
        StateVersion(1).steps(2, store="orders")


def test_bad_declarations_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=">= 1"):
        StateVersion(0)
    with pytest.raises(ConfigError, match="1 to 1"):
        StateVersion(2, {2: lambda k, v: (k, v)})
    with pytest.raises(ConfigError, match="not callable"):
        StateVersion(2, {1: "nope"})  # type: ignore[dict-item]


def test_chain_runs_in_order_drops_and_counts() -> None:
    steps = StateVersion(
        3,
        {
            1: lambda k, v: None if v == b"x" else (k, v + b"-v2"),
            2: lambda k, v: (k, v.upper()),
        },
    ).steps(1, store="t")
    counts = MigrationCounts()
    out = migrate_rows(rows((b"b", b"x"), (b"a", b"y")), steps, partition=0, counts=counts)
    assert out.column("key").to_pylist() == [b"a"]
    assert out.column("value").to_pylist() == [b"Y-V2"]
    assert out.column("offset").to_pylist() == [1]  # other columns travel with the row
    assert counts.to_json() == {"kept": 0, "changed": 1, "dropped": 1}


def test_migrated_rows_keep_their_schema() -> None:
    """A Spark bootstrap folds migrated rows with new ones: the schemas must be the same."""
    schema = pa.schema([pa.field("key", pa.binary(), nullable=False), ("value", pa.binary())])
    before = pa.table({"key": [b"a"], "value": [b"v"]}, schema=schema)
    assert migrate_rows(before, [lambda k, v: (k + b"2", v)], partition=0).schema == schema


def test_keys_merged_by_a_migration_keep_the_row_written_last_sorted() -> None:
    out = migrate_rows(
        rows((b"a1", b"old"), (b"a2", b"new"), (b"0", b"z"), offsets=[9, 3, 5]),
        [lambda k, v: (k[:1], v)],
        partition=0,
    )
    assert out.column("key").to_pylist() == [b"0", b"a"]
    assert out.column("value").to_pylist() == [b"z", b"old"]  # offset 9 beats offset 3


def test_a_key_moved_to_another_partition_is_refused() -> None:
    m = manifest()
    by_first_byte = lambda key, n: key[0] % n  # noqa: E731
    migrator = StateVersion(2, {1: lambda k, v: (b"b" + k[1:], v)}).migrator(
        m, "t", partitions=2, partitioner=by_first_byte
    )
    assert migrator is not None
    with pytest.raises(MigrationError) as e:  # b"a…" is in partition 1, b"b…" belongs to 0
        migrator.rows(1, rows((b"a1", b"v")))
    assert "\n" not in str(e.value)
    assert "partition 1" in str(e.value)
    assert "partition 0" in str(e.value)
    assert "b'b1'" in str(e.value)


def test_a_migration_may_name_the_partition_of_its_new_key() -> None:
    migrator = RowMigrator("t", 1, 2, [lambda k, v: (k + b"!", v, 1)], lambda k, n: 0, 2)
    assert migrator.rows(1, rows((b"a", b"v"))).column("key").to_pylist() == [b"a!"]
    with pytest.raises(MigrationError, match="the migration says partition 1"):
        migrator.rows(0, rows((b"a", b"v")))


def test_manifest_records_state_versions_per_store() -> None:
    m = manifest({"orders": 2, "balances": 3})
    again = CheckpointManifest.from_bytes(m.to_bytes())
    assert again.state_version("orders") == 2
    assert again.state_version("balances") == 3
    assert again.state_version("other") == 1
    obj = json.loads(m.to_bytes())
    obj["state_versions"] = {"orders": 0}
    obj.pop("checksum")
    obj["format_version"] = 1
    with pytest.raises(CorruptCheckpointError, match="state version"):
        CheckpointManifest.from_bytes(json.dumps(obj).encode())


def test_a_snapshot_whose_tasks_wrote_two_versions_is_not_committed() -> None:
    """Two versions of the code in one consumer group would mix formats in one checkpoint."""
    from statesnap.snapshot.model import CheckpointRef, Snapshot, SnapshotState, TaskSnapshot
    from statesnap.snapshot.orchestrator import manifest_of

    def task(name: str, p: int, version: int) -> TaskSnapshot:
        ref = CheckpointRef("file:///x", {})
        return TaskSnapshot(name, {("t", p): 0}, {"t": ref}, writer={"state_versions": {"t": version}})

    now = datetime.now(UTC)
    same = Snapshot(3, SnapshotState.CREATED, now, now, (0, 1), {"a": task("a", 0, 2), "b": task("b", 1, 2)})
    manifest = manifest_of(same, table="t", topic="t", cluster_id="c")
    assert manifest.state_versions == {"t": 2}
    assert "state_versions" not in manifest.writer
    mixed = Snapshot(3, SnapshotState.CREATED, now, now, (0, 1), {"a": task("a", 0, 1), "b": task("b", 1, 2)})
    with pytest.raises(CheckpointMismatchError, match="state versions 1 and 2"):
        manifest_of(mixed, table="t", topic="t", cluster_id="c")
