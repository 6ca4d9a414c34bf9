"""The built-in joins' rules, each pinned on a small input whose results are written out by hand:
a left join sends an unmatched record once its window closes (never eagerly) and a null-key record
at once, skips null values; join buffers are checkpointed (a restore in the middle changes
nothing); a stream–table join reads a table topic (tombstones delete) or a processor store.
Proven on Apache Kafka (the suite's broker) and Tansu: ordered partitions and record timestamps as
produced; the merge across inputs by timestamp is statesnap's own."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from integration.conftest import KafkaTool
from statesnap import CheckpointOptions, JoinWindows, Processor, ProcessorContext, Record

T = 1_700_000_000_000  # a real epoch: a zero timestamp means "now" to the producer


def topics(kafka: KafkaTool, *names: str) -> list[str]:
    tag = uuid.uuid4().hex[:8]
    return [kafka.create_topic(f"{name}-{tag}", 1) for name in names]


def produce(bootstrap: str, topic: str, records: list[tuple[str | None, Any, int]]) -> None:
    """(key, JSON value or None, timestamp ms) in order, into partition 0."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2})
    for key, value, ts in records:
        producer.produce(
            topic,
            None if value is None else json.dumps(value).encode(),
            None if key is None else key.encode(),
            partition=0,
            timestamp=ts,
        )
    assert producer.flush(30) == 0


def sent(kafka: KafkaTool, topic: str) -> list[tuple[str | None, Any]]:
    return [
        (None if r.key is None else r.key.decode(), None if r.value is None else json.loads(r.value))
        for r in kafka.read_all(topic, [0])
    ]


def processor(
    kafka: KafkaTool, inputs: list[str], checkpoints: Path | None = None, name: str = ""
) -> Processor:
    return Processor(
        name or f"joins-{uuid.uuid4().hex[:8]}", inputs=inputs, bootstrap_servers=kafka.bootstrap,
        checkpoints=None if checkpoints is None else CheckpointOptions(str(checkpoints), interval="1h"),
        key_serde="string", value_serde="json",
    )  # fmt: skip


def test_left_join_sends_unmatched_records_when_their_window_closes(kafka: KafkaTool) -> None:
    """Kafka Streams' leftJoin (3.1+): a pair as soon as both sides are there; an unmatched left
    record joined with None once stream time passes its window plus grace, not before; a null-key
    left record at once (KIP-962); a null value skipped."""
    left, right, out = topics(kafka, "l", "r", "out")
    produce(kafka.bootstrap, left, [
        ("a", {"id": 1}, T),
        ("b", {"id": 3}, T + 1_000),  # no partner ever: sent when stream time passes T + 3 s
        (None, {"id": 4}, T + 1_100),
        ("c", None, T + 1_200),
    ])  # fmt: skip
    produce(kafka.bootstrap, right, [("a", {"id": 2}, T + 500), ("b", {"id": 5}, T + 4_500)])
    proc = processor(kafka, [left, right])
    proc.join("j", left=left, right=right, window=JoinWindows.of("1s", grace="1s"), how="left", to=out)
    proc.run(follow=False)
    assert sent(kafka, out) == [
        ("a", {"left": {"id": 1}, "right": {"id": 2}}),
        (None, {"left": {"id": 4}, "right": None}),
        ("b", {"left": {"id": 3}, "right": None}),
    ]


def test_a_join_restored_from_its_checkpoint_sends_what_one_run_sends(
    kafka: KafkaTool, tmp_path: Path
) -> None:
    """The join's buffers, clock and unmatched records are stores, checkpointed: a run that stops
    after the left records and one that restores and reads the right ones send the one run's
    results (the pair, then the unmatched record at close), each once."""
    left, right, out = topics(kafka, "l", "r", "out")
    name = f"joins-{uuid.uuid4().hex[:8]}"

    def run() -> None:
        proc = processor(kafka, [left, right], tmp_path, name)
        window = JoinWindows.of("1s", grace="1s")
        proc.join("j", left=left, right=right, window=window, how="outer", to=out)
        proc.run(follow=False)

    produce(kafka.bootstrap, left, [("a", {"id": 1}, T), ("b", {"id": 2}, T + 100)])
    run()
    assert sent(kafka, out) == []  # both wait: their windows are open
    produce(kafka.bootstrap, right, [("a", {"id": 3}, T + 900), ("z", {"id": 4}, T + 9_000)])
    run()
    assert sent(kafka, out) == [
        ("a", {"left": {"id": 1}, "right": {"id": 3}}),
        ("b", {"left": {"id": 2}, "right": None}),
    ]


def test_stream_table_join_reads_the_table_as_of_each_record(kafka: KafkaTool) -> None:
    """Kafka Streams' KStream-KTable join: the table's value when the stream record is processed
    (inputs merged by timestamp); a tombstone deletes; table updates send nothing."""
    orders, customers, inner, left = topics(kafka, "orders", "customers", "inner", "left")
    produce(
        kafka.bootstrap,
        customers,
        [("a", {"tier": "gold"}, T), ("a", None, T + 20), ("b", {"tier": "x"}, T + 40)],
    )
    produce(
        kafka.bootstrap, orders, [("a", {"n": 1}, T + 10), ("a", {"n": 2}, T + 30), ("b", {"n": 3}, T + 50)]
    )
    proc = processor(kafka, [orders, customers])
    proc.join_table("t-inner", stream=orders, table=customers, how="inner", to=inner)
    proc.join_table("t-left", stream=orders, table=customers, how="left", to=left)
    proc.run(follow=False)
    assert sent(kafka, inner) == [
        ("a", {"left": {"n": 1}, "right": {"tier": "gold"}}),
        ("b", {"left": {"n": 3}, "right": {"tier": "x"}}),
    ]
    assert sent(kafka, left) == [
        ("a", {"left": {"n": 1}, "right": {"tier": "gold"}}),
        ("a", {"left": {"n": 2}, "right": None}),
        ("b", {"left": {"n": 3}, "right": {"tier": "x"}}),
    ]


def test_stream_table_join_on_a_processor_store(kafka: KafkaTool) -> None:
    """A stream enriched from a store another step keeps: each order with its key's click count
    so far, through a joiner."""
    clicks, orders, out = topics(kafka, "clicks", "orders", "out")
    produce(kafka.bootstrap, clicks, [("a", {}, T), ("a", {}, T + 10), ("b", {}, T + 30)])
    produce(kafka.bootstrap, orders, [("a", {"n": 1}, T + 20), ("b", {"n": 2}, T + 25)])
    proc = processor(kafka, [clicks, orders])
    proc.add_store("clicks")

    @proc.handler
    def count_clicks(record: Record, ctx: ProcessorContext) -> None:
        if record.topic == clicks:
            ctx.stores["clicks"][record.key] = ctx.stores["clicks"].get(record.key, 0) + 1

    proc.join_table(
        "orders-with-clicks", stream=orders, store="clicks", how="left", to=out,
        joiner=lambda order, count: {**order, "clicks": count or 0},
    )  # fmt: skip
    proc.run(follow=False)
    assert sent(kafka, out) == [("a", {"n": 1, "clicks": 2}), ("b", {"n": 2, "clicks": 0})]
