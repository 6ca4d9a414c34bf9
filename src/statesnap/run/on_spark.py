"""The Spark engine's run: a table's bootstrap job (one-shot) or streaming materializer (follow),
or a processor over its input's history (:func:`run_processor_on_spark`).

Both write the same checkpoints and take part in the same snapshots as the Python engine; the
result has the same fields. A typo'd topic, settings librdkafka refuses or a dead broker fail
before the Spark session starts (seconds of start-up for nothing otherwise).
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from statesnap.checkpoint import CheckpointManifest
from statesnap.deadline import call_within
from statesnap.durations import format_duration
from statesnap.errors import CheckpointError, CheckpointTimeoutError
from statesnap.kafka.admin import KafkaAdmin
from statesnap.kafka.config import KafkaSettings
from statesnap.run.engine import EngineChoice
from statesnap.run.options import FollowOptions, SparkOptions
from statesnap.run.progress import MaterializeProgress, Stage
from statesnap.run.result import Followed, MaterializeResult, ProcessorRunResult
from statesnap.task.migration import StateVersion
from statesnap.task.options import CheckpointOptions
from statesnap.task.restore import RestoreReport

if TYPE_CHECKING:
    from statesnap.processor import Processor

__all__ = ["default_query_location", "run_on_spark", "run_processor_on_spark"]

#: How often the follow loop looks at the stop request and the streaming query's state.
POLL_SECONDS = 0.5


def run_on_spark(
    settings: KafkaSettings,
    topic: str,
    table: str,
    checkpoints: CheckpointOptions,
    *,
    choice: EngineChoice,
    follow: FollowOptions | None,
    spark_options: SparkOptions,
    progress: MaterializeProgress,
    state: StateVersion | None = None,
) -> MaterializeResult:
    """Bootstrap (or, with *follow*, continuously materialize) *topic* into checkpoints on Spark.

    The result's figures are this run's, measured: ``restore`` is the checkpoint it resumed from,
    the records it read to reach the topic's end and how long that took; ``checkpoint_seconds``
    the commit of its (final) checkpoint."""
    from statesnap.spark.writer import check_table_options, table_options

    started = time.monotonic()
    check_table_options(
        table_options(settings.bootstrap_servers, topic, dict(settings.config), settings.timeout)
    )
    KafkaAdmin(settings).partitions(topic)
    progress.stage(Stage.SESSION_STARTING)
    spark = _session(spark_options)
    try:
        if follow is None:
            return _bootstrap(spark, settings, topic, table, checkpoints, choice, progress, started, state)
        return _follow(spark, settings, topic, table, checkpoints, choice, follow, spark_options,
                       progress, started, state)  # fmt: skip
    finally:
        spark.stop()


def _session(options: SparkOptions) -> Any:
    if options.session is not None:
        return options.session()
    from statesnap.spark.session import spark_session

    return spark_session(conf=options.conf)


@contextlib.contextmanager
def _job(progress: MaterializeProgress, label: str) -> Iterator[None]:
    progress.job_started(label)
    try:
        yield
    finally:
        progress.job_finished()


def _bootstrap(
    spark: Any,
    settings: KafkaSettings,
    topic: str,
    table: str,
    checkpoints: CheckpointOptions,
    choice: EngineChoice,
    progress: MaterializeProgress,
    started: float,
    state: StateVersion | None = None,
) -> MaterializeResult:
    from statesnap.spark.bootstrap import BootstrapSpec, run_bootstrap

    spec = BootstrapSpec(settings.bootstrap_servers, topic, table, checkpoints, settings.config,
                         timeout=settings.timeout, state=state or StateVersion())  # fmt: skip
    progress.stage(Stage.READING)
    with _job(progress, f"bootstrapping {topic}"):

        def tasks(records: int, done: int, total: int) -> None:
            progress.job(f"{done}/{total} tasks · {records:,} records read")

        run = run_bootstrap(spark, spec, progress=tasks)
    progress.stage(Stage.COMMITTED)
    return _result(
        spark,
        run.manifest,
        checkpoints,
        topic,
        table,
        choice,
        started,
        written=run.written,
        restore=run.restore,
        checkpoint_seconds=run.checkpoint_seconds,
    )


def _follow(
    spark: Any,
    settings: KafkaSettings,
    topic: str,
    table: str,
    checkpoints: CheckpointOptions,
    choice: EngineChoice,
    follow: FollowOptions,
    spark_options: SparkOptions,
    progress: MaterializeProgress,
    started: float,
    state: StateVersion | None = None,
) -> MaterializeResult:
    """Run the streaming materializer until *follow* says stop, then commit the final
    checkpoint within its shutdown timeout."""
    from statesnap.spark import materialize_stream

    location = spark_options.checkpoint_location or default_query_location(checkpoints, table)
    progress.stage(Stage.QUERY_STARTING)
    materializer = materialize_stream(
        spark,
        bootstrap_servers=settings.bootstrap_servers,
        topic=topic,
        table=table,
        checkpoints=checkpoints,
        checkpoint_location=location,
        kafka_config=settings.config,
        timeout=settings.timeout,
        state=state or StateVersion(),
    )
    progress.stage(Stage.FOLLOWING)
    following = time.monotonic()
    progress.status(
        f"materializing {topic} on Spark; checkpoints every {format_duration(checkpoints.interval)}, "
        f"streaming state in {location} (Ctrl-C to stop)"
    )
    seconds = follow.shutdown_timeout.total_seconds()
    with _job(progress, f"materializing {topic}"):

        def show(state: str) -> None:
            m = materializer
            progress.job(f"{m.batches} batches · {m.records_read:,} records read · {state}")

        with contextlib.suppress(KeyboardInterrupt):  # a script's Ctrl-C: a stop request
            while not follow.stop.wait(POLL_SECONDS):
                show("caught up" if materializer.caught_up else "catching up")
                if not materializer.query.isActive:
                    if materializer.failure is not None:
                        raise materializer.failure
                    raise CheckpointError(f"streaming query stopped: {materializer.query.exception()}")
        progress.stage(Stage.FINAL_CHECKPOINT)
        show("final checkpoint")
        committing = time.monotonic()
        followed = Followed(  # as the Python engine reports it: what the query read after its restore
            max(0, materializer.records_read - materializer.restore.replayed_records), committing - following
        )
        final = call_within(
            seconds,
            # A batch in flight may finish within half the time: its records make the checkpoint.
            lambda _abandoned: materializer.stop(checkpoint=True, drain_seconds=seconds / 2),
            lambda: CheckpointTimeoutError(
                f"the final checkpoint did not finish within {seconds:g}s (shutdown timeout); the "
                "last committed checkpoint stands"
            ),
            "statesnap-final-checkpoint",
        )
        checkpoint_seconds = time.monotonic() - committing
        show("stopped")
    progress.stage(Stage.COMMITTED)
    return _result(
        spark,
        final or materializer.last_checkpoint,
        checkpoints,
        topic,
        table,
        choice,
        started,
        written=final is not None,
        restore=materializer.restore,
        checkpoint_seconds=checkpoint_seconds,
        followed=followed,
    )


def _result(
    spark: Any,
    manifest: CheckpointManifest | None,
    checkpoints: CheckpointOptions,
    topic: str,
    table: str,
    choice: EngineChoice,
    started: float,
    *,
    written: bool,
    restore: RestoreReport,
    checkpoint_seconds: float,
    followed: Followed | None = None,
) -> MaterializeResult:
    """The run's result; ``keys`` is the table's key count (recorded by the writer, or merged
    from the files by a small job)."""
    from statesnap.checkpoint import locate_table
    from statesnap.spark import count_keys
    from statesnap.task.opening import open_checkpoint_store

    keys, url, shown = 0, None, None
    if manifest is not None:
        repo = locate_table(open_checkpoint_store(checkpoints), table, manifest.cluster_id)
        keys, url, shown = count_keys(spark, repo, manifest), repo.url, repo.shown
    return MaterializeResult.of(
        manifest,
        table=table,
        topic=topic,
        engine=choice,
        written=written,
        keys=keys,
        restore=restore,
        checkpoint_seconds=checkpoint_seconds,
        seconds=time.monotonic() - started,
        url=url,
        followed=followed,
        shown=shown,
    )


def default_query_location(checkpoints: CheckpointOptions, table: str) -> str:
    """Spark's own streaming checkpoint: a per-user cache directory keyed by store and table."""
    where = checkpoints.url if checkpoints.url is not None else repr(checkpoints.location)
    digest = hashlib.sha256(f"{where}|{table}".encode()).hexdigest()[:12]
    return str(Path.home() / ".cache" / "statesnap" / "spark" / f"{table}-{digest}")


