"""A :class:`~statesnap.Table` as a member of a consumer group: what happens at each rebalance.

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

Everything here runs on the table's consuming thread, inside the group reader's poll, with the
table's lock held.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

import pyarrow as pa

from statesnap.checkpoint.restore import CheckpointSelector
from statesnap.checkpoint.selection import TopicState, resume_offsets
from statesnap.errors import (
    BlobStoreError,
    CheckpointError,
    ConfigError,
    PartitionNotOwnedError,
    SnapshotError,
)
from statesnap.kafka.group_reader import GroupReader
from statesnap.kafka.partitioner import PartitionerSpec, resolve_partitioner

if TYPE_CHECKING:
    from statesnap.python.table import Table

log = logging.getLogger(__name__)

#: start() gives up when the group assigns nothing (not even an empty assignment) for this long;
#: a join takes ~3 s on the dev broker, a rebalance of a large group on Kafka up to tens of seconds.
FIRST_ASSIGNMENT_TIMEOUT = 60.0


def check_group_options(
    group: str, instance: int | None, partitions: object, generation: int | None, read_only: bool
) -> None:
    """Refuse what cannot go with a consumer group, in one line each, before any I/O."""
    if not group.strip():
        raise ConfigError("group must be a non-empty consumer group id")
    if instance is not None:
        raise ConfigError(
            "group and instance/instances are two ways of sharing partitions; pick one "
            "(group: Kafka rebalances them; instance/instances: a fixed p % N == I)"
        )
    if partitions is not None:
        raise ConfigError("group assigns the partitions; it cannot go with partitions=")
    if generation is not None or read_only:
        raise ConfigError(
            "group is for a writer that tails the topic: not with generation=, tail=False or read_only"
        )


class GroupMembership:
    """The rebalance listener of a table's :class:`GroupReader`, and its read-side ownership check."""

    def __init__(self, table: Table[object, object], group: str, partitioner: PartitionerSpec) -> None:
        self.table = table
        self.group = group
        self.partition_of = resolve_partitioner(partitioner)
        self.partition_count = 0
        self.topic_state: TopicState | None = None
        self.reader: GroupReader | None = None
        #: Set by close(): leaving the group then neither reports nor drops (the table is closing).
        self.closing = False
        #: The first assignment restores during start(): its figures go into the start report.
        self.first = True
        self._warned_partitioner = False

    def join(self, topic_state: TopicState) -> GroupReader:
        """Subscribe; partitions arrive in the reader's polls."""
        t = self.table
        self.topic_state = topic_state
        self.partition_count = len(topic_state.partitions)
        self.reader = GroupReader(t.settings, t.topic, self.group, self)
        return self.reader

    # --- the rebalance listener ----------------------------------------------------------------

    def partitions_gained(self, partitions: list[int]) -> Mapping[int, int]:
        t = self.table
        assert self.reader is not None
        assert self.topic_state is not None
        manifest = None
        if t.repo is not None:
            state = replace(
                self.topic_state, partitions=tuple(partitions), log_start=self.reader.log_start(partitions)
            )
            selector = CheckpointSelector(t.repo, t.name, None, t.require_checkpoint)

            def load(partition: int, rows: pa.Table) -> None:
                t.store.load(partition, rows if t.row_filter is None else t.row_filter.rows(rows))

            before = len(t.store)

            def undo() -> None:  # a checkpoint failed mid-load: forget only what it loaded
                t.store.drop_partitions(partitions)

            manifest = selector.restore(state, partitions, load, undo, t._clock())
            if self.first:
                t.report.skipped = selector.skipped
                t.report.checkpoint = manifest.generation if manifest is not None else None
                t.report.restored_keys = len(t.store) - before
        self.first = False
        offsets = resume_offsets(manifest, tuple(partitions))
        if t.snapshots is not None:
            t.snapshots.gain(partitions, manifest)
        t.partitions = tuple(sorted(set(t.partitions) | set(partitions)))
        log.info(
            "table %s (group %s): gained partitions %s, restored from checkpoint %s, resuming at %s",
            t.name,
            self.group,
            partitions,
            manifest.generation if manifest is not None else None,
            offsets,
        )
        return offsets

    def partitions_leaving(self, partitions: list[int]) -> None:
        t = self.table
        if self.closing or t.snapshots is None or t.read_only:
            return
        try:
            t.store.flush()
            manifest = t.snapshots.checkpoint(t._task_state())
        except (CheckpointError, BlobStoreError, SnapshotError) as e:
            # The next owner restores from an older checkpoint and replays a longer tail: slower,
            # still exact.
            log.warning(
                "table %s: could not checkpoint partitions %s it hands over: %s", t.name, partitions, e
            )
            return
        log.info(
            "table %s (group %s): handing over partitions %s (reported to generation %s%s)",
            t.name,
            self.group,
            partitions,
            t.snapshots.reported,
            ", completed" if manifest is not None else "",
        )

    def partitions_dropped(self, partitions: list[int]) -> None:
        t = self.table
        gone = set(partitions)
        t.partitions = tuple(p for p in t.partitions if p not in gone)
        if t.snapshots is not None:
            t.snapshots.lose(partitions)
        if self.closing:
            return
        dropped = t.store.drop_partitions(partitions)
        log.info(
            "table %s (group %s): dropped partitions %s (%d keys)", t.name, self.group, partitions, dropped
        )

    # --- reads ---------------------------------------------------------------------------------

    def partition_for(self, raw_key: bytes) -> int:
        """The partition the producer's partitioner writes *raw_key* to."""
        return self.partition_of(raw_key, self.partition_count)

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
                    self.table.name,
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
            f"table {self.table.name!r}: the key is in partition {p}, which {why} "
            f"(this member serves partitions {sorted(reader.owned - reader.restoring)})",
            table=self.table.name,
            partition=p,
            restoring=restoring,
        )
