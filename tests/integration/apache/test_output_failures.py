"""A processor's outputs that cannot be delivered or committed: said once, at once, in the words
of what happens next.

On Apache Kafka 4.1.1 (the suite's broker: ``auto.create.topics.enable=false``, one broker):

- a dead-letter or output topic the cluster does not have is refused at the first record sent
  there, naming it (:class:`TopicNotFoundError`), not after librdkafka's 30 s
  ``topic.metadata.propagation.max.ms``, and nothing claims the record was sent;
- an exactly-once commit that fails (a zombie fenced by the next instance of its task) is said once,
  saying the processor stopped — not first "will retry at the next commit point", then twice more.
"""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from integration.conftest import KafkaTool
from statesnap import CheckpointOptions, ProcessingOptions, Processor
from statesnap.errors import TopicNotFoundError
from statesnap.processor.context import ProcessorContext, Record
from statesnap.task.lifecycle import TaskPhase

pytestmark = pytest.mark.integration

PARTITIONS = 2


def _processor(
    kafka: KafkaTool, tmp_path: Path, topic: str, out: str | None, name: str | None = None, **options: Any
) -> Processor:
    """Keeps a count per key; emits it to *out*; raises on values b"bad"."""
    proc = Processor(
        name or f"p-{uuid.uuid4().hex[:8]}",
        inputs=[topic],
        bootstrap_servers=kafka.bootstrap,
        checkpoints=CheckpointOptions((tmp_path / "cp").as_uri(), commit_interval="100ms"),
        stores=["counts"],
        **options,
    )

    @proc.handler
    def count(record: Record, ctx: ProcessorContext) -> None:
        if record.value == b"bad":
            raise ValueError("a bad record")
        counts = ctx.stores["counts"]
        counts[record.key] = b"%d" % (int(counts.get(record.key, b"0")) + 1)
        if out is not None:
            ctx.emit(out, record.key, counts[record.key])

    return proc


def _input(kafka: KafkaTool, topic: str, bad_at: int | None = None, n: int = 20) -> None:
    kafka.create_topic(topic, PARTITIONS)
    kafka.produce(topic, [(i % PARTITIONS, b"k%d" % i, b"bad" if i == bad_at else b"v") for i in range(n)])


def test_a_missing_dead_letter_topic_is_refused_naming_it(
    kafka: KafkaTool, topic_name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Apache Kafka (no topic creation on use): the first record sent to a dead-letter topic the
    cluster does not have stops the processor at once with TopicNotFoundError naming it; no log
    line says the record was sent (before the fix: "sent to no-such-dlq", then a failure 30 s on)."""
    _input(kafka, topic_name, bad_at=7)
    dlq = f"no-such-dlq-{uuid.uuid4().hex[:6]}"
    proc = _processor(
        kafka, tmp_path, topic_name, None, processing=ProcessingOptions(dead_letter_topic=dlq), timeout=10
    )
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="statesnap"), pytest.raises(TopicNotFoundError) as refused:
        proc.run(follow=False)
    assert time.monotonic() - started < 8, "waited for librdkafka's delivery failure"
    message = str(refused.value)
    assert f"dead-letter topic {dlq!r} does not exist" in message, message
    assert "\n" not in message
    assert not kafka.topic_exists(dlq)
    assert not [r for r in caplog.records if "sent to" in r.getMessage()]


def test_a_missing_dead_letter_topic_is_refused_at_start(
    kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    """Apache Kafka: a dead-letter topic is written only when a handler fails, maybe hours into
    a run, so the start refuses one the cluster does not have before processing any record
    (before, a run with no failing record never noticed, and the first failure stopped it)."""
    _input(kafka, topic_name)  # no bad record: the topic would never be written
    dlq = f"no-such-dlq-{uuid.uuid4().hex[:6]}"
    proc = _processor(
        kafka, tmp_path, topic_name, None, processing=ProcessingOptions(dead_letter_topic=dlq), timeout=10
    )
    with pytest.raises(TopicNotFoundError, match=f"dead-letter topic {dlq!r} does not exist"):
        proc.start()
    assert not list(tmp_path.glob("cp/*/snapshots/*.json"))
    assert not kafka.topic_exists(dlq)


def test_a_missing_output_topic_is_refused_naming_it(
    kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    """Apache Kafka: emitting to a topic the cluster does not have stops the processor at the
    first record with TopicNotFoundError naming the topic."""
    _input(kafka, topic_name)
    out = f"no-such-out-{uuid.uuid4().hex[:6]}"
    proc = _processor(kafka, tmp_path, topic_name, out, timeout=10)
    started = time.monotonic()
    with pytest.raises(TopicNotFoundError, match=out):
        proc.run(follow=False)
    assert time.monotonic() - started < 8


def test_a_failed_exactly_once_commit_is_said_once(
    kafka: KafkaTool, topic_name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Apache Kafka: a second instance of an exactly-once task fences the first; the first's
    failed commit is logged once (its background thread's one line, nobody having asked), saying
    it stopped, never "will retry"; librdkafka's own FATAL line is not repeated above DEBUG."""
    _input(kafka, topic_name)
    out = kafka.create_topic(f"{topic_name}-out", PARTITIONS)
    name = f"eos-{uuid.uuid4().hex[:8]}"

    def instance() -> Processor:
        return _processor(
            kafka,
            tmp_path,
            topic_name,
            out,
            name,
            partitions=range(PARTITIONS),
            processing=ProcessingOptions(exactly_once=True),
        )

    zombie = instance()
    successor = None
    with caplog.at_level(logging.DEBUG):
        zombie.start()
        try:
            successor = instance()
            successor.start()
            kafka.produce(topic_name, [(p, b"late", b"v") for p in range(PARTITIONS)])
            KafkaTool.wait_for(lambda: zombie.task.failure is not None, 30, "the zombie to stop")
            assert zombie.task.phase is TaskPhase.FAILED
            time.sleep(1.5)  # the background thread's grace for a caller to meet the failure
        finally:
            zombie.close(checkpoint=False)
            if successor is not None:
                successor.close(checkpoint=False)
    said = [r for r in caplog.records if r.levelno >= logging.WARNING and "fenced" in r.getMessage().lower()]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert "stop" in said[0].getMessage()
    assert not [r for r in caplog.records if "will retry" in r.getMessage()]
