"""The commands `statesnap --help` teaches first, run as a new user runs them: ``produce-sample``
into a real broker, then ``materialize`` and ``dump`` of it, and ``demo`` on each engine.

Ground truth is read back with a plain consumer to partition EOF (``KafkaTool``) or from the files
on disk, never through statesnap.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

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
