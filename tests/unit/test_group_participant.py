"""Snapshot tasks whose partitions move (consumer groups), on a real file:// checkpoint store.

Two tasks, each with its own API and memory store as two processes would have, hand a partition
over the way :mod:`statesnap.python.membership` does (report on revocation, drop, restore on gain). What
must hold: a task that gains partitions after reporting reports again; the snapshot completes
with every partition; and a delta is only written on top of the files the task's change set is
relative to — when another task's report of a partition went into the checkpoint, the next
checkpoint of it is a new base, and every checkpoint restores to exactly the model.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from statesnap.snapshot.model import SnapshotState
from unit.snapshot_tasks import TOPIC, Log, Task, model, restored, two_tasks_after_g1


@pytest.fixture
def log() -> Log:
    return {p: [] for p in range(4)}


def test_a_gained_partition_is_reported_again_and_its_delta_never_builds_on_foreign_files(
    tmp_path: Path, log: Log
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


def test_a_snapshot_completes_when_the_dead_tasks_partitions_move(tmp_path: Path, log: Log) -> None:
    a, b = two_tasks_after_g1(tmp_path, log, adopted=False)
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


def test_records_applied_after_an_idle_report_are_in_the_next_delta(tmp_path: Path, log: Log) -> None:
    """A task whose offsets had not moved reports no file; it learns that the snapshot completed
    only later, after it applied new records. Those records must stay in its change set (they were
    once forgotten: the next checkpoint claimed their offsets without their rows)."""
    a, b = two_tasks_after_g1(tmp_path, log)  # a adopted g1: its change set is empty now
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
