"""What a :class:`~statesnap.task.engine.Task` is handed: the code that gives records their
meaning, and its say at each step of the task's life.

Kafka Streams' ``StreamTask`` is handed the user's topology; here a task is handed a
:class:`TaskHandler`: a table's (:class:`~statesnap.python.table.UpsertTaskHandler`: the latest
value per key) or a processor's (:class:`~statesnap.processor.task.ProcessorTaskHandler`: user
handlers, named stores, outputs, several inputs). The task owns everything around it — open,
restore, catch up, commit points, checkpoints, snapshots, consumer groups, close — and calls the
handler at these points, always on the thread doing that step, with the task's lock held where
the step holds it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from statesnap.checkpoint import CheckpointManifest
from statesnap.kafka.reader import ChangelogReader
from statesnap.stores import StateStore
from statesnap.stores.base import KafkaMessage
from statesnap.task.hooks import Change
from statesnap.task.restore import RestoreReport

if TYPE_CHECKING:
    from statesnap.task.engine import Task

__all__ = ["RecordHandler", "TaskHandler"]


class RecordHandler(Protocol):
    """What a task does with a batch of one partition's records (in offset order)."""

    def apply(self, partition: int, messages: Sequence[KafkaMessage], changes: list[Change] | None) -> None:
        """Apply *messages*; when *changes* is given, append each (key, old, new) first."""
        ...

    def commit_point(self, *, checkpoint: bool) -> None:
        """Make durable what the handler did outside the store (a processor's emitted records)
        and drop what the state no longer holds (expired windows): before any checkpoint may
        claim the offsets applied so far. *checkpoint*: one may be taken at this commit point, so
        nothing expired may stay in the store (a TTL sweep is otherwise spread out)."""
        ...

    def rebase_partitions(self) -> frozenset[int]:
        """Partitions whose next checkpoint must be a new base, not a delta (rows were dropped
        that must not linger in older base files: windows past retention)."""
        ...

    def checkpointed(self) -> None:
        """The last checkpoint's report covers what :meth:`rebase_partitions` named."""
        ...


class TaskHandler(Protocol):
    """The code a task runs, and what it does at each step of the task's life."""

    def records(self, task: Task) -> RecordHandler:
        """The record handler over ``task.store`` (asked again when ``store="auto"`` replaces the
        store before the restore)."""
        ...

    def describes(self) -> Mapping[str, Any] | None:
        """What every manifest the task writes records of it (``writer``), beside the engine."""
        ...

    def starting(self, task: Task) -> None:
        """Before the restore: exactly-once outputs fence the previous incarnation and learn
        which input offsets their transactions committed."""
        ...

    def reading(self, reader: ChangelogReader, store: StateStore) -> ChangelogReader:
        """What the task consumes, given the reader of its topic (from offsets, or a consumer
        group's) and the restored *store*: a table reads its topic, a processor with several
        inputs merges them all."""
        ...

    def started(self, task: Task, restored: CheckpointManifest | None) -> None:
        """Restored (from *restored*, None: replayed from the beginning) and caught up."""
        ...

    def restored(
        self, gained: tuple[int, ...], manifest: CheckpointManifest, report: RestoreReport | None
    ) -> CheckpointManifest:
        """A consumer group gave the task *gained*, just restored from *manifest*: what the task
        continues from (a processor replays a partition whose other inputs cannot continue the
        checkpoint from the beginning). *report*: the start's, for the first assignment."""
        ...

    def gained(self, partitions: tuple[int, ...], restored: CheckpointManifest | None) -> None:
        """*partitions* are now the task's (after :meth:`restored`)."""
        ...

    def lost(self, partitions: tuple[int, ...]) -> None:
        """*partitions* are leaving the task (before their rows are dropped)."""
        ...

    def failure(self) -> BaseException | None:
        """An error outside the store that stops the task at the next commit point (outputs
        that failed to commit: the state is past them)."""
        ...

    def emits(self) -> bool:
        """Whether a clean close must first make emitted records durable (:meth:`closing`)."""
        ...

    def closing(self) -> None:
        """A clean close, the task's lock held, before the final checkpoint: commit what was
        emitted (with or without a checkpoint store)."""
        ...
