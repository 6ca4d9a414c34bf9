"""Offline migration on Spark (``migrate_checkpoint(spark=...)``, ``checkpoints migrate --engine
spark``), on the suite's broker (Apache Kafka; Tansu too: nothing here depends on broker behaviour
beyond produce and consume to partition EOF). The migration lives in a module only the driver can
import, as a user's module in the directory they run the CLI from: it reaches Spark's workers by
value. Ground truth: the records the broker acknowledged, folded by the KTable rule, migrated by
the same function in plain Python."""

from __future__ import annotations

import importlib
import secrets
from pathlib import Path
from typing import Any

import pytest

from integration.spark.spark_testkit import changelog, replay
from statesnap import Table
from statesnap.blob import open_blob_store
from statesnap.checkpoint.discovery import locate_table
from statesnap.errors import MigrationError
from statesnap.snapshot.api import SnapshotApi
from statesnap.snapshot.model import SnapshotState
from statesnap.spark.migration import ship_by_value
from statesnap.task.offline_migration import migrate_checkpoint

pytestmark = [pytest.mark.spark, pytest.mark.integration]

MODULE = """
def v1_to_v2(key, value):
    if value.endswith(b"5"):
        return None
    return key, value.upper()


def move_keys(key, value):
    return key + b"-moved", value
"""


def test_offline_migration_on_spark_equals_the_python_engine_and_a_refusal_fails_its_snapshot(
    spark: Any, bootstrap: str, topic_name: str, produce: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = str(tmp_path / "cp")
    history = produce(topic_name, changelog(900, partitions=3, keys=90))
    first: Table[bytes, bytes] = Table(
        topic_name, bootstrap_servers=bootstrap, checkpoints=url, background=False
    )
    first.start()
    try:
        assert first.checkpoint() is not None
    finally:
        first.close(checkpoint=False)
    repo = locate_table(open_blob_store(url), topic_name)

    name = f"user_migration_{secrets.token_hex(4)}"  # importable here only (workers lack tmp_path)
    (tmp_path / f"{name}.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    module: Any = importlib.import_module(name)
    ship_by_value(name)

    on_python = migrate_checkpoint(url, topic_name, module.v1_to_v2, dry_run=True)
    on_spark = migrate_checkpoint(url, topic_name, module.v1_to_v2, dry_run=True, spark=spark)
    assert (on_spark.counts, on_spark.samples) == (on_python.counts, on_python.samples)
    assert on_spark.counts.dropped > 0
    assert repo.generations() == [1]  # dry runs write nothing

    # Refused by a task: one line, the snapshot it began failed at once, nothing pinned or committed.
    with pytest.raises(MigrationError, match="out of partition"):
        migrate_checkpoint(url, topic_name, module.move_keys, spark=spark)
    assert repo.generations() == [1]
    api = SnapshotApi.for_repo(repo, topic_name)
    try:
        assert not api.get(1).pinned
        assert api.current().state is SnapshotState.FAILED
    finally:
        api.close()

    done = migrate_checkpoint(url, topic_name, module.v1_to_v2, spark=spark)
    assert done.counts == on_python.counts
    assert done.generation is not None
    manifest = repo.read_manifest(done.generation)
    assert manifest.state_version(topic_name) == 2
    assert manifest.offsets == repo.read_manifest(1).offsets
    expected = {k: v.upper() for k, v in replay(history).items() if not v.endswith(b"5")}
    migrated: dict[bytes, bytes] = {}
    for _p, rows in repo.iter_partitions(manifest):
        migrated.update(zip(rows.column("key").to_pylist(), rows.column("value").to_pylist(), strict=True))
    assert migrated == expected
    api = SnapshotApi.for_repo(repo, topic_name)
    try:
        assert api.get(1).pinned
    finally:
        api.close()

    # Code of version 2 restores it as it is (nothing to migrate, nothing to replay).
    again: Table[bytes, bytes] = Table(
        topic_name, bootstrap_servers=bootstrap, checkpoints=url, background=False, state=2
    )
    report = again.start()
    try:
        assert (report.checkpoint, report.migrated_from, report.replayed_records) == (
            done.generation,
            None,
            0,
        )
        assert dict(again.raw_items()) == expected
    finally:
        again.close(checkpoint=False)
