"""A processor's state restored from its checkpoint plus the tail equals processing everything,
and equals an independent recomputation (a plain consumer loop). Proven on Apache Kafka (the suite's broker)
and on Tansu (the dev broker): nothing here depends on broker behaviour beyond ordered partitions and EOF."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from integration.conftest import KafkaTool
from statesnap import CheckpointOptions, ProcessingOptions, Processor, ProcessorContext, Record
from statesnap.errors import ConfigError, HandlerError, StoreAccessError


def tally(name: str, topic: str, bootstrap: str, url: str | None, **options: Any) -> Processor:
    proc = Processor(
        name,
        inputs=[topic],
        bootstrap_servers=bootstrap,
        checkpoints=None if url is None else CheckpointOptions(url, interval="1h"),
        stores=["balances"],
        value_serde="json",
        **options,
    )

    @proc.handler
    def on_payment(record: Record, ctx: ProcessorContext) -> None:
        balances = ctx.stores["balances"]
        balances[record.key] = balances.get(record.key, 0) + record.value["amount"]

    return proc


def payments(kafka: KafkaTool, topic: str, start: int, n: int) -> None:
    kafka.produce(
        topic,
        # Each account in one partition, as a key's partitioner puts it.
        (
            (i % 17 % 3, f"acct-{i % 17}".encode(), json.dumps({"amount": i}).encode())
            for i in range(start, start + n)
        ),
    )


def recompute(kafka: KafkaTool, topic: str) -> dict[bytes, int]:
    """The ground truth: a plain consumer loop over the whole input, not statesnap."""
    out: dict[bytes, int] = {}
    for r in kafka.read_all(topic, range(3)):
        assert r.key is not None
        assert r.value is not None
        out[r.key] = out.get(r.key, 0) + json.loads(r.value)["amount"]
    return out


def test_restore_plus_tail_equals_processing_everything(
    kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    topic = kafka.create_topic(topic_name, 3)
    url = str(tmp_path / "ckpt")
    payments(kafka, topic, 0, 300)
    first = tally("tally", topic, kafka.bootstrap, url)
    first.run(follow=False)
    assert first.last_checkpoint is not None
    payments(kafka, topic, 300, 200)

    resumed = tally("tally", topic, kafka.bootstrap, url)
    report = resumed.start()
    try:
        assert report.checkpoint == first.last_checkpoint.generation
        assert report.replayed_records == 200
        restored = dict(resumed.store("balances").items())
    finally:
        resumed.close()
    scratch = tally("scratch", topic, kafka.bootstrap, None)
    scratch.start()
    try:
        everything = dict(scratch.store("balances").items())
    finally:
        scratch.close()
    truth = recompute(kafka, topic)
    assert restored == everything == truth
    assert len(truth) == 17


def test_store_written_outside_a_handler_is_refused(kafka: KafkaTool, topic_name: str) -> None:
    topic = kafka.create_topic(topic_name, 3)
    payments(kafka, topic, 0, 10)
    kept: list[ProcessorContext] = []
    proc = tally("outside", topic, kafka.bootstrap, None)
    proc.handler(lambda record, ctx: kept.append(ctx))
    proc.start()
    try:
        with pytest.raises(StoreAccessError, match="outside a handler"):
            kept[0].stores["balances"]["x"] = 1
    finally:
        proc.close()


def test_failing_handler_stops_with_its_record_or_goes_to_the_dead_letter_topic(
    kafka: KafkaTool, topic_name: str
) -> None:
    topic = kafka.create_topic(topic_name, 3)
    dlq = kafka.create_topic(topic_name + "-dlq", 1)
    kafka.produce(topic, [(0, b"a", b'{"amount": 1}'), (0, b"b", b"not json"), (0, b"a", b'{"amount": 2}')])
    stopping = tally("strict", topic, kafka.bootstrap, None)
    with pytest.raises(HandlerError, match=rf"{topic}\[0\]@1"):
        stopping.run(follow=False)

    lenient = tally(
        "lenient", topic, kafka.bootstrap, None, processing=ProcessingOptions(dead_letter_topic=dlq)
    )
    lenient.start()
    try:
        assert dict(lenient.store("balances").items()) == {b"a": 3}
    finally:
        lenient.close()
    (dead,) = kafka.read_all(dlq, [0])
    assert dead.value == b"not json"


def test_bad_configuration_is_one_typed_line(kafka: KafkaTool, topic_name: str) -> None:
    with pytest.raises(ConfigError, match="one or more distinct input topics"):
        Processor("p", inputs=[], bootstrap_servers=kafka.bootstrap)
    with pytest.raises(ConfigError, match="invalid store name"):
        Processor("p", inputs=["a"], bootstrap_servers=kafka.bootstrap, stores=["bad name"])
    with pytest.raises(ConfigError, match="no handler"):
        Processor("p", inputs=["a"], bootstrap_servers=kafka.bootstrap).start()
