"""Running a processor the way ``statesnap materialize`` runs a table: what ``statesnap run`` calls.

:func:`load_processor` finds the user's :class:`Processor` from ``MODULE:OBJECT`` (as uvicorn
finds an app), :func:`with_overrides` rebuilds it with what the command line overrides, and
:func:`run_processor` restores it, catches up, (with follow) keeps processing until asked to stop,
writes the (final) checkpoint and returns a :class:`ProcessorRunResult`, whose ``to_json()`` has
``materialize --json``'s keys plus the processor's own (``processed``, ``emitted``,
``dead_lettered``, ``stores``). The engine is chosen as materialize chooses it, but for what a
Spark run cannot honour: the Spark engine runs the processor over its input's history
(:func:`statesnap.spark.bootstrap_processor`), does not follow and emits nothing, so exactly-once
outputs and a dead-letter topic are refused on it, ``auto`` runs processors in python (a handler
may emit, and outputs are never traded for speed), and an explicit Spark run warns that it
produces no outputs.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import logging
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from types import MappingProxyType
from typing import Any

from statesnap.checkpoint import RetentionPolicy
from statesnap.errors import ConfigError, EngineOptionError, TableStateError
from statesnap.kafka.config import KafkaSettings
from statesnap.materialize import (
    Engine,
    EngineChoice,
    FollowOptions,
    MaterializeProgress,
    SparkOptions,
    Stage,
)
from statesnap.materialize.engine import choose_engine, estimate_table_backlog
from statesnap.materialize.python_run import TaskRun, restore_with_progress
from statesnap.materialize.result import MaterializeResult
from statesnap.processor.handler import ProcessorHandler
from statesnap.processor.processor import Processor
from statesnap.task.options import CheckpointOptions, GroupOptions, SnapshotOptions, StaticShare, StoreOptions
from statesnap.task.restore import ProgressCallback, RestoreReport

__all__ = [
    "CheckpointOverrides",
    "ProcessorOverrides",
    "ProcessorRunResult",
    "choose_processor_engine",
    "load_processor",
    "run_processor",
    "spark_processor_available",
    "with_overrides",
]

log = logging.getLogger(__name__)

#: The module the Spark engine's processor bootstrap lives in.
SPARK_BOOTSTRAP_MODULE = "statesnap.spark.processor_bootstrap"


def load_processor(spec: str) -> Processor:
    """The :class:`Processor` named by ``MODULE:OBJECT`` (``OBJECT`` may be dotted), the module
    imported from the current directory or ``PYTHONPATH``. Anything else is one
    :class:`ConfigError` saying what is wrong."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"{spec!r} is not MODULE:OBJECT: name the module and the Processor in it, as in app:proc"
        )
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, "")  # the current directory, as `python -m` and uvicorn import from it
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and (module_name == e.name or module_name.startswith(f"{e.name}.")):
            raise ConfigError(
                f"cannot import module {module_name!r}: no such module here (run from the directory that "
                "holds it, or put that directory on PYTHONPATH)"
            ) from None
        raise ConfigError(f"module {module_name!r} failed to import: {type(e).__name__}: {e}") from e
    except Exception as e:  # the user's module raised while it ran
        raise ConfigError(f"module {module_name!r} failed to import: {type(e).__name__}: {e}") from e
    found: Any = module
    for part in attr.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            processors = sorted(n for n, v in vars(module).items() if isinstance(v, Processor))
            hint = f" (its processors: {', '.join(processors)})" if processors else " (it has no Processor)"
            raise ConfigError(f"module {module_name!r} has no attribute {attr!r}{hint}") from None
    if not isinstance(found, Processor):
        raise ConfigError(f"{spec} is a {type(found).__name__}, not a statesnap Processor")
    return found


