"""A commit point's wait for deliveries ends at the task's ``timeout``, not a fixed 30 s.

On a private Tansu broker (the embedded dev broker; nothing here depends on Kafka semantics beyond
a broker that stops answering): the handler freezes the broker (SIGSTOP) before it emits a record,
so the record can never be delivered; the next commit point waits ``timeout`` (2 s) for it, then
the processor stops with :class:`OutputError` saying so. Before the fix the wait was 30 s.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from integration.conftest import KafkaTool
from statesnap import CheckpointOptions, Processor
from statesnap.devstack import EmbeddedBroker
from statesnap.errors import OutputError
from statesnap.processor.context import ProcessorContext, Record
from statesnap.task.lifecycle import TaskPhase

pytestmark = pytest.mark.integration


@pytest.fixture
def broker() -> Iterator[EmbeddedBroker]:
    b = EmbeddedBroker()
    b.start()
    try:
        yield b
    finally:
        if b.pid is not None:
            os.kill(b.pid, signal.SIGCONT)
        b.stop()


def test_a_delivery_wait_ends_at_the_task_timeout(broker: EmbeddedBroker, tmp_path: Path) -> None:
    """Tansu, frozen by the handler: the undeliverable output stops the processor within about
    its 2 s ``timeout`` with an OutputError naming that timeout."""
    kafka = KafkaTool(broker.bootstrap_servers)
    try:
        topic = kafka.create_topic(f"in-{uuid.uuid4().hex[:6]}", 1)
        out = kafka.create_topic(f"out-{uuid.uuid4().hex[:6]}", 1)
        proc = Processor(
            "frozen",
            inputs=[topic],
            bootstrap_servers=broker.bootstrap_servers,
            checkpoints=CheckpointOptions((tmp_path / "cp").as_uri(), commit_interval="100ms"),
            timeout=2,
        )
        frozen_at: list[float] = []

        @proc.handler
        def forward(record: Record, ctx: ProcessorContext) -> None:
            if record.value == b"freeze":
                assert broker.pid is not None
                os.kill(broker.pid, signal.SIGSTOP)
                frozen_at.append(time.monotonic())
            ctx.emit(out, record.key, record.value)

        proc.start()
        try:
            kafka.produce(topic, [(0, b"k", b"v")])
            KafkaTool.wait_for(lambda: proc.emitted == 1, 20, "the first output")
            kafka.produce(topic, [(0, b"k", b"freeze")])
            KafkaTool.wait_for(lambda: proc.task.phase is TaskPhase.FAILED, 30, "the processor to stop")
            took = time.monotonic() - frozen_at[0]
            error = proc.task.failure
            assert isinstance(error, OutputError), error
            assert "within 2s" in str(error), error
            assert took < 10, f"the delivery wait took {took:.1f}s"
        finally:
            if broker.pid is not None:
                os.kill(broker.pid, signal.SIGCONT)  # so that close() finds a broker
            proc.close(checkpoint=False)
    finally:
        kafka.close()
