"""A Spark-written checkpoint carries the persisted key index of its large bases (issue 21), written
by the executors beside the base file, and a Python table's columnar restore reads it (the whole default path:
task restore, selector, repository, store) and equals a full replay. Broker: Apache Kafka (the suite's broker)
and Tansu (produce, consume and partition EOF are all this needs)."""

from __future__ import annotations

from typing import Any

import pytest

from integration.spark.spark_testkit import changelog, digest, replay
from statesnap import CheckpointOptions, Table
from statesnap.blob import open_blob_store
from statesnap.checkpoint import locate_table
from statesnap.checkpoint.repository import INDEX_MIN_ROWS
from statesnap.spark import bootstrap as spark_bootstrap
from statesnap.stores.columnar import ColumnarStore

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def test_a_spark_bootstrap_writes_the_key_index_of_its_bases(
    spark: Any, bootstrap: str, topic_name: str, produce: Any, tmp_path: Any
) -> None:
    keys = INDEX_MIN_ROWS + 2000
    history = produce(topic_name, changelog(keys, partitions=1, keys=keys, tombstone_every=keys + 1))
    url = f"file://{tmp_path}/cp"
    manifest = spark_bootstrap(
        spark, bootstrap_servers=bootstrap, topic=topic_name, table="big", checkpoints=CheckpointOptions(url)
    )
    base = manifest.partitions[0].files[0]
    assert base.index is not None
    assert base.index.rows == base.rows >= INDEX_MIN_ROWS
    repo = locate_table(open_blob_store(url), "big")
    assert repo.verify(manifest.generation).ok  # the index's size, checksum and header included

    t = Table(
        topic_name,
        bootstrap_servers=bootstrap,
        name="big",
        checkpoints=CheckpointOptions(url),
        store="columnar",
        background=False,
    )
    try:
        report = t.start()
        assert report.checkpoint == manifest.generation
        assert isinstance(t.store, ColumnarStore)
        assert 0 in t.store._base.persisted  # the restore read the index: nothing hashed or sorted
        assert digest(dict(t.raw_items())) == digest(replay(history))
    finally:
        t.close(checkpoint=False)
