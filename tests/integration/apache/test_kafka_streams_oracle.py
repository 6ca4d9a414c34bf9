"""statesnap's aggregations and windows against Kafka Streams itself (issue #33's proof).

Kafka Streams 4.1 (``tests/oracle/kafka-streams``, built with Maven) and a statesnap
:class:`~statesnap.Processor` read the same generated input on the suite's Apache Kafka broker:
three partitions, JSON values ``{"amount": N}``, stream time advancing with jitter, and on
purpose records out of order within the grace period, late ones (their windows closed), ones
exactly on window boundaries, null keys (some far in the future: in Kafka Streams they advance no
aggregation's stream time) and null values (tombstones, which Kafka Streams' aggregations skip).

Each operator's result must equal Kafka Streams' last update per key (per key and window): count,
sum (``aggregate``), max (``reduce``), tumbling and hopping windowed counts; the tumbling count's
final results (``suppress(untilWindowCloses)``) are exactly the windows closed by the end of the
input. A plain loop over the input (the ground truth the suite uses everywhere) checks the
non-windowed aggregates independently of both. Skipped with the reason where Java or Maven is
missing.
"""

from __future__ import annotations

import json
import random
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from integration.conftest import KafkaTool
from oracle.streams import OracleUnavailableError, Windowing, oracle_classpath, run_oracle
from statesnap import Processor, Windows

PARTITIONS = 3
WINDOWING = Windowing(size_ms=60_000, grace_ms=10_000, advance_ms=20_000)
#: A minute-aligned start in 2026, far from the epoch (the epoch's own case is a test below).
BASE_MS = 1_790_000_040_000 - 1_790_000_040_000 % 60_000
#: Operators whose results are one value per key / per (key, window start).
TABLES = ("count", "sum", "max")
WINDOWED = ("tumbling", "hopping")


@pytest.fixture(scope="module")
def classpath() -> str:
    try:
        return oracle_classpath()
    except OracleUnavailableError as e:
        pytest.skip(str(e))


@dataclass(frozen=True)
class Event:
    partition: int
    key: str | None
    value: dict[str, int] | None
    timestamp: int


def partition_of(key: str | None, rng: random.Random) -> int:
    return rng.randrange(PARTITIONS) if key is None else zlib.crc32(key.encode()) % PARTITIONS


def generate(seed: int, n: int, base: int) -> list[Event]:
    """*n* events from *base*: mostly in order, with every kind of record the semantics differ on."""
    rng = random.Random(seed)
    size, grace, advance = WINDOWING.size_ms, WINDOWING.grace_ms, WINDOWING.advance_ms
    now = base
    out: list[Event] = []
    for _ in range(n):
        now += rng.randrange(0, 400)
        key: str | None = f"k{rng.randrange(25)}"
        draw = rng.random()
        if draw < 0.08:
            ts = now - rng.randrange(0, grace)  # out of order, within grace
        elif draw < 0.12:
            ts = now - rng.randrange(grace + size, 3 * size)  # late: its windows have closed
        elif draw < 0.18:
            edge = now // advance * advance  # on a boundary: a window's first or last millisecond
            ts = edge - rng.choice((0, 1))
        elif draw < 0.20:
            key, ts = None, now + rng.randrange(size, 3 * size)  # null key, far ahead
        elif draw < 0.23:
            key, ts = None, now
        else:
            ts = now
        value = None if rng.random() < 0.05 else {"amount": rng.randrange(-40, 100)}
        # A timestamp of 0 would mean "now" to the producer: the earliest is 1 ms.
        out.append(Event(partition_of(key, rng), key, value, max(ts, 1)))
    return out


