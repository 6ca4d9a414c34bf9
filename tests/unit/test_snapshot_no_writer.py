"""``snapshot create --wait`` with no writer running says so (issue 34, item 7): a snapshot is taken
by the table's writers at their next commit, and creating one only asks them. Before, the wait ran
its whole timeout and the snapshot failed with "timed out waiting for partitions [...]; tasks that
owned them last time: ..." without saying a writer must run. On a real file:// store, the command
run as a user runs it (a fresh process); no broker (a blob snapshot store)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from statesnap.blob import open_blob_store
from statesnap.checkpoint import CheckpointRepository
from statesnap.checkpoint.datafile import empty_table
from statesnap.checkpoint.writer import PartitionUpdate, write_partition_files
from statesnap.snapshot.api import SnapshotApi
from statesnap.snapshot.model import CheckpointRef, SnapshotState, TaskSnapshot
from statesnap.snapshot.store import BlobSnapshotStore

NO_WRITER = (
    "no writer reported: a writer must be running to take the snapshot (statesnap materialize --follow"
)


def table_at(where: Path) -> CheckpointRepository:
    repo = CheckpointRepository.for_table(open_blob_store(str(where)), "c1", "orders")
    repo.ensure_descriptor("orders", "orders", "c1", 2)
    return repo


def test_create_wait_without_a_writer_says_a_writer_must_run(tmp_path: Path) -> None:
    table_at(tmp_path)
    command = [sys.executable, "-m", "statesnap.cli", "snapshot"]
    where = [str(tmp_path), "--table", "orders"]
    waited = subprocess.run(
        [*command, "create", *where, "--wait", "--timeout", "1s"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=dict(os.environ),
    )
    assert waited.returncode == 1, waited.stderr
    assert "FAILED" in waited.stdout
    assert f"timed out waiting for partitions [0, 1]: {NO_WRITER}" in waited.stdout
    shown = subprocess.run(
        [*command, "show", *where, "1"], capture_output=True, text=True, timeout=120, check=False
    )
    assert NO_WRITER in shown.stdout  # the record keeps the reason


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now


def test_a_writer_that_reported_part_is_named_and_asked_after(tmp_path: Path) -> None:
    """Some partitions reported: the missing ones are named, with the tasks that owned them in the
    last completed snapshot, and no claim that no writer runs; one that reads past its deadline
    before anyone marks it says no writer reported as well."""
    repo = table_at(tmp_path)
    clock = Clock()
    api = SnapshotApi(
        BlobSnapshotStore(repo.store, repo.directory),
        repo,
        table="orders",
        topic="orders",
        cluster_id="c1",
        partitions=range(2),
        clock=clock,
    )

    def part(generation: int, task_id: str, partition: int) -> TaskSnapshot:
        """What a task reports at a commit point: its partition's files, written, and its offset."""
        refs = write_partition_files(
            repo, generation, {partition: PartitionUpdate(partition, 0, base=empty_table())}
        )
        return TaskSnapshot(task_id, {("orders", partition): 0}, {"orders": CheckpointRef(repo.url, refs)})

    api.create()
    api.orchestrator.report(1, part(1, "a", 0))
    api.orchestrator.report(1, part(1, "b", 1))
    api.create(timeout="10s")
    api.orchestrator.report(2, part(2, "a", 0))
    clock.now += timedelta(seconds=11)
    failed = api.orchestrator.refresh()
    assert failed.state is SnapshotState.FAILED
    assert failed.error == (
        "timed out waiting for partitions [1]; tasks that owned them last time: b (is their writer running?)"
    )
    api.create(timeout="10s")
    clock.now += timedelta(seconds=11)
    seen = api.get(3)
    assert seen.state is SnapshotState.FAILED
    assert seen.error is not None
    assert "passed waiting for partitions [0, 1]: no writer reported" in seen.error
