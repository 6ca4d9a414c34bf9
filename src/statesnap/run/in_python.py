"""The Python engine's run of a task in this process — a :class:`~statesnap.python.table.Table`
(:func:`run_in_python`) or a :class:`~statesnap.processor.Processor`
(:func:`run_processor_in_python`): restore, replay to the input's end (and with follow keep
consuming), then write a checkpoint.

Steps, in order, the same for both (:class:`TaskRun`): open the task (a table's settings from the
bundles, in :func:`open_table`), start it (restore the newest usable checkpoint, replay the tail to
partition EOF; a processor's handlers run over it), follow until asked to stop when following,
write the (final) checkpoint, close without another one.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from statesnap.checkpoint import CheckpointManifest
from statesnap.deadline import Deadline
from statesnap.durations import format_duration
from statesnap.python.table import Table
from statesnap.run.engine import EngineChoice
from statesnap.run.options import FollowOptions, StopRequest
from statesnap.run.progress import MaterializeProgress, Stage
from statesnap.run.result import Followed, MaterializeResult, ProcessorRunResult, records_between
from statesnap.task.engine import Task
from statesnap.task.migration import StateVersion
from statesnap.task.options import CheckpointOptions, GroupOptions, StaticShare, StoreOptions
from statesnap.task.restore import ProgressCallback, RestoreReport

if TYPE_CHECKING:  # a table's run loads no processor package
    from statesnap.processor.processor import Processor

__all__ = [
    "Restorable",
    "TaskRun",
    "open_table",
    "restore_with_progress",
    "run_in_python",
    "run_processor_in_python",
]

#: How often a follow run looks at its stop request and the table's background failure.
POLL_SECONDS = 0.5


def open_table(
    topic: str,
    *,
    bootstrap_servers: str,
    name: str,
    checkpoints: CheckpointOptions,
    store: StoreOptions,
    share: StaticShare | GroupOptions | None,
    kafka_config: Mapping[str, Any],
    timeout: float,
    background: bool,
    state: StateVersion | None = None,
) -> Table:
    """The table a run materializes (the one place that knows ``Table``'s keywords)."""
    state = state or StateVersion()
    return Table(
        topic,
        bootstrap_servers=bootstrap_servers,
        name=name,
        checkpoints=checkpoints,
        store=store,
        kafka_config=dict(kafka_config),
        timeout=timeout,
        partitions=share if isinstance(share, StaticShare) else None,
        group=share if isinstance(share, GroupOptions) else None,
        background=background,
        state=state,
    )


class Restorable(Protocol):
    """What :func:`restore_with_progress` needs: a table or a follower, before its start."""

    @property
    def topic(self) -> str: ...

    @property
    def name(self) -> str: ...

    def lag(self) -> dict[int, int]: ...

    def start(self, *, progress: ProgressCallback | None = None) -> RestoreReport: ...

    def stop_catching_up(self, *, timeout: float | None = ...) -> None: ...


def restore_with_progress(
    table: Restorable, progress: MaterializeProgress, stop: StopRequest | None = None
) -> RestoreReport:
    """``table.start()``, telling *progress* the records replayed of an estimated total and the
    partitions at their end. The total is records replayed plus the lag the broker's high
    watermarks suggest — an estimate (the dev broker under-reports them), never shrinking.

    *stop*, once set, stops the catch-up between two batches with a checkpoint of what was read
    (:class:`~statesnap.errors.CatchUpStoppedError`): the CLI's first Ctrl-C during a long
    catch-up keeps the work done instead of losing it back to the last periodic checkpoint."""
    progress.replay_started(f"replaying {table.topic}")
    estimate: list[int] = []  # the largest estimate so far, once there is one

    def update(records: int, done: int, total: int) -> None:
        if stop is not None and stop.event.is_set():
            table.stop_catching_up(timeout=stop.timeout.total_seconds())
        behind = sum(table.lag().values())
        if behind or estimate:
            estimate[:] = [max(estimate[0] if estimate else 0, records + behind)]
        progress.replay(records, done, total, estimate[0] if estimate else None)

    report = table.start(progress=update)
    progress.replay_finished(report.replayed_records, f"restored {table.name}")
    return report


class TaskRun:
    """What a Python run does after the restore — follow when asked, then the (final)
    checkpoint — for a table and a processor alike. ``deadline`` bounds the close that follows
    it: none for a one-shot run, the shutdown timeout once a follow was stopped."""

    def __init__(self) -> None:
        self.deadline = Deadline(None)  # a one-shot run waits for its checkpoint as long as it takes
        self.followed: Followed | None = None
        self.write_seconds = 0.0

    def finish(
        self,
        task: Table[Any, Any] | Task,
        *,
        follow: FollowOptions | None,
        progress: MaterializeProgress,
        instances: int | None,
        doing: str,
    ) -> CheckpointManifest | None:
        """Follow *task* until stopped (*doing*: what the status line says it does), then write
        the checkpoint. One task of several (a static share, following) cannot complete a
        snapshot alone: its peers report on their own, so it writes no final checkpoint."""
        restored_at, restored_offsets = time.monotonic(), task.offsets
        if follow is not None:
            progress.stage(Stage.FOLLOWING)
            group = task.group
            member = f" as {task.task_id} of consumer group {group.group_id}" if group else ""
            progress.status(
                f"{doing}{member}; checkpoints every "
                f"{format_duration(task.checkpoint_interval)} (Ctrl-C to stop)"
            )
            with contextlib.suppress(KeyboardInterrupt):  # a script's Ctrl-C: a stop request
                while not follow.stop.wait(POLL_SECONDS):
                    task.raise_if_failed()
            progress.stage(Stage.FINAL_CHECKPOINT)
            self.deadline = Deadline(follow.shutdown_timeout.total_seconds())
            self.followed = Followed(
                records_between(restored_offsets, task.offsets), time.monotonic() - restored_at
            )
        write_started = time.monotonic()
        solo = not instances or instances == 1 or follow is None
        manifest = task.checkpoint(timeout=self.deadline.remaining()) if solo else None
        self.write_seconds = time.monotonic() - write_started
        progress.stage(Stage.COMMITTED)
        return manifest


def run_in_python(
    table: Table,
    *,
    choice: EngineChoice,
    follow: FollowOptions | None,
    progress: MaterializeProgress,
    instances: int | None,
    stop: StopRequest | None = None,
) -> MaterializeResult:
    """Restore *table*, follow it when asked, checkpoint it, close it; what the run did."""
    started = time.monotonic()
    run = TaskRun()
    try:
        progress.stage(Stage.CATCHING_UP)
        report = restore_with_progress(table, progress, StopRequest.of(stop, follow))
        manifest = run.finish(
            table, follow=follow, progress=progress, instances=instances, doing=f"following {table.topic}"
        )
        keys = len(table.store)
    finally:
        table.close(checkpoint=False, timeout=run.deadline.remaining())
    return MaterializeResult.of(
        manifest or table.last_checkpoint,
        table=table.name,
        topic=table.topic,
        engine=choice,
        written=manifest is not None,
        keys=keys,
        restore=report,
        checkpoint_seconds=run.write_seconds,
        seconds=time.monotonic() - started,
        url=table.repo.url if table.repo else None,
        followed=run.followed,
        shown=table.repo.shown if table.repo else None,
    )


class _Restoring:
    """A processor as :func:`restore_with_progress` sees a table: its input, name, lag, start.

    Its start also says, once, when exactly-once outputs run on a broker that shows aborted
    records to their readers: at the first progress report (the cluster's id is known by then;
    asking costs nothing) or, with nothing to report, once started."""

    def __init__(self, proc: Processor) -> None:
        self.proc = proc
        self._checked = False

    @property
    def topic(self) -> str:
        """Every input, in order: the replay's label names what is read (it named the first)."""
        return ", ".join(self.proc.inputs)

    @property
    def name(self) -> str:
        return self.proc.name

    def lag(self) -> dict[int, int]:
        return self.proc.task.lag()

    def stop_catching_up(self, *, timeout: float | None = 20.0) -> None:
        self.proc.task.stop_catching_up(timeout=timeout)

    def start(self, *, progress: ProgressCallback | None = None) -> RestoreReport:
        def reported(records: int, done: int, total: int) -> None:
            self._check_broker()
            if progress is not None:
                progress(records, done, total)

        report = self.proc.start(progress=reported)
        self._check_broker()
        return report

    def _check_broker(self) -> None:
        if not self._checked and self.proc.task.cluster_id:
            self._checked = True
            self.proc.check_broker()


def run_processor_in_python(
    proc: Processor,
    *,
    choice: EngineChoice,
    follow: FollowOptions | None,
    progress: MaterializeProgress,
    instances: int | None,
    stop: StopRequest | None = None,
) -> ProcessorRunResult:
    """:func:`run_in_python`'s steps, for a processor: restore and catch up (the handler runs over
    the tail), follow when asked, write the (final) checkpoint, count, close. One task of several
    (a static share, following) writes no final checkpoint of its own: its peers report on their
    own."""
    from statesnap.processor.handler import ProcessorHandler

    started = time.monotonic()
    run = TaskRun()
    try:
        progress.stage(Stage.CATCHING_UP)
        report = restore_with_progress(_Restoring(proc), progress, StopRequest.of(stop, follow))
        task = proc.task
        manifest = run.finish(
            task,
            follow=follow,
            progress=progress,
            instances=instances,
            doing=f"processing {', '.join(proc.inputs)} with {proc.name}",  # every input, in order
        )
        stores = {name: len(proc.store(name)) for name in proc.stores}
        keys = sum(stores.values())  # the user's rows, not statesnap's bookkeeping (stream time)
        handler = task.handler
        processed = handler.processed if isinstance(handler, ProcessorHandler) else 0
        dead_lettered = handler.dead_lettered if isinstance(handler, ProcessorHandler) else 0
        skipped = handler.skipped if isinstance(handler, ProcessorHandler) else 0
        state_only = handler.outputs.state_only_records if isinstance(handler, ProcessorHandler) else 0
    finally:
        proc.close(checkpoint=False, timeout=run.deadline.remaining())
    result = MaterializeResult.of(
        manifest or task.last_checkpoint,
        table=proc.name,
        topic=task.topic,
        engine=choice,
        written=manifest is not None,
        keys=keys,
        restore=report,
        checkpoint_seconds=run.write_seconds,
        seconds=time.monotonic() - started,
        url=task.repo.url if task.repo else None,
        followed=run.followed,
        shown=task.repo.shown if task.repo else None,
    )
    return ProcessorRunResult(result, processed, proc.emitted, dead_lettered, stores, skipped, state_only)
