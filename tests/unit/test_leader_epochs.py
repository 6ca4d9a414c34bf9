"""Leader epochs kept with a checkpoint's offsets (KIP-320): the manifest field, the offset type
that carries an epoch from a reader's positions into the manifest and back, and the selection rule
that skips a checkpoint whose log was truncated below it.

The rule's cluster answers (where an epoch ends: Kafka's OffsetForLeaderEpoch) come from a precise
fake here; the same answers from a real broker, truncated by a torn segment and a restart, are
proven on Apache Kafka 4.1.1 in tests/integration/apache/test_broker_restart.py and
tests/integration/apache/test_leader_epochs.py.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Mapping

import pytest

from statesnap.checkpoint.manifest import (
    CheckpointManifest,
    DataFile,
    FileKind,
    NextOffset,
    PartitionCheckpoint,
    leader_epoch_of,
)
from statesnap.checkpoint.restore import CheckpointSelector
from statesnap.checkpoint.selection import TopicState, beyond_end, diverged, resume_offsets
from statesnap.checkpoint.writer import PartitionUpdate, write_partition_files
from statesnap.errors import CorruptCheckpointError
from statesnap.kafka.reader import assign_checked, assignment, log_truncated

from .conftest import T0, make_manifest


class FakeEpochs:
    """Where each partition's leader epochs end, as a leader answers OffsetForLeaderEpoch: the
    epoch's end is the start of the next newer epoch in its log, else the log end."""

    def __init__(self, starts: Mapping[int, Mapping[int, int]], ends: Mapping[int, int]) -> None:
        self.starts, self.ends = starts, ends  # partition -> {epoch: start offset}; log ends
        self.asked: list[dict[int, tuple[int, int | None]]] = []

    def __call__(self, positions: Mapping[int, NextOffset]) -> dict[int, int]:
        self.asked.append({p: (int(o), o.leader_epoch) for p, o in positions.items()})
        found = {}
        for p, pos in positions.items():
            epochs = sorted(self.starts[p].items())
            assert pos.leader_epoch is not None
            if pos.leader_epoch > epochs[-1][0]:
                found[p] = -1
                continue
            later = [start for epoch, start in epochs if epoch > pos.leader_epoch]
            end = later[0] if later else self.ends[p]
            if end < pos:
                found[p] = end
        return found


def _state(log_end: Mapping[int, int], probe: FakeEpochs | None, topic_id: str | None = None) -> TopicState:
    return TopicState(
        "orders-changelog",
        "cluster-a",
        tuple(sorted(log_end)),
        dict.fromkeys(log_end, 0),
        log_end=log_end,
        topic_id=topic_id,
        epoch_ends=probe,
    )


def _base(generation: int, partition: int) -> tuple[DataFile, ...]:
    path = f"data/{generation:020d}/p{partition:05d}-base-0.parquet"
    return (DataFile(path, FileKind.BASE, 1, 100, "0" * 64),)


def _with_epochs(
    generation: int, positions: Mapping[int, NextOffset], topic_id: str | None = None
) -> CheckpointManifest:
    """A manifest whose partitions resume at *positions*, with the epochs they carry."""
    m = make_manifest(
        generation,
        offsets=dict(positions),
        files={p: _base(generation, p) for p, off in positions.items() if off > 0},
    )
    return CheckpointManifest(
        m.table,
        m.topic,
        m.cluster_id,
        m.generation,
        m.partitions,
        m.created_at,
        m.state,
        m.writer,
        topic_id=topic_id,
    )


# --- the offset that carries an epoch ---------------------------------------------------------


def test_a_next_offset_is_an_int_everywhere_and_keeps_its_epoch_through_copies() -> None:
    """Lead-owned code copies a reader's positions (``dict(reader.positions)``) and passes them
    on as ints: the epoch must survive that, and JSON, pickling (Spark executors) and equality
    must see a plain offset."""
    pos = NextOffset(120, 3)
    positions = {0: pos}
    copied = dict(positions)
    assert copied[0] == 120
    assert leader_epoch_of(copied[0]) == 3
    assert json.dumps({"0": pos}) == '{"0": 120}'
    assert leader_epoch_of(pickle.loads(pickle.dumps(pos))) == 3
    assert leader_epoch_of(pos + 1) is None  # a computed offset: no record was read before it
    assert leader_epoch_of(120) is None
    assert NextOffset(5, -1).leader_epoch is None  # librdkafka's "no epoch"


def test_an_assignment_carries_the_epoch_only_where_one_is_known() -> None:
    assert assignment("t", 0, NextOffset(120, 3)).leader_epoch == 3
    assert assignment("t", 0, 120).leader_epoch is None
    assert assignment("t", 0, 0).offset < 0  # the beginning


