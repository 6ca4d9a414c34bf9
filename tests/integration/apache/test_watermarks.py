"""High watermarks are exact on Apache Kafka, so the totals statesnap derives from them are too.

Tansu reports the base offset of the last record batch + 1, short of the end whenever that batch
holds several records; statesnap therefore labels these numbers estimates and decides "caught up"
by partition EOF. On Apache Kafka (a plain, uncompacted, non-transactional topic) the engine
choice's backlog, a table's lag and the restore progress total equal the records there are.
Ground truth: the offsets the broker acknowledged to the producer.
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import pytest

from integration.cli_runner import statesnap
from integration.conftest import KafkaTool
from statesnap import Table
from statesnap.kafka.backlog import estimate_backlog, high_watermarks
from statesnap.kafka.config import KafkaSettings

pytestmark = pytest.mark.integration

PARTITIONS = 3


def _records(tag: str, n: int) -> list[tuple[int, bytes, bytes]]:
    return [(i % PARTITIONS, b"k%d" % (i % 500), f"{tag}-{i}".encode()) for i in range(n)]


def test_high_watermarks_are_the_exact_ends(kafka: KafkaTool) -> None:
    """Apache Kafka 4.1.1 proved it: after batched produces (many records per batch, the case
    Tansu under-reports) each partition's high watermark is its last acknowledged offset + 1."""
    topic = kafka.create_topic(f"hw-{uuid.uuid4().hex[:10]}", PARTITIONS)
    produced = kafka.produce(topic, _records("a", 3000))
    ends = high_watermarks(KafkaSettings(kafka.bootstrap), topic, tuple(range(PARTITIONS)))
    assert ends == kafka.end_offsets(produced, range(PARTITIONS))
    assert estimate_backlog(ends, {0: 100}) == 3000 - 100


def test_restore_progress_total_and_lag_are_exact(kafka: KafkaTool, tmp_path: Path) -> None:
    """Apache Kafka 4.1.1 proved it: during a restore, records replayed + the table's lag (from the
    fetched high watermarks) never exceeds the records after the checkpoint and reaches exactly
    that number — the total the CLI's progress bar shows; the lag is 0 once caught up."""
    topic = kafka.create_topic(f"hw-{uuid.uuid4().hex[:10]}", PARTITIONS)
    url = (tmp_path / "cp").as_uri()
    kafka.produce(topic, _records("a", 500))
    t = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)
    t.start()
    assert t.checkpoint() is not None
    t.close(checkpoint=False)
    tail = 40_000  # several consume batches (10 000 records each)
    kafka.produce(topic, _records("b", tail))

    r = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)
    totals: list[int] = []
    report = r.start(progress=lambda records, _done, _total: totals.append(records + sum(r.lag().values())))
    try:
        assert report.replayed_records == tail
        assert totals
        assert max(totals) == tail
        assert all(total <= tail for total in totals)
        assert sum(r.lag().values()) == 0
    finally:
        r.close(checkpoint=False)


def test_the_engine_choice_names_the_exact_backlog(kafka: KafkaTool, tmp_path: Path) -> None:
    """Apache Kafka 4.1.1 proved it: ``statesnap materialize --engine auto`` (run as a user runs
    it) estimates the backlog from high watermarks minus the newest checkpoint's offsets; here
    that is exactly the records produced since the checkpoint."""
    topic = kafka.create_topic(f"hw-{uuid.uuid4().hex[:10]}", PARTITIONS)
    url = (tmp_path / "cp").as_uri()
    kafka.produce(topic, _records("a", 700))
    args = ["materialize", "-b", kafka.bootstrap, "-t", topic, "-c", url, "--engine", "auto"]
    env = {k: "" for k in os.environ if k.startswith("STATESNAP_SPARK")}
    first = statesnap(*args, env=env)
    assert first.returncode == 0, first.stderr
    assert "backlog is 700 records" in first.stderr
    kafka.produce(topic, _records("b", 1234))
    second = statesnap(*args, env=env)
    assert second.returncode == 0, second.stderr
    assert re.search(r"backlog is 1,234 records", second.stderr), second.stderr
