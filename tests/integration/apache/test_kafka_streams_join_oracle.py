"""statesnap's joins against Kafka Streams itself (issue #33's proof, item 4).

Kafka Streams 4.1 (``tests/oracle/kafka-streams``'s ``JoinOracle``) and a statesnap
:class:`~statesnap.Processor` read the same generated inputs on the suite's Apache Kafka broker:
three co-partitioned topics (a left and a right stream, a table), three partitions, JSON values
``{"id": N}``, stream time advancing with jitter, and on purpose records out of order within the
grace period, late ones (behind their window, within and beyond the buffers' retention), ones
exactly on the join window's bounds and one millisecond-pair outside, null keys (some far ahead:
in Kafka Streams they advance the join's stream time) and null values (skipped; in the table, a
delete). The windowed inner, left and outer joins and the stream–table inner and left joins
must send the same records — key, joined value and timestamp — as Kafka Streams.

Left records have even timestamps and right and table records odd ones: a tie across inputs is
taken in an order neither system promises (Kafka Streams' by its priority queue, statesnap's by
input order), so the generator makes none. Output records with a null key (Kafka Streams'
KIP-962 left/outer results) go to a partition of the producer's choosing, so results are compared
as one multiset over all partitions. Skipped with the reason where Java or Maven is missing.
"""

from __future__ import annotations

import json
import random
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka import KafkaError as RdKafkaError

from integration.conftest import KafkaTool
from oracle.streams import JoinTopics, OracleUnavailableError, oracle_classpath, run_join_oracle
from statesnap import JoinWindows, Processor

PARTITIONS = 3
BEFORE_MS, AFTER_MS, GRACE_MS = 3_001, 1_999, 2_000  # odd bounds: a right record can sit on one
RETENTION_MS = BEFORE_MS + AFTER_MS + GRACE_MS
BASE_MS = 1_790_000_000_000
JOINS = ("inner", "left", "outer", "table-inner", "table-left")


@pytest.fixture(scope="module")
def classpath() -> str:
    try:
        return oracle_classpath()
    except OracleUnavailableError as e:
        pytest.skip(str(e))


@dataclass(frozen=True)
class Event:
    topic: str  # "left", "right" or "table"
    partition: int
    key: str | None
    value: dict[str, int] | None
    timestamp: int


def _parity(ts: int, topic: str) -> int:
    ts = max(ts, 2)
    even = ts - ts % 2
    return even if topic == "left" else even + 1


def generate(seed: int, n: int) -> list[Event]:
    """*n* events: mostly in order, with every kind of record the join rules differ on."""
    rng = random.Random(seed)
    now = BASE_MS
    recent: dict[tuple[str, str], int] = {}  # (topic, key) -> a recent timestamp
    out: list[Event] = []
    for i in range(n):
        now += rng.randrange(0, 300)
        topic = rng.choices(("left", "right", "table"), (4, 4, 2))[0]
        key: str | None = f"k{rng.randrange(15)}"
        draw = rng.random()
        if draw < 0.10:
            ts = now - rng.randrange(0, GRACE_MS)  # out of order, within grace
        elif draw < 0.15:
            ts = now - rng.randrange(AFTER_MS + GRACE_MS, RETENTION_MS)  # late, still buffered
        elif draw < 0.18:
            ts = now - rng.randrange(2 * RETENTION_MS, 4 * RETENTION_MS)  # beyond retention
        elif draw < 0.30 and topic != "table":
            other = "right" if topic == "left" else "left"
            partner = recent.get((other, key or ""), now)
            # On a bound of the partner's window, or just outside it (bounds are odd, left even).
            if topic == "right":
                ts = rng.choice(
                    (partner + AFTER_MS, partner - BEFORE_MS, partner + AFTER_MS + 2, partner - BEFORE_MS - 2)
                )
            else:
                ts = rng.choice(
                    (partner - AFTER_MS, partner + BEFORE_MS, partner - AFTER_MS - 2, partner + BEFORE_MS + 2)
                )
        elif draw < 0.32:
            key, ts = None, now + rng.randrange(RETENTION_MS, 3 * RETENTION_MS)  # null key, far ahead
        elif draw < 0.35:
            key, ts = None, now
        else:
            ts = now
        ts = _parity(ts, topic)
        value = None if rng.random() < 0.06 else {"id": i}
        if key is not None:
            recent[(topic, key)] = ts
        partition = rng.randrange(PARTITIONS) if key is None else zlib.crc32(key.encode()) % PARTITIONS
        out.append(Event(topic, partition, key, value, ts))
    return out


