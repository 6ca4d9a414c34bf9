"""A task (a :class:`~statesnap.Table`'s, a processor's) as a member of a consumer group: what
happens at each rebalance.

- **Gained** partitions are restored from the newest valid checkpoint (only their files are
  read; the rest of the store is untouched), then replayed from its offsets by the group reader.
  Reads of their keys raise :class:`~statesnap.errors.PartitionNotOwnedError` (``restoring``)
  until they reach their end.
- **Revoked** partitions are handed over first: the table flushes, and its snapshot task reports
  everything it owns to the snapshot in progress, or starts one (only if something changed since
  the last checkpoint) — so the next owner restores from a recent checkpoint. Then their rows are
  dropped. Partitions **lost** (the session expired) are dropped without a report.
- The snapshot task's ``owned`` partitions follow the assignment, so a snapshot names tasks by
  current ownership: after a member dies, whoever gains its partitions reports them and the
  snapshot completes.

Reads of a key whose partition the member does not serve (another member owns it, or it is still
being restored after a rebalance) raise :class:`~statesnap.errors.PartitionNotOwnedError`; the
key's partition comes from the producers' partitioner (``GroupOptions(partitioner=...)``, default
Kafka's ``murmur2_random``) and ``Table.partition_for(key)`` tells it, for routing. ``len``,
iteration and scans cover the rows the member holds. The assignment strategy is librdkafka's
``partition.assignment.strategy`` (default ``roundrobin``), the session timeout
``session.timeout.ms`` (default 6 s: a dead member's partitions move after that long), both
settable through ``kafka_config``. The offsets committed to the group are informational (lag
tools); restores never read them. The restore listener sees only the restore ``start()`` does.

Everything here runs on the task's consuming thread, inside the group reader's poll, with the
task's lock held. The task (:class:`~statesnap.task.engine.Task`) is the :class:`GroupHost`: it
restores, takes, hands over and releases partitions through its writer and its handler.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Protocol, cast

from statesnap.checkpoint import CheckpointManifest
from statesnap.checkpoint.selection import TopicState, resume_offsets
from statesnap.errors import ConfigError, PartitionNotOwnedError
from statesnap.kafka.group_reader import GroupReader
from statesnap.kafka.partitioner import resolve_partitioner
from statesnap.kafka.reader import ChangelogReader
from statesnap.task.opening import OpenedTask
from statesnap.task.options import CheckpointOptions, GroupOptions, StaticShare

__all__ = ["FIRST_ASSIGNMENT_TIMEOUT", "GroupHost", "GroupMembership", "check_group"]

log = logging.getLogger(__name__)

#: start() gives up when the group assigns nothing (not even an empty assignment) for this long;
#: a join takes ~3 s on the dev broker, a rebalance of a large group on Kafka up to tens of seconds.
FIRST_ASSIGNMENT_TIMEOUT = 60.0


class GroupHost(Protocol):
    """What a group member's task does at a rebalance (a :class:`~statesnap.task.engine.Task`)."""

    name: str

    def restore_partitions(
        self, task: OpenedTask, state: TopicState, *, first: bool
    ) -> CheckpointManifest | None:
        """Restore ``state.partitions`` from the newest usable checkpoint (None: replay them)."""
        ...

    def take_partitions(self, partitions: tuple[int, ...], restored: CheckpointManifest | None) -> None:
        """*partitions* are now this task's (its snapshot task reports them)."""
        ...

    def hand_over(self, partitions: tuple[int, ...]) -> None:
        """Checkpoint what the task owns before *partitions* leave it."""
        ...

    def release_partitions(self, partitions: tuple[int, ...], *, drop_rows: bool) -> int:
        """*partitions* are no longer this task's; drop their rows unless the task is closing."""
        ...


def check_group(
    share: StaticShare | None,
    partitions: tuple[int, ...] | None,
    writes: bool,
    checkpoints: CheckpointOptions | None,
) -> None:
    """Refuse what cannot go with a consumer group, in one line each, before any I/O."""
    if share is not None:
        raise ConfigError(
            "group and StaticShare are two ways of sharing partitions; pick one "
            "(group: Kafka rebalances them; StaticShare: a fixed p % N == I)"
        )
    if partitions is not None:
        raise ConfigError("group assigns the partitions; it cannot go with partitions=")
    if not writes or (checkpoints is not None and checkpoints.generation is not None):
        raise ConfigError("group is for a writer that tails the topic: not with a generation, nor read-only")