@dataclass(frozen=True, slots=True)
class CheckpointOverrides:
    """Checkpoint settings given on the command line; None keeps what the processor was built with
    (a new ``location`` starts from the library defaults and *storage_options* alone: options of
    another store would not apply)."""

    location: str | None = None
    storage_options: Mapping[str, str] | None = None
    interval: timedelta | None = None
    commit_interval: timedelta | None = None
    generation: int | None = None
    snapshot_store: str | None = None
    snapshot_timeout: timedelta | None = None
    min_count: int | None = None
    min_age: timedelta | None = None
    orphan_grace: timedelta | None = None

    def apply(self, name: str, built: str | Any | CheckpointOptions | None) -> CheckpointOptions:
        """The processor's checkpoint options (*built*) with these overrides."""
        base: CheckpointOptions | None
        if self.location is not None:
            base = CheckpointOptions(self.location, storage_options=self.storage_options)
            if isinstance(built, CheckpointOptions):  # keep how it writes: intervals, retention, …
                base = dataclasses.replace(
                    built, location=self.location, storage_options=base.storage_options
                )
        else:
            base = CheckpointOptions.of(built)
            if base is None:
                raise ConfigError(
                    f"processor {name!r} has no checkpoint store: give --checkpoints URL (a run "
                    "writes a checkpoint)"
                )
            if self.storage_options:
                base = dataclasses.replace(
                    base, storage_options={**base.storage_options, **self.storage_options}
                )
        changes: dict[str, Any] = {}
        if self.interval is not None:
            changes["interval"] = self.interval
        if self.commit_interval is not None:
            changes["commit_interval"] = self.commit_interval
        if self.generation is not None:
            changes["generation"] = self.generation
        if self.snapshot_store is not None or self.snapshot_timeout is not None:
            old = base.snapshots
            changes["snapshots"] = SnapshotOptions(
                self.snapshot_store if self.snapshot_store is not None else old.store,
                self.snapshot_timeout if self.snapshot_timeout is not None else old.timeout,
                old.task_id,
            )
        if self.min_count is not None or self.min_age is not None or self.orphan_grace is not None:
            old_policy = base.retention
            changes["retention"] = RetentionPolicy(
                self.min_count if self.min_count is not None else old_policy.min_count,
                self.min_age if self.min_age is not None else old_policy.min_age,
                self.orphan_grace if self.orphan_grace is not None else old_policy.orphan_grace,
            )
        return dataclasses.replace(base, **changes) if changes else base


@dataclass(frozen=True, slots=True)
class ProcessorOverrides:
    """What the command line overrides of a processor's connection and task settings (None: as
    the processor was built)."""

    bootstrap_servers: str | None = None
    kafka_config: Mapping[str, Any] | None = None
    timeout: float | None = None
    checkpoints: CheckpointOverrides = CheckpointOverrides()
    store: StoreOptions | None = None
    share: StaticShare | GroupOptions | None = None


def with_overrides(proc: Processor, overrides: ProcessorOverrides) -> Processor:
    """A new processor with *proc*'s stores, handlers, punctuators and serdes and *overrides*'
    settings; *proc* itself is left as it was (it must not have been started).

    It is :meth:`Processor.replace` with the command line's overrides."""
    settings = proc.settings
    changes: dict[str, Any] = {
        "checkpoints": overrides.checkpoints.apply(proc.name, settings.checkpoints),
    }
    if overrides.bootstrap_servers is not None:
        changes["bootstrap_servers"] = overrides.bootstrap_servers
    if overrides.kafka_config is not None:
        changes["kafka_config"] = {**dict(settings.kafka_config or {}), **overrides.kafka_config}
    if overrides.timeout is not None:
        changes["timeout"] = overrides.timeout
    if overrides.store is not None:
        changes["store"] = overrides.store
    if isinstance(overrides.share, StaticShare):
        changes.update(partitions=overrides.share, group=None)
    elif isinstance(overrides.share, GroupOptions):
        changes.update(partitions=None, group=overrides.share)
    try:
        return proc.replace(**changes)
    except TableStateError:
        raise ConfigError(
            f"processor {proc.name!r} was already started in its module; build it, do not start it"
        ) from None


@dataclass(frozen=True, slots=True)
class ProcessorRunResult:
    """One run of a processor: the table-run figures (``materialize``'s, key for key), and what the
    processor's own code did in this run: records ``processed`` (the tail included), records
    ``emitted`` and ``dead_lettered``, and rows per store at the end of the run (``stores``)."""

    run: MaterializeResult
    processed: int
    emitted: int
    dead_lettered: int
    stores: Mapping[str, int]

    def __post_init__(self) -> None:
        object.__setattr__(self, "stores", MappingProxyType(dict(self.stores)))

    def to_json(self) -> dict[str, Any]:
        return {
            **self.run.to_json(),
            "processed": self.processed,
            "emitted": self.emitted,
            "dead_lettered": self.dead_lettered,
            "stores": dict(self.stores),
        }

    def summary(self) -> str:
        stores = ", ".join(f"{n} {k:,}" for n, k in self.stores.items()) or "no stores"
        return (
            f"{self.run.summary()}; processed {self.processed:,} records, emitted {self.emitted:,}, "
            f"dead-lettered {self.dead_lettered:,}; rows per store: {stores}"
        )


