"""Snapshot tasks whose partitions move (consumer groups), on a real file:// checkpoint store.

Two tasks, each with its own API and memory store as two processes would have, hand a partition
over the way :mod:`statesnap.membership` does (report on revocation, drop, restore on gain). What
must hold: a task that gains partitions after reporting reports again; the snapshot completes
with every partition; and a delta is only written on top of the files the task's change set is
relative to — when another task's report of a partition went into the checkpoint, the next
checkpoint of it is a new base, and every checkpoint restores to exactly the model.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from statesnap.blob import open_blob_store
from statesnap.checkpoint import CheckpointManifest, CheckpointRepository
from statesnap.snapshot.api import SnapshotApi
from statesnap.snapshot.model import SnapshotState
from statesnap.snapshot.participant import SnapshotTask, TaskState
from statesnap.snapshot.store import BlobSnapshotStore
from statesnap.stores import MemoryStore

TOPIC = "orders"


class Task:
    """A table task: a store, its offsets, a snapshot task, and the model of what it applied."""

    def __init__(self, root: Path, name: str, owned: tuple[int, ...]) -> None:
        blob = open_blob_store(str(root))
        self.repo = CheckpointRepository.for_table(blob, "c1", TOPIC)
        self.repo.ensure_descriptor(TOPIC, TOPIC, "c1", 4)
        api = SnapshotApi(
            BlobSnapshotStore(blob, self.repo.directory),
            self.repo,
            table=TOPIC,
            topic=TOPIC,
            cluster_id="c1",
            partitions=range(4),
        )
        self.task = SnapshotTask(
            api,
            task_id=name,
            owned=owned,
            engine="python",
            retention=None,
            snapshot_timeout=timedelta(seconds=60),
            previous=None,
        )
        self.store = MemoryStore()
        self.offsets = dict.fromkeys(owned, 0)

    def write(self, log: dict[int, list[tuple[bytes, bytes | None]]], p: int, n: int, tag: str) -> None:
        """Append *n* records to partition *p*'s log (the shared "topic") and apply them."""
        for i in range(n):
            key = b"p%d-k%d" % (p, i % 5)
            log[p].append((key, None if i % 4 == 3 else f"{tag}-{i}".encode()))
        self.catch_up(log, p)

    def catch_up(self, log: dict[int, list[tuple[bytes, bytes | None]]], p: int) -> None:
        start = self.offsets[p]
        self.store.apply(p, [(k, v, off, 0) for off, (k, v) in enumerate(log[p]) if off >= start])
        self.offsets[p] = len(log[p])

    def state(self) -> TaskState:
        return TaskState(
            dict(self.offsets), self.store.export, self.store.changes, self.store.mark_checkpointed
        )

    def checkpoint(self) -> CheckpointManifest | None:
        return self.task.checkpoint(self.state())

    def hand_over(self, p: int) -> None:
        self.checkpoint()  # report everything owned, the leaving partition included
        self.store.drop_partitions([p])
        del self.offsets[p]
        self.task.lose([p])

    def gain(self, p: int, log: dict[int, list[tuple[bytes, bytes | None]]]) -> None:
        restored = self.repo.latest()
        if restored is not None and p in restored.partitions:
            self.store.load(p, self.repo.load_partition(restored, p))
        self.offsets[p] = restored.partitions[p].next_offset if restored and p in restored.partitions else 0
        self.task.gain([p], restored)
        self.catch_up(log, p)


def model(log: dict[int, list[tuple[bytes, bytes | None]]], upto: dict[int, int]) -> dict[bytes, bytes]:
    out: dict[bytes, bytes] = {}
    for p, records in log.items():
        for key, value in records[: upto[p]]:
            if value is None:
                out.pop(key, None)
            else:
                out[key] = value
    return out


def restored(repo: CheckpointRepository, manifest: CheckpointManifest) -> dict[bytes, bytes]:
    out: dict[bytes, bytes] = {}
    for _p, rows in repo.iter_partitions(manifest):
        out.update(zip(rows.column("key").to_pylist(), rows.column("value").to_pylist(), strict=True))
    return out


@pytest.fixture
def log() -> dict[int, list[tuple[bytes, bytes | None]]]:
    return {p: [] for p in range(4)}


