"""The snapshot protocol on a real file:// blob store, with tasks simulated in-process."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from statesnap.blob import open_blob_store
from statesnap.checkpoint import CheckpointRepository, RetentionPolicy, collect_garbage
from statesnap.checkpoint.writer import PartitionUpdate, write_partition_files
from statesnap.errors import BlobStoreError, SnapshotError, StaleGenerationError
from statesnap.processor.diff import diff_snapshots
from statesnap.snapshot.api import SnapshotApi
from statesnap.snapshot.model import CheckpointRef, Snapshot, SnapshotState, TaskSnapshot
from statesnap.snapshot.orchestrator import LocalOrchestrator
from statesnap.snapshot.store import BlobSnapshotStore

TOPIC = "orders"


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def api(tmp_path: Path, clock: Clock) -> SnapshotApi:
    blob = open_blob_store(str(tmp_path))
    repo = CheckpointRepository.for_table(blob, "c1", TOPIC)
    repo.ensure_descriptor(TOPIC, TOPIC, "c1", 4)
    return SnapshotApi(
        BlobSnapshotStore(blob, repo.directory),
        repo,
        table=TOPIC,
        topic=TOPIC,
        cluster_id="c1",
        partitions=range(4),
        clock=clock,
    )


def rows(pairs: dict[bytes, bytes]) -> pa.Table:
    keys = sorted(pairs)
    return pa.table(
        {
            "key": pa.array(keys, pa.binary()),
            "value": pa.array([pairs[k] for k in keys], pa.binary()),
            "offset": pa.array(range(len(keys)), pa.int64()),
            "timestamp": pa.array([0] * len(keys), pa.int64()).cast(pa.timestamp("ms")),
        }
    )


def task(
    api: SnapshotApi, generation: int, task_id: str, parts: dict[int, dict[bytes, bytes]]
) -> TaskSnapshot:
    """What a Table task does at a commit point: write its files, describe them."""
    updates = {p: PartitionUpdate(p, len(kv) + 10, base=rows(kv)) for p, kv in parts.items()}
    refs = write_partition_files(api.repo, generation, updates)
    return TaskSnapshot(
        task_id,
        {(TOPIC, p): len(kv) + 10 for p, kv in parts.items()},
        {TOPIC: CheckpointRef(api.repo.url, refs)},
    )


def test_snapshot_completes_only_when_every_partition_reported(api: SnapshotApi) -> None:
    snap = api.create(label="nightly")
    assert snap.state is SnapshotState.CREATED
    assert snap.generation == 1
    assert api.create().generation == 1, "create returns the snapshot still in progress"

    after_one = api.orchestrator.report(1, task(api, 1, "a", {0: {b"k0": b"v0"}, 2: {b"k2": b"v2"}}))
    assert after_one.state is SnapshotState.CREATED
    assert after_one.missing_partitions == [1, 3]
    assert api.repo.generations() == [], "no manifest before every partition is in"

    done = api.orchestrator.report(1, task(api, 1, "b", {1: {b"k1": b"v1"}, 3: {}}))
    assert done.state is SnapshotState.COMPLETED
    manifest = api.repo.read_manifest(1)
    assert sorted(manifest.partitions) == [0, 1, 2, 3]
    assert manifest.writer["tasks"] == ["a", "b"]
    assert manifest.offsets == {0: 11, 1: 11, 2: 11, 3: 10}


def test_stale_reports_are_fenced(api: SnapshotApi) -> None:
    api.create()
    with pytest.raises(StaleGenerationError, match="generation 7"):
        api.orchestrator.report(7, task(api, 7, "a", {0: {}}))
    api.orchestrator.report(1, task(api, 1, "a", {0: {}, 1: {}, 2: {}, 3: {}}))
    with pytest.raises(StaleGenerationError, match="COMPLETED"):
        api.orchestrator.report(1, task(api, 1, "late", {}))


def test_expired_snapshot_fails_naming_missing_partitions_and_owners(api: SnapshotApi, clock: Clock) -> None:
    api.create()
    api.orchestrator.report(1, task(api, 1, "a", {0: {}, 2: {}}))
    api.orchestrator.report(1, task(api, 1, "b", {1: {}, 3: {}}))
    api.create(timeout="10s")
    api.orchestrator.report(2, task(api, 2, "a", {0: {}, 2: {}}))
    clock.now += timedelta(seconds=11)
    failed = api.orchestrator.refresh()
    assert failed.state is SnapshotState.FAILED
    assert failed.error is not None
    assert "[1, 3]" in failed.error
    assert "b" in failed.error
    assert 2 not in api.repo.generations(), "a failed snapshot never gets a manifest"
    assert api.create().generation == 3, "a new create starts a new generation"


def test_failing_task_marks_snapshot_failed(api: SnapshotApi) -> None:
    api.create()
    assert api.orchestrator.fail(1, "a", "disk full").state is SnapshotState.FAILED
    assert "disk full" in (api.get(1).error or "")


def test_generation_skips_numbers_used_by_plain_checkpoints(api: SnapshotApi) -> None:
    write_partition_files(api.repo, 5, {0: PartitionUpdate(0, 1, base=rows({b"a": b"1"}))})
    assert api.create().generation == 6, "generations only grow, past any data directory"


def test_pin_unpin_delete_and_gc_respects_pins(api: SnapshotApi, clock: Clock) -> None:
    for gen in (1, 2, 3):
        api.create(pin=gen == 1)
        api.orchestrator.report(gen, task(api, gen, "a", {p: {b"k%d" % p: b"g%d" % gen} for p in range(4)}))
    with pytest.raises(SnapshotError, match="pinned"):
        api.delete(1)
    clock.now += timedelta(days=30)
    report = collect_garbage(
        api.repo,
        RetentionPolicy(1, timedelta(0), timedelta(0)),
        now=clock.now,
        keep=api.retained().__contains__,
    )
    assert report.deleted_generations == [2]
    assert api.repo.generations() == [3, 1]
    api.unpin(1)
    api.delete(1)
    assert 1 not in {s.generation for s in api.list()}


def test_diff_between_snapshots(api: SnapshotApi) -> None:
    api.create()
    api.orchestrator.report(
        1, task(api, 1, "a", {0: {b"a": b"1", b"b": b"1"}, 1: {b"c": b"1"}, 2: {}, 3: {}})
    )
    api.create()
    api.orchestrator.report(
        2, task(api, 2, "a", {0: {b"a": b"1", b"b": b"2"}, 1: {}, 2: {b"d": b"1"}, 3: {}})
    )
    d = diff_snapshots(api.repo, 1, 2)
    assert (d.added, d.removed, d.changed, d.unchanged) == (1, 1, 1, 1)
    assert d.examples == {"added": ["d"], "removed": ["c"], "changed": ["b"]}


def test_checkpoints_without_a_record_are_listed_as_snapshots(api: SnapshotApi) -> None:
    """A checkpoint an older statesnap committed without a snapshot record is a COMPLETED one-task
    snapshot, and pinning it gives it a record (so GC keeps it like any other)."""
    from statesnap.checkpoint.manifest import CheckpointManifest, PartitionCheckpoint

    files = write_partition_files(
        api.repo, 1, {p: PartitionUpdate(p, 5, base=rows({b"k%d" % p: b"v"})) for p in range(4)}
    )
    api.repo.commit(
        CheckpointManifest(TOPIC, TOPIC, "c1", 1, files, datetime.now(UTC), writer={"engine": "spark"})
    )
    assert all(isinstance(pc, PartitionCheckpoint) for pc in files.values())
    (snap,) = api.list()
    assert snap.state is SnapshotState.COMPLETED
    assert list(snap.tasks) == ["spark"]
    assert snap.missing_partitions == []
    assert api.get(snap.generation) == snap
    assert api.pin(1).pinned
    assert api.store.get(1).pinned  # a real record now
    assert api.create().generation == snap.generation + 1


def test_write_checkpoint_commits_through_the_orchestrator(api: SnapshotApi) -> None:
    """Every writer's checkpoint has a snapshot record: one commit path."""
    from statesnap.task.write import write_checkpoint

    m = write_checkpoint(
        api.repo,
        table=TOPIC,
        topic=TOPIC,
        cluster_id="c1",
        engine="spark",
        updates={p: PartitionUpdate(p, 5, base=rows({b"k%d" % p: b"v"})) for p in range(4)},
    )
    record = api.store.get(m.generation)
    assert record.state is SnapshotState.COMPLETED
    assert m.writer["engine"] == "spark"
    assert m.keys == 4
    assert [t.writer["engine"] for t in record.tasks.values()] == ["spark"]