def spark_processor_available() -> bool:
    """Whether this build has the Spark engine's processor bootstrap."""
    try:
        return importlib.util.find_spec(SPARK_BOOTSTRAP_MODULE) is not None
    except ModuleNotFoundError:  # pyspark's package missing altogether
        return False


def run_processor(
    proc: Processor,
    *,
    engine: Engine | str = Engine.AUTO,
    follow: bool | FollowOptions = False,
    spark: SparkOptions | None = None,
    progress: MaterializeProgress | None = None,
) -> ProcessorRunResult:
    """Restore *proc*, catch up with its input, (with *follow*) keep processing until
    ``FollowOptions.stop`` is set, then write the (final) checkpoint and close it.

    *proc* must not have been started (use :func:`with_overrides` for command-line settings);
    it must have a checkpoint store. The engine is chosen as :func:`statesnap.materialize.materialize`
    chooses it, except that ``auto`` runs a processor in python (a Spark run emits nothing); an
    option the chosen engine cannot honour (``exactly_once`` or a dead-letter topic on Spark) is
    refused before any work, a SparkSession included.
    """
    following = FollowOptions.of(follow)
    listener = progress or MaterializeProgress()
    spark_options = spark or SparkOptions()
    options = proc.settings.table_options()
    checkpoints = CheckpointOptions.of(options.get("checkpoints"))
    if checkpoints is None:
        raise ConfigError(f"processor {proc.name!r} has no checkpoint store: give it checkpoints=URL")
    share = options.get("group") or options.get("partitions")
    choice = _choose(proc, engine, following, spark_options, options, checkpoints)
    listener.engine_chosen(choice)
    if isinstance(options.get("group"), (str, GroupOptions)) and following is None:
        raise ConfigError(
            "a consumer group needs follow: a group member holds only the partitions it is assigned, "
            "so a one-shot run could not checkpoint every partition"
        )
    if choice.engine is Engine.SPARK:
        log.warning(
            "processor %s on the spark engine: a run over history emits nothing; records its handlers "
            "emit for these inputs are not produced, now or by a python run resuming from its checkpoint",
            proc.name,
        )
        return _on_spark(proc, choice, spark_options, listener)
    instances = share.instances if isinstance(share, StaticShare) else None
    return _in_python(proc, choice, following, listener, instances)


def choose_processor_engine(
    proc: Processor,
    engine: Engine | str = Engine.AUTO,
    *,
    follow: bool | FollowOptions = False,
    spark: SparkOptions | None = None,
) -> EngineChoice:
    """The engine :func:`run_processor` runs *proc* on, and why; what the engine cannot honour is
    refused here (:class:`~statesnap.errors.EngineOptionError`). Only ``auto`` weighing a backlog
    asks the cluster, and for a processor it never needs to (it runs processors in python)."""
    options = proc.settings.table_options()
    checkpoints = CheckpointOptions.of(options.get("checkpoints"))
    if checkpoints is None:
        raise ConfigError(f"processor {proc.name!r} has no checkpoint store: give it checkpoints=URL")
    return _choose(proc, engine, FollowOptions.of(follow), spark or SparkOptions(), options, checkpoints)


def _choose(
    proc: Processor,
    engine: Engine | str,
    follow: FollowOptions | None,
    spark: SparkOptions,
    options: Mapping[str, Any],
    checkpoints: CheckpointOptions,
) -> EngineChoice:
    """The engine, as materialize chooses it, except that only the python engine follows (the
    Spark engine runs a processor over history) and the local store kind is the python engine's
    business alone (Spark tasks hold a partition's state in memory), so it chooses nothing."""
    try:
        requested = Engine(engine)
    except ValueError:
        raise ConfigError(f"unknown engine {engine!r}: use auto, python or spark") from None
    python_only = {
        # What a Spark run of a processor cannot honour: it emits nothing (see PYTHON_ONLY).
        "exactly_once": proc.exactly_once,
        "dead_letter_topic": proc.dead_letter_topic is not None,
        "instances": isinstance(options.get("partitions"), StaticShare),
        "group": options.get("group") is not None,
    }
    spark_only = {"spark_conf": bool(spark.conf)}
    if follow is not None:
        if requested is Engine.SPARK:
            raise EngineOptionError(
                "--follow cannot be used with --engine spark: the spark engine runs a processor over "
                "its input's history and stops; a python run (or proc.run()) resumes from its checkpoint"
            )
        chosen = choose_engine(
            Engine.PYTHON, python_only=python_only, spark_only=spark_only, backlog=None, follow=True
        )
        if requested is Engine.AUTO:
            return EngineChoice(Engine.PYTHON, "--follow needs the python engine (spark runs history only)")
        return chosen
    if requested is Engine.SPARK:
        # Refuse what Spark cannot honour (exactly-once outputs first) before anything else.
        choose_engine(requested, python_only=python_only, spark_only=spark_only, backlog=None, follow=False)
    if requested is not Engine.PYTHON and not spark_processor_available():
        if requested is Engine.SPARK:
            raise EngineOptionError(
                "--engine spark cannot run a processor in this build: it has no "
                f"{SPARK_BOOTSTRAP_MODULE} (statesnap.spark.bootstrap_processor)"
            )
        return EngineChoice(Engine.PYTHON, "the spark engine cannot run processors in this build")
    if requested is Engine.AUTO and not any(python_only.values()) and not any(spark_only.values()):
        # A processor's handlers may emit (ctx.emit), and a Spark run over history emits nothing:
        # auto never trades a processor's outputs for speed. --engine spark (or a Spark setting)
        # runs the history on Spark for the stores alone, and says what it does not produce.
        return EngineChoice(Engine.PYTHON, SPARK_EMITS_NOTHING)
    settings = KafkaSettings(
        options["bootstrap_servers"], dict(options.get("kafka_config") or {}), float(options["timeout"])
    )
    return choose_engine(
        requested,
        python_only=python_only,
        spark_only=spark_only,
        backlog=lambda: estimate_table_backlog(settings, proc.inputs[0], proc.name, checkpoints),
        follow=False,
    )


