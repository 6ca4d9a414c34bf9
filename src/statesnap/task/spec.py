"""What a task is, as one value: its input, its cluster, its checkpoints, its store, its share of
the partitions, and whether it writes — what :class:`~statesnap.Table`, a processor and a
follower each turn their options into before they build a :class:`~statesnap.task.engine.Task`."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field

from statesnap.kafka.config import KafkaSettings
from statesnap.task.migration import StateVersion
from statesnap.task.options import CheckpointOptions, GroupOptions, StaticShare, StoreOptions
from statesnap.task.rowfilter import RowFilter

__all__ = ["TaskSpec"]


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """A task's settings. *partitions*: all (None), these, or a static share; *group*: a consumer
    group's share instead. *writes*: False for a read-only task (no checkpoint, no snapshot, no
    GC); *tail*: False for a point-in-time view (restored, never consumed)."""

    name: str
    topic: str
    settings: KafkaSettings
    checkpoints: CheckpointOptions | None = None
    state: StateVersion = field(default_factory=StateVersion)
    store: StoreOptions = field(default_factory=StoreOptions)
    partitions: Collection[int] | StaticShare | None = None
    group: GroupOptions | None = None
    row_filter: RowFilter | None = None
    background: bool = True
    writes: bool = True
    tail: bool = True

    def __post_init__(self) -> None:
        partitions = self.partitions
        if partitions is not None and not isinstance(partitions, StaticShare):
            object.__setattr__(self, "partitions", tuple(sorted(set(partitions))))  # a generator, once

    @property
    def share(self) -> StaticShare | None:
        return self.partitions if isinstance(self.partitions, StaticShare) else None

    @property
    def wanted_partitions(self) -> tuple[int, ...] | None:
        """The partitions asked for by number (None: all, or a share)."""
        partitions = self.partitions
        return None if partitions is None or isinstance(partitions, StaticShare) else tuple(partitions)

    def new_task_id(self) -> str:
        """The task's name in its table's snapshots: the one the options give, else ``main``, a
        static share's ``instance-I``, or one per group member's incarnation (host, pid, random)."""
        given = (self.checkpoints or CheckpointOptions(location="")).snapshots.task_id
        if given:
            return given
        if self.group is not None:
            return f"{self.group.group_id}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        share = self.share
        return f"instance-{share.instance}" if share is not None else "main"