def produce(bootstrap: str, topics: JoinTopics, events: list[Event]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    failed: list[str] = []
    for e in events:
        producer.produce(
            getattr(topics, e.topic),
            None if e.value is None else json.dumps(e.value).encode(),
            None if e.key is None else e.key.encode(),
            partition=e.partition,
            timestamp=e.timestamp,
            on_delivery=lambda err, _msg: failed.append(str(err)) if err is not None else None,
        )
        producer.poll(0)
    assert producer.flush(30) == 0, "records left undelivered"
    assert not failed, failed[:3]


Result = tuple[str | None, str, int]


def results(bootstrap: str, topic: str, timeout: float = 30.0) -> Counter[Result]:
    """Every record of *topic*, as (key, joined value as canonical JSON, timestamp), counted."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "test-join-oracle",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    out: Counter[Result] = Counter()
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        eof: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(eof) < PARTITIONS:
            assert time.monotonic() < deadline, f"reading {topic} timed out"
            for m in c.consume(1000, 0.1):
                err = m.error()
                if err is not None:
                    assert err.code() == RdKafkaError._PARTITION_EOF, err
                    eof.add(m.partition() or 0)
                    continue
                raw_key, raw_value = m.key(), m.value()
                assert raw_value is not None, m
                key = None if raw_key is None else raw_key.decode()
                value = json.dumps(json.loads(raw_value), sort_keys=True)
                out[(key, value, m.timestamp()[1])] += 1
    finally:
        c.close()
    return out


def processor(bootstrap: str, topics: JoinTopics, out: str) -> Processor:
    """The same joins, as a statesnap user writes them."""
    proc = Processor(
        f"join-oracle-{uuid.uuid4().hex[:8]}", [topics.left, topics.right, topics.table],
        bootstrap_servers=bootstrap, key_serde="string", value_serde="json",
    )  # fmt: skip
    window = JoinWindows.of(f"{AFTER_MS}ms", grace=f"{GRACE_MS}ms").before(f"{BEFORE_MS}ms")
    for how in ("inner", "left", "outer"):
        proc.join(how, left=topics.left, right=topics.right, window=window, how=how, to=f"{out}-{how}")
    for how in ("inner", "left"):
        proc.join_table(
            f"table-{how}", stream=topics.left, table=topics.table, how=how, to=f"{out}-table-{how}"
        )
    return proc


def test_joins_equal_kafka_streams(classpath: str, kafka: KafkaTool, bootstrap: str, tmp_path: Path) -> None:
    """Apache Kafka: windowed inner/left/outer stream–stream joins and inner/left stream–table
    joins over 6,000 records with out-of-order, late, boundary, null-key and null-value records
    send exactly Kafka Streams' records (key, value, timestamp); 1,322 inner, 2,687 left,
    4,087 outer, 1,936 and 2,216 stream–table results at seed 33."""
    del classpath
    tag = uuid.uuid4().hex[:8]
    topics = JoinTopics(*(kafka.create_topic(f"join-{side}-{tag}", PARTITIONS) for side in ("l", "r", "t")))
    prefix, out = f"jo{tag}", f"js{tag}"
    for name in JOINS:
        kafka.create_topic(f"{prefix}-{name}", PARTITIONS)
        kafka.create_topic(f"{out}-{name}", PARTITIONS)
    events = generate(seed=33, n=6000)
    produce(bootstrap, topics, events)

    window = (BEFORE_MS, AFTER_MS, GRACE_MS)
    assert run_join_oracle(bootstrap, topics, prefix, tmp_path / "streams", window) == len(events)
    processor(bootstrap, topics, out).run(follow=False)

    sent: dict[str, Counter[Result]] = {}
    for name in JOINS:
        want, got = results(bootstrap, f"{prefix}-{name}"), results(bootstrap, f"{out}-{name}")
        sent[name] = want
        missing, extra = want - got, got - want
        assert want, f"{name}: Kafka Streams sent nothing"
        assert not missing, (
            f"{name}: {missing.total()} of Kafka Streams' {want.total()} results missing, "
            f"e.g. {sorted(missing, key=str)[:3]}"
        )
        assert not extra, (
            f"{name}: {extra.total()} results Kafka Streams did not send, e.g. {sorted(extra, key=str)[:3]}"
        )

    # The input exercised every rule: unmatched records at close on each outer side, and the
    # null-key records an outer side sends at once (KIP-962).
    def count(name: str, where: Callable[[str | None, dict[str, Any]], bool]) -> int:
        return sum(n for (key, value, _ts), n in sent[name].items() if where(key, json.loads(value)))

    assert count("left", lambda _k, v: v["right"] is None) > 0
    assert count("outer", lambda _k, v: v["left"] is None) > 0
    assert count("table-left", lambda _k, v: v["right"] is None) > 0
    for name in ("left", "outer", "table-left"):
        assert count(name, lambda k, _v: k is None) > 0, f"{name}: no null-key record was sent"
