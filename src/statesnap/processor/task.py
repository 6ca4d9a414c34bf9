"""The engine of a processor: a table task whose handler runs the processor's code.

Everything a table does around its handler — open, restore, catch up, commit points,
checkpoints, snapshots, GC, consumer groups — a processor task does through the same code
(:class:`~statesnap.Table`); only :meth:`ProcessorTask._new_handler` differs, and with several
inputs the reader: the table's reader of the first input is continued by a
:class:`~statesnap.processor.inputs.MergedReader` of every input.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, cast

from statesnap.checkpoint import CheckpointManifest
from statesnap.checkpoint.restore import SkippedCheckpoint
from statesnap.checkpoint.selection import TopicState, resume_offsets
from statesnap.errors import OutputError
from statesnap.kafka.group_reader import GroupReader
from statesnap.kafka.reader import ChangelogReader
from statesnap.processor.handler import ProcessorHandler
from statesnap.processor.inputs import MergedReader, check_co_partitioned
from statesnap.processor.transactions import TransactionalOutputs
from statesnap.python.consuming import RecordHandler
from statesnap.python.table import Table
from statesnap.task.lifecycle import TaskPhase
from statesnap.task.opening import OpenedTask
from statesnap.task.restore import ProgressCallback, RestoreReport

__all__ = ["ProcessorTask"]

log = logging.getLogger(__name__)


class ProcessorTask(Table[bytes, bytes]):
    """A processor's task. *make_handler* builds the handler for the task's (current) store;
    *describes* goes into every manifest it writes (inputs, stores); *on_start* runs before the
    restore (exactly-once outputs fence the previous incarnation and read the committed offsets)."""

    def __init__(
        self,
        topic: str,
        *,
        make_handler: Callable[[ProcessorTask], RecordHandler],
        describes: Mapping[str, Any],
        on_start: Callable[[ProcessorTask], None] | None = None,
        others: Sequence[str] = (),
        max_idle: float = 0.5,
        **table_options: Any,
    ) -> None:
        """*others*: the inputs after the first (*topic*), co-partitioned with it; *max_idle*:
        see :class:`MergedReader`."""
        self._make_handler = make_handler
        self._describes = dict(describes)
        self._on_start = on_start
        self.others = tuple(others)
        self.max_idle = max_idle
        super().__init__(topic, **table_options)

    def _read_with(self, reader: ChangelogReader) -> ChangelogReader:
        """The first input's reader, continued by a merged reader of every input at the offsets
        the restored store holds (the other inputs' offsets live in the task's keyspace). A
        consumer group's reader commits no offsets of its own under exactly-once outputs: their
        transactions commit them, with the member's group metadata."""
        outputs = self._transactional()
        group: object = reader
        if outputs is not None and isinstance(group, GroupReader):
            group.informational_commits = False
            outputs.group_metadata = group.group_metadata
        if not self.others:
            return reader
        return cast(
            ChangelogReader,
            MergedReader.continuing(reader, self.others, self.store, max_idle=self.max_idle),
        )

    def restore_partitions(
        self, task: OpenedTask, state: TopicState, *, first: bool
    ) -> CheckpointManifest | None:
        """Restore what a consumer group gave the task, as a table does; then a partition whose
        checkpoint another input cannot continue (retention deleted records of it the checkpoint
        never saw) is replayed from the beginning instead, its restored rows dropped: what a
        start does with a checkpoint it cannot continue, for that partition alone. The others
        continue the checkpoint. With ``require`` the next poll fails naming it instead."""
        restored = super().restore_partitions(task, state, first=first)
        reader: object = self._reader
        options = self.checkpoints
        if restored is None or not isinstance(reader, MergedReader) or options is None or options.require:
            return restored
        gained = tuple(sorted(state.partitions))
        holes = reader.holes(resume_offsets(restored, gained), self.store)
        if not holes:
            return restored
        dropped = self.store.drop_partitions(tuple(holes))
        for p, error in holes.items():
            log.warning(
                "processor %s: partition %d replays from the beginning, not from checkpoint "
                "generation %d: %s",
                self.name,
                p,
                restored.generation,
                error,
            )
        kept = {p: pc for p, pc in restored.partitions.items() if p not in holes}
        if first:
            self.report.skipped.extend(SkippedCheckpoint(restored.generation, str(e)) for e in holes.values())
            self.report.restored_keys -= dropped
            if not any(p in kept for p in gained):
                self.report.checkpoint = None
        return dataclasses.replace(restored, partitions=kept)

    def take_partitions(self, partitions: tuple[int, ...], restored: CheckpointManifest | None) -> None:
        """A consumer group gave the task partition p of its first input: it reads partition p of
        every input (the group assigns the first input only, so any assignment strategy keeps
        the inputs co-partitioned)."""
        super().take_partitions(partitions, restored)
        outputs = self._transactional()
        if outputs is not None:
            outputs.taken(partitions, self.settings.timeout)
        reader: object = self._reader
        if isinstance(reader, MergedReader):
            reader.gain(resume_offsets(restored, partitions), self.store)

    def release_partitions(self, partitions: tuple[int, ...], *, drop_rows: bool) -> int:
        reader: object = self._reader
        if isinstance(reader, MergedReader):
            reader.drop(partitions)
        handler = self._handler
        if isinstance(handler, ProcessorHandler):
            handler.release(partitions)
        return super().release_partitions(partitions, drop_rows=drop_rows)

    def _transactional(self) -> TransactionalOutputs | None:
        handler = self._handler
        if isinstance(handler, ProcessorHandler) and isinstance(handler.outputs, TransactionalOutputs):
            return handler.outputs
        return None

    def _new_handler(self) -> RecordHandler:
        handler = self._make_handler(self)
        if isinstance(handler, ProcessorHandler):
            handler.positions = self.input_positions
            handler.other_positions = self.other_positions
        return handler

    def input_positions(self) -> Mapping[int, int]:
        """The next offset to consume per input partition, of what the handler applied."""
        return {} if self._reader is None else self._reader.positions

    def other_positions(self) -> Mapping[str, Mapping[int, int]]:
        """The same for every input after the first, per topic."""
        reader: object = self._reader
        if not isinstance(reader, MergedReader):
            return {}
        return {topic: dict(reader.applied_at[i]) for i, topic in enumerate(reader.topics) if i}

    def start(self, *, progress: ProgressCallback | None = None) -> RestoreReport:
        if self.others and self._state is TaskPhase.NEW:
            check_co_partitioned(self.name, self.settings, (self.topic, *self.others))
        if self._on_start is None or self._state is not TaskPhase.NEW:
            return super().start(progress=progress)
        self._on_start(self)
        report = super().start(progress=progress)
        handler, restored = self._handler, self._restored
        if isinstance(handler, ProcessorHandler) and restored is not None:
            committed = handler.outputs.replay_until
            behind = {
                p: (committed.get(p), c)
                for p, c in restored.offsets.items()
                if p in self.partitions and c > committed.get(p, 0)
            }
            if behind:  # outputs committed must cover what a checkpoint claims: not so here
                log.log(
                    # None committed: a checkpoint Spark or an at-least-once run wrote, most often.
                    logging.WARNING if committed else logging.INFO,
                    "processor %s: the committed output offsets are behind checkpoint %d (partition: "
                    "(committed, checkpoint) %s): outputs of the records between were not committed "
                    "here (written by an at-least-once run or Spark, or the group's offsets expired "
                    "or were reset)",
                    self.name,
                    restored.generation,
                    behind,
                )
        return report

    def _maybe_commit(self) -> None:
        """A commit point's failed checkpoint is retried later, but outputs that failed to commit
        (an aborted transaction) stop the task: its state is past them."""
        super()._maybe_commit()
        failure = self._outputs_failure()
        if failure is not None:
            self._thread_error = failure
            raise failure

    def _outputs_failure(self) -> BaseException | None:
        handler = self._handler
        return handler.outputs.failure if isinstance(handler, ProcessorHandler) else None

    def close(self, *, checkpoint: bool = True, timeout: str | float | timedelta | None = "30s") -> None:
        """A clean close commits the outputs, with a checkpoint or without one (no checkpoint
        store: exactly-once outputs are still committed with their offsets)."""
        handler = self._handler
        if (
            checkpoint
            and self._state is TaskPhase.RUNNING
            and self._thread_error is None
            and self._reader is not None
            and isinstance(handler, ProcessorHandler)
            and handler.outputs.failure is None
        ):
            try:
                with self._lock:
                    handler.commit_outputs()
            except OutputError:
                super().close(checkpoint=False, timeout=timeout)
                raise
        super().close(checkpoint=checkpoint and self._outputs_failure() is None, timeout=timeout)

    @property
    def handler(self) -> RecordHandler:
        return self._handler

    def _join_snapshots(self, task: OpenedTask, manifest: CheckpointManifest | None) -> None:
        super()._join_snapshots(task, manifest)
        assert self.snapshots is not None
        self.snapshots.describes = self._describes

    def __repr__(self) -> str:
        return f"ProcessorTask(name={self.name!r}, input={self.topic!r}, state={self._state.value!r})"
