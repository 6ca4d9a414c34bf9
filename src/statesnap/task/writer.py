"""The part of a task that writes checkpoints — the component a read-only task lacks.

A writer is a task of its table's snapshots (:class:`~statesnap.snapshot.participant.SnapshotTask`):
it joins them after the restore, watches for snapshots others started, reports at commit points
and takes a checkpoint when the checkpoint interval has elapsed. A read-only task (a follower's
replica, ``statesnap dump``) has no :class:`TaskWriter` at all: nothing of this runs, and asking it
for a checkpoint raises :class:`~statesnap.errors.ReadOnlyTableError`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from statesnap.checkpoint import CheckpointManifest
from statesnap.errors import BlobStoreError, CheckpointError, SnapshotError
from statesnap.snapshot.participant import SnapshotTask, TaskState
from statesnap.task.hooks import CheckpointHook, call_safely
from statesnap.task.opening import OpenedTask, TaskEngine

__all__ = ["TaskWriter"]

log = logging.getLogger(__name__)


class TaskWriter:
    """A task's snapshot participant and its checkpoint cadence; without a checkpoint store it
    never joins (commit points then only keep the store from growing apart)."""

    def __init__(self, name: str, *, checkpoint_interval: timedelta, commit_interval: timedelta) -> None:
        self.name = name
        self.checkpoint_interval = checkpoint_interval
        self._commit_interval = commit_interval
        #: The task's part in its table's snapshots, once joined (None: no checkpoint store).
        self.snapshots: SnapshotTask | None = None
        self._last_checkpoint_at = time.monotonic()

    def join(
        self,
        task: OpenedTask,
        *,
        task_id: str,
        owned: tuple[int, ...],
        previous: CheckpointManifest | None,
        state_versions: Mapping[str, int],
        describes: Mapping[str, Any] | None,
        on_checkpoint: CheckpointHook | None,
    ) -> None:
        """Become a task of the table's snapshots, continuing *previous* (the restored checkpoint)."""
        self.snapshots = task.join_snapshots(
            SnapshotTask,
            task_id=task_id,
            owned=owned,
            engine=TaskEngine.PYTHON,
            previous=previous,
            refresh_interval=min(1.0, max(0.05, self._commit_interval.total_seconds() / 2)),
        )
        self.snapshots.state_versions = dict(state_versions)
        if describes is not None:
            self.snapshots.describes = dict(describes)
        if on_checkpoint is not None:
            hook, name = on_checkpoint, self.name
            self.snapshots.on_checkpoint = lambda m: call_safely("on_checkpoint", name, hook, m)

    @property
    def joined(self) -> bool:
        return self.snapshots is not None

    def watch(self, at: float | None = None) -> None:
        """Watch for snapshots from now (the watcher's first read is strict: a store that does not
        answer fails the start); the checkpoint interval counts from *at*."""
        if self.snapshots is not None:
            self.snapshots.start()
        if at is not None:
            self._last_checkpoint_at = at

    def leave(self) -> None:
        """Stop taking part (a close, or a restore that starts over)."""
        if self.snapshots is not None:
            self.snapshots.close()

    def restart_interval(self, at: float) -> None:
        """The checkpoint interval counts from *at* (the end of a restore)."""
        self._last_checkpoint_at = at

    @property
    def last_checkpoint_at(self) -> float:
        """``time.monotonic()`` of the last checkpoint taken (or of the restore)."""
        return self._last_checkpoint_at

    def due(self, now: float) -> bool:
        """Whether a commit point at *now* takes a checkpoint (the interval has elapsed)."""
        interval = self.checkpoint_interval.total_seconds()
        return self.snapshots is not None and now - self._last_checkpoint_at >= interval

    def pending(self) -> bool:
        """Whether a snapshot is waiting for this task's report."""
        return self.snapshots is not None and self.snapshots.pending() is not None

    def on_commit(self, state: TaskState, *, due: bool, at: float) -> CheckpointManifest | None:
        """A commit point's part: report to a pending snapshot, or start one when *due*."""
        assert self.snapshots is not None
        if due:
            self._last_checkpoint_at = at
        return self.snapshots.on_commit(state, checkpoint_due=due)

    def checkpoint(self, state: TaskState, *, full: bool = False) -> CheckpointManifest | None:
        """A checkpoint now (the task's lock held, its handler's commit point done)."""
        assert self.snapshots is not None
        self._last_checkpoint_at = time.monotonic()
        return self.snapshots.checkpoint(state, full=full)

    @property
    def last_checkpoint(self) -> CheckpointManifest | None:
        return None if self.snapshots is None else self.snapshots.last_checkpoint

    # --- a consumer group's rebalances ---------------------------------------------------------

    def gain(self, partitions: tuple[int, ...], restored: CheckpointManifest | None) -> None:
        if self.snapshots is not None:
            self.snapshots.gain(partitions, restored)

    def lose(self, partitions: tuple[int, ...]) -> None:
        if self.snapshots is not None:
            self.snapshots.lose(partitions)

    def hand_over(
        self, partitions: tuple[int, ...], checkpoint: Callable[[], CheckpointManifest | None]
    ) -> None:
        """Before *partitions* leave: report everything the task owns to the snapshot in progress
        (or a new one) by *checkpoint* (the task's checkpoint now), so the next owner restores
        from a recent checkpoint."""
        if self.snapshots is None:
            return
        try:
            manifest = checkpoint()
        except (CheckpointError, BlobStoreError, SnapshotError) as e:
            # The next owner restores from an older checkpoint and replays a longer tail: slower,
            # still exact.
            log.warning(
                "table %s: could not checkpoint partitions %s it hands over: %s", self.name, partitions, e
            )
            return
        log.info(
            "table %s: handing over partitions %s (reported to generation %s%s)",
            self.name,
            list(partitions),
            self.snapshots.reported,
            ", completed" if manifest is not None else "",
        )
