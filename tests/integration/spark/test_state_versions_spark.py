"""Spark writers and state versions (#20), on the dev broker (Tansu; nothing here depends on
broker behaviour beyond produce and consume to partition EOF): a Spark bootstrap records its
state version in the manifest, refuses to continue a checkpoint of another version in one line
(it runs no migrations), and its checkpoint restores in a Python table of that version equal to a
full replay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from integration.spark.spark_testkit import changelog, replay
from statesnap import Table
from statesnap.errors import CheckpointMismatchError, EngineOptionError
from statesnap.spark import bootstrap as spark_bootstrap
from statesnap.spark.bootstrap import BootstrapSpec, run_bootstrap
from statesnap.task.migration import StateVersion
from statesnap.task.options import CheckpointOptions

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def test_spark_bootstrap_records_and_checks_the_state_version(
    spark: Any, bootstrap: str, topic_name: str, produce: Any, tmp_path: Path
) -> None:
    url = str(tmp_path / "cp")
    history = produce(topic_name, changelog(600, partitions=3, keys=60))
    first: Table[bytes, bytes] = Table(
        topic_name, bootstrap_servers=bootstrap, checkpoints=url, background=False, state_version=2
    )
    first.start()
    try:
        written = first.checkpoint()
    finally:
        first.close(checkpoint=False)
    assert written is not None
    assert written.state_version(topic_name) == 2
    history += produce(topic_name, changelog(300, partitions=3, keys=60, seed=1))

    common: dict[str, Any] = {"bootstrap_servers": bootstrap, "topic": topic_name, "table": topic_name}
    with pytest.raises(CheckpointMismatchError, match="newer than this code's version 1"):
        spark_bootstrap(spark, checkpoints=url, **common)
    with pytest.raises(EngineOptionError, match="does not run migrations"):
        run_bootstrap(
            spark,
            BootstrapSpec(
                checkpoints=CheckpointOptions(url), state=StateVersion(3, {2: lambda k, v: (k, v)}), **common
            ),
        )
    manifest = spark_bootstrap(spark, checkpoints=url, state_version=2, **common)
    assert (manifest.generation, manifest.state_version(topic_name)) == (2, 2)

    again: Table[bytes, bytes] = Table(
        topic_name, bootstrap_servers=bootstrap, checkpoints=url, background=False, state_version=2
    )
    report = again.start()
    try:
        assert (report.checkpoint, report.replayed_records) == (2, 0)
        assert dict(again.raw_items()) == replay(history)
    finally:
        again.close(checkpoint=False)
