"""An exactly-once commit that fails after close() dropped the producer (close from another
thread, as the cluster tests' coordinator kill did) fails with the typed OutputError, not an
AttributeError on the missing producer (pure: the producer is never created)."""

from __future__ import annotations

import pytest

from statesnap.errors import OutputError
from statesnap.kafka.config import KafkaSettings
from statesnap.processor.transactions import TransactionalOutputs
from statesnap.serde import resolve_serde


def test_an_abort_after_close_is_the_typed_failure() -> None:
    outputs = TransactionalOutputs(
        KafkaSettings("127.0.0.1:1", {}, 1.0),
        resolve_serde("bytes"),
        resolve_serde("bytes"),
        topic="in",
        group_id="g",
    )
    outputs.close()
    with pytest.raises(OutputError, match="closed meanwhile"):
        outputs._abort("commit failed: the coordinator is gone")
    assert isinstance(outputs.failure, OutputError)
