"""Consistent snapshots across three table instances in separate processes (real broker).

Proves the snapshot protocol of DESIGN.md point 3 on the session's broker (Apache Kafka; Tansu proved it too)
with a file:// checkpoint store: every task reports after a commit, the snapshot completes only when all
partitions are in, stale reports are fenced, and a killed instance fails the snapshot instead of letting it
complete with a partition missing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from integration.conftest import restored_digest
from statesnap import CheckpointOptions, Follower, StaticShare
from statesnap.digest import table_digest
from statesnap.errors import StaleGenerationError
from statesnap.kafka.config import KafkaSettings
from statesnap.sample import SampleSpec, produce_sample, sample_records
from statesnap.snapshot.api import SnapshotApi
from statesnap.snapshot.model import SnapshotState, TaskSnapshot

pytestmark = pytest.mark.integration

STATESNAP = [sys.executable, "-m", "statesnap.cli"]
PARTITIONS = 8


def SAMPLE(topic: str) -> SampleSpec:  # noqa: N802 - reads like a constant
    return SampleSpec(topic, PARTITIONS, 500, 5000, 0.05, 20, 1)


def ground_truth(topic: str, live_writes: int) -> dict[bytes, bytes]:
    """The table computed straight from what was produced: last write per key, tombstones delete."""
    table: dict[bytes, bytes] = {}
    for key, value in sample_records(SAMPLE(topic)):
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value
    for i in range(live_writes):
        table[b"key-%d" % (i % 500)] = b"live-%d" % i
    return table


def statesnap(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*STATESNAP, *args], capture_output=True, text=True, timeout=timeout, check=False)


class Instances:
    """``statesnap materialize --follow --instance I --instances N`` processes."""

    def __init__(self, bootstrap: str, topic: str, url: str, n: int) -> None:
        self.args = (bootstrap, topic, url, n)
        self.procs: dict[int, subprocess.Popen[str]] = {}

    def start(self, i: int) -> None:
        bootstrap, topic, url, n = self.args
        self.procs[i] = subprocess.Popen(
            [
                *STATESNAP,
                "materialize",
                "-b",
                bootstrap,
                "-t",
                topic,
                "--checkpoints",
                url,
                "--follow",
                "--instance",
                str(i),
                "--instances",
                str(n),
                "--commit-interval",
                "1s",
                "--checkpoint-interval",
                "1h",
                "--snapshot-timeout",
                "30s",
                "-q",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def kill(self, i: int) -> None:
        proc = self.procs.pop(i)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.procs.clear()


class ContinuousWriter(threading.Thread):
    """Keeps appending upserts so the snapshot is taken under load; remembers what it wrote."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "linger.ms": 5, "partitioner": "murmur2_random"}
        )
        self.topic = topic
        self.stop = threading.Event()
        self.written = 0

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            for _ in range(200):
                self.producer.produce(self.topic, b"live-%d" % i, b"key-%d" % (i % 500))
                i += 1
            self.producer.poll(0)
            time.sleep(0.02)
        assert self.producer.flush(30) == 0
        self.written = i


@pytest.fixture
def cluster(bootstrap: str, topic_name: str, tmp_path: Path) -> Iterator[tuple[Instances, str]]:
    produce_sample(KafkaSettings(bootstrap), SAMPLE(topic_name))
    url = str(tmp_path / "ckpt")
    inst = Instances(bootstrap, topic_name, url, 3)
    for i in range(3):
        inst.start(i)
    descriptor = next(iter([]), None)
    deadline = time.monotonic() + 60
    while descriptor is None and time.monotonic() < deadline:
        found = list((tmp_path / "ckpt").glob("*/table.json"))
        descriptor = found[0] if found else None
        time.sleep(0.2)
    assert descriptor is not None, "instances never registered the table"
    time.sleep(3)  # let every instance finish its restore
    yield inst, url
    inst.stop_all()


