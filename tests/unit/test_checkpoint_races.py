"""Checkpoints whose offsets could run ahead of (or behind) their rows: reorderings and races.

Snapshot tasks (one or two) on a real file:// checkpoint store with memory stores, as
tests/unit/test_group_participant.py does; a scenario that needs another thread's action at one
exact point (the orchestrator's refresher finishing a snapshot late) injects it there, so every
test is deterministic. A ``Table`` whose apply fails mid-batch is in
tests/integration/test_table_apply_failures.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from statesnap.snapshot.model import SnapshotState
from unit.snapshot_tasks import Log, Task, exact, two_tasks_after_g1


@pytest.fixture
def log() -> Log:
    return {p: [] for p in range(4)}


# --- the orchestrator's refresher finishing a snapshot late ----------------------------------


def late_refresher(t: Task, generation: int) -> Callable[[], None]:
    """What the refresher thread does when it read *generation* as complete but not yet
    ``COMPLETED`` (the reporter was between its report and marking it) and runs ``_finish`` after
    the table thread moved on: the manifest is there already, the record is not current any
    more, and ``on_completed`` still gets the old manifest."""
    done = t.task.api.get(generation)
    as_read = replace(done, state=SnapshotState.CREATED)
    assert as_read.complete
    orchestrator = t.task.orchestrator

    def finish() -> None:
        orchestrator._finish(as_read)  # the refresher thread's own step

    return finish


def test_a_late_completion_never_moves_last_checkpoint_back(tmp_path: Path, log: Log) -> None:
    a = Task(tmp_path, "a", (0, 1, 2, 3))
    a.write(log, 0, 10, "g1")
    g1 = a.checkpoint()
    assert g1 is not None
    finish_g1 = late_refresher(a, g1.generation)
    a.write(log, 0, 5, "g2")
    g2 = a.checkpoint()
    assert g2 is not None
    finish_g1()
    assert a.task.last_checkpoint is not None
    assert a.task.last_checkpoint.generation == g2.generation


def test_a_completion_landing_mid_report_does_not_lose_rows(tmp_path: Path, log: Log) -> None:
    a = Task(tmp_path, "a", (0, 1, 2, 3))
    for p in range(4):
        a.write(log, p, 10, "g1")
    g1 = a.checkpoint()
    assert g1 is not None
    finish_g1 = late_refresher(a, g1.generation)
    a.write(log, 0, 5, "g2")
    a.write(log, 1, 5, "g2")
    g2 = a.checkpoint()
    assert g2 is not None
    assert exact(a.repo, g2, log)
    a.write(log, 0, 3, "g3")  # partition 0: a delta on top of g2; partition 1: unchanged since g2
    g3 = a.checkpoint(before_changes=finish_g1)  # the refresher's late finish lands mid-report
    assert g3 is not None
    assert g3.offsets == {p: len(log[p]) for p in log}
    assert exact(a.repo, g3, log), "g3 claims g2's records of partitions 0 and 1 without their rows"


# --- questions of the review, answered (these hold today) ------------------------------------


def test_a_failed_snapshot_keeps_the_change_set_for_the_next_delta(tmp_path: Path, log: Log) -> None:
    """a reports g2, b never does, g2 fails (timeout): nothing a handed to g2 is forgotten."""
    a, b = two_tasks_after_g1(tmp_path, log, adopted=False)
    a.write(log, 0, 6, "g2")
    assert a.checkpoint() is None  # g2: a reported, b has not
    g2 = a.task.reported
    failed = a.task.orchestrator.fail(g2, "b", "timed out")
    assert failed.state is SnapshotState.FAILED
    assert a.task.pending(block=True) is None
    a.write(log, 0, 2, "g3")
    a.checkpoint()
    g3 = b.checkpoint()
    assert g3 is not None
    assert g3.generation > g2
    assert exact(a.repo, g3, log)


def test_a_task_that_never_adopted_its_snapshot_builds_on_the_older_one(tmp_path: Path, log: Log) -> None:
    """a reports g2, b completes it, and b starts g3 before a looks: a never adopts g2, so its
    g3 files are relative to g1 (its change set was never marked) — still exact."""
    a, b = two_tasks_after_g1(tmp_path, log)
    a.write(log, 0, 6, "g2")
    b.write(log, 2, 1, "g2")
    assert a.checkpoint() is None
    assert b.checkpoint() is not None  # g2 completed; a does not know
    b.write(log, 2, 1, "g3")
    b.task.api.create()
    a.write(log, 0, 4, "g3")
    assert a.checkpoint() is None
    g3 = b.checkpoint()
    assert g3 is not None
    assert exact(a.repo, g3, log)


def test_a_fenced_re_report_then_adopting_the_earlier_one_stays_exact(tmp_path: Path, log: Log) -> None:
    """a reports g2, applies more, re-reports to g2 from a stale view after b completed it (the
    re-report is fenced but its change set and refs are what a marks when it adopts g2)."""
    a, b = two_tasks_after_g1(tmp_path, log)
    a.write(log, 0, 6, "g2")
    assert a.checkpoint() is None
    g2 = b.checkpoint()
    assert g2 is not None
    a.write(log, 0, 4, "after")  # not in g2
    stale = replace(a.task.api.get(g2.generation), state=SnapshotState.CREATED)
    assert a.task.report(stale, a.state()) is None  # fenced
    assert a.task.pending(block=True) is None  # adopts g2 (with the fenced report's bookkeeping)
    a.write(log, 1, 2, "g3")
    a.checkpoint()
    g3 = b.checkpoint()
    assert g3 is not None
    assert exact(a.repo, g3, log)


def test_a_partition_dropped_and_gained_between_report_and_adoption(tmp_path: Path, log: Log) -> None:
    """a reports g2 with partition 1, loses it (dropped: its change-set entries go), gains it
    back restored from g1 (g2 not complete yet), replays; then g2 completes and a adopts it."""
    a, b = two_tasks_after_g1(tmp_path, log)
    a.write(log, 1, 6, "g2")
    assert a.checkpoint() is None
    a.store.drop_partitions([1])  # session lost: dropped without a report
    del a.offsets[1]
    a.task.lose([1])
    log[1].extend((f"p1-between-{i}".encode(), b"x") for i in range(3))
    restored_from = a.repo.latest()
    assert restored_from is not None
    a.store.load(1, a.repo.load_partition(restored_from, 1))
    a.offsets[1] = restored_from.partitions[1].next_offset
    a.task.gain([1], restored_from)
    a.catch_up(log, 1)
    g2 = b.checkpoint()
    assert g2 is not None
    assert a.task.pending(block=True) is None  # adopts g2
    a.write(log, 1, 2, "g3")
    a.checkpoint()
    g3 = b.checkpoint()
    assert g3 is not None
    assert exact(a.repo, g3, log)


# --- two writers of one table under one task id (CI's test_two_writers_on_one_table) ----------


def test_an_idle_report_on_another_writers_files_forgets_what_they_hold(
    tmp_path: Path, log: Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    """x's last checkpoint becomes y's files at x's own offsets (x's refresher finished y's
    snapshot: y died before committing it), then x reports to a snapshot it did not start without
    applying a record since. Its records since its last hand-out are in those files: forgotten,
    or x's next delta starts below its base's offsets and verify refuses the checkpoint."""
    x, y = Task(tmp_path, "main", (0, 1, 2, 3)), Task(tmp_path, "main", (0, 1, 2, 3))
    x.write(log, 0, 10, "g1")
    assert x.checkpoint() is not None
    x.write(log, 0, 5, "after-g1")  # in x's change set, not handed out
    for p in range(4):
        y.catch_up(log, p)

    def killed(*_: object) -> None:
        raise RuntimeError("y was killed before it committed the manifest")

    with monkeypatch.context() as patched:
        patched.setattr(y.repo, "commit", killed)
        with pytest.raises(RuntimeError, match="killed"):
            y.checkpoint()  # g2 holds y's report: complete, not committed
    x.task.orchestrator.refresh()  # x's refresher commits g2: y's files, x's offsets
    assert x.task.last_checkpoint is not None
    g2 = x.task.last_checkpoint
    assert g2.offsets == x.offsets
    y.task.api.create()  # g3, from another process (an operator's `snapshot create`)
    g3 = x.checkpoint()  # joins g3: every offset where g2 has it
    assert g3 is not None
    assert g3.generation == g2.generation + 1
    x.write(log, 0, 3, "g4")
    g4 = x.checkpoint()
    assert g4 is not None
    assert any(f.kind == "delta" for f in g4.files)
    assert x.repo.verify(g4.generation).ok, x.repo.verify(g4.generation).problems
    assert exact(x.repo, g4, log)
