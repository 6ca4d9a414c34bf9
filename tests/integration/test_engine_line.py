"""The engine and its reason are said once per run, on every run and at every log level: the CLI
prints its engine line, and the library, which logged the same sentence on a table's run (so
``--log-level info`` printed it twice), tells only its listener. Kafka behaviour: none beyond a
topic to read (Apache Kafka, the suite's broker)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

from integration.cli_runner import STATESNAP, ok, statesnap
from integration.conftest import KafkaTool


def test_the_engine_reason_is_said_once_per_run(kafka: KafkaTool, tmp_path: Path) -> None:
    topic = kafka.create_topic(f"engine-line-{uuid.uuid4().hex[:8]}", 2)
    kafka.produce(topic, [(i % 2, b"k%d" % (i % 5), b'{"n": 1}') for i in range(40)])
    materialize = ["materialize", "-b", kafka.bootstrap, "-t", topic, "-c", str(tmp_path / "a")]
    for _ in range(2):  # a first run and an incremental one
        result = statesnap("--log-level", "info", *materialize, "--engine", "auto")
        ok(result)
        assert said_once(result.stderr), result.stderr

    (tmp_path / "app.py").write_text(
        textwrap.dedent(
            f"""
            from statesnap import Processor

            proc = Processor("tally", inputs=[{topic!r}], bootstrap_servers={kafka.bootstrap!r},
                             checkpoints={str(tmp_path / "b")!r}, stores=["n"], value_serde="json")

            @proc.handler
            def count(record, ctx):
                ctx.stores["n"][record.key] = ctx.stores["n"].get(record.key, 0) + 1
            """
        )
    )
    result = statesnap("--log-level", "info", "run", "app:proc", env={"PYTHONPATH": str(tmp_path)})
    ok(result)
    assert said_once(result.stderr), result.stderr
    assert "auto runs processors in python" in result.stderr


def test_a_follow_run_says_it_once_over_its_rounds(kafka: KafkaTool, tmp_path: Path) -> None:
    """A follow run commits and checkpoints every second here, several rounds with records in
    each: the engine line and its reason are said at the start only, not per round or checkpoint."""
    topic = kafka.create_topic(f"engine-follow-{uuid.uuid4().hex[:8]}", 2)
    kafka.produce(topic, [(i % 2, b"k%d" % (i % 5), b"v%d" % i) for i in range(40)])
    log = tmp_path / "stderr.log"
    args = ["--log-level", "info", "materialize", "-b", kafka.bootstrap, "-t", topic, "-c", str(tmp_path)]
    follow = ["--engine", "auto", "--follow", "--checkpoint-interval", "1s", "--commit-interval", "1s"]
    with log.open("w") as err:
        proc = subprocess.Popen(
            [*STATESNAP, *args, *follow],
            stdout=subprocess.DEVNULL,
            stderr=err,
            text=True,
            env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        )
        try:
            deadline = time.monotonic() + 60
            while "following" not in log.read_text():
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
            for round_ in range(4):  # new records in each checkpoint interval
                kafka.produce(topic, [(i % 2, b"k%d" % i, b"r%d" % round_) for i in range(10)])
                time.sleep(1.2)
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    text = log.read_text()
    assert proc.returncode == 0, text
    assert text.count("committed checkpoint") >= 3, text  # it did run in rounds (INFO lines)
    assert said_once(text), text


def said_once(stderr: str) -> bool:
    """Whether the engine line's reason appears in *stderr* once, the line itself included."""
    line = next(line for line in stderr.splitlines() if line.startswith("engine: python ("))
    reason = line.removeprefix("engine: python (").removesuffix(")")
    return stderr.count(reason) == 1