@pytest.mark.slow
def test_snapshot_across_three_processes_is_consistent(
    cluster: tuple[Instances, str], bootstrap: str, topic_name: str
) -> None:
    _inst, url = cluster
    writer = ContinuousWriter(bootstrap, topic_name)
    writer.start()
    try:
        time.sleep(1)
        out = statesnap(
            "snapshot", "create", url, "--table", topic_name, "--wait", "--timeout", "45s", "--json"
        )
        assert out.returncode == 0, out.stdout + out.stderr
        snap = json.loads(out.stdout)
        assert snap["state"] == "COMPLETED"
        assert sorted(t["task_id"] for t in snap["tasks"]) == ["instance-0", "instance-1", "instance-2"]
        covered = sorted(o["partition"] for t in snap["tasks"] for o in t["offsets"])
        assert covered == list(range(PARTITIONS))
    finally:
        writer.stop.set()
        writer.join()

    generation = snap["generation"]
    # Restore every instance's partitions from that generation, replay the tail: equals a full replay.
    pairs: list[tuple[bytes, bytes]] = []
    for i in range(3):
        t = Follower(
            topic_name,
            bootstrap_servers=bootstrap,
            checkpoints=CheckpointOptions(url, generation=generation),
            partitions=StaticShare(i, 3),
        )
        report = t.start()
        assert report.checkpoint == generation
        pairs.extend(t.raw_items())
        t.close()
    assert table_digest(pairs) == restored_digest(topic_name, bootstrap)  # a full replay
    # Ground truth, independent of statesnap's readers.
    assert table_digest(pairs) == table_digest(ground_truth(topic_name, writer.written).items())

    # A report for a generation that is no longer the current CREATED one is fenced.
    api = SnapshotApi.open(url, topic_name)
    with pytest.raises(StaleGenerationError):
        api.orchestrator.report(generation, TaskSnapshot("instance-0", {(topic_name, 0): 1}))


@pytest.mark.slow
def test_killed_instance_fails_snapshot_then_recovers(
    cluster: tuple[Instances, str], bootstrap: str, topic_name: str
) -> None:
    inst, url = cluster
    inst.kill(1)
    out = statesnap("snapshot", "create", url, "--table", topic_name, "--wait", "--timeout", "4s", "--json")
    snap = json.loads(out.stdout)
    assert out.returncode == 1
    assert snap["state"] == "FAILED"
    assert snap["missing_partitions"] == [1, 4, 7]  # the partitions instance 1 owns
    assert "1, 4, 7" in snap["error"]
    assert "instance-1" not in {t["task_id"] for t in snap["tasks"]}

    inst.start(1)  # the instance returns: a new snapshot completes with all three
    out = statesnap("snapshot", "create", url, "--table", topic_name, "--wait", "--timeout", "45s", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    again = json.loads(out.stdout)
    assert again["generation"] > snap["generation"]
    assert again["state"] == "COMPLETED"
    assert len(again["tasks"]) == 3

    listed = json.loads(statesnap("snapshot", "list", url, "--table", topic_name, "--json").stdout)
    states = {s["generation"]: s["state"] for s in listed}
    assert states[snap["generation"]] == "FAILED"
    assert all(s != "COMPLETED" or not s["missing_partitions"] for s in listed)


def test_snapshot_pin_unpin_delete(cluster: tuple[Instances, str], topic_name: str) -> None:
    _inst, url = cluster
    api = SnapshotApi.open(url, topic_name)
    snap = api.wait(api.create(label="before-migration", pin=True).generation, "45s")
    assert snap.state is SnapshotState.COMPLETED
    assert snap.pinned
    assert snap.label == "before-migration"
    assert snap.generation in api.retained()
    shown = json.loads(
        statesnap("snapshot", "show", url, "--table", topic_name, str(snap.generation), "--json").stdout
    )
    assert shown["pinned"] is True
    assert statesnap("snapshot", "delete", url, "--table", topic_name, str(snap.generation)).returncode == 1
    assert statesnap("snapshot", "unpin", url, "--table", topic_name, str(snap.generation)).returncode == 0
    # Even the newest snapshot can be deleted once unpinned; its generation is never used again.
    assert statesnap("snapshot", "delete", url, "--table", topic_name, str(snap.generation)).returncode == 0
    assert snap.generation not in {s.generation for s in api.list()}
    nxt = api.wait(api.create().generation, "45s")
    assert nxt.state is SnapshotState.COMPLETED
    assert nxt.generation > snap.generation
    assert os.path.exists(url)
