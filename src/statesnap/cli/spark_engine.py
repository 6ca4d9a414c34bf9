"""``--engine spark``: the CLI's bridge to :mod:`statesnap.spark` (imported only when used)."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import click

from statesnap.checkpoint import RetentionPolicy
from statesnap.cli.options import emit_json, kafka_settings, pairs_to_dict
from statesnap.snapshot.diff import SnapshotDiff

#: ``local[*]`` by default; point it at a cluster with STATESNAP_SPARK_MASTER.
MASTER_ENV = "STATESNAP_SPARK_MASTER"


def spark_available() -> bool:
    """Whether the Spark engine can run here: pyspark importable and a Java runtime present."""
    has_java = shutil.which("java") is not None or bool(os.environ.get("JAVA_HOME"))
    return has_java and importlib.util.find_spec("pyspark") is not None


def spark_session() -> Any:
    """A quiet local (or $STATESNAP_SPARK_MASTER) session with the statesnap sources registered."""
    from pyspark.sql import SparkSession

    from statesnap.spark import register

    # Python workers must run this interpreter: it is the one with statesnap installed.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(os.environ.get(MASTER_ENV, "local[*]"))
        .appName("statesnap")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(max(2, os.cpu_count() or 2)))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def materialize_on_spark(
    *,
    bootstrap_servers: str,
    topic: str,
    table: str,
    checkpoints: str,
    storage_pairs: tuple[str, ...],
    kafka_pairs: tuple[str, ...],
    kafka_files: tuple[str, ...],
    follow: bool,
    checkpoint_interval: str,
    retention: RetentionPolicy,
    as_json: bool,
    spark_checkpoint_location: str | None = None,
) -> None:
    """Bootstrap (or, with ``follow``, continuously materialize) *topic* into checkpoints on Spark."""
    from statesnap.spark import bootstrap, materialize_stream

    settings = kafka_settings(bootstrap_servers, kafka_pairs, kafka_files)
    options = pairs_to_dict(storage_pairs, "--storage-option")
    spark = spark_session()
    try:
        if not follow:
            manifest = bootstrap(
                spark,
                bootstrap_servers=settings.bootstrap_servers,
                topic=topic,
                table=table,
                checkpoints=checkpoints,
                storage_options=options,
                kafka_config=dict(settings.config),
                retention=retention,
            )
            result = {
                "table": table,
                "topic": topic,
                "engine": "spark",
                "checkpoint": manifest.generation,
                "keys": manifest.total_rows,
                "offsets": manifest.offsets,
                "writer": dict(manifest.writer),
            }
            if as_json:
                emit_json(result)
            else:
                click.echo(
                    f"checkpoint {manifest.generation} of {table} on Spark: {manifest.total_rows} rows, "
                    f"{manifest.total_bytes:,} bytes in {manifest.writer.get('duration_seconds', '?')}s"
                )
            return
        location = spark_checkpoint_location or _default_query_location(checkpoints, table)
        materializer = materialize_stream(
            spark,
            bootstrap_servers=settings.bootstrap_servers,
            topic=topic,
            table=table,
            checkpoints=checkpoints,
            checkpoint_location=location,
            storage_options=options,
            kafka_config=dict(settings.config),
            checkpoint_interval=checkpoint_interval,
            retention=retention,
        )
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        if not as_json:
            click.echo(
                f"materializing {topic} on Spark; streaming state in {location} (Ctrl-C to stop)", err=True
            )
        while not stop.wait(0.5):
            if not materializer.query.isActive:
                raise click.ClickException(f"streaming query stopped: {materializer.query.exception()}")
        final = materializer.stop(checkpoint=True)
        if as_json:
            emit_json({"table": table, "engine": "spark", "checkpoint": final.generation if final else None})
    finally:
        spark.stop()


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
