"""A processor's part in its task: the :class:`~statesnap.task.handler.TaskHandler` a processor
hands the engine (:class:`~statesnap.task.engine.Task`).

Everything around the handler — open, restore, catch up, commit points, checkpoints, snapshots,
GC, consumer groups, close — the task does as it does for a table. What a processor adds, at the
task's hooks: its record handler (:class:`~statesnap.processor.handler.ProcessorHandler`) and its
outputs, fenced before the restore under exactly-once; with several inputs the reader of the first
continued by a :class:`~statesnap.processor.inputs.MergedReader` of every input; at a rebalance
the other inputs' partitions and the outputs' committed offsets; the outputs committed on a clean
close, and their failure stopping the task.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from statesnap.checkpoint import CheckpointManifest
from statesnap.checkpoint.restore import SkippedCheckpoint
from statesnap.checkpoint.selection import resume_offsets
from statesnap.kafka.group_reader import GroupReader
from statesnap.kafka.reader import ChangelogReader
from statesnap.processor.buffer import StoreReads
from statesnap.processor.handler import ProcessorHandler
from statesnap.processor.inputs import MergedReader, check_co_partitioned
from statesnap.processor.outputs import Outputs
from statesnap.processor.transactions import TransactionalOutputs, offsets_group_of, transactional_id_of
from statesnap.stores import StateStore
from statesnap.task.engine import Task
from statesnap.task.restore import RestoreReport

if TYPE_CHECKING:
    from statesnap.processor.processor import Processor

__all__ = ["ProcessorTaskHandler"]

log = logging.getLogger(__name__)


class ProcessorTaskHandler:
    """What *proc*'s task runs: its handlers over the task's store, its outputs, its inputs."""

    def __init__(self, proc: Processor) -> None:
        self.proc = proc
        self.others = proc.inputs[1:]
        #: The outputs, made with the first record handler (kept when the store is replaced).
        self.outputs: Outputs | None = None
        self._task: Task | None = None
        self._records: ProcessorHandler | None = None
        self._reader: ChangelogReader | None = None

    def _outputs_for(self, task: Task) -> Outputs:
        proc = self.proc
        if self.outputs is None:
            self.outputs = (
                TransactionalOutputs(
                    task.settings,
                    proc.key_serde,
                    proc.value_serde,
                    topic=proc.inputs[0],
                    group_id=offsets_group_of(proc.name) if task.group is None else task.group.group_id,
                    others=self.others,
                )
                if proc.processing.exactly_once
                else Outputs(task.settings, proc.key_serde, proc.value_serde)
            )
        if (
            proc.processing.dead_letter_topic is not None and not proc.processing.exactly_once
        ):  # else once open
            self.outputs.require_topic(proc.processing.dead_letter_topic, "dead-letter")
        return self.outputs

    def records(self, task: Task) -> ProcessorHandler:
        self._task = task
        handler = self.proc.handler_for(task.store, self._outputs_for(task))
        handler.hold_writes()  # a write-back cache (statesnap.processor.buffer)
        handler.positions = self.input_positions
        handler.other_positions = self.other_positions
        self._records = handler
        return handler

    def describes(self) -> Mapping[str, Any]:
        return self.proc.describe()

    def starting(self, task: Task) -> None:
        """Several inputs must be co-partitioned; exactly-once outputs fence the previous
        incarnation and learn which outputs committed."""
        if self.others:
            check_co_partitioned(task.name, task.settings, (task.topic, *self.others))
        outputs = self._transactional()
        if outputs is None:
            return
        proc = self.proc
        # A static group member (group.instance.id) keeps its transactional.id across
        # restarts, so a restart aborts what its crashed incarnation left open at once.
        instance = task.settings.config.get("group.instance.id") if task.group is not None else None
        outputs.open(
            transactional_id_of(proc.name, str(instance or task.task_id), task.wanted_partitions),
            task.settings.timeout,
            grouped=task.group is not None,
        )
        if proc.processing.dead_letter_topic is not None:
            outputs.require_topic(proc.processing.dead_letter_topic, "dead-letter")

    def reading(self, reader: ChangelogReader, store: StateStore) -> ChangelogReader:
        """The first input's reader, continued by a merged reader of every input at the offsets
        the restored store holds (the other inputs' offsets live in the task's keyspace). A
        consumer group's reader commits no offsets of its own under exactly-once outputs: their
        transactions commit them, with the member's group metadata."""
        outputs = self._transactional()
        group: object = reader
        if outputs is not None and isinstance(group, GroupReader):
            group.informational_commits = False
            outputs.group_metadata = group.group_metadata
        if self.others:
            reader = cast(
                ChangelogReader,
                MergedReader.continuing(
                    reader, self.others, store, max_idle=self.proc.processing.max_idle.total_seconds()
                ),
            )
        self._reader = reader
        return reader

    def started(self, task: Task, restored: CheckpointManifest | None) -> None:
        """Exactly-once: the outputs committed must cover what the restored checkpoint claims;
        say so when they do not."""
        outputs = self._transactional()
        if outputs is None or restored is None:
            return
        committed = outputs.replay_until
        behind = {
            p: (committed.get(p), c)
            for p, c in restored.offsets.items()
            if p in task.partitions and c > committed.get(p, 0)
        }
        if behind:
            log.log(
                # None committed: a checkpoint Spark or an at-least-once run wrote, most often.
                logging.WARNING if committed else logging.INFO,
                "processor %s: the committed output offsets are behind checkpoint %d (partition: "
                "(committed, checkpoint) %s): outputs of the records between were not committed "
                "here (written by an at-least-once run or Spark, or the group's offsets expired "
                "or were reset)",
                task.name,
                restored.generation,
                behind,
            )

    def restored(
        self, gained: tuple[int, ...], manifest: CheckpointManifest, report: RestoreReport | None
    ) -> CheckpointManifest:
        """A partition whose checkpoint another input cannot continue (retention deleted records
        of it the checkpoint never saw) is replayed from the beginning instead, its restored rows
        dropped: what a start does with a checkpoint it cannot continue, for that partition
        alone. The others continue the checkpoint. (With ``require`` the task does not ask: the
        next poll fails naming it.)"""
        reader: object = self._reader
        if not isinstance(reader, MergedReader) or self._task is None:
            return manifest
        store = self._task.store
        holes = reader.holes(resume_offsets(manifest, gained), store)
        if not holes:
            return manifest
        dropped = store.drop_partitions(tuple(holes))
        for p, error in holes.items():
            log.warning(
                "processor %s: partition %d replays from the beginning, not from checkpoint "
                "generation %d: %s",
                self.proc.name,
                p,
                manifest.generation,
                error,
            )
        kept = {p: pc for p, pc in manifest.partitions.items() if p not in holes}
        if report is not None:
            report.skipped.extend(SkippedCheckpoint(manifest.generation, str(e)) for e in holes.values())
            report.restored_keys -= dropped
            if not any(p in kept for p in gained):
                report.checkpoint = None
        return dataclasses.replace(manifest, partitions=kept)

    def gained(self, partitions: tuple[int, ...], restored: CheckpointManifest | None) -> None:
        """A consumer group gave the task partition p of its first input: it reads partition p of
        every input (the group assigns the first input only, so any assignment strategy keeps
        the inputs co-partitioned)."""
        outputs = self._transactional()
        if outputs is not None and self._task is not None:
            outputs.taken(partitions, self._task.settings.timeout)
        reader: object = self._reader
        if isinstance(reader, MergedReader) and self._task is not None:
            reader.gain(resume_offsets(restored, partitions), self._task.store)

    def lost(self, partitions: tuple[int, ...]) -> None:
        reader: object = self._reader
        if isinstance(reader, MergedReader):
            reader.drop(partitions)
        if self._records is not None:
            self._records.release(partitions)

    def readable(self, store: StateStore) -> StoreReads:
        """*store* as readers outside the handlers see it: with the writes the record handler
        still holds (see :mod:`statesnap.processor.buffer`)."""
        return store if self._records is None else self._records.reads()

    def failure(self) -> BaseException | None:
        return None if self.outputs is None else self.outputs.failure

    def emits(self) -> bool:
        return True

    def closing(self) -> None:
        """Commit the outputs, with a checkpoint or without one (no checkpoint store:
        exactly-once outputs are still committed with their offsets)."""
        if self._records is not None:
            self._records.commit_outputs()

    # --- positions the record handler commits with its outputs ---------------------------------

    def input_positions(self) -> Mapping[int, int]:
        """The next offset to consume per input partition, of what the handler applied."""
        return {} if self._reader is None else self._reader.positions

    def other_positions(self) -> Mapping[str, Mapping[int, int]]:
        """The same for every input after the first, per topic."""
        reader: object = self._reader
        if not isinstance(reader, MergedReader):
            return {}
        return {topic: dict(reader.applied_at[i]) for i, topic in enumerate(reader.topics) if i}

    def _transactional(self) -> TransactionalOutputs | None:
        outputs = self.outputs
        return outputs if isinstance(outputs, TransactionalOutputs) else None
