"""A windowed join with ``exactly_once=True`` SIGKILLed again and again while it works through its
inputs sends each joined result exactly once.

A child process (``join_child.py``: an outer join, checkpoints at every 20 ms commit point) is
killed at random moments of its catch-up over two co-partitioned inputs with out-of-order
records, restarted, and finally run to the end. Its output, read ``read_committed``, must equal
— record for record: key, value, timestamp — what one uninterrupted run of the same join sends:
no pair and no unmatched record lost, none twice. Apache Kafka (transactions, ``read_committed``,
CreateTime timestamps).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from faults.harness import Location, cli_env
from faults.join_child import build
from integration.conftest import KafkaTool
from statesnap.devstack import ApacheKafkaBroker

PARTITIONS = 3
CHILD = Path(__file__).with_name("join_child.py")
Result = tuple[str | None, bytes, int]


@pytest.fixture(scope="module")
def kafka(apache_kafka: ApacheKafkaBroker) -> Iterator[KafkaTool]:
    """This module's broker is Apache Kafka (transactions), not the suite's Tansu."""
    tool = KafkaTool(apache_kafka.bootstrap_servers)
    yield tool
    tool.close()


def produce(kafka: KafkaTool, left: str, right: str, n: int, seed: int) -> None:
    """*n* records over both inputs, event times a few ms apart, one in eight up to 700 ms back."""
    rng = random.Random(seed)
    producer = kafka.producer
    clock = int(time.time() * 1000) - 600_000
    for i in range(n):
        clock += rng.randrange(0, 6)
        ts = clock - rng.randrange(1, 700) if rng.random() < 0.125 else clock
        k = rng.randrange(60)
        topic = left if rng.random() < 0.5 else right
        producer.produce(
            topic, json.dumps({"id": i}).encode(), b"k%02d" % k, partition=k % PARTITIONS, timestamp=ts
        )
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0


def committed_records(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes, int]]:
    """(key, value, timestamp) of every committed record of *topic*: a plain ``read_committed``
    consumer to every partition's EOF, not statesnap."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-truth-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    out: list[tuple[bytes | None, bytes, int]] = []
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        eof: set[int] = set()
        deadline = time.monotonic() + 60
        while len(eof) < PARTITIONS:
            assert time.monotonic() < deadline, f"reading {topic} timed out"
            for m in consumer.consume(1000, 0.1):
                err = m.error()
                if err is not None:
                    assert err.code() == KafkaError._PARTITION_EOF, err
                    eof.add(m.partition() or 0)
                    continue
                value = m.value()
                assert value is not None
                out.append((m.key(), value, m.timestamp()[1]))
    finally:
        consumer.close()
    return out


def results(bootstrap: str, topic: str) -> Counter[Result]:
    """The committed records of *topic* as a multiset of (key as text, value, timestamp)."""
    return Counter(
        (None if key is None else key.decode(), value, ts)
        for key, value, ts in committed_records(bootstrap, topic)
    )


def child(
    kafka: KafkaTool, topics: tuple[str, str, str], loc: Location, how: str, log: Path
) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, str(CHILD), kafka.bootstrap, *topics, loc.cli_url, how],
            stdout=out, stderr=out, stdin=subprocess.DEVNULL, env=cli_env(loc.cli_env),
            start_new_session=True,
        )  # fmt: skip


def test_sigkill_never_loses_or_repeats_a_join_result(
    kafka: KafkaTool, new_topic: object, new_location: object, tmp_path: Path
) -> None:
    """Apache Kafka: an exactly-once outer join killed 3 times mid-catch-up, then run to the end,
    sends exactly the results of one uninterrupted run (``read_committed``)."""
    left, right = new_topic(PARTITIONS, "jl"), new_topic(PARTITIONS, "jr")  # type: ignore[operator]
    output, reference = new_topic(PARTITIONS, "jout"), new_topic(PARTITIONS, "jref")  # type: ignore[operator]
    seed = int(uuid.uuid4().hex[:8], 16)
    produce(kafka, left, right, 40_000, seed)
    build(kafka.bootstrap, left, right, reference, None, exactly_once=False).run(follow=False)
    want = results(kafka.bootstrap, reference)
    assert want, "the join sent nothing"

    loc: Location = new_location("file")  # type: ignore[operator]
    log = tmp_path / "join.log"
    rng = random.Random(seed)
    committed = [0]
    for _ in range(3):
        proc = child(kafka, (left, right, output), loc, "follow", log)
        try:
            deadline = time.monotonic() + 60
            # It commits again — unless an earlier round already committed everything (a restart
            # of a caught-up join has nothing to add).
            while committed[-1] < want.total() and results(kafka.bootstrap, output).total() <= committed[-1]:
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, "a restarted join committed nothing in 60 s"
                time.sleep(0.2)
            time.sleep(rng.uniform(0, 0.5))
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
        committed.append(results(kafka.bootstrap, output).total())
    final = child(kafka, (left, right, output), loc, "once", log)
    try:
        assert final.wait(120) == 0, log.read_text()[-3000:]
    finally:
        if final.poll() is None:
            os.kill(final.pid, signal.SIGKILL)
    got = results(kafka.bootstrap, output)
    lost, twice = want - got, got - want
    # The first kill lands mid-catch-up; on a fast machine a later one may come once it is done
    # (a restart of a caught-up join: fine, and still judged below).
    assert committed[1] < want.total(), f"the first kill came after the catch-up: {committed}"
    assert not lost, (
        f"{lost.total()} of {want.total()} join results lost (seed {seed}), e.g. {list(lost)[:3]}"
    )
    assert not twice, (
        f"{twice.total()} join results sent twice or foreign (seed {seed}), e.g. {list(twice)[:3]}"
    )
    print(json.dumps({"results": want.total(), "committed_at_kills": committed, "seed": seed}))
