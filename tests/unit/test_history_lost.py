"""A running writer whose last checkpoint vanished (store wiped, restored from an older copy,
snapshot deleted), on a real file:// store.

A Python task holds the whole table in its store, so it recovers on its own: the next checkpoint is
complete (no delta on top of files that are gone), under a generation number never used before,
and the descriptor is written back. A writer that cannot rebuild (the Spark materializer's state is
those files) gets :class:`CheckpointHistoryLostError` instead of running on without checkpoints.
"""

from __future__ import annotations

import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from statesnap.blob import open_blob_store
from statesnap.checkpoint import CheckpointRepository
from statesnap.checkpoint.writer import PartitionUpdate
from statesnap.errors import CheckpointHistoryLostError
from statesnap.snapshot.api import SnapshotApi
from statesnap.snapshot.participant import Participant, SnapshotTask, TaskState
from statesnap.snapshot.store import BlobSnapshotStore
from statesnap.stores import MemoryStore

TOPIC = "orders"
PARTITIONS = (0, 1)


def _api(root: Path) -> tuple[SnapshotApi, CheckpointRepository]:
    blob = open_blob_store(str(root))
    repo = CheckpointRepository.for_table(blob, "c1", TOPIC)
    repo.ensure_descriptor(TOPIC, TOPIC, "c1", len(PARTITIONS))
    snapshots = BlobSnapshotStore(blob, repo.directory)
    api = SnapshotApi(snapshots, repo, table=TOPIC, topic=TOPIC, cluster_id="c1", partitions=PARTITIONS)
    return api, repo


def _contents(repo: CheckpointRepository) -> dict[bytes, bytes]:
    manifest = repo.latest()
    assert manifest is not None
    out: dict[bytes, bytes] = {}
    for _p, rows in repo.iter_partitions(manifest):
        out.update(zip(rows.column("key").to_pylist(), rows.column("value").to_pylist(), strict=True))
    return out


class _Writer:
    """A Python task over a memory store, and the rows it was given (the model)."""

    def __init__(self, api: SnapshotApi) -> None:
        self.task = SnapshotTask(
            api, task_id="main", owned=PARTITIONS, engine="python", retention=None,
            snapshot_timeout=timedelta(seconds=30), previous=None,
        )  # fmt: skip
        self.store, self.offsets = MemoryStore(), dict.fromkeys(PARTITIONS, 0)
        self.model: dict[bytes, bytes] = {}

    def write(self, tag: str, keys: range) -> TaskState:
        for i in keys:
            p = i % 2
            key, value = b"k%d" % i, f"{tag}-{i}".encode()
            self.store.apply(p, [(key, value, self.offsets[p], 0)])
            self.offsets[p] += 1
            self.model[key] = value
        store = self.store
        return TaskState(dict(self.offsets), store.export, store.changes, store.mark_checkpointed)


def test_a_python_task_writes_a_complete_checkpoint_under_a_new_generation(tmp_path: Path) -> None:
    root = tmp_path / "store"
    api, repo = _api(root)
    writer = _Writer(api)
    task, write, model = writer.task, writer.write, writer.model

    first = task.checkpoint(write("a", range(100)))
    second = task.checkpoint(write("b", range(10)))  # a delta on top of the first
    assert first is not None
    assert second is not None
    assert second.generation == 2
    assert any(f.kind == "delta" for f in second.files)

    shutil.move(root, tmp_path / "wiped")  # the whole store, at once
    third = task.checkpoint(write("c", range(5)))

    assert third is not None
    assert third.generation == 3, "a generation number was used twice"
    assert all(f.kind == "base" for f in third.files), "a delta was written on top of lost files"
    assert repo.verify(3).ok
    assert _contents(repo) == model
    assert repo.descriptor() is not None, "the descriptor was not written back"
    fourth = task.checkpoint(write("d", range(3)))  # and incremental again from there
    assert fourth is not None
    assert any(f.kind == "delta" for f in fourth.files)
    assert _contents(repo) == model


@pytest.mark.parametrize("how", ["starting a snapshot", "joining one"])
def test_a_writer_that_cannot_rebuild_says_so(tmp_path: Path, how: str) -> None:
    """The Spark materializer's state is its files: it stops, in one line, whether it starts the
    next snapshot or joins one another process started on the wiped store."""
    root = tmp_path / "store"
    api, _repo = _api(root)
    participant = Participant(
        api, task_id="spark", owned=PARTITIONS, engine="spark", retention=None,
        snapshot_timeout=timedelta(seconds=30), previous=None,
    )  # fmt: skip
    snap = participant.begin()
    store = MemoryStore()
    store.apply(0, [(b"k", b"v", 0, 0)])
    updates = {p: PartitionUpdate(p, 1 if p == 0 else 0, base=store.export().get(p)) for p in PARTITIONS}
    refs = participant.write(snap.generation, updates)
    assert participant.submit(snap.generation, refs, {0: 1, 1: 0}) is not None

    shutil.rmtree(root)
    if how == "starting a snapshot":
        with pytest.raises(CheckpointHistoryLostError, match="generation 1"):
            participant.begin()
    else:
        other, _ = _api(root)  # another process, on the wiped store
        started = other.create()
        with pytest.raises(CheckpointHistoryLostError, match="generation 1"):
            participant.still_builds_on(started)


@pytest.mark.parametrize("when", ["before-the-files", "after-the-files"])
def test_a_store_wiped_while_a_checkpoint_is_written_commits_nothing_naming_lost_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """The wipe lands after begin() found the last checkpoint there: before the snapshot's record
    is made (the wiped store then hands out an old generation number again) or after the delta
    files are written. The generation fails instead of committing a manifest that names the
    wiped files; the next one is complete, under a new number, and every row is in it."""
    root = tmp_path / "store"
    api, repo = _api(root)
    writer = _Writer(api)
    task, write, model = writer.task, writer.write, writer.model

    assert task.checkpoint(write("a", range(100))) is not None
    if when == "before-the-files":
        create = api.create

        def wipe_then_create(*args: Any, **kwargs: Any) -> Any:
            shutil.move(root, tmp_path / "wiped")  # the whole store, at once
            return create(*args, **kwargs)

        monkeypatch.setattr(api, "create", wipe_then_create)
    else:
        files = task.write

        def write_then_wipe(*args: Any, **kwargs: Any) -> Any:
            refs = files(*args, **kwargs)
            shutil.move(root, tmp_path / "wiped")
            return refs

        monkeypatch.setattr(task, "write", write_then_wipe)
    assert task.checkpoint(write("b", range(10))) is None, "a checkpoint named files that are gone"
    assert repo.latest() is None
    monkeypatch.undo()

    after = task.checkpoint(write("c", range(5)))
    assert after is not None
    assert after.generation > 1, "a committed generation's number was used again"
    assert all(f.kind == "base" for f in after.files)
    assert repo.verify(after.generation).ok
    assert _contents(repo) == model