class UnreachableStore(BlobSnapshotStore):
    """A snapshot store whose reads fail while ``down`` is set, as S3 does when it is unreachable
    (a fake of the outage only: the store itself is the real file:// one)."""

    down = True

    def current(self, block: bool = True) -> Snapshot:
        if self.down:
            raise BlobStoreError("s3://bucket/ckpt: could not connect to the endpoint URL")
        return super().current(block)


def test_a_snapshot_store_that_stays_down_is_said_once_then_once_when_it_answers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The orchestrator re-reads the snapshot store every refresh_interval; an outage was two
    warning lines a second (at the 0.5 s default), for as long as it lasted."""
    blob = open_blob_store(str(tmp_path))
    repo = CheckpointRepository.for_table(blob, "c1", TOPIC)
    repo.ensure_descriptor(TOPIC, TOPIC, "c1", 4)
    store = UnreachableStore(blob, repo.directory)
    orchestrator = LocalOrchestrator(
        store, repo, table=TOPIC, topic=TOPIC, cluster_id="c1", refresh_interval=0.01
    )
    store.down = False
    with caplog.at_level(logging.WARNING, logger="statesnap.snapshot.orchestrator"):
        orchestrator.start()
        try:
            store.down = True
            time.sleep(0.6)  # some 50 failed refreshes
            store.down = False
            time.sleep(0.1)
        finally:
            orchestrator.close()
    said = [r.getMessage() for r in caplog.records if r.name == "statesnap.snapshot.orchestrator"]
    assert len(said) == 2, said
    assert said[0].startswith("snapshot refresh failed; retrying every 0.01 s: ")
    assert "could not connect" in said[0]
    assert said[1].startswith("snapshot refresh works again (after ")
