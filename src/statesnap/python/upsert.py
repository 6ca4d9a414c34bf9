"""What makes a task a table: each record upserts its key, a tombstone deletes it.

:class:`UpsertHandler` is the record handler (it also reports each change for ``on_update``);
:class:`UpsertTaskHandler` is the :class:`~statesnap.task.handler.TaskHandler` a
:class:`~statesnap.Table` hands its :class:`~statesnap.task.engine.Task`: a table emits nothing,
reads its one topic and has nothing to do at a rebalance beyond what the task does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from statesnap.checkpoint import CheckpointManifest
from statesnap.kafka.reader import ChangelogReader
from statesnap.stores import StateStore
from statesnap.stores.base import KafkaMessage
from statesnap.task.hooks import Change, changes_of
from statesnap.task.restore import RestoreReport
from statesnap.task.rowfilter import RowFilter

if TYPE_CHECKING:
    from statesnap.task.engine import Task

__all__ = ["UpsertHandler", "UpsertTaskHandler"]


class UpsertHandler:
    """A table's handler: each record upserts its key, a tombstone deletes it."""

    def __init__(self, store: StateStore, row_filter: RowFilter | None) -> None:
        self.store = store
        self.row_filter = row_filter

    def apply(self, partition: int, messages: Sequence[KafkaMessage], changes: list[Change] | None) -> None:
        if changes is not None:
            records = (self.row_filter or RowFilter()).records(messages)
            changes.extend(changes_of(self.store, records))
            self.store.apply(partition, records)
        elif self.row_filter is None:
            self.store.apply_messages(partition, messages)
        else:
            self.store.apply(partition, self.row_filter.records(messages))

    def commit_point(self, *, checkpoint: bool) -> None:
        """A table emits nothing and drops nothing."""

    def rebase_partitions(self) -> frozenset[int]:
        return frozenset()

    def checkpointed(self) -> None:
        """Nothing to forget."""


class UpsertTaskHandler:
    """A table's part in its task: upserts over the task's store, keeping *row_filter*'s subset."""

    def __init__(self, row_filter: RowFilter | None) -> None:
        self.row_filter = row_filter

    def records(self, task: Task) -> UpsertHandler:
        return UpsertHandler(task.store, self.row_filter)

    def describes(self) -> Mapping[str, Any] | None:
        return None  # a table's manifests say only what the task writes into every one

    def starting(self, task: Task) -> None:
        """Nothing to fence: a table produces nothing."""

    def reading(self, reader: ChangelogReader, store: StateStore) -> ChangelogReader:
        return reader  # a table reads its one topic

    def started(self, task: Task, restored: CheckpointManifest | None) -> None:
        """Nothing to check."""

    def restored(
        self, gained: tuple[int, ...], manifest: CheckpointManifest, report: RestoreReport | None
    ) -> CheckpointManifest:
        return manifest  # one input: the checkpoint continues as it is

    def gained(self, partitions: tuple[int, ...], restored: CheckpointManifest | None) -> None:
        """The task already owns them; nothing else reads them."""

    def lost(self, partitions: tuple[int, ...]) -> None:
        """The task drops their rows; a table keeps nothing else of them."""

    def failure(self) -> BaseException | None:
        return None

    def emits(self) -> bool:
        return False

    def closing(self) -> None:
        """Nothing emitted, nothing to commit."""
