"""The equivalence invariant, as a Hypothesis property on the real broker:

    restore(any checkpoint) + replay(tail) == replay(everything)

key for key and byte for byte, for both local stores (memory, rocksdb) and both blob stores
(file, s3 on the moto server). Each example produces a random history of upserts, tombstones
(and the odd keyless record) to explicit partitions of a fresh topic, takes checkpoints at random
points, then compares three tables: restored from the newest checkpoint, restored from a randomly
chosen older one, and fully replayed without checkpoints; and all of them against a ground truth
the test computes itself from the acknowledged records.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from statesnap import CheckpointOptions, RetentionPolicy, StoreOptions, Table
from statesnap.digest import table_digest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 3
KEYS = 12

# A record: key id (None = keyless), value (None = tombstone; b"" is a real, empty value).
_record = st.tuples(
    st.one_of(st.integers(0, KEYS - 1), st.integers(0, KEYS - 1), st.none()),
    st.one_of(st.none(), st.binary(max_size=6), st.binary(max_size=300)),
)
_history = st.lists(
    st.tuples(st.lists(_record, max_size=25), st.booleans()),  # (segment, checkpoint after it?)
    min_size=1,
    max_size=4,
)


def _partition_of(key_id: int | None, salt: int) -> int:
    # Keys are partition-affine, as a Kafka partitioner makes them; keyless records go anywhere.
    return (salt if key_id is None else key_id) % PARTITIONS


def _key(key_id: int | None) -> bytes | None:
    return None if key_id is None else b"key-%02d" % key_id


def _at_or_after(produced: list[Any], offsets: dict[int, int]) -> int:
    """Records a restore from *offsets* must read from the log (keyless ones included: they
    are read, and skipped when applied)."""
    return sum(1 for r in produced if r.offset >= offsets.get(r.partition, 0))


@pytest.mark.parametrize("store", ["memory", "rocksdb"])
# S3 is the long variant: the invariant does not depend on the blob store, whose S3 behaviour is the
# file store's (test_blob_contract.py) and whose S3 restores are proven by default elsewhere
# (test_incremental_checkpoints.py, test_checkpoint_corruption.py, test_gc_table.py).
@pytest.mark.parametrize(
    "checkpoint_location", ["file", pytest.param("s3", marks=pytest.mark.long)], indirect=True
)
# Each example costs seconds on the real broker: no shrinking (it would run dozens more), the
# falsifying example is printed as generated.
@settings(
    max_examples=4,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(history=_history, data=st.data())
def test_restore_plus_tail_equals_full_replay(
    store: Literal["memory", "rocksdb"],
    checkpoint_location: Any,
    kafka: Any,
    tmp_path_factory: pytest.TempPathFactory,
    history: list[tuple[list[tuple[int | None, bytes | None]], bool]],
    data: st.DataObject,
) -> None:
    topic = kafka.create_topic(f"eq-{uuid.uuid4().hex[:12]}", PARTITIONS)
    parts = tuple(range(PARTITIONS))

    def table(**kw: Any) -> Table:
        options = (
            CheckpointOptions(
                checkpoint_location.url,
                storage_options=checkpoint_location.options,
                interval="1h",
                commit_interval="1h",
                **kw,
            )
            if kw
            else None
        )
        return Table(
            topic,
            bootstrap_servers=kafka.bootstrap,
            store=StoreOptions(store, path=tmp_path_factory.mktemp("db") / "db"),
            background=False,
            checkpoints=options,
        )

    writer = table(retention=RetentionPolicy(min_count=100))
    writer.start()
    produced: list[Any] = []
    checkpoints: dict[int, dict[int, int]] = {}  # generation -> its offsets
    try:
        for i, (segment, take_checkpoint) in enumerate(history):
            produced += kafka.produce(
                topic, [(_partition_of(k, i + j), _key(k), v) for j, (k, v) in enumerate(segment)]
            )
            ends = kafka.end_offsets(produced, parts)
            kafka.drain(writer, ends)
            if take_checkpoint:
                manifest = writer.checkpoint()
                if manifest is None:  # nothing consumed since the previous checkpoint
                    assert checkpoints
                    assert checkpoints[max(checkpoints)] == ends
                else:
                    assert manifest.offsets == ends  # next offset to consume, per partition
                    checkpoints[manifest.generation] = manifest.offsets
    finally:
        writer.close(checkpoint=False)

    truth = kafka.truth(produced)
    expected = table_digest(truth.items())
    ends = kafka.end_offsets(produced, parts)

    full = table()  # no checkpoint store at all: replays everything
    report = full.start()
    try:
        assert report.checkpoint is None
        assert full.offsets == ends
        full_digest = table_digest(full.raw_items())
    finally:
        full.close()
    assert full_digest == expected

    # Restore from the newest checkpoint, and from one chosen at random, then replay the tail.
    targets: list[int | None] = [None]
    if checkpoints:
        targets.append(data.draw(st.sampled_from(sorted(checkpoints)), label="older generation"))
    for generation in targets:
        restored = table(generation=generation)
        report = restored.start()
        try:
            want = generation if generation is not None else max(checkpoints, default=None)
            assert report.checkpoint == want
            assert report.skipped == []
            # It continued from the checkpoint: exactly the tail was replayed.
            offsets = checkpoints[want] if want is not None else {}
            assert report.replayed_records == _at_or_after(produced, offsets)
            assert restored.offsets == ends
            assert table_digest(restored.raw_items()) == full_digest == expected
            assert dict(restored.raw_items()) == truth
        finally:
            restored.close(checkpoint=False)
