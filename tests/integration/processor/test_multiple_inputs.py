"""A processor over two co-partitioned inputs: restore + tail == processing everything == a plain
consumer loop that merges the inputs by timestamp; every input's offsets in the checkpoint.

Proven on Apache Kafka (the suite's broker) and on Tansu (the dev broker): nothing here depends on broker
behaviour beyond ordered partitions, record timestamps and partition EOF."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from integration.conftest import KafkaTool
from statesnap import CheckpointOptions, ProcessingOptions, Processor, ProcessorContext, Record
from statesnap.errors import ConfigError
from statesnap.processor.keyspace import input_offset_key, input_offset_of

BASE = 1_700_000_000_000
PARTITIONS = 2

Event = tuple[int, int, bytes, int]  # (timestamp, partition, key, amount)


def ledger(name: str, inputs: list[str], bootstrap: str, url: str | None, **options: Any) -> Processor:
    """An order-sensitive fold per key (a hash chain over both inputs): any change in the order
    the handler sees records changes the result."""
    proc = Processor(
        name,
        inputs=inputs,
        bootstrap_servers=bootstrap,
        checkpoints=None if url is None else CheckpointOptions(url, interval="1h", commit_interval="50ms"),
        stores=["ledger"],
        value_serde="json",
        **options,
    )
    first = inputs[0]

    @proc.handler
    def fold(record: Record, ctx: ProcessorContext) -> None:
        store = ctx.stores["ledger"]
        state = store.get(record.key, {"n": 0, "h": 0})
        sign = 1 if record.topic == first else -1
        store[record.key] = {"n": state["n"] + 1, "h": (state["h"] * 31 + sign * record.value) % 1_000_003}

    return proc


def per_input_counter(
    name: str, inputs: list[str], bootstrap: str, checkpoints: CheckpointOptions, **options: Any
) -> Processor:
    """Counts records per input and key (``b"topic/key"``): order-free, so live input (ordered
    across inputs by arrival) still has one right answer."""
    proc = Processor(
        name,
        inputs=inputs,
        bootstrap_servers=bootstrap,
        checkpoints=checkpoints,
        stores=["counts"],
        processing=ProcessingOptions(max_idle="50ms"),
        **options,
    )

    @proc.handler
    def count(record: Record, ctx: ProcessorContext) -> None:
        counts = ctx.stores["counts"]
        key = record.topic.encode() + b"/" + (record.key or b"")
        counts[key] = b"%d" % (int(counts.get(key, b"0")) + 1)

    return proc


def events(rng: random.Random, start: int, stop: int) -> list[Event]:
    """Events with timestamps in [start, stop) s after BASE, in time order (ties included)."""
    out = []
    for t in range(start, stop):
        for _ in range(rng.randint(0, 3)):
            key = rng.randint(0, 7)
            out.append((BASE + t * 1000, key % PARTITIONS, f"k{key}".encode(), rng.randint(1, 99)))
    return out


def produce(bootstrap: str, topic: str, batch: Iterable[Event]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2})
    for ts, partition, key, amount in batch:
        producer.produce(topic, json.dumps(amount).encode(), key, partition=partition, timestamp=ts)
    assert producer.flush(15) == 0


def produce_split(bootstrap: str, topics: list[str], rng: random.Random, start: int, stop: int) -> int:
    batch = events(rng, start, stop)
    sides: list[list[Event]] = [[], []]
    for e in batch:
        sides[rng.randint(0, 1)].append(e)
    for topic, side in zip(topics, sides, strict=True):
        produce(bootstrap, topic, side)
    return len(batch)


def read_input(
    bootstrap: str, topic: str, partitions: int = PARTITIONS
) -> list[tuple[int, int, int, bytes, int]]:
    """(partition, timestamp, offset, key, amount) of every record: a plain consumer to EOF."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "test-truth",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 10,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[tuple[int, int, int, bytes, int]] = []
    ended: set[int] = set()
    deadline = time.monotonic() + 30
    try:
        while len(ended) < partitions and time.monotonic() < deadline:
            for m in consumer.consume(1000, 0.1):
                partition, offset, key, value = m.partition(), m.offset(), m.key(), m.value()
                assert partition is not None
                if m.error() is not None:
                    ended.add(partition)
                    continue
                assert offset is not None
                assert key is not None
                assert value is not None
                out.append((partition, m.timestamp()[1], offset, key, json.loads(value)))
    finally:
        consumer.close()
    assert len(ended) == partitions
    return out