#: auto's reason for running a processor in python when nothing else decides.
SPARK_EMITS_NOTHING = (
    "a processor's handlers may emit, and a Spark run over history emits nothing: auto runs "
    "processors in python (--engine spark runs the history for the stores alone)"
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
        return self.proc.inputs[0]

    @property
    def name(self) -> str:
        return self.proc.name

    def lag(self) -> dict[int, int]:
        return self.proc.task.lag()

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


def _in_python(
    proc: Processor,
    choice: EngineChoice,
    follow: FollowOptions | None,
    progress: MaterializeProgress,
    instances: int | None,
) -> ProcessorRunResult:
    """:func:`statesnap.materialize.python_run.run_in_python`'s steps, for a processor: restore
    and catch up (the handler runs over the tail), follow when asked, write the (final)
    checkpoint, count, close. One task of several (a static share, following) writes no final
    checkpoint of its own: its peers report on their own."""
    started = time.monotonic()
    run = TaskRun()
    try:
        progress.stage(Stage.READING)
        report = restore_with_progress(_Restoring(proc), progress)
        task = proc.task
        manifest = run.finish(
            task,
            follow=follow,
            progress=progress,
            instances=instances,
            doing=f"processing {task.topic} with {proc.name}",
        )
        keys = len(task.store)
        stores = {name: len(proc.store(name)) for name in proc.stores}
        handler = task.handler
        processed = handler.processed if isinstance(handler, ProcessorHandler) else 0
        dead_lettered = handler.dead_lettered if isinstance(handler, ProcessorHandler) else 0
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
    )
    return ProcessorRunResult(result, processed, proc.emitted, dead_lettered, stores)


def _on_spark(
    proc: Processor, choice: EngineChoice, spark_options: SparkOptions, progress: MaterializeProgress
) -> ProcessorRunResult:
    """The processor over its input's history as one Spark job (one task per input partition),
    committing the checkpoint a Python run resumes from."""
    from statesnap.spark import processor_bootstrap

    started = time.monotonic()
    progress.stage(Stage.SESSION_STARTING)
    if spark_options.session is not None:
        session = spark_options.session()
    else:
        from statesnap.spark.session import spark_session

        session = spark_session(conf=spark_options.conf)
    try:
        progress.stage(Stage.READING)
        progress.job_started(f"processing the history of {proc.inputs[0]}")

        def tasks(records: int, done: int, total: int) -> None:
            progress.job(f"{done}/{total} tasks · {records:,} records processed")

        try:
            done = processor_bootstrap.bootstrap_processor(session, proc, progress=tasks)
        finally:
            progress.job_finished()
        progress.stage(Stage.COMMITTED)
    finally:
        session.stop()
    run = MaterializeResult.of(
        done.manifest,
        table=proc.name,
        topic=done.topic,
        engine=choice,
        written=done.written,
        keys=done.keys,
        restore=done.restore,
        checkpoint_seconds=done.checkpoint_seconds,
        seconds=time.monotonic() - started,
        url=done.url,
    )
    return ProcessorRunResult(run, done.processed, done.emitted, done.dead_lettered, dict(done.stores or {}))
