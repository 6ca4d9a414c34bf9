"""A ``Table`` whose apply fails mid-batch (a value projection that raises, a store error), on the
session broker: the consumer has moved past the batch, so no checkpoint may claim it afterwards,
and ``offsets`` / ``wait_for`` (read on other threads) never claim a record before it is applied.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]  # re-exported without __all__

from statesnap import CheckpointOptions, RowFilter, Table
from statesnap.blob import open_blob_store
from statesnap.checkpoint import CheckpointRepository
from statesnap.devstack import EmbeddedBroker
from statesnap.errors import StatesnapError, TableStateError

pytestmark = pytest.mark.integration


@pytest.fixture
def topic(broker: EmbeddedBroker) -> str:
    name = f"t-{uuid.uuid4().hex[:12]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(15)
    deadline = time.monotonic() + 10
    while name not in admin.list_topics(timeout=5).topics:
        assert time.monotonic() < deadline, "topic did not appear"
        time.sleep(0.05)
    return name


def produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> list[int]:
    """Produce to partition 0 in order; the offsets the broker acknowledged."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2, "acks": "all"})
    offsets: list[int] = []

    def delivered(err: object, msg: Any) -> None:
        assert err is None, err
        offsets.append(int(msg.offset()))

    for key, value in records:
        producer.produce(topic, value, key, partition=0, on_delivery=delivered)
    assert producer.flush(15) == 0
    return sorted(offsets)


def poll_for(t: Table[Any, Any], seconds: float) -> None:
    """Poll a ``background=False`` table for *seconds* (or until a poll raises)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        t.poll(0.2)


def claimed_offset(tmp_path: Path, t: Table[Any, Any], topic: str) -> int:
    """Where the newest checkpoint of *t* resumes partition 0 (0 without a checkpoint)."""
    repo = CheckpointRepository.for_table(open_blob_store(str(tmp_path / "ckpt")), t.cluster_id, topic)
    newest = repo.latest()
    return newest.partitions[0].next_offset if newest is not None else 0


def strict_projection(value: bytes) -> bytes:
    """A value projection that rejects malformed values (as a json.loads would)."""
    if value == b"malformed":
        raise ValueError("malformed value")
    return value


@pytest.fixture
def table_factory(
    broker: EmbeddedBroker, topic: str, tmp_path: Path
) -> Iterator[Callable[..., Table[Any, Any]]]:
    made: list[Table[Any, Any]] = []

    def make(**options: Any) -> Table[Any, Any]:
        t: Table[Any, Any] = Table(
            topic,
            bootstrap_servers=broker.bootstrap_servers,
            checkpoints=CheckpointOptions(str(tmp_path / "ckpt"), commit_interval="1h", interval="1h"),
            **options,
        )
        made.append(t)
        return t

    yield make
    for t in made:
        with contextlib.suppress(StatesnapError):
            t.close(checkpoint=False, timeout=5)


def test_a_batch_that_failed_to_apply_is_never_claimed_by_a_checkpoint(
    broker: EmbeddedBroker, topic: str, tmp_path: Path, table_factory: Callable[..., Table[Any, Any]]
) -> None:
    produce(broker.bootstrap_servers, topic, [(b"k%d" % i, b"v%d" % i) for i in range(5)])
    t = table_factory(background=False, row_filter=RowFilter(value_projection=strict_projection))
    t.start()
    bad = produce(broker.bootstrap_servers, topic, [(b"bad", b"malformed"), (b"later", b"v")])
    with pytest.raises(ValueError, match="malformed"):
        poll_for(t, 10.0)
    # The caller logs the error and tries to go on: refused, naming the cause; close() writes no
    # final checkpoint (the table no longer equals a replay) and does not raise.
    with pytest.raises(TableStateError, match="malformed"):
        t.poll(0.2)
    with pytest.raises(TableStateError, match="malformed"):
        t.checkpoint()
    t.close()
    claimed = claimed_offset(tmp_path, t, topic)
    assert claimed <= bad[0], f"checkpoint claims offset {claimed}, past the record at {bad[0]}"


def test_no_checkpoint_after_the_background_consumer_failed_mid_batch(
    broker: EmbeddedBroker, topic: str, tmp_path: Path, table_factory: Callable[..., Table[Any, Any]]
) -> None:
    produce(broker.bootstrap_servers, topic, [(b"k%d" % i, b"v%d" % i) for i in range(5)])
    t = table_factory(row_filter=RowFilter(value_projection=strict_projection))
    t.start()
    bad = produce(broker.bootstrap_servers, topic, [(b"bad", b"malformed"), (b"later", b"v")])
    deadline = time.monotonic() + 10
    while t.failure is None:
        assert time.monotonic() < deadline, "the background consumer did not fail"
        time.sleep(0.02)
    with contextlib.suppress(StatesnapError):  # refusing is fine
        t.checkpoint(timeout=10)
    claimed = claimed_offset(tmp_path, t, topic)
    assert claimed <= bad[0], f"checkpoint claims offset {claimed}, past the record at {bad[0]}"


def test_offsets_never_claim_a_record_before_it_is_applied(
    broker: EmbeddedBroker, topic: str, table_factory: Callable[..., Table[Any, Any]]
) -> None:
    t = table_factory(background=False, store="memory")
    t.start()
    (offset,) = produce(broker.bootstrap_servers, topic, [(b"k", b"v")])
    seen: list[tuple[dict[int, int], bool]] = []
    apply = t.store.apply_messages

    def watched(partition: int, messages: Any) -> None:
        # What a reader on another thread sees at this instant (wait_for's condition, unlocked).
        seen.append((t.offsets, t._freshness.reached({0: offset}, None)()))
        apply(partition, messages)

    t.store.apply_messages = watched  # type: ignore[method-assign]
    deadline = time.monotonic() + 10
    while t.get_raw(b"k") is None:
        assert time.monotonic() < deadline, "the record never arrived"
        t.poll(0.2)
    assert seen
    offsets, reached = seen[-1]
    assert offsets[0] <= offset, f"offsets {offsets} claim the record at {offset} before it is applied"
    assert not reached, "wait_for would return before the record is applied"