def produce(bootstrap: str, topic: str, events: list[Event]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    failed: list[str] = []
    for e in events:
        producer.produce(
            topic,
            None if e.value is None else json.dumps(e.value).encode(),
            None if e.key is None else e.key.encode(),
            partition=e.partition,
            timestamp=e.timestamp,
            on_delivery=lambda err, _msg: failed.append(str(err)) if err is not None else None,
        )
        producer.poll(0)
    assert producer.flush(30) == 0, "records left undelivered"
    assert not failed, failed[:3]


def last_updates(kafka: KafkaTool, topic: str) -> dict[str, int]:
    """The last value per key of an oracle output topic (each key's updates are in one partition,
    in order), as Kafka Streams' table holds it at the end."""
    out: dict[str, int] = {}
    for r in kafka.read_all(topic, range(PARTITIONS)):
        assert r.key is not None, r
        assert r.value is not None, r
        out[r.key.decode()] = int(r.value)
    return out


def processor(bootstrap: str, topic: str, windows: dict[str, Windows], out: str) -> Processor:
    """The same operators, as a statesnap user writes them, each emitting its changes to
    ``OUT-<operator>`` and the tumbling count's final results to ``OUT-tumbling-final``; windows
    keep every window for the comparison (retention a day: nothing expires within the input)."""
    proc = Processor(
        f"oracle-{uuid.uuid4().hex[:8]}", [topic], bootstrap_servers=bootstrap, key_serde="string",
        value_serde="json",
    )  # fmt: skip
    proc.count("count", emit="changes", to=f"{out}-count")
    proc.sum("sum", "amount", emit="changes", to=f"{out}-sum")
    proc.reduce("max", max, value="amount", emit="changes", to=f"{out}-max")
    for name, window in windows.items():
        proc.count(name, window=window, emit="changes", to=f"{out}-{name}")
    proc.count("tumbling-final", window=windows["tumbling"], emit="final", to=f"{out}-tumbling-final")
    return proc


def statesnap_results(proc: Processor) -> dict[str, dict[str, int]]:
    proc.start()
    try:
        out: dict[str, dict[str, int]] = {}
        for name in proc.stores:
            items: Iterator[tuple[Any, Any]] = proc.store(name).items()
            if name in TABLES:
                out[name] = {str(k): int(v) for k, v in items}
            elif name in WINDOWED:
                out[name] = {f"{k}@{start}": int(v) for (k, start), v in items}
        return out
    finally:
        proc.close(checkpoint=False)


def plain_loop(events: list[Event]) -> dict[str, dict[str, int]]:
    """Kafka Streams' record rules for the non-windowed aggregations, by definition: records with
    a null key or a null value are skipped."""
    count: dict[str, int] = {}
    total: dict[str, int] = {}
    high: dict[str, int] = {}
    for e in sorted(events, key=lambda e: e.partition):  # per partition in produce order
        if e.key is None or e.value is None:
            continue
        amount = e.value["amount"]
        count[e.key] = count.get(e.key, 0) + 1
        total[e.key] = total.get(e.key, 0) + amount
        high[e.key] = max(high.get(e.key, amount), amount)
    return {"count": count, "sum": total, "max": high}


def windows_of(w: Windowing, retention: str = "1d") -> dict[str, Windows]:
    return {
        "tumbling": Windows.tumbling(f"{w.size_ms}ms", grace=f"{w.grace_ms}ms", retention=retention),
        "hopping": Windows.hopping(
            f"{w.size_ms}ms", advance=f"{w.advance_ms}ms", grace=f"{w.grace_ms}ms", retention=retention
        ),
    }


def updates(kafka: KafkaTool, topic: str, *, statesnap: bool) -> dict[str, list[int]]:
    """Every result sent to *topic*, per key (per ``key@window start``), in the order sent.
    statesnap keeps the input key and sends windows as ``{"start", "end", "value"}``; the oracle
    puts the window in the key."""
    out: dict[str, list[int]] = {}
    for r in kafka.read_all(topic, range(PARTITIONS)):
        assert r.key is not None, r
        assert r.value is not None, r
        value = json.loads(r.value)
        if statesnap and isinstance(value, dict):
            assert value["end"] - value["start"] == WINDOWING.size_ms, value
            key, value = f"{r.key.decode()}@{value['start']}", value["value"]
        else:
            key = r.key.decode()
        out.setdefault(key, []).append(int(value))
    return out


def compare_updates(kafka: KafkaTool, theirs: str, mine: str, names: tuple[str, ...]) -> None:
    """What statesnap sent equals what Kafka Streams sent, update for update, per key."""
    for name in names:
        want = updates(kafka, f"{theirs}-{name}", statesnap=False)
        got = updates(kafka, f"{mine}-{name}", statesnap=True)
        differ = sorted(k for k in want.keys() | got.keys() if want.get(k) != got.get(k))
        shown = ", ".join(f"{k}: statesnap {got.get(k)}, Kafka Streams {want.get(k)}" for k in differ[:3])
        assert not differ, (
            f"{name}: emitted results differ from Kafka Streams' for {len(differ)} keys: {shown}"
        )


def compare(kafka: KafkaTool, prefix: str, got: dict[str, dict[str, int]], names: tuple[str, ...]) -> None:
    for name in names:
        want = last_updates(kafka, f"{prefix}-{name}")
        mine = got[name]
        differ = sorted(k for k in want.keys() | mine.keys() if want.get(k) != mine.get(k))
        shown = ", ".join(f"{k}: statesnap {mine.get(k)}, Kafka Streams {want.get(k)}" for k in differ[:5])
        assert not differ, f"{name}: {len(differ)} of {len(want)} results differ from Kafka Streams: {shown}"


def test_aggregations_and_windows_equal_kafka_streams(
    classpath: str, kafka: KafkaTool, bootstrap: str, tmp_path: Path
) -> None:
    """Apache Kafka: count, sum, reduce, tumbling and hopping windowed counts over 4,000 records
    with out-of-order, late, boundary, null-key and null-value records equal Kafka Streams'."""
    del classpath  # built (or skipped) by the fixture
    topic = kafka.create_topic(f"oracle-in-{uuid.uuid4().hex[:8]}", PARTITIONS)
    prefix, out = f"o{uuid.uuid4().hex[:8]}", f"s{uuid.uuid4().hex[:8]}"
    for name in (*TABLES, *WINDOWED, "tumbling-final"):
        kafka.create_topic(f"{prefix}-{name}", PARTITIONS)
        kafka.create_topic(f"{out}-{name}", PARTITIONS)
    events = generate(seed=33, n=4000, base=BASE_MS)
    produce(bootstrap, topic, events)

    assert run_oracle(bootstrap, topic, prefix, tmp_path / "streams", WINDOWING) == len(events)
    got = statesnap_results(processor(bootstrap, topic, windows_of(WINDOWING), out))

    truth = plain_loop(events)
    for name in TABLES:
        assert got[name] == truth[name], f"{name}: statesnap differs from the plain loop"
    compare(kafka, prefix, got, (*TABLES, *WINDOWED))
    # Every update emitted (emit="changes"), and the final results (emit="final"): one per
    # window closed by the end (stream time past end + grace), none for a window still open.
    compare_updates(kafka, prefix, out, (*TABLES, *WINDOWED, "tumbling-final"))
    final = updates(kafka, f"{out}-tumbling-final", statesnap=True)
    assert final, "no window closed"
    assert all(len(v) == 1 for v in final.values()), "a window's final result came twice"
    assert all(got["tumbling"][k] == v[0] for k, v in final.items()), "a final result is not the count"


def test_hopping_windows_near_the_epoch_start_at_zero(
    classpath: str, kafka: KafkaTool, bootstrap: str, tmp_path: Path
) -> None:
    """Apache Kafka: records within one window size of the epoch fall in no window starting below
    0 (Kafka Streams clamps a hopping window's start at 0); counts equal Kafka Streams'."""
    del classpath
    topic = kafka.create_topic(f"oracle-epoch-{uuid.uuid4().hex[:8]}", PARTITIONS)
    prefix, out = f"o{uuid.uuid4().hex[:8]}", f"s{uuid.uuid4().hex[:8]}"
    for name in (*TABLES, *WINDOWED, "tumbling-final"):
        kafka.create_topic(f"{prefix}-{name}", PARTITIONS)
        kafka.create_topic(f"{out}-{name}", PARTITIONS)
    events = generate(seed=7, n=600, base=0)
    produce(bootstrap, topic, events)

    assert run_oracle(bootstrap, topic, prefix, tmp_path / "streams", WINDOWING) == len(events)
    got = statesnap_results(processor(bootstrap, topic, windows_of(WINDOWING), out))
    assert all(int(k.rsplit("@", 1)[1]) >= 0 for k in got["hopping"]), "a window starts below 0"
    compare(kafka, prefix, got, WINDOWED)
    compare_updates(kafka, prefix, out, (*WINDOWED, "tumbling-final"))