def run_processor_on_spark(
    proc: Processor, *, choice: EngineChoice, spark_options: SparkOptions, progress: MaterializeProgress
) -> ProcessorRunResult:
    """The processor over its input's history as one Spark job (one task per input partition),
    committing the checkpoint a Python run resumes from."""
    from statesnap.spark import processor_bootstrap

    started = time.monotonic()
    progress.stage(Stage.SESSION_STARTING)
    session = _session(spark_options)
    try:
        progress.stage(Stage.READING)
        with _job(progress, f"processing the history of {', '.join(proc.inputs)}"):  # every input

            def tasks(records: int, done: int, total: int) -> None:
                progress.job(f"{done}/{total} tasks · {records:,} records processed")

            done = processor_bootstrap.bootstrap_processor(session, proc, progress=tasks)
        progress.stage(Stage.COMMITTED)
    finally:
        session.stop()
    # The user's stores only, as the Python run counts them: the bookkeeping store is statesnap's.
    stores = {name: rows for name, rows in (done.stores or {}).items() if name in proc.stores}
    run = MaterializeResult.of(
        done.manifest,
        table=proc.name,
        topic=done.topic,
        engine=choice,
        written=done.written,
        keys=sum(stores.values()) if done.stores is not None else done.keys,
        restore=done.restore,
        checkpoint_seconds=done.checkpoint_seconds,
        seconds=time.monotonic() - started,
        url=done.url,
        shown=done.shown,
    )
    return ProcessorRunResult(run, done.processed, done.emitted, done.dead_lettered, stores, done.skipped)
