"""Streaming materialization: crash anywhere, restart, and every checkpoint is still a full replay.

Crashes are injected at each step of a micro-batch (after the delta files, after the journal entry,
after the manifest) and by stopping a running query abruptly; Spark then re-runs the last planned
batch with the same batch id. Every committed generation is restored by a Python ``Table`` and
compared with a full replay of what the broker acknowledged.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from integration.spark.spark_testkit import changelog, digest, replay
from statesnap import CheckpointOptions, Table
from statesnap.blob import open_blob_store
from statesnap.checkpoint import CheckpointRepository
from statesnap.durations import parse_duration
from statesnap.errors import CheckpointHistoryLostError
from statesnap.spark import materialize_stream, read_table

pytestmark = [pytest.mark.spark, pytest.mark.integration]


class CrashError(RuntimeError):
    """An injected crash."""


def _restore_digest(bootstrap: str, topic: str, url: str, generation: int | None = None) -> tuple[str, int]:
    t = Table(
        topic,
        bootstrap_servers=bootstrap,
        name="mat",
        checkpoints=CheckpointOptions(url, generation=generation, require=True),
        background=False,
    )
    t.start()
    try:
        return digest(dict(t.raw_items()))
    finally:
        t.close(checkpoint=False)


def _every_generation_is_a_full_replay(bootstrap: str, topic: str, url: str, expected: Any) -> list[int]:
    store = open_blob_store(url)
    (location,) = [d for d in store.list_dirs() if d.endswith("_mat")]
    repo = CheckpointRepository(store, location)
    generations = repo.generations()
    for gen in generations:
        assert repo.verify(gen).ok, gen
        assert _restore_digest(bootstrap, topic, url, gen) == expected, gen
    return generations


def test_crash_at_every_step_then_restart(
    spark: Any, bootstrap: str, topic_name: str, produce: Any, tmp_path: Path
) -> None:
    url, chk = f"file://{tmp_path}/cp", str(tmp_path / "chk")
    history = produce(topic_name, changelog(1500, partitions=3, keys=120))
    crashes = [("deltas", 1), ("journaled", 2), ("checkpointed", None)]
    seen: list[tuple[str, int]] = []

    def observer(stage: str, number: int) -> None:
        seen.append((stage, number))
        if crashes and crashes[0][0] == stage and crashes[0][1] in (None, number):
            crashes.pop(0)
            raise CrashError(f"crash after {stage} {number}")

    def run() -> Any:
        try:
            # A restart first commits what the journal holds: a crash can hit that commit too.
            m = materialize_stream(
                spark,
                bootstrap_servers=bootstrap,
                topic=topic_name,
                table="mat",
                checkpoints=CheckpointOptions(url, interval=timedelta(0)),
                checkpoint_location=chk,
                available_now=True,
                max_offsets_per_trigger=400,
                compact_after=2,
                observer=observer,
            )
        except CrashError:
            return None
        try:
            m.query.awaitTermination()
        except Exception as e:
            if "crash after" not in str(e):
                raise
            m.stop(checkpoint=False)
            return None
        return m

    runs = 0
    while (m := run()) is None:
        runs += 1
        assert runs <= 3
    assert runs == 3
    assert not crashes
    tail = produce(topic_name, changelog(400, partitions=3, keys=120, seed=5))
    assert run() is not None
    final = m.stop()
    assert final is None  # every batch already ended with a checkpoint

    expected = digest(replay(history + tail))
    generations = _every_generation_is_a_full_replay(bootstrap, topic_name, url, expected)
    assert len(generations) >= 4
    assert _restore_digest(bootstrap, topic_name, url) == expected
    df = read_table(spark, url, "mat")
    assert digest({r["key"]: r["value"] for r in df.collect()}) == expected
    store = open_blob_store(url)
    latest = CheckpointRepository(store, store.list_dirs()[0]).latest()
    assert latest is not None
    assert latest.writer["engine"] == "spark"
    assert all(len(pc.files) <= 3 for pc in latest.partitions.values())  # compaction kept up
    assert not list(store.list(store.list_dirs()[0] + "/_spark/"))  # journal cleaned up


def _wait(predicate: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_abrupt_stop_recovers_from_the_journal_and_from_a_lost_journal(
    spark: Any, bootstrap: str, topic_name: str, produce: Any, tmp_path: Path
) -> None:
    url, chk = f"file://{tmp_path}/cp", str(tmp_path / "chk")
    history = produce(topic_name, changelog(1200, partitions=2, keys=80))

    def start(trigger_interval: str = "10s", **kw: Any) -> Any:
        return materialize_stream(
            spark,
            bootstrap_servers=bootstrap,
            topic=topic_name,
            table="mat",
            checkpoints=CheckpointOptions(
                url, interval=timedelta(minutes=30), commit_interval=parse_duration(trigger_interval)
            ),
            checkpoint_location=chk,
            max_offsets_per_trigger=300,
            **kw,
        )

    # 1. A running query with no checkpoint yet is stopped abruptly: only the journal knows.
    m = start(trigger_interval="0.2s")
    _wait(lambda: len(m.pending) >= 2)
    more = produce(topic_name, changelog(300, partitions=2, keys=80, seed=7))
    m.stop(checkpoint=False)
    assert m.repo.generations() == []

    # 2. Restarted on the same checkpointLocation: finished batches come back from the journal
    # and are committed at once, without being read again.
    m = start(available_now=True)
    recovered = m.last_checkpoint
    assert recovered is not None
    assert recovered.writer["batches"] >= 2
    assert recovered.writer["records_read"] == 0
    m.query.awaitTermination()
    first = m.stop()
    assert first is not None
    assert first.writer["base_generation"] == recovered.generation
    expected = digest(replay(history + more))
    assert _restore_digest(bootstrap, topic_name, url) == expected

    # 3. Batches journaled after that checkpoint are lost with the journal (e.g. deleted by hand):
    # the next batch reads again from the checkpoint's offsets instead of Spark's.
    tail = produce(topic_name, changelog(200, partitions=2, keys=80, seed=8))
    m = start(trigger_interval="0.2s")
    _wait(
        lambda: all(
            m.offsets[p] == first.offsets[p] + sum(1 for d in tail if d.partition == p) for p in first.offsets
        )
    )
    m.stop(checkpoint=False)
    shutil.rmtree(tmp_path / "cp" / m.repo.directory / "_spark")
    last = produce(topic_name, changelog(100, partitions=2, keys=80, seed=9))
    m = start(available_now=True)
    assert m.pending == []
    assert m.offsets == first.offsets
    m.query.awaitTermination()
    final = m.stop()
    assert final is not None
    assert final.writer["base_generation"] == first.generation
    assert final.writer["records_read"] == len(tail) + len(last)
    _every_generation_is_a_full_replay(
        bootstrap, topic_name, url, digest(replay(history + more + tail + last))
    )


@pytest.mark.slow
def test_store_wiped_under_the_materializer_stops_it_with_a_typed_error(
    spark: Any, bootstrap: str, topic_name: str, produce: Any, tmp_path: Path
) -> None:
    """Its state is the checkpoint's files: with them gone it must stop and say so, not run on
    without checkpoints; restarted, it rebuilds the table from the topic."""
    url, chk = f"file://{tmp_path}/cp", str(tmp_path / "chk")
    history = produce(topic_name, changelog(400, partitions=2, keys=50))

    def start(trigger_interval: str = "10s", **kw: Any) -> Any:
        trigger = parse_duration(trigger_interval)
        return materialize_stream(
            spark, bootstrap_servers=bootstrap, topic=topic_name, table="mat",
            checkpoints=CheckpointOptions(url, interval=timedelta(0), commit_interval=trigger),
            checkpoint_location=chk, **kw,
        )  # fmt: skip

    m = start(trigger_interval="0.2s")
    _wait(lambda: m.last_checkpoint is not None)
    shutil.rmtree(tmp_path / "cp")
    more = produce(topic_name, changelog(100, partitions=2, keys=50, seed=3))
    _wait(lambda: m.failure is not None and not m.query.isActive, timeout=30)
    assert isinstance(m.failure, CheckpointHistoryLostError)
    m.stop(checkpoint=False)

    m = start(available_now=True)
    m.query.awaitTermination()
    m.stop()
    assert m.last_checkpoint is not None
    assert _restore_digest(bootstrap, topic_name, url) == digest(replay(history + more))


# Long: a crash at every step of a Spark stream is proven by default by
# test_crash_at_every_step_then_restart; this adds the real SIGKILL of a driver process.
@pytest.mark.long
def test_driver_killed_with_sigkill_mid_stream(
    spark: Any, bootstrap: str, topic_name: str, produce: Any, tmp_path: Path
) -> None:
    """The whole driver (Python, JVM and workers) dies with SIGKILL while batches and
    checkpoints are in flight; a new driver on the same checkpointLocation resumes."""
    url, chk = f"file://{tmp_path}/cp", str(tmp_path / "chk")
    history = produce(topic_name, changelog(1800, partitions=2, keys=150))
    child = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).with_name("materialize_child.py")),
            bootstrap,
            topic_name,
            url,
            chk,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        store = open_blob_store(url)

        def generations() -> list[int]:
            dirs = [d for d in store.list_dirs() if d.endswith("_mat")]
            return CheckpointRepository(store, dirs[0]).generations() if dirs else []

        _wait(lambda: len(generations()) >= 2 or child.poll() is not None, timeout=120)
        assert child.poll() is None, "the materializer exited early"
        time.sleep(0.3)  # land somewhere inside a later batch or checkpoint
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(30)

    tail = produce(topic_name, changelog(300, partitions=2, keys=150, seed=11))
    m = materialize_stream(
        spark,
        bootstrap_servers=bootstrap,
        topic=topic_name,
        table="mat",
        checkpoints=CheckpointOptions(url, interval=timedelta(0)),
        checkpoint_location=chk,
        available_now=True,
        max_offsets_per_trigger=600,
        compact_after=2,
    )
    m.query.awaitTermination()
    m.stop()
    expected = digest(replay(history + tail))
    gens = _every_generation_is_a_full_replay(bootstrap, topic_name, url, expected)
    assert m.last_checkpoint is not None
    assert gens[0] == m.last_checkpoint.generation
    assert _restore_digest(bootstrap, topic_name, url) == expected
