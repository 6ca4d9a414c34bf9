"""Cross-engine equivalence: checkpoints written by Spark restore in Python and the other way.

Invariant under test (DESIGN.md): ``restore(checkpoint) + replay(tail) == replay(everything)``,
compared by table digest against a full replay of what the broker acknowledged.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from integration.spark.spark_testkit import changelog, digest, replay
from statesnap import CheckpointOptions, Table
from statesnap.checkpoint import CheckpointRepository
from statesnap.errors import BrokerUnavailableError, TableNotFoundError, TopicNotFoundError
from statesnap.spark import bootstrap as spark_bootstrap
from statesnap.spark import read_table

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def _restore(
    bootstrap_servers: str, topic: str, url: str, options: dict[str, str], table: str
) -> tuple[tuple[str, int], Any]:
    t = Table(
        topic,
        bootstrap_servers=bootstrap_servers,
        name=table,
        checkpoints=CheckpointOptions(url, storage_options=options),
        background=False,
    )
    report = t.start()
    try:
        return digest(dict(t.raw_items())), report
    finally:
        t.close(checkpoint=False)


def _spark_digest(df: Any) -> tuple[str, int]:
    return digest({r["key"]: r["value"] for r in df.select("key", "value").collect()})


# S3 is the long variant: Spark writing checkpoints to S3 (options travelling to executors) is proven
# by default by test_cli_engines.py's spark-blob matrix (moto) and spark_cluster/test_cluster.py.
@pytest.mark.parametrize(
    "checkpoint_location", ["file", pytest.param("s3", marks=pytest.mark.long)], indirect=True
)
def test_spark_bootstrap_restores_in_python_and_continues_incrementally(
    spark: Any, bootstrap: str, topic_name: str, produce: Any, checkpoint_location: Any
) -> None:
    url, options = checkpoint_location.url, checkpoint_location.options
    history = produce(topic_name, changelog(3000, partitions=3, keys=240))

    # 3 partitions, at least 6 tasks: partitions are split, so the two-stage merge runs too.
    first = spark_bootstrap(
        spark,
        bootstrap_servers=bootstrap,
        topic=topic_name,
        table="orders",
        checkpoints=CheckpointOptions(url, storage_options=options),
        min_partitions=6,
    )
    assert first.writer["engine"] == "spark"
    assert first.writer["mode"] == "full"
    assert first.writer["spark_tasks"] >= 6
    assert first.writer["tasks"] == ["spark-bootstrap"]  # the snapshot task
    assert first.writer["records_read"] == len(history)
    ends = {p: max(d.offset for d in history if d.partition == p) + 1 for p in range(3)}
    assert first.offsets == ends  # last offset actually read + 1, not the under-reported watermark
    assert all(len(pc.files) == 1 and pc.files[0].kind == "base" for pc in first.partitions.values())

    tail = produce(topic_name, changelog(500, partitions=3, keys=240, seed=1))
    expected = digest(replay(history + tail))
    got, report = _restore(bootstrap, topic_name, url, options, "orders")
    assert report.checkpoint == first.generation
    assert report.replayed_records == len(tail)
    assert got == expected

    second = spark_bootstrap(
        spark,
        bootstrap_servers=bootstrap,
        topic=topic_name,
        table="orders",
        checkpoints=CheckpointOptions(url, storage_options=options),
    )
    assert second.generation > first.generation
    assert second.writer["mode"] == "incremental"
    assert second.writer["base_generation"] == first.generation
    assert second.writer["records_read"] == len(tail)  # only the records after gen 1's offsets
    got, report = _restore(bootstrap, topic_name, url, options, "orders")
    assert (report.checkpoint, report.replayed_records) == (second.generation, 0)
    assert got == expected
    assert _spark_digest(read_table(spark, url, "orders", storage_options=options)) == expected
    assert _spark_digest(
        read_table(spark, url, "orders", generation=first.generation, storage_options=options)
    ) == digest(replay(history))

    # Nothing new: no new generation.
    again = spark_bootstrap(
        spark,
        bootstrap_servers=bootstrap,
        topic=topic_name,
        table="orders",
        checkpoints=CheckpointOptions(url, storage_options=options),
    )
    assert again.generation == second.generation


def test_read_table_of_a_python_checkpoint(
    spark: Any, bootstrap: str, topic_name: str, produce: Any, tmp_path: Any
) -> None:
    url = f"file://{tmp_path}/cp"
    history = produce(topic_name, changelog(1200, partitions=2, keys=90, tombstone_every=5))
    t = Table(topic_name, bootstrap_servers=bootstrap, checkpoints=url, background=False)
    t.start()
    t.close()  # a clean close writes a checkpoint
    df = read_table(spark, url, topic_name)
    assert df.columns == ["key", "value", "offset", "timestamp", "partition"]
    rows = df.collect()
    truth = replay(history)
    assert _spark_digest(df) == digest(truth)
    assert len(rows) == len(truth)
    newest = {}
    for d in history:
        newest[d.key] = d
    assert all(
        r["offset"] == newest[r["key"]].offset and r["partition"] == newest[r["key"]].partition for r in rows
    )

    # A tail on top of the Python checkpoint, checkpointed again by Spark.
    tail = produce(topic_name, changelog(300, partitions=2, keys=90, seed=3))
    manifest = spark_bootstrap(
        spark, bootstrap_servers=bootstrap, topic=topic_name, table=topic_name, checkpoints=url
    )
    assert manifest.writer["records_read"] == len(tail)
    assert _spark_digest(read_table(spark, url, topic_name)) == digest(replay(history + tail))


def test_bootstrap_and_read_table_fail_with_typed_errors(
    spark: Any, bootstrap: str, topic_name: str, tmp_path: Any
) -> None:
    url = str(tmp_path / "cp")
    with pytest.raises(TopicNotFoundError, match=topic_name):
        spark_bootstrap(spark, bootstrap_servers=bootstrap, topic=topic_name, table="t", checkpoints=url)
    with pytest.raises(BrokerUnavailableError, match=r"127\.0\.0\.1:9"):
        spark_bootstrap(
            spark, bootstrap_servers="127.0.0.1:9", topic=topic_name, table="t", checkpoints=url, timeout=2
        )
    with pytest.raises(TableNotFoundError, match="nothing-here"):  # the one "locate the table" error
        read_table(spark, url, "nothing-here")


def test_repository_layout_is_the_shared_contract(
    spark: Any, bootstrap: str, topic_name: str, produce: Any, tmp_path: Any
) -> None:
    """Files land where every reader looks: <cluster>_<table>/data/<gen>/p<part>-base-<n>.parquet
    (n drawn once per run: a run joining a failed run's generation never reuses its files)."""
    from statesnap.blob import open_blob_store

    produce(topic_name, changelog(100, partitions=2, keys=10))
    manifest = spark_bootstrap(
        spark, bootstrap_servers=bootstrap, topic=topic_name, table="lay", checkpoints=str(tmp_path)
    )
    repo = CheckpointRepository.for_table(open_blob_store(str(tmp_path)), manifest.cluster_id, "lay")
    assert repo.generations() == [manifest.generation]
    assert repo.verify(manifest.generation).ok
    paths = sorted(f.path for f in manifest.files)
    assert [re.sub(r"-base-\d+\.", "-base-N.", path) for path in paths] == [
        f"data/{manifest.generation:020d}/p{p:05d}-base-N.parquet" for p in range(2)
    ]
    assert len({path.rsplit("-", 1)[1] for path in paths}) == 1  # one run, one number


def test_a_bootstrap_joining_a_failed_runs_generation_writes_its_own_files(
    spark: Any, bootstrap: str, topic_name: str, produce: Any, tmp_path: Any
) -> None:
    """A failed run leaves its snapshot CREATED and a partition's base file (of the records it had
    read) in that generation. The next run joins the generation after more records arrived: it
    must write its own files, never adopt the failed run's same-named file, whose rows stop short
    of the offsets the new checkpoint claims (a silent loss: restore would skip those records)."""
    from statesnap.blob import open_blob_store
    from statesnap.snapshot.api import SnapshotApi

    url = str(tmp_path)
    history = produce(topic_name, changelog(200, partitions=2, keys=20))
    first = spark_bootstrap(spark, bootstrap_servers=bootstrap, topic=topic_name, table="t", checkpoints=url)
    repo = CheckpointRepository.for_table(open_blob_store(url), first.cluster_id, "t")
    open_generation = SnapshotApi.for_repo(repo, "t").create().generation
    stale = repo.merge_files(first.partitions[0].files)  # what a run that read no further had
    for n in range(3):  # wherever the run would have put it
        repo.write_file(open_generation, 0, "base", n, stale)
    tail = produce(topic_name, changelog(100, partitions=2, keys=20, seed=3))

    joined = spark_bootstrap(spark, bootstrap_servers=bootstrap, topic=topic_name, table="t", checkpoints=url)
    assert joined.generation == open_generation
    got, report = _restore(bootstrap, topic_name, url, {}, "t")
    assert (report.checkpoint, report.replayed_records) == (open_generation, 0)
    assert got == digest(replay(history + tail))