def test_a_gained_partition_is_reported_again_and_its_delta_never_builds_on_foreign_files(
    tmp_path: Path, log: dict[int, list[tuple[bytes, bytes | None]]]
) -> None:
    a, b, c = Task(tmp_path, "a", (0,)), Task(tmp_path, "b", (2, 3)), Task(tmp_path, "c", (1,))
    for t, parts in ((a, (0,)), (b, (2, 3)), (c, (1,))):
        for p in parts:
            t.write(log, p, 12, "g1")
    assert a.checkpoint() is None  # the others have yet to report
    assert b.checkpoint() is None
    g1 = c.checkpoint()
    assert g1 is not None
    assert restored(a.repo, g1) == model(log, {p: len(log[p]) for p in log})

    # g2: a reports first, then b hands partition 3 over (its report lands after a's) ...
    a.write(log, 0, 6, "g2")
    g2 = a.task.api.create()
    assert a.checkpoint() is None
    b.write(log, 3, 7, "b-before-leaving")
    b.hand_over(3)
    # ... a gains it from g1 (g2 is not complete: c has not reported), catches up, reports again.
    log[3].extend([(b"p3-k1", b"after-b"), (b"p3-k9", b"after-b")])
    a.gain(3, log)
    assert a.task.pending(block=True) is not None, "a gained a partition after reporting: report again"
    assert a.checkpoint() is None
    assert a.task.api.get(g2.generation).tasks["a"].partitions == {0, 3}
    done = c.checkpoint()
    assert done is not None
    assert done.generation == g2.generation
    snap = a.task.api.get(g2.generation)
    assert snap.state is SnapshotState.COMPLETED
    # Partition 3 was reported by both; b's report came second and its files are the checkpoint's.
    assert done.partitions[3] == snap.tasks["b"].checkpoints[TOPIC].partitions[3]
    upto = {p: pc.next_offset for p, pc in done.partitions.items()}
    assert restored(a.repo, done) == model(log, upto)

    # g3: partition 3's change set in a is relative to a's own report, not to b's files: a new base.
    a.task.pending(block=True)  # a learns that g2 completed
    a.write(log, 3, 5, "g3")
    a.write(log, 0, 3, "g3")
    for t in (b, c):
        t.write(log, next(iter(t.offsets)), 2, "g3")
    assert a.checkpoint() is None
    assert b.checkpoint() is None
    g3 = c.checkpoint()
    assert g3 is not None
    writer = a.task.api.get(g3.generation).tasks["a"].writer
    assert 3 in writer["base_partitions"]
    assert 0 in writer["delta_partitions"]
    assert restored(a.repo, g3) == model(log, {p: len(log[p]) for p in log})


def test_a_snapshot_completes_when_the_dead_tasks_partitions_move(
    tmp_path: Path, log: dict[int, list[tuple[bytes, bytes | None]]]
) -> None:
    a, b = Task(tmp_path, "a", (0, 1)), Task(tmp_path, "b", (2, 3))
    for t, parts in ((a, (0, 1)), (b, (2, 3))):
        for p in parts:
            t.write(log, p, 10, "g1")
    a.checkpoint()
    assert b.checkpoint() is not None
    a.write(log, 1, 4, "g2")
    b.write(log, 2, 4, "lost")  # b dies: these records are in the log but in no report of b
    g2 = a.task.api.create()
    assert a.checkpoint() is None
    assert a.task.api.get(g2.generation).missing_partitions == [2, 3]
    a.gain(2, log)
    a.gain(3, log)
    done = a.checkpoint()
    assert done is not None
    assert set(a.task.api.get(g2.generation).tasks) == {"a"}
    assert restored(a.repo, done) == model(log, {p: len(log[p]) for p in log})
    # A task owning nothing reports nothing and starts nothing.
    idle = Task(tmp_path, "idle", ())
    assert idle.checkpoint() is None


def test_records_applied_after_an_idle_report_are_in_the_next_delta(
    tmp_path: Path, log: dict[int, list[tuple[bytes, bytes | None]]]
) -> None:
    """A task whose offsets had not moved reports no file; it learns that the snapshot completed
    only later, after it applied new records. Those records must stay in its change set (they were
    once forgotten: the next checkpoint claimed their offsets without their rows)."""
    a, b = Task(tmp_path, "a", (0, 1)), Task(tmp_path, "b", (2, 3))
    for t, parts in ((a, (0, 1)), (b, (2, 3))):
        for p in parts:
            t.write(log, p, 10, "g1")
    a.checkpoint()
    assert b.checkpoint() is not None
    assert a.task.pending(block=True) is None  # a adopts g1: its change set is empty now
    b.write(log, 2, 3, "g2")
    g2 = b.task.api.create()
    assert a.checkpoint() is None  # a joins g2 with unmoved offsets: no file written
    assert set(a.task.api.get(g2.generation).tasks) == {"a"}
    assert b.checkpoint() is not None
    a.write(log, 0, 7, "after")  # applied before a hears that g2 completed
    assert a.task.pending(block=True) is None  # a adopts g2 here
    assert a.task.last_checkpoint is not None
    assert a.task.last_checkpoint.generation == g2.generation
    a.checkpoint()
    g3 = b.checkpoint()
    assert g3 is not None
    assert g3.offsets == {p: len(log[p]) for p in log}
    assert restored(a.repo, g3) == model(log, {p: len(log[p]) for p in log})