class RecordingConsumer:
    """The calls assign_checked makes, in order (a fake: the time it saves is measured on Apache
    Kafka by the window and table equivalence tests, 0.5 s per reader)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def list_topics(self, timeout: float) -> None:
        self.calls.append("list_topics")

    def assign(self, tps: list[object]) -> None:
        self.calls.append("assign")

    def pause(self, tps: list[object]) -> None:
        self.calls.append("pause")

    def seek(self, tp: object) -> None:
        self.calls.append("seek")

    def resume(self, tps: list[object]) -> None:
        self.calls.append("resume")


@pytest.mark.parametrize(
    ("positions", "calls"),
    [
        ({0: 0, 1: 7}, ["list_topics", "assign"]),
        ({0: 3, 1: NextOffset(7, 1)}, ["assign", "pause", "seek", "resume"]),
    ],
)
def test_a_read_from_the_beginning_fetches_the_metadata_before_assigning(
    positions: dict[int, int], calls: list[str]
) -> None:
    """librdkafka resolves the beginning only once it knows the leader, else it retries after
    500 ms: metadata first when a partition starts there, and no extra request otherwise."""
    consumer = RecordingConsumer()
    assign_checked(consumer, "t", positions)
    assert consumer.calls == calls


# --- the manifest field -----------------------------------------------------------------------


def test_the_epoch_goes_from_a_position_into_the_manifest_and_its_checksum() -> None:
    m = _with_epochs(1, {0: NextOffset(120, 3), 1: NextOffset(20, None)})
    assert m.partitions[0].leader_epoch == 3
    assert type(m.partitions[0].next_offset) is int
    assert m.partitions[1].leader_epoch is None
    data = m.to_bytes()
    obj = json.loads(data)
    assert obj["partitions"]["0"]["leader_epoch"] == 3
    assert "leader_epoch" not in obj["partitions"]["1"]  # unknown: absent, as in old manifests
    assert CheckpointManifest.from_bytes(data) == m
    obj["partitions"]["0"]["leader_epoch"] = 4  # edited: the manifest's own checksum catches it
    with pytest.raises(CorruptCheckpointError, match="checksum"):
        CheckpointManifest.from_bytes(json.dumps(obj).encode())


def test_an_old_manifest_without_epochs_reads_as_unknown() -> None:
    old = make_manifest(files={0: _base(1, 0), 1: _base(1, 1)})
    assert all(
        pc.leader_epoch is None for pc in CheckpointManifest.from_bytes(old.to_bytes()).partitions.values()
    )
    assert resume_offsets(old, (0, 1)) == {0: 10, 1: 20}
    assert all(leader_epoch_of(o) is None for o in resume_offsets(old, (0, 1)).values())


@pytest.mark.parametrize(("epoch", "match"), [(-1, "leader_epoch"), ("3", "leader_epoch")])
def test_a_malformed_epoch_is_corrupt(epoch: object, match: str) -> None:
    with pytest.raises(CorruptCheckpointError, match=match):
        PartitionCheckpoint.from_json(0, {"next_offset": 0, "files": [], "leader_epoch": epoch})


def test_an_epoch_at_offset_0_is_implausible() -> None:
    with pytest.raises(CorruptCheckpointError, match="before offset 0"):
        PartitionCheckpoint.from_json(0, {"next_offset": 0, "files": [], "leader_epoch": 2})


def test_resume_offsets_hand_the_epoch_back_to_the_reader() -> None:
    m = _with_epochs(1, {0: NextOffset(120, 3), 1: NextOffset(20, 0)})
    offsets = resume_offsets(m, (0, 1, 2))
    assert offsets == {0: 120, 1: 20, 2: 0}
    assert [leader_epoch_of(o) for o in offsets.values()] == [3, 0, None]


def test_the_writer_records_the_epoch_of_each_position(tmp_path: object) -> None:
    """A commit point's offsets are the reader's positions: a partition unchanged since the
    previous checkpoint keeps that checkpoint's epoch even when its offset came as a plain int."""

    class NoFiles:
        url = "mem://"

    prev = _with_epochs(1, {0: NextOffset(0, None), 1: NextOffset(20, 2)})
    parts = write_partition_files(
        NoFiles(),  # type: ignore[arg-type]  # nothing is written: no base, no delta
        2,
        {0: PartitionUpdate(0, NextOffset(0, None)), 1: PartitionUpdate(1, 20)},
        prev,
    )
    assert parts[1].leader_epoch == 2
    assert parts[0].leader_epoch is None


# --- the selection rule -----------------------------------------------------------------------


def test_a_checkpoint_the_log_was_truncated_below_is_skipped_with_the_reason() -> None:
    """Apache Kafka 4.1.1 measured (tests/integration/apache): 120 records in epoch 0, recovery
    truncates to 100, the restarted leader writes epoch 2 from offset 100 up to 160. A checkpoint
    at 120 after a record of epoch 0 looks valid by offsets; its epoch ends at 100."""
    probe = FakeEpochs({0: {0: 0, 2: 100}}, {0: 160})
    state = _state({0: 160}, probe)
    truncated = _with_epochs(2, {0: NextOffset(120, 0)})
    assert beyond_end(truncated, state) is None
    reason = diverged(truncated, state)
    assert reason is not None
    assert "partition 0" in reason
    assert "offset 120" in reason
    assert "leader epoch 0 only up to offset 100" in reason
    assert "truncated" in reason
    assert diverged(_with_epochs(1, {0: NextOffset(90, 0)}), state) is None  # below the cut: intact
    assert diverged(_with_epochs(3, {0: NextOffset(150, 2)}), state) is None


