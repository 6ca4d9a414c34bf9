"""``materialize()``: restore a topic's table, catch up to the end of the topic, checkpoint it.

The one entry point behind ``statesnap materialize``: it picks the engine (and says why),
refuses an option the chosen engine cannot honour, runs it and returns a
:class:`~statesnap.run.result.MaterializeResult`. It prints nothing: progress goes to the
listener it is given.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from statesnap.kafka.config import KafkaSettings
from statesnap.run.engine import Engine, EngineChoice, choose_engine, estimate_table_backlog
from statesnap.run.options import FollowOptions, SparkOptions, StopRequest
from statesnap.run.progress import MaterializeProgress
from statesnap.run.result import MaterializeResult
from statesnap.task.migration import StateVersion
from statesnap.task.options import CheckpointOptions, GroupOptions, StaticShare, StoreName, StoreOptions
from statesnap.task.sharing import check_share

__all__ = ["materialize"]


def materialize(
    topic: str,
    *,
    bootstrap_servers: str,
    checkpoints: str | CheckpointOptions,
    name: str | None = None,
    engine: Engine | str = Engine.AUTO,
    follow: bool | FollowOptions = False,
    kafka_config: Mapping[str, Any] | None = None,
    timeout: float = 15.0,
    store: StoreName | StoreOptions | None = None,
    share: StaticShare | GroupOptions | None = None,
    spark: SparkOptions | None = None,
    progress: MaterializeProgress | None = None,
    state: StateVersion | None = None,
    stop: StopRequest | None = None,
) -> MaterializeResult:
    """Restore *topic*'s table (``name``, default the topic) from its newest usable checkpoint,
    read to the end of the topic and write a checkpoint; running it again is incremental.

    Args:
        checkpoints: the checkpoint store URL, or :class:`CheckpointOptions` (storage options,
            interval and commit interval while following, retention, a generation to continue
            from, snapshot settings).
        engine: ``python`` (this process), ``spark`` (a PySpark job) or ``auto``: the one
            expected to finish first from the backlog (Spark for large backlogs or when
            ``STATESNAP_SPARK_MASTER`` names a cluster), said in ``result.engine.reason``.
        follow: keep consuming and checkpointing until ``FollowOptions.stop`` is set, then write
            a final checkpoint (True: every default, stopped by KeyboardInterrupt).
        store: the Python engine's local state store.
        share: the Python engine's share of the partitions: a :class:`StaticShare`, or a
            consumer group (:class:`GroupOptions`, with ``follow`` only).
        spark: what only the Spark engine honours (Spark settings, streaming checkpoint).
        progress: told what happens while the run goes (see :class:`MaterializeProgress`).
        state: the state version checkpoints are written at, and migrations from older ones,
            run while restoring (Python) or as the bootstrap's tasks read (Spark, not with follow;
            see :mod:`statesnap.task.migration`); a checkpoint of another version is refused
            without them.

        stop: a stop request for the Python engine's catch-up: once its event is set, the
            catch-up stops between two batches with a checkpoint of what it read
            (:class:`~statesnap.errors.CatchUpStoppedError`); with *follow* its stop is the default.

    An option the chosen engine cannot honour is refused before any work
    (:class:`~statesnap.errors.EngineOptionError`); a missing topic or broker fails at once.
    """
    options = checkpoints if isinstance(checkpoints, CheckpointOptions) else CheckpointOptions(checkpoints)
    following = FollowOptions.of(follow)
    spark_options = spark or SparkOptions()
    listener = progress or MaterializeProgress()
    table = name or topic
    check_share(share, follow=following is not None, generation=options.generation, run="materialize")
    settings = KafkaSettings(bootstrap_servers, dict(kafka_config or {}), timeout)
    choice = choose_engine(
        engine,
        python_only={
            "store": store is not None,
            "instances": isinstance(share, StaticShare),
            "group": isinstance(share, GroupOptions),
            # Spark's one-shot bootstrap migrates as its tasks read; its streaming run does not.
            "migrations": bool(state is not None and state.migrations) and following is not None,
        },
        spark_only={
            "spark_checkpoint_location": bool(spark_options.checkpoint_location),
            "spark_conf": bool(spark_options.conf),
        },
        backlog=lambda: estimate_table_backlog(settings, topic, table, options),
        follow=following is not None,
    )
    listener.engine_chosen(choice)  # said once, to the listener (the default one logs it)
    if choice.engine is Engine.SPARK:
        from statesnap.run.on_spark import run_on_spark

        return run_on_spark(settings, topic, table, options, choice=choice, follow=following,
                            spark_options=spark_options, progress=listener, state=state)  # fmt: skip
    return _in_python(settings, topic, table, options, choice, following, store, share, listener, state, stop)


def _in_python(
    settings: KafkaSettings,
    topic: str,
    table: str,
    checkpoints: CheckpointOptions,
    choice: EngineChoice,
    follow: FollowOptions | None,
    store: StoreName | StoreOptions | None,
    share: StaticShare | GroupOptions | None,
    progress: MaterializeProgress,
    state: StateVersion | None = None,
    stop: StopRequest | None = None,
) -> MaterializeResult:
    from statesnap.run.in_python import open_table, run_in_python

    opened = open_table(
        topic,
        bootstrap_servers=settings.bootstrap_servers,
        name=table,
        checkpoints=checkpoints,
        store=StoreOptions.of(store or "auto"),
        share=share,
        kafka_config=settings.config,
        timeout=settings.timeout,
        background=follow is not None,
        state=state,
    )
    instances = share.instances if isinstance(share, StaticShare) else None
    return run_in_python(
        opened, choice=choice, follow=follow, progress=progress, instances=instances, stop=stop
    )
