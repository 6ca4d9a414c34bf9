"""What a processor run tells a person names every input (issue #32): the replay's label named
only the first input of a processor over several. Kafka behaviour: none beyond two topics to read
(Apache Kafka, the suite's broker, proved it)."""

from __future__ import annotations

import uuid
from pathlib import Path

from integration.conftest import KafkaTool
from statesnap import Processor, ProcessorContext, Record
from statesnap.run.engine import EngineChoice
from statesnap.run.processor import run_processor
from statesnap.run.progress import MaterializeProgress


class Told(MaterializeProgress):
    """Every label a run gives its listener."""

    def __init__(self) -> None:
        self.labels: list[str] = []

    def engine_chosen(self, choice: EngineChoice) -> None:
        self.labels.append(f"engine {choice.engine}")

    def replay_started(self, label: str) -> None:
        self.labels.append(label)

    def replay_finished(self, records: int, label: str) -> None:
        self.labels.append(label)


def test_the_replay_label_names_every_input(kafka: KafkaTool, tmp_path: Path) -> None:
    first, second = (kafka.create_topic(f"labels-{side}-{uuid.uuid4().hex[:8]}", 2) for side in "ab")
    for topic in (first, second):
        kafka.produce(topic, [(i % 2, b"k%d" % i, b"v") for i in range(10)])
    inputs, bootstrap, url = [first, second], kafka.bootstrap, str(tmp_path)
    proc = Processor("labels", inputs=inputs, bootstrap_servers=bootstrap, checkpoints=url, stores=["n"])

    @proc.handler
    def count(record: Record, ctx: ProcessorContext) -> None:
        ctx.stores["n"][record.key] = b"%d" % (int(ctx.stores["n"].get(record.key, b"0")) + 1)

    told = Told()
    result = run_processor(proc, engine="python", progress=told)
    assert result.processed == 20
    assert told.labels == ["engine python", f"replaying {first}, {second}", "restored labels"]