def test_a_checkpoint_of_an_epoch_the_log_never_had_is_skipped() -> None:
    probe = FakeEpochs({0: {0: 0}}, {0: 50})
    reason = diverged(_with_epochs(1, {0: NextOffset(40, 7)}), _state({0: 50}, probe))
    assert reason is not None
    assert "knows no leader epoch 7" in reason


def test_no_question_is_asked_when_the_epochs_cannot_tell_anything() -> None:
    """Tansu writes epoch 0 and checks nothing: its end carries epoch 0 like the checkpoint, so
    the broker is not asked. Nor without epochs in the manifest (old manifests, Spark writers),
    without a cluster, or for partitions this restore does not read."""
    probe = FakeEpochs({0: {0: 0}, 1: {0: 0}}, {0: 50, 1: 50})
    same_epoch = _state({0: NextOffset(50, 0), 1: NextOffset(50, 0)}, probe)
    assert diverged(_with_epochs(1, {0: NextOffset(40, 0), 1: NextOffset(50, 0)}), same_epoch) is None
    assert diverged(make_manifest(offsets={0: 40, 1: 50}), _state({0: 50, 1: 50}, probe)) is None
    assert diverged(_with_epochs(1, {0: NextOffset(40, 0)}), None) is None
    assert diverged(_with_epochs(1, {0: NextOffset(40, 0)}), _state({0: 50}, None)) is None
    only_1 = _state({1: 50}, probe)
    assert diverged(_with_epochs(1, {0: NextOffset(40, 0), 1: NextOffset(50, 0)}), only_1) is None
    assert probe.asked == [{1: (50, 0)}]  # end epoch unknown there: asked once, found intact


class Repo:
    """The repository calls the selector makes while choosing (listing only)."""

    url = "mem://cp"

    def __init__(self, manifests: list[CheckpointManifest]) -> None:
        self._m = sorted(manifests, key=lambda m: -m.generation)

    def manifests(self) -> list[tuple[int, CheckpointManifest]]:
        return [(m.generation, m) for m in self._m]


def test_the_selector_continues_from_the_newest_checkpoint_before_the_truncation() -> None:
    """A truncation says nothing of checkpoints taken below it: the selector goes on to them,
    unlike a checkpoint of another incarnation of the topic (every older one skipped too)."""
    probe = FakeEpochs({0: {0: 0, 2: 100}}, {0: 160})
    manifests = [_with_epochs(1, {0: NextOffset(50, 0)}), _with_epochs(2, {0: NextOffset(120, 0)})]
    selector = CheckpointSelector(Repo(manifests), "orders")  # type: ignore[arg-type]
    chosen = next(selector.candidates(_state({0: 160}, probe), T0))
    assert chosen.generation == 1
    assert [s.generation for s in selector.skipped] == [2]
    assert "leader epoch 0 only up to offset 100" in selector.skipped[0].reason


def test_past_the_end_with_the_same_topic_id_is_a_truncation_older_checkpoints_survive() -> None:
    """Before new records refill the log (its end 100 < 120): the newest checkpoint is past the
    end. With the topic ID the checkpoint's, that is a truncation, not another incarnation of the
    topic: the older checkpoint below the cut is used. Without IDs it stays the old rule."""
    manifests = [
        _with_epochs(1, {0: NextOffset(50, 0)}, "id-a"),
        _with_epochs(2, {0: NextOffset(120, 0)}, "id-a"),
    ]
    selector = CheckpointSelector(Repo(manifests), "orders")  # type: ignore[arg-type]
    chosen = next(selector.candidates(_state({0: 100}, None, topic_id="id-a"), T0))
    assert chosen.generation == 1
    assert "past the partition's end (100)" in selector.skipped[0].reason
    assert "truncated" in selector.skipped[0].reason

    other = CheckpointSelector(Repo(manifests), "orders")  # type: ignore[arg-type]
    assert list(other.candidates(_state({0: 100}, None, topic_id="id-b"), T0)) == []


def test_the_truncation_error_is_an_offset_out_of_range_error_naming_the_cut() -> None:
    """librdkafka 2.16's words after a failed epoch check (measured on Apache Kafka 4.1.1)."""
    detail = (
        "Partition log truncation detected at offset 120 (leader epoch 0): broker end offset is 100 "
        "(offset leader epoch 0). Reset to INVALID.: Local: Partition log truncation detected"
    )
    e = log_truncated("orders", 0, NextOffset(120, 0), detail, "127.0.0.1:9092")
    assert (e.topic, e.partition, e.offset, e.log_end) == ("orders", 0, 120, 100)
    text = str(e)
    assert "truncated below next offset 120" in text
    assert "leader epoch 0 ends at offset 100" in text
    assert "127.0.0.1:9092" in text
    assert "incarnation" not in text
    assert "\n" not in text
