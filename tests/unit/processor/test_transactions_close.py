"""An exactly-once commit that fails after close() dropped the producer (close from another
thread, as the cluster tests' coordinator kill did) fails with the typed OutputError, not an
AttributeError on the missing producer (pure: the producer is never created); and one whose
producer call never returns stops the outputs with a typed OutputError past its timeout."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from statesnap.errors import OutputError
from statesnap.kafka.config import KafkaSettings
from statesnap.processor import transactions
from statesnap.processor.transactions import TransactionalOutputs
from statesnap.serde import resolve_serde


def _outputs() -> TransactionalOutputs:
    """Exactly-once outputs that never reach a broker (no producer is created by these tests)."""
    return TransactionalOutputs(
        KafkaSettings("127.0.0.1:1", {}, 1.0),
        resolve_serde("bytes"),
        resolve_serde("bytes"),
        topic="in",
        group_id="g",
    )


def test_an_abort_after_close_is_the_typed_failure() -> None:
    outputs = _outputs()
    outputs.close()
    with pytest.raises(OutputError, match="closed meanwhile"):
        outputs._abort("commit failed: the coordinator is gone")
    assert isinstance(outputs.failure, OutputError)


class StuckProducer:
    """A transactional producer whose send_offsets_to_transaction never returns (librdkafka 2.16
    after a SIGKILL of the node coordinating the offsets group: tests/integration/cluster/
    test_failover.py proves it on Apache Kafka), whatever its timeout."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.aborts = 0

    def begin_transaction(self) -> None:
        pass

    def flush(self, timeout: float) -> int:
        return 0

    def send_offsets_to_transaction(self, offsets: Any, metadata: Any, timeout: float) -> None:
        assert timeout <= 0.5
        self.release.wait(30)

    def abort_transaction(self, timeout: float) -> None:
        self.aborts += 1


def test_a_transactional_call_that_never_returns_stops_the_outputs_with_a_typed_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(transactions, "STUCK_GRACE_SECONDS", 0.3)
    outputs = _outputs()
    outputs.transactional_id = "t-p0"
    outputs.group_metadata = object
    producer = StuckProducer()
    outputs._producer = producer
    began = time.monotonic()
    try:
        with pytest.raises(
            OutputError, match=r"'t-p0': send_offsets_to_transaction did not return within 1 s"
        ):
            outputs.commit({0: 5}, 0.5)
        assert time.monotonic() - began < 3
        assert outputs.failure is not None
        with pytest.raises(OutputError, match="did not return"):  # the outputs stay failed
            outputs.commit({0: 6}, 0.5)
        outputs.close()  # no abort on a producer whose call is still running: it would conflict
        assert producer.aborts == 0
    finally:
        producer.release.set()
