"""Expired windows leave nothing behind: a window store's rows, change set and export stay
bounded by the windows still live, whatever number came and went (issue #36, item 2).

The processor's record handler runs over a real store with no broker: records are handed to it
as the task's reader hands them (per partition batch), and what the store holds is read back.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from statesnap import Processor, Windows
from statesnap.checkpoint import datafile
from statesnap.kafka.config import KafkaSettings
from statesnap.processor.handler import ProcessorHandler
from statesnap.processor.keyspace import partition_prefix, window_bytes
from statesnap.processor.outputs import Outputs
from statesnap.stores import StateStore, open_state_store
from statesnap.stores.base import NO_TIMESTAMP

MINUTE = 60_000
T0 = 1_700_000_000_000 // MINUTE * MINUTE


class Message:
    """The part of confluent-kafka's Message the handler reads."""

    __slots__ = ("_key", "_offset", "_ts", "_value")

    def __init__(self, key: bytes, value: bytes, offset: int, ts: int) -> None:
        self._key, self._value, self._offset, self._ts = key, value, offset, ts

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes:
        return self._value

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, self._ts)

    def topic(self) -> str:
        return "events"

    def headers(self) -> None:
        return None


@pytest.fixture(params=["memory", "columnar", "rocksdb"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StateStore]:
    s = open_state_store(str(request.param), path=tmp_path / "db")
    yield s
    s.close()


def window_count(store: StateStore) -> ProcessorHandler:
    proc = Processor("w", inputs=["events"], bootstrap_servers="localhost:1", value_serde="json")
    proc.count("counts", window=Windows.tumbling("1m"))
    outputs = Outputs(KafkaSettings("localhost:1"), proc.key_serde, proc.value_serde)
    return proc.handler_for(store, outputs)


def feed(handler: ProcessorHandler, minutes: int, keys_per_minute: int, first_offset: int = 0) -> int:
    """Per minute, one record for each of *keys_per_minute* new keys (so every window is new
    and expires a minute later); one partition batch per minute. Returns the next offset."""
    offset = first_offset
    for m in range(minutes):
        start = T0 + (first_offset // keys_per_minute + m) * MINUTE
        batch = []
        for k in range(keys_per_minute):
            batch.append(Message(b"k%d-%d" % (m, k), b"{}", offset, start + k))
            offset += 1
        handler.apply(0, batch, None)
    return offset


def test_windows_that_came_and_went_leave_no_rows_and_no_change_set(store: StateStore) -> None:
    handler = window_count(store)
    feed(handler, minutes=200, keys_per_minute=100)  # 20,000 windows, 100 of them live
    windows = sum(1 for _ in store.scan(prefix=partition_prefix("counts", 0)))
    assert windows == 100
    assert len(store) == 100 + 1  # the live windows and the partition's stream time
    # What the next checkpoint walks: an export holds the live rows; the change set (a delta)
    # holds no trace of the 19,900 windows created and expired since the store began (RocksDB's
    # tells them from its snapshot of the table as the change family began).
    exported = sum(t.num_rows for t in store.export().values())
    assert exported == 101
    changes = sum(t.num_rows for t in store.changes().values())
    assert changes == 101


def test_after_a_checkpoint_only_what_changed_and_what_expired_from_it_is_in_the_delta(
    store: StateStore,
) -> None:
    """A window that was in the last checkpoint still leaves a tombstone when it expires (the
    delta must delete it); windows born after the checkpoint and expired before the next leave
    nothing."""
    handler = window_count(store)
    offset = feed(handler, minutes=3, keys_per_minute=50)
    store.export()
    store.mark_checkpointed()  # the 50 live windows of minute 2 are in a checkpoint now
    feed(handler, minutes=100, keys_per_minute=50, first_offset=offset)
    rows = {
        k: v
        for t in store.changes().values()
        for k, v in zip(t.column("key").to_pylist(), t.column("value").to_pylist(), strict=True)
    }
    prefix = partition_prefix("counts", 0)
    checkpointed = {prefix + window_bytes(T0 + 2 * MINUTE) + b"k2-%d" % k for k in range(50)}
    tombstones = {k for k, v in rows.items() if v is None}
    live = {k for k, v in rows.items() if v is not None and k.startswith(prefix)}
    assert len(live) == 50  # the last minute's windows
    assert tombstones == checkpointed
    assert len(rows) == 50 + 50 + 1  # + the stream time


def test_expire_keeps_tombstones_for_rows_held_before_the_change_set_began(store: StateStore) -> None:
    """The store-level rule, once asked to track births: a restored row (or one written before
    the last checkpoint) gets a tombstone when it expires; a row born since does not; a key never
    held is no deletion. Without tracking every expiry keeps its tombstone (tables never pay)."""
    table = pa.table(
        {
            "key": pa.array([b"old"], pa.binary()),
            "value": pa.array([b"1"], pa.binary()),
            "offset": pa.array([0], pa.int64()),
            "timestamp": pa.array([1000], pa.timestamp("ms", tz="UTC")),
        }
    )
    store.track_births()
    store.load(0, table.cast(datafile.SCHEMA))
    store.apply(0, [(b"new", b"2", 1, NO_TIMESTAMP), (b"old", b"3", 2, NO_TIMESTAMP)])
    assert store.expire(0, [b"old", b"new", b"never"], 3, 5) == 2
    assert store.get(b"old") is None
    assert store.get(b"new") is None
    assert len(store) == 0
    rows = {
        k: v
        for t in store.changes().values()
        for k, v in zip(t.column("key").to_pylist(), t.column("value").to_pylist(), strict=True)
    }
    assert rows == {b"old": None}


def test_without_tracking_births_every_expiry_keeps_its_tombstone(store: StateStore) -> None:
    store.apply(0, [(b"new", b"2", 1, NO_TIMESTAMP)])
    assert store.expire(0, [b"new"], 3, 5) == 1
    rows = {
        k: v
        for t in store.changes().values()
        for k, v in zip(t.column("key").to_pylist(), t.column("value").to_pylist(), strict=True)
    }
    assert rows == {b"new": None}


def test_a_row_handed_out_to_a_failed_checkpoint_still_gets_its_tombstone(store: StateStore) -> None:
    """A checkpoint took the change set (and failed: nothing marked): a row written before it is
    no longer born, so its expiry keeps a tombstone that the next delta folds over the live row
    it was handed out with; a row born after that hand-out and expired leaves nothing."""
    store.track_births()
    store.apply(0, [(b"before", b"1", 1, NO_TIMESTAMP)])
    assert {k for t in store.changes().values() for k in t.column("key").to_pylist()} == {b"before"}
    store.apply(0, [(b"after", b"2", 2, NO_TIMESTAMP)])
    assert store.expire(0, [b"before", b"after"], 3, 5) == 2
    rows = {
        k: v
        for t in store.changes().values()
        for k, v in zip(t.column("key").to_pylist(), t.column("value").to_pylist(), strict=True)
    }
    assert rows == {b"before": None}
    assert len(store) == 0
