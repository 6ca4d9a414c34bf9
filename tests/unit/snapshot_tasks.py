"""Snapshot tasks of one table as separate processes would run them, in one test process.

Each :class:`Task` has its own snapshot API, memory store and offsets over a shared "topic" (a
dict of per-partition record lists), on a real file:// checkpoint store. The model of what a
checkpoint must hold is computed from that log, never through statesnap.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from statesnap.blob import open_blob_store
from statesnap.checkpoint import CheckpointManifest, CheckpointRepository
from statesnap.snapshot.api import SnapshotApi
from statesnap.snapshot.participant import SnapshotTask, TaskState
from statesnap.snapshot.store import BlobSnapshotStore
from statesnap.stores import MemoryStore

TOPIC = "orders"
#: Per partition, the records (key, value or None for a tombstone) in offset order.
Log = dict[int, list[tuple[bytes, bytes | None]]]


class Task:
    """A table task: a store, its offsets, a snapshot task, over the shared log."""

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

    def write(self, log: Log, p: int, n: int, tag: str) -> None:
        """Append *n* records to partition *p*'s log (five keys, every fourth a tombstone) and
        apply them."""
        for i in range(n):
            key = b"p%d-k%d" % (p, i % 5)
            log[p].append((key, None if i % 4 == 3 else f"{tag}-{i}".encode()))
        self.catch_up(log, p)

    def catch_up(self, log: Log, p: int) -> None:
        start = self.offsets[p]
        self.store.apply(p, [(k, v, off, 0) for off, (k, v) in enumerate(log[p]) if off >= start])
        self.offsets[p] = len(log[p])

    def state(self, before_changes: Callable[[], None] | None = None) -> TaskState:
        """The commit point's state; *before_changes* runs when the task takes its change set
        (where another thread's action can land mid-report)."""

        def changes() -> dict[int, Any]:
            if before_changes is not None:
                before_changes()
            return self.store.changes()

        return TaskState(dict(self.offsets), self.store.export, changes, self.store.mark_checkpointed)

    def checkpoint(self, before_changes: Callable[[], None] | None = None) -> CheckpointManifest | None:
        return self.task.checkpoint(self.state(before_changes))

    def hand_over(self, p: int) -> None:
        self.checkpoint()  # report everything owned, the leaving partition included
        self.store.drop_partitions([p])
        del self.offsets[p]
        self.task.lose([p])

    def gain(self, p: int, log: Log) -> None:
        restored = self.repo.latest()
        if restored is not None and p in restored.partitions:
            self.store.load(p, self.repo.load_partition(restored, p))
        self.offsets[p] = restored.partitions[p].next_offset if restored and p in restored.partitions else 0
        self.task.gain([p], restored)
        self.catch_up(log, p)


def two_tasks_after_g1(root: Path, log: Log, *, adopted: bool = True) -> tuple[Task, Task]:
    """Tasks a (partitions 0, 1) and b (2, 3) with ten records each, both in checkpoint g1 (b's
    report completed it); *adopted*: a has also seen that g1 completed (its change set is empty)."""
    a, b = Task(root, "a", (0, 1)), Task(root, "b", (2, 3))
    for t, parts in ((a, (0, 1)), (b, (2, 3))):
        for p in parts:
            t.write(log, p, 10, "g1")
    a.checkpoint()
    assert b.checkpoint() is not None
    if adopted:
        assert a.task.pending(block=True) is None
    return a, b


def model(log: Log, upto: dict[int, int]) -> dict[bytes, bytes]:
    """The table after the first ``upto[p]`` records of each partition, by a KTable's rules."""
    out: dict[bytes, bytes] = {}
    for p, records in log.items():
        for key, value in records[: upto.get(p, 0)]:
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


def exact(repo: CheckpointRepository, manifest: CheckpointManifest, log: Log) -> bool:
    """Whether the checkpoint holds exactly the rows below the offsets it claims."""
    return restored(repo, manifest) == model(log, manifest.offsets)
