"""``statesnap run`` as a user runs it (a fresh process of the venv's interpreter) when its outputs
fail: one line on stderr naming the cause, saying the processor stopped; exit non-zero.

On Apache Kafka 4.1.1 (the suite's broker; transactions, no topic creation on use):

- an exactly-once processor fenced by a second instance of its task (same ``transactional.id``)
  stops at its next commit: before the fix its log said "will retry at the next commit point",
  then the background thread logged the failure again, then the command's error line (and
  librdkafka's own FATAL/TXNERR lines);
- a dead-letter topic the cluster does not have stops the run at the first record sent there, at
  once, naming the topic (before the fix: "sent to no-such-dlq", then a failure 30 s later).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer
from confluent_kafka import KafkaError as RdKafkaError

from integration.cli_runner import STATESNAP
from integration.conftest import KafkaTool
from statesnap.devstack.orphans import guarded

pytestmark = pytest.mark.integration

PARTITIONS = 2


def _app(where: Path, *, topic: str, out: str, bootstrap: str, url: str, dlq: str | None = None) -> Path:
    """A user's module ``tally_app.py``: a running tally emitting each total; amounts < 0 fail."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "tally_app.py").write_text(
        textwrap.dedent(
            f"""
            from statesnap import CheckpointOptions, ProcessingOptions, Processor

            proc = Processor("tally", inputs=[{topic!r}], bootstrap_servers={bootstrap!r},
                             checkpoints=CheckpointOptions({url!r}, commit_interval="200ms"),
                             stores=["balances"], value_serde="json", timeout=10,
                             partitions=range({PARTITIONS}),
                             processing=ProcessingOptions(dead_letter_topic={dlq!r}))

            @proc.handler
            def on_payment(record, ctx):
                if record.value["amount"] < 0:
                    raise ValueError("a negative amount")
                balances = ctx.stores["balances"]
                balances[record.key] = balances.get(record.key, 0) + record.value["amount"]
                ctx.emit({out!r}, record.key, balances[record.key])
            """
        )
    )
    return where


def _payments(kafka: KafkaTool, topic: str, amounts: list[int]) -> None:
    kafka.produce(
        topic,
        (
            (i % PARTITIONS, f"acct-{i % 5}".encode(), json.dumps({"amount": a}).encode())
            for i, a in enumerate(amounts)
        ),
    )


def _committed_outputs(bootstrap: str, topic: str) -> int:
    """Records a read_committed consumer sees in *topic* now (to partition EOF)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    seen, ended = 0, set[int]()
    deadline = time.monotonic() + 20
    try:
        while len(ended) < PARTITIONS and time.monotonic() < deadline:
            for msg in consumer.consume(100, 0.2):
                err = msg.error()
                if err is None:
                    seen += 1
                elif err.code() == RdKafkaError._PARTITION_EOF:
                    ended.add(int(msg.partition() or 0))
    finally:
        consumer.close()
    return seen


def test_a_fenced_exactly_once_run_says_so_once(kafka: KafkaTool, topic_name: str, tmp_path: Path) -> None:
    """Apache Kafka: the zombie ``run --follow --exactly-once`` exits non-zero on its own with one
    stderr line naming the fencing and saying the processor stops; nothing says "will retry"."""
    kafka.create_topic(topic_name, PARTITIONS)
    out = kafka.create_topic(f"{topic_name}-out", PARTITIONS)
    _payments(kafka, topic_name, list(range(1, 21)))
    where = _app(
        tmp_path / "app", topic=topic_name, out=out, bootstrap=kafka.bootstrap, url=str(tmp_path / "cp")
    )
    command = [*STATESNAP, "run", "tally_app:proc", "--follow", "--exactly-once", "-q"]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    procs: list[subprocess.Popen[str]] = []

    def start() -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            guarded(command), cwd=where, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        procs.append(proc)
        return proc

    try:
        zombie = start()
        KafkaTool.wait_for(
            lambda: _committed_outputs(kafka.bootstrap, out) >= 20, 90, "the first run's outputs"
        )
        start()  # the same task: its init_transactions fences the zombie
        time.sleep(3)
        _payments(kafka, topic_name, list(range(21, 41)))  # the zombie's next commit fails
        try:
            code = zombie.wait(60)
        except subprocess.TimeoutExpired:
            pytest.fail("the fenced run kept running")
        stderr = zombie.stderr.read() if zombie.stderr else ""
        assert code != 0, stderr
        naming = [line for line in stderr.splitlines() if "fenced" in line]
        assert len(naming) == 1, stderr
        assert "OutputError" in naming[0], stderr
        assert "the processor stops" in naming[0], stderr
        assert "will retry" not in stderr, stderr
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


def test_a_missing_dead_letter_topic_stops_the_run_naming_it(
    kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    """Apache Kafka: ``statesnap run`` of a processor whose dead-letter topic does not exist exits
    non-zero at the first failed record, well within its 10 s timeout, with one line naming the
    topic; nothing says the record was sent."""
    kafka.create_topic(topic_name, PARTITIONS)
    out = kafka.create_topic(f"{topic_name}-out", PARTITIONS)
    dlq = f"no-such-dlq-{uuid.uuid4().hex[:6]}"
    _payments(kafka, topic_name, [1, 2, -3, 4])
    where = _app(
        tmp_path / "app",
        topic=topic_name,
        out=out,
        bootstrap=kafka.bootstrap,
        url=str(tmp_path / "cp"),
        dlq=dlq,
    )
    started = time.monotonic()
    result = subprocess.run(
        [*STATESNAP, "run", "tally_app:proc", "-q"],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    took = time.monotonic() - started
    assert result.returncode != 0, result.stderr
    naming = [line for line in result.stderr.splitlines() if dlq in line]
    assert len(naming) == 1, result.stderr
    assert "TopicNotFoundError" in naming[0], result.stderr
    assert "sent to" not in result.stderr, result.stderr
    assert took < 25, f"took {took:.0f}s (the process start included)"
