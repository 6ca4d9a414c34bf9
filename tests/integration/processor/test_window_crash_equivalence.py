"""Crash equivalence of windowed aggregations: restore + tail == full re-processing, with
out-of-order timestamps and late records (issue #18, point 3).

Hypothesis draws the records (keys, event times jumping back and forth around a moving clock, so
some land in windows still open within grace and some are late) and two cut points. The split run
processes the first part and checkpoints, processes the second part and crashes (closed without a
checkpoint: its work since the checkpoint is lost), then a restart restores that checkpoint and
re-processes everything after it. Its final checkpoint must equal, byte for byte and key for key
(every store, and the stream time statesnap keeps per partition), the final checkpoint of one run
over everything; both must equal a plain-loop model of the window rules and of a punctuator on
stream time (a record counts in a
window while stream time is below end + grace; a window is gone at start + retention), so windows
past retention are absent from the checkpoint files. Checkpoints are read from their Parquet
files, not through statesnap.

Proven on Apache Kafka (the suite's broker) and on Tansu (the dev broker): it needs ordered partitions, EOF
and record timestamps as produced (CreateTime), which it keeps.
"""

from __future__ import annotations

import io
import json
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from faults.processor_child import Event, build_windowed, window_model
from integration.conftest import KafkaTool
from statesnap import CheckpointOptions, Processor
from statesnap.blob import open_blob_store
from statesnap.checkpoint import layout

pytestmark = pytest.mark.integration

PARTITIONS = 2
#: Event times are this plus the drawn milliseconds (2023-11-14: in the past, which brokers accept).
EPOCH = 1_700_000_000_000
EXAMPLES = 25 if os.environ.get("STATESNAP_LONG", "") in {"1", "true", "yes"} else 3


def events() -> st.SearchStrategy[list[Event]]:
    """A moving clock with jumps back (out of order: still open, or late past grace) and ahead
    (past retention of the oldest windows)."""
    step = st.tuples(
        st.integers(0, PARTITIONS - 1),
        st.sampled_from([b"a", b"b", b"c"]),
        st.one_of(st.integers(0, 400), st.integers(-1500, -1), st.integers(2000, 6000)),
        st.integers(1, 9),
    )

    def build(steps: list[tuple[int, bytes, int, int]]) -> list[Event]:
        clock = 10_000
        out = []
        for partition, key, jump, amount in steps:
            ts = max(0, clock + jump)
            clock = max(clock, ts)
            out.append(Event(partition, key, EPOCH + ts, amount))
        return out

    return st.lists(step, min_size=1, max_size=60).map(build)


def _at(*events: tuple[int, bytes, int]) -> list[Event]:
    """Hand-written cases: (partition, key, ms after the epoch), amount 1."""
    return [Event(p, key, EPOCH + ms, 1) for p, key, ms in events]


def windowed(topic: str, bootstrap: str, url: str) -> Processor:
    return build_windowed(bootstrap, topic, CheckpointOptions(url, interval="1h", commit_interval="50ms"))


def produce(kafka: KafkaTool, topic: str, records: Sequence[Event]) -> None:
    producer = kafka.producer
    for e in records:
        value = json.dumps({"amount": e.amount}).encode()
        producer.produce(topic, value, e.key, partition=e.partition, timestamp=e.timestamp)
    assert producer.flush(30) == 0


def newest_checkpoint(url: str) -> tuple[int, dict[int, int], dict[bytes, bytes], set[bytes]]:
    """(generation, offsets, every stored key -> value, every key any of its files holds a value
    of — superseded and deleted ones too) of the newest checkpoint, from its files."""
    store = open_blob_store(url)
    (directory,) = store.list_dirs("")
    gens = [
        g
        for b in store.list(f"{directory}/snapshots/")
        if (g := layout.manifest_generation(b.key[len(directory) + 1 :]))
    ]
    gen = max(gens)
    manifest = json.loads(store.read(f"{directory}/{layout.manifest_key(gen)}"))
    offsets: dict[int, int] = {}
    rows: dict[bytes, bytes] = {}
    held: set[bytes] = set()
    for partition, entry in manifest["partitions"].items():
        offsets[int(partition)] = int(entry["next_offset"])
        for f in entry["files"]:
            table = pq.read_table(io.BytesIO(store.read(f"{directory}/{f['path']}"))).to_pydict()
            for key, value in zip(table["key"], table["value"], strict=True):
                if value is None:
                    rows.pop(key, None)
                else:
                    rows[key] = value
                    held.add(key)
    return gen, offsets, rows, held


def run_once(proc: Processor) -> Any:
    return proc.run(follow=False)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(records=events(), cuts=st.tuples(st.floats(0, 1), st.floats(0, 1)))
@example(records=_at((0, b"a", 10_000), (0, b"a", 11_100), (0, b"a", 10_500)), cuts=(0.4, 0.7))  # in grace
@example(records=_at((0, b"a", 10_000), (0, b"a", 11_400), (0, b"a", 10_500)), cuts=(0.4, 0.7))  # late
@example(  # past retention in partition 0 only (stream time is per partition)
    records=_at((0, b"a", 10_000), (1, b"a", 10_000), (0, b"b", 20_000), (1, b"a", 10_100)), cuts=(0.3, 0.6)
)
def test_restore_plus_tail_equals_full_processing_of_windows(
    kafka: KafkaTool, tmp_path: Path, records: list[Event], cuts: tuple[float, float]
) -> None:
    """Tansu (see the module docstring)."""
    first, second = sorted(round(c * len(records)) for c in cuts)
    first = max(first, 1)  # the first run checkpoints something
    second = max(second, first)
    topic = kafka.create_topic(f"win-{uuid.uuid4().hex[:12]}", PARTITIONS)
    case = tmp_path / uuid.uuid4().hex[:8]
    split_url, full_url = (case / "split").as_uri(), (case / "full").as_uri()
    ordered = sorted(records, key=lambda e: e.partition)  # what each task sees, in offset order

    produce(kafka, topic, records[:first])
    run_once(windowed(topic, kafka.bootstrap, split_url))
    checkpointed = newest_checkpoint(split_url)[0]

    produce(kafka, topic, records[first:second])
    crashed = windowed(topic, kafka.bootstrap, split_url)
    crashed.start()  # processes the second part ...
    crashed.close(checkpoint=False)  # ... and dies without a checkpoint: that work is lost
    assert newest_checkpoint(split_url)[0] == checkpointed

    produce(kafka, topic, records[second:])
    restarted = windowed(topic, kafka.bootstrap, split_url)
    report = run_once(restarted)
    assert report.checkpoint == checkpointed
    assert report.replayed_records == len(records) - first

    run_once(windowed(topic, kafka.bootstrap, full_url))
    _, split_offsets, split, split_held = newest_checkpoint(split_url)
    _, full_offsets, full, full_held = newest_checkpoint(full_url)
    assert split_offsets == full_offsets
    assert split == full, "restore + tail differs from processing everything"
    expected = window_model(ordered)
    assert full == expected, "the checkpoint differs from the window rules"
    # Past retention means gone from the files, not shadowed by a tombstone in a later delta.
    assert split_held <= expected.keys(), (
        f"expired windows in the files: {sorted(split_held - expected.keys())}"
    )
    assert full_held <= expected.keys(), (
        f"expired windows in the files: {sorted(full_held - expected.keys())}"
    )
