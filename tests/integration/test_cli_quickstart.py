"""The commands `statesnap --help` teaches first, run as a new user runs them: ``produce-sample``
into a real broker, then ``materialize`` and ``dump`` of it, and ``demo`` on each engine.

Ground truth is read back with a plain consumer to partition EOF (``KafkaTool``) or from the files
on disk, never through statesnap.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from integration.cli_runner import digest, ok, statesnap
from integration.conftest import KafkaTool
from statesnap.devstack import EmbeddedBroker
from statesnap.materialize import spark_available

pytestmark = pytest.mark.integration


@pytest.fixture
def kafka(broker: EmbeddedBroker) -> Iterator[KafkaTool]:
    """The quick start runs on the embedded Tansu broker, the zero-Java default a new user meets."""
    tool = KafkaTool(broker.bootstrap_servers)
    yield tool
    tool.close()


def test_produce_sample_then_materialize_and_dump_as_the_help_teaches(kafka: Any, tmp_path: Path) -> None:
    """produce-sample creates the topic with the partitions asked for and appends exactly the
    records asked for over the keys asked for, the same changelog for the same seed; the quick
    start's materialize and dump then agree with an independent read of the topic. Tansu."""
    topics = [f"quick-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    for topic in topics:
        produced = ok(
            statesnap(
                "produce-sample", "-b", kafka.bootstrap, "-t", topic, "--partitions", "3", "--keys", "400",
                "--updates", "4000", "--tombstone-ratio", "0.1", "--value-bytes", "40", "--seed", "7",
                "--json",
            )
        )  # fmt: skip
        assert (produced["topic"], produced["records"]) == (topic, 4000)
    first, second = (kafka.read_all(t, range(3)) for t in topics)
    assert len(first) == 4000
    assert {r.partition for r in first} == {0, 1, 2}
    assert {r.key for r in first} <= {b"key-%d" % i for i in range(400)}
    tombstones = sum(r.value is None for r in first)
    assert 250 < tombstones < 550, tombstones  # about 10 % of 4000
    assert all(len(r.value) == 40 for r in first if r.value is not None)
    changelog = sorted((r.partition, r.offset, r.key, r.value) for r in first)
    assert changelog == sorted((r.partition, r.offset, r.key, r.value) for r in second), (
        "same seed, other changelog"
    )

    topic, url = topics[0], str(tmp_path / "ckpt")
    written = ok(statesnap("materialize", "-b", kafka.bootstrap, "-t", topic, "--checkpoints", url, "--json"))
    assert written["written"] is True
    dumped = ok(
        statesnap("dump", "-b", kafka.bootstrap, "-t", topic, "--checkpoints", url, "--digest", "--json")
    )
    truth = kafka.truth(first)
    assert (dumped["keys"], dumped["digest"], dumped["checkpoint"]) == (len(truth), digest(truth), 1)
    listed = ok(statesnap("checkpoints", "list", url, "--table", topic))
    assert re.search(r"\b1\b", listed), listed


@pytest.mark.parametrize("engine", ["python", pytest.param("spark", marks=pytest.mark.spark)])
def test_demo_tells_the_whole_story_on_embedded_services(tmp_path: Path, engine: str) -> None:
    """The README's first command, small: its own broker, a history, a checkpoint by the engine,
    a tail, two restores whose digests agree; the checkpoint it reports is the one on disk, and a
    --dir the user gave is kept."""
    if engine == "spark" and not spark_available():
        pytest.skip("Spark needs pyspark and Java")
    work = tmp_path / "work"
    args = ["demo", "--updates", "12000", "--keys", "1500", "--tail", "2000", "--partitions", "2"]
    chosen = ["--state-store", "columnar"] if engine == "python" else []
    out = ok(statesnap(*args, "--engine", engine, "--dir", str(work), *chosen, "--json"))
    assert (out["engine"], out["digests_equal"]) == (engine, True)
    if engine == "python":  # --state-store (as materialize and run name it) is the store restored into
        assert {r["store"] for r in out["results"].values()} == {"columnar"}, out["results"]
    restored, replayed = out["results"]["checkpoint"], out["results"]["full replay"]
    assert (restored["checkpoint"], restored["replayed"]) == (1, 2000)
    assert (replayed["checkpoint"], replayed["replayed"]) == (None, 14000)
    assert restored["keys"] == replayed["keys"] <= 1500
    files = sorted(work.rglob("*.parquet"))
    assert files, f"no checkpoint files under {work}"
    assert sum(f.stat().st_size for f in files) == out["checkpoint_bytes"]
    keys = [k for f in files for k in pq.read_table(f, columns=["key"]).column("key").to_pylist()]
    assert len(keys) == len(set(keys)) <= 1500
    if engine == "python":  # what a user sees without --json
        text = statesnap(*args, "--engine", engine)
        assert text.returncode == 0, text.stderr[-3000:]
        assert re.fullmatch(
            r"checkpoint restore \d+\.\d\ds vs full replay \d+\.\d\ds: \d+\.\dx faster, digests equal\n",
            text.stdout,
        ), text.stdout
        assert "Traceback" not in text.stderr
        # The verdict once (it was printed to stderr too), and the store auto chose by its name
        # (it said "restored into a auto store"); the table's title may wrap, so whitespace is folded.
        assert "faster" not in text.stderr, text.stderr
        told = " ".join(text.stderr.split())
        assert "restored into a memory store" in told, told


def test_produce_sample_events_for_two_co_partitioned_inputs(kafka: KafkaTool) -> None:
    """``produce-sample --events`` into two topics: every record's timestamp is its event's ``ts``,
    none lies in the future, each key's records sit on the same partition of both topics
    (co-partitioned), and out-of-order, late, tombstone and null-key records are there. Read
    back with a plain consumer to partition EOF (on Tansu, whose watermarks are not trusted)."""
    a, b = f"imp-{uuid.uuid4().hex[:8]}", f"clk-{uuid.uuid4().hex[:8]}"
    args = (
        "produce-sample", "-b", kafka.bootstrap, "-t", a, "-t", b, "--partitions", "3", "--keys", "30",
        "--updates", "2000", "--events", "--out-of-order", "0.2", "--late", "0.05",
        "--tombstone-ratio", "0.05", "--null-key-ratio", "0.05", "--json",
    )  # fmt: skip
    result = ok(statesnap(*args))
    assert result["topics"] == {a: 2000, b: 2000}
    now_ms = time.time() * 1000
    partition_of: dict[str, dict[bytes, set[int]]] = {}
    for topic in (a, b):
        records = _consume_with_timestamps(kafka.bootstrap, topic, 3)
        assert len(records) == 2000
        newest = late = disordered = 0
        for partition, key, value, ts in sorted(
            records, key=lambda r: json.loads(r[2] or b'{"id": -1}')["id"]
        ):
            assert ts <= now_ms + 1000
            if value is not None:
                assert json.loads(value)["ts"] == ts
            if key is not None:
                partition_of.setdefault(topic, {}).setdefault(key, set()).add(partition)
            late += ts < newest - 120_000
            disordered += newest - 120_000 <= ts < newest
            newest = max(newest, ts)
        assert late > 20
        assert disordered > 100
        assert sum(r[2] is None for r in records) > 20
        assert sum(r[1] is None for r in records) > 20
    assert partition_of[a] == partition_of[b]
    assert all(len(parts) == 1 for parts in partition_of[a].values())


def _consume_with_timestamps(
    bootstrap: str, topic: str, partitions: int
) -> list[tuple[int, bytes | None, bytes | None, int]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 10,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    out: list[tuple[int, bytes | None, bytes | None, int]] = []
    at_end: set[int] = set()
    deadline = time.monotonic() + 30
    try:
        while len(at_end) < partitions:
            assert time.monotonic() < deadline, f"{topic}: no partition EOF within 30 s"
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            err, partition = msg.error(), msg.partition()
            assert partition is not None
            if err is not None:
                assert err.code() == KafkaError._PARTITION_EOF, err
                at_end.add(partition)
                continue
            at_end.discard(partition)
            out.append((partition, msg.key(), msg.value(), msg.timestamp()[1]))
    finally:
        consumer.close()
    return out
