"""What a Spark task of a processor bootstrap runs for one partition, on an executor.

:func:`~statesnap.spark.processor_bootstrap.bootstrap_processor` (the driver) plans one
:class:`Work` per partition; :func:`partition_task` loads the base checkpoint's rows of that
partition into a memory store, runs the processor's handler over the partition's records (several
inputs merged as a Python task merges them) and writes one base file; the task returns a
:class:`Done` (its file as JSON, never rows).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from statesnap.checkpoint import CheckpointRepository, datafile
from statesnap.checkpoint.manifest import DataFile
from statesnap.errors import HandlerError
from statesnap.processor import Processor
from statesnap.processor.handler import ProcessorHandler
from statesnap.processor.inputs import restored_offsets
from statesnap.processor.keyspace import META_STORE
from statesnap.processor.outputs import Outputs
from statesnap.spark.changes import write_data_file
from statesnap.spark.kafka_io import iter_range
from statesnap.spark.options import KafkaSourceOptions
from statesnap.spark.processor_counts import rows_per_store
from statesnap.stores import MemoryStore

__all__ = ["Done", "Work", "partition_task", "records"]


@dataclass(frozen=True, slots=True)
class Work:
    """One partition's task: records ``[start, end)`` on top of the base checkpoint's files.

    Its file is ``p<partition>-base-<run>``, *run* drawn once per run: a retried Spark task finds
    its own file and reuses it (same run, same rows), while a later run that joins the same
    generation — the snapshot a failed run began is still open — writes its own instead of
    reusing rows another plan (other offsets, a fixed handler) computed."""

    partition: int
    start: int
    end: int
    previous: tuple[DataFile, ...]
    run: int = 0
    #: With several inputs, (topic, log start, end) of every input after the first; each starts
    #: at the offset the base checkpoint's rows hold, else at its log start.
    other_ends: tuple[tuple[str, int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Done:
    """What a task returns to the driver (its file as JSON, never rows)."""

    partition: int
    files: tuple[dict[str, Any], ...]
    rows: int
    stores: dict[str, int]
    processed: int = 0
    dead_lettered: int = 0
    emitted: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    skipped: int = 0
    #: A handler failed without a dead-letter topic: (message, offset).
    failed: tuple[str, int] | None = None


def partition_task(
    proc: Processor, opts: KafkaSourceOptions, repo: CheckpointRepository, generation: int, emit: bool
) -> Callable[[Work], Done]:
    """The function a Spark task runs for one partition (a closure: it pickles with *proc*)."""
    names = [*proc.stores, META_STORE]

    def run(w: Work) -> Done:
        clock = time.perf_counter
        mark = clock()
        p = w.partition
        rows = repo.merge_files(w.previous) if w.previous else datafile.empty_table()
        store = MemoryStore()
        store.load(p, rows)
        store.forget_changes()  # no incremental checkpoint is taken of this store: keep no change set
        others = [
            (topic, restored_offsets(store, topic, [p])[p] or low, end) for topic, low, end in w.other_ends
        ]
        if w.end <= w.start and all(end <= start for _, start, end in others):
            # nothing new: the base checkpoint's files stand (or an empty base)
            if w.previous:
                return Done(
                    p, tuple(f.to_json() for f in w.previous), rows.num_rows, rows_per_store(rows, names)
                )
            if w.end == 0:
                return Done(p, (), 0, dict.fromkeys(names, 0))
            empty = write_data_file(repo, generation, p, "base", w.run, rows)
            return Done(p, (empty.to_json(),), 0, dict.fromkeys(names, 0))
        outputs = Outputs(opts.settings(), proc.key_serde, proc.value_serde)
        outputs.state_only = not emit
        handler = proc.handler_for(store, outputs)
        handler.hold_writes()  # a write-back cache, as a Python task's (statesnap.processor.buffer)
        seconds = {"load": clock() - mark}
        mark = clock()
        processed = 0
        try:
            for msgs in records(opts, p, w.start, w.end, others, handler):
                handler.apply(p, msgs, None)
                processed += len(msgs)
                store.forget_changes()
            handler.commit_point(checkpoint=True)  # nothing expired stays in the file, as at a Python commit
            store.forget_changes()  # the held writes the commit point handed over
        except HandlerError as e:
            return Done(p, (), 0, {}, processed, failed=(str(e), e.offset))
        finally:
            outputs.close()
        seconds["process"] = clock() - mark
        mark = clock()
        rows = store.export().get(p, datafile.empty_table())
        written = write_data_file(repo, generation, p, "base", w.run, rows)
        seconds["write"] = clock() - mark
        return Done(
            p,
            (written.to_json(),),
            rows.num_rows,
            rows_per_store(rows, names),
            processed,
            handler.dead_lettered,
            outputs.emitted,
            seconds,
            skipped=handler.skipped,
        )

    return run


def records(
    opts: KafkaSourceOptions,
    partition: int,
    start: int,
    end: int,
    others: list[tuple[str, int, int]],
    handler: ProcessorHandler,
) -> Iterator[list[Any]]:
    """The partition's records in batches: one input's in offset order, several merged as a
    Python task merges them with every input at its end (:mod:`statesnap.processor.merge`:
    the smallest timestamp first, ties to the input listed first, each input in offset order;
    ``heapq.merge`` keeps exactly that head rule). The handler's first-input position follows
    the batches, as a Python task's reader's does."""
    if not others:
        yield from iter_range(opts, partition, start, end)
        return
    first = opts.topic
    applied = {partition: start}
    handler.positions = lambda: applied
    inputs = [_flat(iter_range(opts, partition, start, end))] + [
        _flat(iter_range(opts, partition, s, e, topic=topic)) for topic, s, e in others
    ]
    batch: list[Any] = []
    for message in heapq.merge(*inputs, key=_timestamp):
        batch.append(message)
        if len(batch) >= _MERGED_BATCH:
            yield batch
            applied[partition] = _first_end(batch, first, applied[partition])
            batch = []
    if batch:
        yield batch


#: Records per merged batch handed to the handler.
_MERGED_BATCH = 10_000


def _flat(batches: Iterator[list[Any]]) -> Iterator[Any]:
    for batch in batches:
        yield from batch


def _timestamp(message: Any) -> int:
    ts_type, ts = message.timestamp()
    return int(ts) if ts_type else -1


def _first_end(batch: list[Any], first: str, before: int) -> int:
    """The first input's next offset after *batch*."""
    for message in reversed(batch):
        if message.topic() == first:
            return int(message.offset()) + 1
    return before
