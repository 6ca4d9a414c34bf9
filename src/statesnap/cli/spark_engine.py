"""``--engine spark``: the CLI's bridge to :mod:`statesnap.spark` (imported only when used).

It returns the same result keys as the python engine, so ``--json`` output does not depend on
which engine ran.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from pathlib import Path
from typing import Any

import click

from statesnap.checkpoint import CheckpointManifest, RetentionPolicy
from statesnap.cli.interrupts import Interrupted, cancel_spark_jobs_on_signals, stop_on_signals
from statesnap.deadline import call_within
from statesnap.durations import parse_duration
from statesnap.errors import CheckpointTimeoutError
from statesnap.kafka.admin import KafkaAdmin
from statesnap.kafka.config import KafkaSettings
from statesnap.snapshot.diff import SnapshotDiff

#: Set by the first Ctrl-C of a CLI Spark session (which then cancels its jobs).
_interrupted = threading.Event()


def _not_from_py4j(record: logging.LogRecord) -> bool:
    # py4j logs through the root logger, so only where the record comes from tells it apart.
    return "py4j" not in record.pathname


def spark_session(conf: dict[str, str] | None = None, *, quiet: bool = False) -> Any:
    """The CLI's session: Spark's logs only with ``--log-level debug``; master from
    STATESNAP_SPARK_MASTER (``local[*]`` by default); one line saying which, unless *quiet*."""
    from statesnap.spark.session import spark_session as make

    verbose = logging.getLogger("statesnap").getEffectiveLevel() <= logging.DEBUG
    if not verbose:  # py4j logs each interrupted call with a traceback; the CLI says it once
        for handler in logging.getLogger().handlers:
            handler.addFilter(_not_from_py4j)
    spark = make(conf=conf, verbose=verbose)
    cancel_spark_jobs_on_signals(spark, _interrupted)  # replaces PySpark's KeyboardInterrupt handler
    if not quiet:
        click.echo(f"spark: {spark.version}, master {spark.sparkContext.master}", err=True)
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
    """Bootstrap (or, with ``follow``, continuously materialize) *topic* into checkpoints on Spark."""
    from statesnap.spark import bootstrap, materialize_stream
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
    spark = spark_session(spark_conf, quiet=quiet)
    try:
        if not follow:
            previous = _newest_generation(checkpoints, storage_options, table)
            try:
                manifest = bootstrap(spark, **common)
            except Exception as e:
                if _interrupted.is_set():  # the job we cancelled, not a failure of its own
                    raise Interrupted("the Spark job was cancelled before its checkpoint") from e
                raise
            written = manifest.generation != previous
            return _result(
                spark, manifest, checkpoints, storage_options, topic, table, started, written=written
            )
        location = spark_checkpoint_location or _default_query_location(checkpoints, table)
        materializer = materialize_stream(
            spark,
            checkpoint_location=location,
            checkpoint_interval=checkpoint_interval,
            trigger_interval=trigger_interval,
            **common,
        )
        stop = stop_on_signals()
        if not quiet:
            click.echo(
                f"materializing {topic} on Spark; checkpoints every {checkpoint_interval}, streaming state "
                f"in {location} (Ctrl-C to stop)",
                err=True,
            )
        while not stop.wait(0.5):
            if not materializer.query.isActive:
                if materializer.failure is not None:
                    raise materializer.failure
                raise click.ClickException(f"streaming query stopped: {materializer.query.exception()}")
        seconds = parse_duration(shutdown_timeout).total_seconds()
        final = call_within(
            seconds,
            lambda _abandoned: materializer.stop(checkpoint=True),
            lambda: CheckpointTimeoutError(
                f"the final checkpoint did not finish within {seconds:g}s (--shutdown-timeout); the "
                "last committed checkpoint stands"
            ),
            "statesnap-final-checkpoint",
        )
        current = final or materializer.last_checkpoint
        return _result(
            spark, current, checkpoints, storage_options, topic, table, started, written=final is not None
        )
    finally:
        spark.stop()


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
) -> dict[str, Any]:
    """The python engine's result keys, filled from a Spark-written manifest (``keys`` is the
    table's key count: recorded by the writer, or merged from the files by a small job)."""
    from statesnap.blob import open_blob_store
    from statesnap.checkpoint import locate_table
    from statesnap.spark import count_keys

    writer = dict(manifest.writer) if manifest is not None else {}
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
            "checkpoint": writer.get("base_generation"),
            "replayed_records": int(writer.get("records_read", 0) or 0),
            "restore_seconds": writer.get("duration_seconds"),
        },
        "checkpoint_seconds": writer.get("duration_seconds"),
        "seconds": round(time.monotonic() - started, 3),
        "bytes": manifest.total_bytes if manifest is not None else 0,
        "url": url,
    }


def _newest_generation(checkpoints: str, storage_options: dict[str, str], table: str) -> int | None:
    """The table's newest generation before a run (to tell whether the run wrote one)."""
    from statesnap.blob import open_blob_store
    from statesnap.checkpoint import locate_table
    from statesnap.errors import ConfigError, TableNotFoundError

    try:
        repo = locate_table(open_blob_store(checkpoints, **storage_options), table)
    except (TableNotFoundError, ConfigError):
        return None
    return next(iter(repo.generations()), None)


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
        return SnapshotDiff(
            old=int(row["old"]),
            new=int(row["new"]),
            added=int(row["added"] or 0),
            removed=int(row["removed"] or 0),
            changed=int(row["changed"] or 0),
            unchanged=int(row["unchanged"] or 0),
        )
    finally:
        spark.stop()
