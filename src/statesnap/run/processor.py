"""Running a processor the way :func:`~statesnap.run.table.materialize` runs a table: what
``statesnap run`` calls.

:func:`run_processor` chooses the engine (:func:`~statesnap.run.engine.choose_engine`, as for a
table, with a processor's rules: the Spark engine runs a processor over its input's history
(:func:`statesnap.spark.bootstrap_processor`), does not follow and emits nothing, so exactly-once
outputs and a dead-letter topic are refused on it, ``auto`` runs processors in python, and an
explicit Spark run warns that it produces no outputs), checks the partition share
(:mod:`statesnap.task.sharing`), runs it (:mod:`statesnap.run.in_python` /
:mod:`statesnap.run.on_spark`) and returns a :class:`~statesnap.run.result.ProcessorRunResult`,
whose ``to_json()`` has ``materialize --json``'s keys plus the processor's own (``processed``,
``emitted``, ``dead_lettered``, ``stores``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from statesnap.errors import ConfigError
from statesnap.kafka.config import KafkaSettings
from statesnap.run.engine import Engine, EngineChoice, choose_engine, estimate_table_backlog
from statesnap.run.options import FollowOptions, SparkOptions, StopRequest
from statesnap.run.progress import MaterializeProgress
from statesnap.run.result import ProcessorRunResult
from statesnap.task.options import CheckpointOptions, StaticShare
from statesnap.task.sharing import check_share

if TYPE_CHECKING:  # a processor's module loads with the processor; a run over one needs no more
    from statesnap.processor.processor import Processor

__all__ = ["choose_processor_engine", "run_processor"]

log = logging.getLogger(__name__)


def run_processor(
    proc: Processor,
    *,
    engine: Engine | str = Engine.AUTO,
    follow: bool | FollowOptions = False,
    spark: SparkOptions | None = None,
    progress: MaterializeProgress | None = None,
    stop: StopRequest | None = None,
) -> ProcessorRunResult:
    """Restore *proc*, catch up with its input, (with *follow*) keep processing until
    ``FollowOptions.stop`` is set, then write the (final) checkpoint and close it.

    *proc* must not have been started (use :func:`statesnap.run.loading.with_overrides` for
    command-line settings); it must have a checkpoint store. The engine is chosen as
    :func:`statesnap.run.materialize` chooses it, except that ``auto`` runs a processor in python
    (a Spark run emits nothing); an option the chosen engine cannot honour (``exactly_once`` or a
    dead-letter topic on Spark) is refused before any work, a SparkSession included. *stop*
    stops a Python catch-up early with a checkpoint, as :func:`statesnap.run.materialize` says.
    """
    following = FollowOptions.of(follow)
    listener = progress or MaterializeProgress()
    spark_options = spark or SparkOptions()
    options = proc.settings.table_options()
    checkpoints = _checkpoints(proc, options)
    share = options.get("group") or options.get("partitions")
    choice = _choose(proc, engine, following, spark_options, options, checkpoints)
    listener.engine_chosen(choice)
    check_share(options.get("group"), follow=following is not None, generation=None, run="run")
    if choice.engine is Engine.SPARK:
        from statesnap.run.on_spark import run_processor_on_spark

        log.warning(
            "processor %s on the spark engine: a run over history emits nothing; records its handlers "
            "emit for these inputs are not produced, now or by a python run resuming from its checkpoint",
            proc.name,
        )
        return run_processor_on_spark(proc, choice=choice, spark_options=spark_options, progress=listener)
    from statesnap.run.in_python import run_processor_in_python

    instances = share.instances if isinstance(share, StaticShare) else None
    return run_processor_in_python(
        proc, choice=choice, follow=following, progress=listener, instances=instances, stop=stop
    )


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
    checkpoints = _checkpoints(proc, options)
    return _choose(proc, engine, FollowOptions.of(follow), spark or SparkOptions(), options, checkpoints)


def _checkpoints(proc: Processor, options: Mapping[str, Any]) -> CheckpointOptions:
    checkpoints = CheckpointOptions.of(options.get("checkpoints"))
    if checkpoints is None:
        raise ConfigError(f"processor {proc.name!r} has no checkpoint store: give it checkpoints=URL")
    return checkpoints


def _choose(
    proc: Processor,
    engine: Engine | str,
    follow: FollowOptions | None,
    spark: SparkOptions,
    options: Mapping[str, Any],
    checkpoints: CheckpointOptions,
) -> EngineChoice:
    """What a processor asks of its engine, for the one choice (:func:`choose_engine`). The local
    store kind is the python engine's business alone (Spark tasks hold a partition's state in
    memory), so it chooses nothing."""

    def backlog() -> int:  # asked only when auto weighs the engines
        settings = KafkaSettings(
            options["bootstrap_servers"], dict(options.get("kafka_config") or {}), float(options["timeout"])
        )
        return estimate_table_backlog(settings, proc.inputs[0], proc.name, checkpoints)

    return choose_engine(
        engine,
        python_only={
            # What a Spark run of a processor cannot honour: it emits nothing (see PYTHON_ONLY).
            "exactly_once": proc.processing.exactly_once,
            "dead_letter_topic": proc.processing.dead_letter_topic is not None,
            "instances": isinstance(options.get("partitions"), StaticShare),
            "group": options.get("group") is not None,
        },
        spark_only={"spark_conf": bool(spark.conf)},
        backlog=backlog,
        follow=follow is not None,
        processor=True,
    )