class GroupMembership:
    """The rebalance listener of a task's :class:`GroupReader`, and its read-side ownership check."""

    def __init__(self, host: GroupHost, group: GroupOptions) -> None:
        self.host = host
        self.group = group.group_id
        self.partition_of = resolve_partitioner(group.partitioner)
        self.partition_count = 0
        self.task: OpenedTask | None = None
        self.reader: GroupReader | None = None
        #: Set by close(): leaving the group then neither reports nor drops (the task is closing).
        self.closing = False
        #: The first assignment restores during start(): its figures go into the start report.
        self.first = True
        self._warned_partitioner = False

    def join(self, task: OpenedTask) -> ChangelogReader:
        """Subscribe; partitions arrive in the reader's polls."""
        self.task = task
        self.partition_count = len(task.facts.all_partitions)
        self.reader = GroupReader(task.settings, task.topic, self.group, self)
        # Duck-typed: the loop and the freshness mixin read positions, caught_up and lag().
        return cast(ChangelogReader, self.reader)

    @property
    def assigned(self) -> bool:
        """Whether the group has made its first assignment (possibly empty)."""
        return self.reader is not None and self.reader.assigned

    def commit_offsets(self) -> None:
        """Commit the group's offsets, for lag monitoring (restores never read them)."""
        if self.reader is not None:
            self.reader.commit()

    # --- the rebalance listener ----------------------------------------------------------------

    def partitions_gained(self, partitions: list[int]) -> Mapping[int, int]:
        assert self.task is not None
        gained = tuple(partitions)
        assert self.reader is not None
        state = self.task.state_of(gained, log_start=self.reader.log_start(partitions))
        manifest = self.host.restore_partitions(self.task, state, first=self.first)
        self.first = False
        offsets = resume_offsets(manifest, gained)
        self.host.take_partitions(gained, manifest)
        log.info(
            "table %s (group %s): gained partitions %s, restored from checkpoint %s, resuming at %s",
            self.host.name,
            self.group,
            partitions,
            manifest.generation if manifest is not None else None,
            offsets,
        )
        return offsets

    def partitions_leaving(self, partitions: list[int]) -> None:
        if not self.closing:
            self.host.hand_over(tuple(partitions))

    def partitions_dropped(self, partitions: list[int]) -> None:
        dropped = self.host.release_partitions(tuple(partitions), drop_rows=not self.closing)
        if not self.closing:
            log.info(
                "table %s (group %s): dropped partitions %s (%d keys)",
                self.host.name,
                self.group,
                partitions,
                dropped,
            )

    # --- reads ---------------------------------------------------------------------------------

    def partition_for(self, raw_key: bytes) -> int:
        """The partition the producer's partitioner writes *raw_key* to."""
        return self.partition_of(raw_key, self.partition_count)

    def serves(self, raw_key: bytes) -> bool:
        """Whether this member serves *raw_key*'s partition by the partitioner (a cheap check
        before :meth:`check_read`)."""
        reader = self.reader
        return reader is None or reader.readable(self.partition_for(raw_key))

    def check_read(self, raw_key: bytes, origin: tuple[int, int] | None = None) -> None:
        """Raise :class:`PartitionNotOwnedError` unless this member serves *raw_key*'s partition.

        *origin* (partition, offset of the row holding the key, when the store has it) wins over
        the partitioner, with a warning: the producer then uses another partitioner.
        """
        reader = self.reader
        if reader is None:
            return
        p = self.partition_for(raw_key)
        if reader.readable(p):
            return
        if origin is not None and reader.readable(origin[0]):
            if not self._warned_partitioner:
                self._warned_partitioner = True
                log.warning(
                    "table %s: the partitioner maps a key to partition %d but the topic holds it in "
                    "partition %d; set Table(partitioner=...) to the producers' partitioner",
                    self.host.name,
                    p,
                    origin[0],
                )
            return
        restoring = p in reader.restoring
        why = (
            "was just gained in a rebalance and is still being restored"
            if restoring
            else f"is owned by another member of consumer group {self.group!r}"
        )
        raise PartitionNotOwnedError(
            f"table {self.host.name!r}: the key is in partition {p}, which {why} "
            f"(this member serves partitions {sorted(reader.owned - reader.restoring)})",
            table=self.host.name,
            partition=p,
            restoring=restoring,
        )
