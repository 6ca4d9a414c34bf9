"""What a Spark run reports is what that run did, and its generations do not skip numbers.

Broker: the session's (Apache Kafka; Tansu proved it too); every figure is checked against what the
producer's delivery reports say was written, and every generation is restored by a Python
``Table`` and compared with a full replay of it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from integration.spark.spark_testkit import changelog, digest, replay
from statesnap import CheckpointOptions, Table
from statesnap.blob import open_blob_store
from statesnap.checkpoint import CheckpointRepository
from statesnap.durations import parse_duration
from statesnap.spark import materialize_stream
from statesnap.spark.bootstrap import BootstrapSpec, run_bootstrap

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def _repo(url: str) -> CheckpointRepository:
    store = open_blob_store(url)
    (location,) = [d for d in store.list_dirs() if d.endswith("_rep")]
    return CheckpointRepository(store, location)


def _restored(bootstrap: str, topic: str, url: str, generation: int) -> tuple[str, int]:
    t = Table(
        topic,
        bootstrap_servers=bootstrap,
        name="rep",
        checkpoints=CheckpointOptions(url, generation=generation),
        background=False,
    )
    t.start()
    try:
        return digest(dict(t.raw_items()))
    finally:
        t.close(checkpoint=False)


def _stream(spark: Any, bootstrap: str, topic: str, url: str, chk: str, interval: str, **kw: Any) -> Any:
    """One run that reads what is there (``availableNow``), then its final checkpoint."""
    m = materialize_stream(
        spark, bootstrap_servers=bootstrap, topic=topic, table="rep",
        checkpoints=CheckpointOptions(url, interval=parse_duration(interval)),
        checkpoint_location=chk, available_now=True, **kw,
    )  # fmt: skip
    m.query.awaitTermination()
    m.stop()
    return m


def test_stream_runs_report_their_own_restore_and_number_generations_consecutively(
    spark: Any, bootstrap: str, topic_name: str, produce: Any, tmp_path: Path
) -> None:
    """Issue 22: after a restart the report named generation 4's writer metadata (restore 0.0 s,
    the records of another run) and generations went 1, 2, 4 — a run's delta files took a data
    directory of their own, i.e. a generation number, before any checkpoint was committed."""
    url, chk = f"file://{tmp_path}/cp", str(tmp_path / "chk")
    history = produce(topic_name, changelog(900, partitions=3, keys=90))
    first = run_bootstrap(spark, BootstrapSpec(bootstrap, topic_name, "rep", CheckpointOptions(url)))
    assert first.manifest.generation == 1

    tail = produce(topic_name, changelog(600, partitions=3, keys=90, seed=3))
    m = _stream(spark, bootstrap, topic_name, url, chk, "1h")
    assert (m.restore.checkpoint, m.restore.replayed_records) == (1, len(tail))
    assert m.restore.restore_seconds > 0
    assert m.caught_up
    assert _repo(url).generations() == [2, 1]

    # Restarted on the same state: several batches, each checkpointed (interval 0s).
    more = produce(topic_name, changelog(600, partitions=3, keys=90, seed=4))
    m = _stream(spark, bootstrap, topic_name, url, chk, "0s", max_offsets_per_trigger=200)
    assert (m.restore.checkpoint, m.restore.replayed_records) == (2, len(more))
    generations = _repo(url).generations()
    assert generations == list(range(len(generations), 0, -1)), generations
    assert len(generations) >= 4
    assert m.last_checkpoint is not None
    assert m.last_checkpoint.generation == generations[0]
    assert _restored(bootstrap, topic_name, url, generations[0]) == digest(replay(history + tail + more))


def test_a_batch_abandoned_after_its_files_never_lends_them_to_another_run(
    spark: Any, bootstrap: str, topic_name: str, produce: Any, tmp_path: Path
) -> None:
    """Delta files now share the data directory of the checkpoint they build on, so a file a
    crashed run left there (written, never journaled) must not be taken for a new run's file of
    the same batch id: here Spark's state is lost too, so batch 0 comes again with another range."""
    url, chk = f"file://{tmp_path}/cp", str(tmp_path / "chk")
    history = produce(topic_name, changelog(800, partitions=2, keys=70))
    run_bootstrap(spark, BootstrapSpec(bootstrap, topic_name, "rep", CheckpointOptions(url)))
    tail = produce(topic_name, changelog(800, partitions=2, keys=70, seed=5))

    def crash(stage: str, _number: int) -> None:
        if stage == "deltas":
            raise RuntimeError("crash after the delta files")

    m = materialize_stream(
        spark, bootstrap_servers=bootstrap, topic=topic_name, table="rep", checkpoints=url,
        checkpoint_location=chk, available_now=True, max_offsets_per_trigger=300, observer=crash,
    )  # fmt: skip
    with pytest.raises(Exception, match="crash after the delta files"):
        m.query.awaitTermination()
    m.stop(checkpoint=False)
    left = sorted(p.name for p in (tmp_path / "cp").glob("*_rep/data/*/*delta*"))
    assert left, "the crashed batch wrote no delta file"
    shutil.rmtree(chk)  # Spark forgets its batches: the next run's batch 0 reads another range

    m = _stream(spark, bootstrap, topic_name, url, chk, "1h")
    assert m.restore.replayed_records == len(tail)
    generations = _repo(url).generations()
    assert generations == [2, 1]
    assert _repo(url).verify(2).ok
    assert _restored(bootstrap, topic_name, url, 2) == digest(replay(history + tail))


def test_bootstrap_reports_this_run(
    spark: Any, bootstrap: str, topic_name: str, produce: Any, tmp_path: Path
) -> None:
    """A bootstrap's figures are measured by the run (the CLI copied ``duration_seconds`` into
    both restore and checkpoint seconds); with nothing new it says so instead of repeating the
    previous run's; progress is reported while the job runs and ends with every task."""
    url = f"file://{tmp_path}/cp"
    history = produce(topic_name, changelog(1200, partitions=3, keys=100))
    heard: list[tuple[int, int, int]] = []
    first = run_bootstrap(
        spark, BootstrapSpec(bootstrap, topic_name, "rep", CheckpointOptions(url)),
        progress=lambda *figures: heard.append(figures),
    )  # fmt: skip
    assert first.written
    assert (first.restore.checkpoint, first.restore.replayed_records) == (None, len(history))
    assert first.restore.restore_seconds > 0
    assert first.checkpoint_seconds > 0
    assert first.checkpoint_seconds != first.restore.restore_seconds
    assert heard
    assert heard[-1] == (len(history), 3, 3)

    again = run_bootstrap(spark, BootstrapSpec(bootstrap, topic_name, "rep", CheckpointOptions(url)))
    assert not again.written
    assert again.manifest.generation == first.manifest.generation
    assert (again.restore.checkpoint, again.restore.replayed_records) == (first.manifest.generation, 0)
    assert again.checkpoint_seconds == 0.0
