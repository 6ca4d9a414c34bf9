"""``--engine spark``: the CLI's bridge to :mod:`statesnap.spark` (imported only when used).

It returns the same result keys as the python engine, so ``--json`` output does not depend on
which engine ran.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from statesnap.checkpoint import CheckpointManifest, RetentionPolicy
from statesnap.cli.interrupts import (
    Interrupted,
    cancel_spark_jobs_on_signals,
    stop_on_signals,
    wait_on_signals,
)
from statesnap.cli.progress import activity_bar, stderr_as_it_is
from statesnap.deadline import call_within
from statesnap.durations import parse_duration
from statesnap.errors import CheckpointTimeoutError
from statesnap.kafka.admin import KafkaAdmin
from statesnap.kafka.config import KafkaSettings
from statesnap.snapshot.diff import SAMPLE as DIFF_SAMPLE
from statesnap.snapshot.diff import SnapshotDiff
from statesnap.task.restore import RestoreReport

#: Set by the first Ctrl-C of a CLI Spark session (which then cancels its jobs).
_interrupted = threading.Event()

#: A session that has not started in this long is an error, not waited on for ever: cold starts
#: measured 11.5-35 s (median 14-20 s) on a 2-core machine at load 4-10 (``benchmarks/spark_startup.py``).
SESSION_START_TIMEOUT_SECONDS = 300.0

#: How often the progress display and the streaming query's state are looked at.
POLL_SECONDS = 0.5


def _not_from_py4j(record: logging.LogRecord) -> bool:
    # py4j logs through the root logger, so only where the record comes from tells it apart.
    return "py4j" not in record.pathname


@contextlib.contextmanager
def _jvm_in_a_session_of_its_own() -> Iterator[None]:
    """The JVM PySpark launches meanwhile gets a session (and process group) of its own.

    A process manager stops a service by signalling its whole process group (systemd's
    ``KillMode=control-group`` sends SIGTERM to every process; ``timeout`` signals the group):
    PySpark's JVM ignores SIGINT but shuts down on SIGTERM, taking the SparkContext with it in
    the middle of the final checkpoint (exit 1, py4j tracebacks). Signals are the CLI's to
    handle; the JVM still ends with it (it exits when its stdin, a pipe from this process,
    closes). PySpark offers no setting for this, so its launcher's ``Popen`` is wrapped while
    the session starts.
    """
    from pyspark import java_gateway

    original = java_gateway.__dict__["Popen"]

    def popen(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("start_new_session", True)
        return original(*args, **kwargs)

    setattr(java_gateway, "Popen", popen)  # noqa: B010 (not an exported name)
    try:
        yield
    finally:
        setattr(java_gateway, "Popen", original)  # noqa: B010


def spark_session(
    conf: dict[str, str] | None = None, *, quiet: bool = False, stop: threading.Event | None = None
) -> Any:
    """The CLI's session: Spark's logs only with ``--log-level debug``; master from
    STATESNAP_SPARK_MASTER (``local[*]`` by default); one line saying which and how long it took
    to start, unless *quiet*; on a terminal, the seconds spent starting while it starts.

    The session starts on a thread of its own: this thread keeps the display and the CLI's
    signal handling (PySpark installs its own SIGINT handler, a KeyboardInterrupt inside a py4j
    call, only when started on the main thread). A SIGINT/SIGTERM while it starts ends the
    command once the session can be stopped (:class:`Interrupted`, exit 130); a second one at
    once. Without *stop*, the signals then cancel the session's jobs (a batch run); with it, they
    set *stop* (the caller's clean stop)."""
    from statesnap.spark.session import default_master
    from statesnap.spark.session import spark_session as make

    verbose = logging.getLogger("statesnap").getEffectiveLevel() <= logging.DEBUG
    if not verbose:  # py4j logs each interrupted call with a traceback; the CLI says it once
        for handler in logging.getLogger().handlers:
            handler.addFilter(_not_from_py4j)
    interrupted = stop if stop is not None else _interrupted
    if stop is None:
        wait_on_signals(interrupted, "stopped again while the Spark session was starting")
    started = time.monotonic()
    outcome: list[Any] = []
    failure: list[BaseException] = []

    def start() -> None:
        try:
            with _jvm_in_a_session_of_its_own():
                outcome.append(make(conf=conf, verbose=verbose))
        except BaseException as e:  # handed to the main thread
            failure.append(e)

    master = default_master()
    starter = threading.Thread(target=start, name="statesnap-spark-start", daemon=True)
    # The display's stderr is taken before the start-up swaps the descriptor for a pipe.
    with (
        stderr_as_it_is() as console,
        activity_bar(quiet or not console.is_terminal, transient=True, console=console) as bar,
    ):
        task = bar.add_task(f"starting a Spark session ({master})", total=None, detail="")
        starter.start()
        while starter.is_alive():
            starter.join(POLL_SECONDS)
            if interrupted.is_set():
                bar.update(task, detail="stopping once it is up (Ctrl-C again to exit at once)")
            if time.monotonic() - started > SESSION_START_TIMEOUT_SECONDS:
                raise click.ClickException(
                    f"the Spark session did not start within {SESSION_START_TIMEOUT_SECONDS:g}s"
                )
    if failure:
        raise failure[0]
    spark = outcome[0]
    seconds = time.monotonic() - started
    if interrupted.is_set():
        spark.stop()
        raise Interrupted("stopped while the Spark session was starting")
    if stop is None:  # from now on a signal has jobs to cancel
        cancel_spark_jobs_on_signals(spark, _interrupted)
    if not quiet:
        click.echo(
            f"spark: {spark.version}, master {spark.sparkContext.master} (started in {seconds:.1f}s)",
            err=True,
        )
    return spark


def materialize_on_spark(
    *,
    settings: KafkaSettings,
    topic: str,
    table: str,
    checkpoints: str,
    storage_options: dict[str, str],
    follow: bool,
    checkpoint_interval: str,
    trigger_interval: str,
    retention: RetentionPolicy,
    generation: int | None,
    snapshot_timeout: str,
    shutdown_timeout: str,
    snapshot_store: str | None,
    spark_checkpoint_location: str | None,
    spark_conf: dict[str, str],
    quiet: bool,
) -> dict[str, Any]:
    """Bootstrap (or, with ``follow``, continuously materialize) *topic* into checkpoints on Spark.

    The result's figures are this run's, measured: ``restore`` is the checkpoint it resumed from,
    the records it read to reach the topic's end and how long that took; ``checkpoint_seconds``
    the commit of its (final) checkpoint. A manifest's ``writer`` metadata describes the
    checkpoint, which another run may have written."""
    from statesnap.spark.bootstrap import run_bootstrap
    from statesnap.spark.writer import check_table_options, table_options

    started = time.monotonic()
    common: dict[str, Any] = {
        "bootstrap_servers": settings.bootstrap_servers,
        "topic": topic,
        "table": table,
        "checkpoints": checkpoints,
        "storage_options": storage_options,
        "kafka_config": dict(settings.config),
        "retention": retention,
        "snapshot_store": snapshot_store,
        "snapshot_timeout": snapshot_timeout,
        "generation": generation,
        "timeout": settings.timeout,
    }
    # A typo'd topic, settings librdkafka refuses or a dead broker fail now, not after Spark's start-up.
    check_table_options(
        table_options(settings.bootstrap_servers, topic, dict(settings.config), settings.timeout)
    )
    KafkaAdmin(settings).partitions(topic)
    if not follow:
        spark = spark_session(spark_conf, quiet=quiet)
        try:
            with activity_bar(quiet) as bar:
                task = bar.add_task(f"bootstrapping {topic}", total=None, detail="")

                def progress(records: int, done: int, tasks: int) -> None:
                    bar.update(task, detail=f"{done}/{tasks} tasks · {records:,} records read")

                try:
                    run = run_bootstrap(spark, progress=progress, **common)
                except Exception as e:
                    if _interrupted.is_set():  # the job we cancelled, not a failure of its own
                        raise Interrupted("the Spark job was cancelled before its checkpoint") from e
                    raise
            return _result(
                spark,
                run.manifest,
                checkpoints,
                storage_options,
                topic,
                table,
                started,
                written=run.written,
                restore=run.restore,
                checkpoint_seconds=run.checkpoint_seconds,
            )
        finally:
            spark.stop()
    again = ["stopped again while the Spark session was starting"]  # what a second signal interrupts
    stop = stop_on_signals(lambda: again[0])
    spark = spark_session(spark_conf, quiet=quiet, stop=stop)
    try:
        return _follow(spark, stop, again, common, spark_checkpoint_location, checkpoint_interval,
                       trigger_interval, shutdown_timeout, quiet, started)  # fmt: skip
    finally:
        spark.stop()


def _follow(
    spark: Any,
    stop: threading.Event,
    again: list[str],
    common: dict[str, Any],
    spark_checkpoint_location: str | None,
    checkpoint_interval: str,
    trigger_interval: str,
    shutdown_timeout: str,
    quiet: bool,
    started: float,
) -> dict[str, Any]:
    """``materialize --follow`` on Spark: run the streaming materializer until the first
    SIGINT/SIGTERM (*stop*), then commit the final checkpoint within *shutdown_timeout*."""
    from statesnap.spark import materialize_stream

    topic, table, checkpoints = common["topic"], common["table"], common["checkpoints"]
    location = spark_checkpoint_location or _default_query_location(checkpoints, table)
    again[0] = "stopped again while the streaming query was starting"
    materializer = materialize_stream(
        spark,
        checkpoint_location=location,
        checkpoint_interval=checkpoint_interval,
        trigger_interval=trigger_interval,
        **common,
    )
    again[0] = "stopped again before the final checkpoint finished"
    following = time.monotonic()
    if not quiet:
        click.echo(
            f"materializing {topic} on Spark; checkpoints every {checkpoint_interval}, streaming state "
            f"in {location} (Ctrl-C to stop)",
            err=True,
        )
    seconds = parse_duration(shutdown_timeout).total_seconds()
    with activity_bar(quiet) as bar:
        task = bar.add_task(f"materializing {topic}", total=None, detail="")

        def show(state: str) -> None:
            m = materializer
            bar.update(task, detail=f"{m.batches} batches · {m.records_read:,} records read · {state}")

        while not stop.wait(POLL_SECONDS):
            show("caught up" if materializer.caught_up else "catching up")
            if not materializer.query.isActive:
                if materializer.failure is not None:
                    raise materializer.failure
                raise click.ClickException(f"streaming query stopped: {materializer.query.exception()}")
        show("final checkpoint")
        committing = time.monotonic()
        followed = {  # as the Python engine reports it: what the query read after its restore
            "records": max(0, materializer.records_read - materializer.restore.replayed_records),
            "seconds": round(committing - following, 3),
        }
        final = call_within(
            seconds,
            # A batch in flight may finish within half the time: its records make the checkpoint.
            lambda _abandoned: materializer.stop(checkpoint=True, drain_seconds=seconds / 2),
            lambda: CheckpointTimeoutError(
                f"the final checkpoint did not finish within {seconds:g}s (--shutdown-timeout); the "
                "last committed checkpoint stands"
            ),
            "statesnap-final-checkpoint",
        )
        checkpoint_seconds = time.monotonic() - committing
        show("stopped")
    current = final or materializer.last_checkpoint
    return _result(
        spark,
        current,
        checkpoints,
        storage_options=common["storage_options"],
        topic=topic,
        table=table,
        started=started,
        written=final is not None,
        restore=materializer.restore,
        checkpoint_seconds=checkpoint_seconds,
        followed=followed,
    )


def _result(
    spark: Any,
    manifest: CheckpointManifest | None,
    checkpoints: str,
    storage_options: dict[str, str],
    topic: str,
    table: str,
    started: float,
    *,
    written: bool,
    restore: RestoreReport,
    checkpoint_seconds: float,
    followed: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The python engine's result keys: the manifest's generation, offsets and size, this run's
    *restore* and *checkpoint_seconds*, and ``keys``, the table's key count (recorded by the
    writer, or merged from the files by a small job)."""
    from statesnap.blob import open_blob_store
    from statesnap.checkpoint import locate_table
    from statesnap.spark import count_keys

    keys, url = 0, None
    if manifest is not None:
        repo = locate_table(open_blob_store(checkpoints, **storage_options), table, manifest.cluster_id)
        keys, url = count_keys(spark, repo, manifest), repo.url
    return {
        "table": table,
        "topic": topic,
        "engine": "spark",
        "checkpoint": manifest.generation if manifest is not None else None,
        "written": written,
        "keys": keys,
        "offsets": manifest.offsets if manifest is not None else {},
        "restore": {
            "checkpoint": restore.checkpoint,
            "replayed_records": restore.replayed_records,
            "restore_seconds": round(restore.restore_seconds, 3),
        },
        "checkpoint_seconds": round(checkpoint_seconds, 3),
        "seconds": round(time.monotonic() - started, 3),
        "bytes": manifest.total_bytes if manifest is not None else 0,
        "url": url,
        **({"followed": followed} if followed is not None else {}),
    }


def _default_query_location(checkpoints: str, table: str) -> str:
    """Spark's own streaming checkpoint: a per-user cache directory keyed by store and table."""
    digest = hashlib.sha256(f"{checkpoints}|{table}".encode()).hexdigest()[:12]
    return str(Path.home() / ".cache" / "statesnap" / "spark" / f"{table}-{digest}")


def diff_on_spark(
    api: Any, old: int, new: int, storage_options: dict[str, str] | None = None
) -> SnapshotDiff:
    """The snapshot diff as a Spark join (for tables larger than one process's memory)."""
    from pyspark.sql import functions as sf

    from statesnap.spark import read_table

    spark = spark_session()
    try:
        url, table = api.repo.store.url, api.table

        def frame(gen: int) -> Any:
            return read_table(
                spark, url, table, generation=gen, cluster_id=api.cluster_id, storage_options=storage_options
            )

        a = frame(old).select("key", sf.col("value").alias("a"))
        b = frame(new).select("key", sf.col("value").alias("b"))
        joined = a.join(b, "key", "full_outer")
        row = joined.agg(
            sf.count("a").alias("old"),
            sf.count("b").alias("new"),
            sf.sum(sf.when(sf.col("a").isNull(), 1).otherwise(0)).alias("added"),
            sf.sum(sf.when(sf.col("b").isNull(), 1).otherwise(0)).alias("removed"),
            sf.sum(
                sf.when(
                    sf.col("a").isNotNull() & sf.col("b").isNotNull() & (sf.col("a") != sf.col("b")), 1
                ).otherwise(0)
            ).alias("changed"),
            sf.sum(sf.when(sf.col("a") == sf.col("b"), 1).otherwise(0)).alias("unchanged"),
        ).collect()[0]
        kinds = {
            "added": sf.col("a").isNull(),
            "removed": sf.col("b").isNull(),
            "changed": sf.col("a").isNotNull() & sf.col("b").isNotNull() & (sf.col("a") != sf.col("b")),
        }
        examples = {  # the same sample the Python engine gives (diff_snapshots), keys in order
            kind: [
                bytes(r["key"]).decode("utf-8", "backslashreplace")
                for r in joined.filter(mask).select("key").orderBy("key").limit(DIFF_SAMPLE).collect()
            ]
            for kind, mask in kinds.items()
        }
        return SnapshotDiff(
            old=int(row["old"]),
            new=int(row["new"]),
            added=int(row["added"] or 0),
            removed=int(row["removed"] or 0),
            changed=int(row["changed"] or 0),
            unchanged=int(row["unchanged"] or 0),
            examples=examples,
        )
    finally:
        spark.stop()