def recompute(bootstrap: str, topics: list[str]) -> dict[bytes, dict[str, int]]:
    """The ground truth, not statesnap: per partition, both inputs sorted by (timestamp, input,
    offset) — the merge, since each input's timestamps never go down — folded as the handler
    folds."""
    rows = [
        (p, ts, i, off, key, amount)
        for i, t in enumerate(topics)
        for p, ts, off, key, amount in read_input(bootstrap, t)
    ]
    state: dict[bytes, dict[str, int]] = {}
    for _p, _ts, i, _off, key, amount in sorted(rows):
        s = state.get(key, {"n": 0, "h": 0})
        state[key] = {"n": s["n"] + 1, "h": (s["h"] * 31 + (1 if i == 0 else -1) * amount) % 1_000_003}
    return state


def contents(proc: Processor) -> dict[bytes, dict[str, int]]:
    return dict(proc.store("ledger").items())


def test_two_inputs_restore_plus_tail_equals_everything_and_a_plain_merge(
    kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    topics = [
        kafka.create_topic(f"{topic_name}-a", PARTITIONS),
        kafka.create_topic(f"{topic_name}-b", PARTITIONS),
    ]
    url = str(tmp_path / "ckpt")
    rng = random.Random(18)
    first_half = produce_split(kafka.bootstrap, topics, rng, 0, 150)
    first = ledger("join", topics, kafka.bootstrap, url)
    assert first.run(follow=False).replayed_records == first_half
    manifest = first.last_checkpoint
    assert manifest is not None
    assert manifest.topic == topics[0]
    second_half = produce_split(kafka.bootstrap, topics, rng, 150, 300)

    resumed = ledger("join", topics, kafka.bootstrap, url)
    report = resumed.start()
    try:
        assert report.checkpoint == manifest.generation
        assert report.replayed_records == second_half  # each input resumed at its own offset
        restored = contents(resumed)
        ends = {
            p: max(off for q, _, off, _, _ in read_input(kafka.bootstrap, topics[1]) if q == p) + 1
            for p in range(PARTITIONS)
        }
        held = {
            p: input_offset_of(resumed.task.store.get(input_offset_key(p, topics[1])))
            for p in range(PARTITIONS)
        }
        assert held == ends  # the second input's offsets live in the task's keyspace
    finally:
        resumed.close()
    scratch = ledger("scratch", topics, kafka.bootstrap, None)
    scratch.start()
    try:
        everything = contents(scratch)
    finally:
        scratch.close()
    truth = recompute(kafka.bootstrap, topics)
    assert restored == everything == truth
    assert sum(v["n"] for v in truth.values()) == first_half + second_half
    last = resumed.last_checkpoint
    assert last is not None
    assert last.writer["processor"]["inputs"] == topics


def wait_for_records(proc: Processor, total: int) -> None:
    deadline = time.monotonic() + 30
    while sum(v["n"] for v in contents(proc).values()) < total:
        assert time.monotonic() < deadline, "the processor did not process every record in 30s"
        time.sleep(0.05)


def test_checkpoints_keep_what_only_the_other_input_changed(
    kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    """A checkpoint that finds the first input's offset of a partition unchanged references its
    old files; what the second input changed there must reach the next checkpoint (a new base)."""
    topics = [
        kafka.create_topic(f"{topic_name}-a", PARTITIONS),
        kafka.create_topic(f"{topic_name}-b", PARTITIONS),
    ]
    url = str(tmp_path / "ckpt")
    produce(kafka.bootstrap, topics[0], [(BASE + i, i % 2, b"k%d" % (i % 2), i) for i in range(10)])
    proc = ledger("join", topics, kafka.bootstrap, url)
    proc.start()
    try:
        assert proc.checkpoint() is not None
        # Only the second input moves in partition 0; both move in partition 1.
        produce(
            kafka.bootstrap, topics[1], [(BASE + 100 + i, i % 2, b"k%d" % (i % 2), 7 + i) for i in range(6)]
        )
        produce(kafka.bootstrap, topics[0], [(BASE + 200, 1, b"k1", 5)])
        wait_for_records(proc, 17)
        assert proc.checkpoint() is not None
        produce(kafka.bootstrap, topics[0], [(BASE + 300 + i, i % 2, b"k%d" % (i % 2), 3) for i in range(4)])
        wait_for_records(proc, 21)
        assert proc.checkpoint() is not None
        live = contents(proc)
    finally:
        proc.close(checkpoint=False)
    frozen = ledger("join", topics, kafka.bootstrap, url)
    report = frozen.start()
    try:
        assert report.replayed_records == 0
        assert not report.skipped
        assert contents(frozen) == live == recompute(kafka.bootstrap, topics)
    finally:
        frozen.close(checkpoint=False)


def test_inputs_must_be_co_partitioned(kafka: KafkaTool, topic_name: str) -> None:
    a = kafka.create_topic(f"{topic_name}-a", 2)
    b = kafka.create_topic(f"{topic_name}-b", 3)
    proc = ledger("skewed", [a, b], kafka.bootstrap, None)
    with pytest.raises(ConfigError, match=rf"not co-partitioned \('{a}' has 2, '{b}' has 3 partitions\)"):
        proc.start()


def test_inputs_must_be_distinct() -> None:
    with pytest.raises(ConfigError, match="distinct input topics"):
        ledger("d", ["a", "a"], "127.0.0.1:1", None)


def test_statesnap_run_processes_every_input(kafka: KafkaTool, topic_name: str, tmp_path: Path) -> None:
    """``statesnap run`` as a user runs it (a fresh process): the python engine, every input's
    records."""
    from integration.processor.test_cli_run import run_in

    topics = [
        kafka.create_topic(f"{topic_name}-a", PARTITIONS),
        kafka.create_topic(f"{topic_name}-b", PARTITIONS),
    ]
    n = produce_split(kafka.bootstrap, topics, random.Random(3), 0, 60)
    app = tmp_path / "app"
    app.mkdir()
    (app / "join_app.py").write_text(
        "from statesnap import Processor\n"
        f"proc = Processor('join', inputs={topics!r}, bootstrap_servers={kafka.bootstrap!r},\n"
        f"                 checkpoints={str(tmp_path / 'ckpt')!r}, stores=['seen'])\n"
        "@proc.handler\n"
        "def on_record(record, ctx):\n"
        "    seen = ctx.stores['seen']\n"
        "    seen[record.topic.encode()] = b'%d' % (int(seen.get(record.topic.encode(), b'0')) + 1)\n"
    )
    done = run_in(app, "run", "join_app:proc", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["engine"] == "python"
    assert result["processed"] == n


def test_following_live_inputs_loses_and_repeats_nothing_across_a_restart(
    kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    """Inputs produced while the processor follows (order across inputs is then by arrival), a
    checkpoint, more input, a stop without a checkpoint, more input: the restart's counts per
    input and key equal a plain count of every record (an order-free handler: nothing lost,
    nothing twice)."""
    topics = [
        kafka.create_topic(f"{topic_name}-a", PARTITIONS),
        kafka.create_topic(f"{topic_name}-b", PARTITIONS),
    ]
    url = str(tmp_path / "ckpt")

    def counter() -> Processor:
        checkpoints = CheckpointOptions(url, interval="100ms", commit_interval="20ms")
        return per_input_counter("live", topics, kafka.bootstrap, checkpoints)

    def total(proc: Processor) -> int:
        return sum(int(v) for v in dict(proc.store("counts").items()).values())

    rng = random.Random(7)
    proc = counter()
    proc.start()
    produced = 0
    try:
        for round_ in range(6):
            produced += produce_split(kafka.bootstrap, topics, rng, round_ * 20, round_ * 20 + 20)
            time.sleep(0.05)
            if round_ == 3:
                deadline = time.monotonic() + 30
                while total(proc) < produced:
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
                proc.checkpoint()  # None when the interval's own checkpoint already holds it all
                assert proc.last_checkpoint is not None
    finally:
        proc.close(checkpoint=False)
    produced += produce_split(kafka.bootstrap, topics, rng, 120, 140)
    restarted = counter()
    restarted.start()
    try:
        assert restarted.report.checkpoint is not None
        got = {k: int(v) for k, v in restarted.store("counts").items()}
    finally:
        restarted.close(checkpoint=False)
    truth: dict[bytes, int] = {}
    for t in topics:
        for p, _ts, _off, key, _amount in read_input(kafka.bootstrap, t):
            del p
            k = t.encode() + b"/" + key
            truth[k] = truth.get(k, 0) + 1
    assert got == truth
    assert sum(truth.values()) == produced


def test_a_consumer_group_moves_partition_p_of_every_input_together(
    kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    """Two group members over two inputs with four partitions, input produced before, between and
    after the rebalances: a member joins (the first hands over half), the first leaves (the second
    restores its partitions from the hand-over checkpoint, every input at its own offset). Each
    member's counts per input and key cover exactly its partitions, and at the end the survivor's
    equal a plain count of every record of both inputs (nothing lost, nothing twice). The group
    assigns the first input only; partition p of the other follows it, whatever the strategy.

    Proven on Apache Kafka (the suite's broker; classic protocol, eager round-robin)."""
    partitions = 4
    topics = [
        kafka.create_topic(f"{topic_name}-a", partitions),
        kafka.create_topic(f"{topic_name}-b", partitions),
    ]
    url = str(tmp_path / "ckpt")
    group = f"{topic_name}-group"
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 2})
    produced: dict[bytes, int] = {}

    def produce_round(n: int) -> None:
        for i in range(n):
            topic = topics[i % 2]
            key = b"k%d" % (i % 24)
            producer.produce(topic, b"1", key, partition=(i % 24) % partitions)
            produced[topic.encode() + b"/" + key] = produced.get(topic.encode() + b"/" + key, 0) + 1
        assert producer.flush(15) == 0

    def member() -> Processor:
        checkpoints = CheckpointOptions(url, interval="1h", commit_interval="50ms")
        return per_input_counter("grouped", topics, kafka.bootstrap, checkpoints, group=group)

    def counts(proc: Processor) -> dict[bytes, int]:
        return {k: int(v) for k, v in proc.store("counts").items()}

    def expected(owned: Iterable[int]) -> dict[bytes, int]:
        keep = set(owned)
        return {k: n for k, n in produced.items() if int(k.rsplit(b"k", 1)[1]) % partitions in keep}

    def wait_for(what: str, predicate: Any, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.1)

    produce_round(200)
    first, second = member(), member()
    first.start()
    try:
        wait_for("the first member to hold everything", lambda: counts(first) == expected(range(partitions)))
        produce_round(120)
        second.start()

        def shared() -> bool:
            a, b = set(first.task.partitions), set(second.task.partitions)
            return bool(a) and bool(b) and a | b == set(range(partitions)) and not a & b

        wait_for("the members to share the partitions", shared)
        produce_round(120)
        wait_for(
            "each member to count exactly its partitions",
            lambda: (
                counts(first) == expected(first.task.partitions)
                and counts(second) == expected(second.task.partitions)
            ),
        )
        first.close()
        produce_round(120)
        wait_for(
            "the survivor to count everything",
            lambda: (
                set(second.task.partitions) == set(range(partitions))
                and counts(second) == expected(range(partitions))
            ),
        )
    finally:
        first.close(checkpoint=False)
        second.close(checkpoint=False)
    truth: dict[bytes, int] = {}
    for t in topics:
        for _p, _ts, _off, key, _amount in read_input(kafka.bootstrap, t, partitions):
            k = t.encode() + b"/" + key
            truth[k] = truth.get(k, 0) + 1
    assert truth == produced
