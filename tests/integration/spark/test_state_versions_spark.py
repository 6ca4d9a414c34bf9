"""Spark bootstrap and state versions (#20), on the suite's broker (Apache Kafka; Tansu too; nothing here
depends on
broker behaviour beyond produce and consume to partition EOF): a Spark bootstrap refuses to
continue a checkpoint of another state version in one line, migrates an older one with the
migrations it is given (as its tasks read the old rows: every partition gets a new base, even one
with nothing new to read), records the new version in the manifest, and a Python table of that
version restores it equal to the old state migrated plus the tail (ground truth: the records the
broker acknowledged, folded by the KTable rule)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from integration.spark.spark_testkit import changelog, replay
from statesnap import Table
from statesnap.checkpoint.manifest import FileKind
from statesnap.errors import CheckpointMismatchError
from statesnap.spark import bootstrap as spark_bootstrap
from statesnap.spark.bootstrap import BootstrapSpec, run_bootstrap
from statesnap.task.migration import StateVersion
from statesnap.task.options import CheckpointOptions

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def test_spark_bootstrap_checks_migrates_and_records_the_state_version(
    spark: Any, bootstrap: str, topic_name: str, produce: Any, tmp_path: Path
) -> None:
    url = str(tmp_path / "cp")

    def upper(key: bytes, value: bytes) -> tuple[bytes, bytes]:
        """Version 2 stores values upper-cased. Defined here, not at module level: the tests'
        modules are not importable on Spark's workers, so it travels by value (a user's migration
        module must be importable there, as any Spark UDF's)."""
        return key, value.upper()

    history = produce(topic_name, changelog(600, partitions=3, keys=60))
    first: Table[bytes, bytes] = Table(
        topic_name, bootstrap_servers=bootstrap, checkpoints=url, background=False
    )
    first.start()
    try:
        written = first.checkpoint()
    finally:
        first.close(checkpoint=False)
    assert written is not None
    assert written.state_version(topic_name) == 1
    # New records in partition 0 only: partitions 1 and 2 have nothing new, yet must be migrated.
    tail = produce(topic_name, [(0, b"k-new-%d" % i, b"tail-%d" % i) for i in range(20)])

    common: dict[str, Any] = {"bootstrap_servers": bootstrap, "topic": topic_name, "table": topic_name}
    with pytest.raises(CheckpointMismatchError, match="register migrations for 1→2"):
        spark_bootstrap(spark, checkpoints=url, state=2, **common)
    run = run_bootstrap(
        spark, BootstrapSpec(checkpoints=CheckpointOptions(url), state=StateVersion(2, {1: upper}), **common)
    )
    manifest = run.manifest
    assert (manifest.generation, manifest.state_version(topic_name)) == (2, 2)
    assert all(
        [f.kind for f in pc.files] == [FileKind.BASE] and pc.files[0].path.startswith(f"data/{2:020d}/")
        for pc in manifest.partitions.values()
    )
    with pytest.raises(CheckpointMismatchError, match="newer than this code's version 1"):
        spark_bootstrap(spark, checkpoints=url, **common)

    expected = {k: v.upper() for k, v in replay(history).items()}
    expected.update({r.key: r.value for r in tail})
    again: Table[bytes, bytes] = Table(
        topic_name, bootstrap_servers=bootstrap, checkpoints=url, background=False, state=2
    )
    report = again.start()
    try:
        assert (report.checkpoint, report.replayed_records) == (2, 0)
        assert dict(again.raw_items()) == expected
    finally:
        again.close(checkpoint=False)
