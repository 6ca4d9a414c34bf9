"""Punctuation on stream time: a punctuator runs once each time a partition's stream time crosses a
multiple of its period, writes stores like a handler, and fires alike across a restore. Proven on
Apache Kafka (the suite's broker) and Tansu (record timestamps as produced, EOF)."""

from __future__ import annotations

from pathlib import Path

from integration.conftest import KafkaTool
from integration.processor.test_aggregations import BASE, MINUTE, produce_timed
from statesnap import CheckpointOptions, Processor, ProcessorContext, Record


def ticking(topic: str, bootstrap: str, url: str | None) -> Processor:
    proc = Processor(
        "ticks" if url else "ticks-scratch",
        inputs=[topic],
        bootstrap_servers=bootstrap,
        checkpoints=None if url is None else CheckpointOptions(url, interval="1h"),
        stores=["ticks"],
        value_serde="json",
    )

    @proc.handler
    def ignore(record: Record, ctx: ProcessorContext) -> None:
        del record, ctx

    @proc.punctuate("1m")
    def tick(ctx: ProcessorContext) -> None:
        ticks = ctx.stores["ticks"]
        ticks[b"at"] = [*ticks.get(b"at", []), ctx.stream_time // MINUTE * MINUTE - BASE // MINUTE * MINUTE]

    return proc


def test_punctuators_fire_on_stream_time_across_restores(
    kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    topic = kafka.create_topic(topic_name, 1)
    url = str(tmp_path / "ckpt")
    start = BASE // MINUTE * MINUTE
    stamps = [start + s * 1000 for s in (0, 30, 61, 59, 200, 201, 420)]  # one out of order (59)
    produce_timed(kafka.bootstrap, topic, [(0, b"k", {}, ts) for ts in stamps[:4]])
    ticking(topic, kafka.bootstrap, url).run(follow=False)
    produce_timed(kafka.bootstrap, topic, [(0, b"k", {}, ts) for ts in stamps[4:]])
    resumed = ticking(topic, kafka.bootstrap, url)
    resumed.start()
    scratch = ticking(topic, kafka.bootstrap, None)
    scratch.start()
    try:
        # Crossings: 0:30→1:01 (minute 1), 1:01→3:20 (minute 3, once), 3:21→7:00 (minute 7).
        expected = [1 * MINUTE, 3 * MINUTE, 7 * MINUTE]
        assert resumed.store("ticks")[b"at"] == scratch.store("ticks")[b"at"] == expected
    finally:
        resumed.close()
        scratch.close(checkpoint=False)
