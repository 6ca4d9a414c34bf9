"""``statesnap materialize`` and ``statesnap dump``: restore a table, then checkpoint or print it."""

from __future__ import annotations

import base64
import json
import signal
import sys
import threading
import time
from typing import Any

import click

from statesnap.checkpoint import RetentionPolicy
from statesnap.cli.options import (
    bootstrap_option,
    emit_json,
    json_option,
    kafka_config_options,
    kafka_settings,
    pairs_to_dict,
    storage_options,
    table_option,
    topic_option,
)
from statesnap.cli.progress import progress_bar
from statesnap.digest import table_digest
from statesnap.durations import parse_duration
from statesnap.table import RestoreReport, Table


def start_with_progress(table: Table, quiet: bool) -> RestoreReport:
    """``table.start()`` with a bar counting replayed records and caught-up partitions."""
    with progress_bar(quiet) as bar:
        task = bar.add_task(f"restoring {table.name}", total=None)

        def update(records: int, done: int, total: int) -> None:
            bar.update(
                task,
                completed=records,
                description=f"replaying {table.topic} ({done}/{total} partitions at end)",
            )

        report = table.start(progress=update)
        bar.update(
            task,
            total=report.replayed_records,
            completed=report.replayed_records,
            description=f"restored {table.name}",
        )
    return report


def _table(
    bootstrap_servers: str,
    topic: str,
    table: str | None,
    checkpoints: str | None,
    storage_pairs: tuple[str, ...],
    kafka_pairs: tuple[str, ...],
    kafka_files: tuple[str, ...],
    **kwargs: Any,
) -> Table:
    settings = kafka_settings(bootstrap_servers, kafka_pairs, kafka_files)
    return Table(
        topic,
        bootstrap_servers=settings.bootstrap_servers,
        kafka_config=dict(settings.config),
        name=table or topic,
        checkpoints=checkpoints,
        storage_options=pairs_to_dict(storage_pairs, "--storage-option"),
        **kwargs,
    )


@click.command()
@bootstrap_option
@topic_option
@table_option(required=False)
@click.option(
    "--checkpoints",
    "-c",
    required=True,
    envvar="STATESNAP_CHECKPOINTS",
    help="Checkpoint store URL: a path, file:///path or s3://bucket/prefix. [env: STATESNAP_CHECKPOINTS]",
)
@click.option(
    "--store",
    type=click.Choice(["memory", "rocksdb"]),
    default="memory",
    show_default=True,
    help="Local state store.",
)
@click.option(
    "--engine",
    type=click.Choice(["auto", "python", "spark"]),
    default="auto",
    show_default=True,
    envvar="STATESNAP_ENGINE",
    help="spark: a PySpark job reads the partitions in parallel and writes the checkpoint; python: this "
    "process does. auto: spark when pyspark and Java are installed, except for --instance/--generation.",
)
@click.option(
    "--spark-checkpoint-location",
    default=None,
    help="With --engine spark --follow: Spark's streaming checkpoint (default: ~/.cache/statesnap/spark/…).",
)
@click.option(
    "--follow", is_flag=True, help="Keep running, checkpointing every --checkpoint-interval, until Ctrl-C."
)
@click.option(
    "--checkpoint-interval", default="1h", show_default=True, help="With --follow: time between checkpoints."
)
@click.option(
    "--commit-interval", default="5s", show_default=True, help="With --follow: time between commit points."
)
@click.option("--instance", type=int, default=None, help="With --instances: own partitions p % N == I.")
@click.option("--instances", type=int, default=None, help="Tasks the table's partitions are spread over.")
@click.option(
    "--generation", type=int, default=None, help="Restore this snapshot generation, not the newest."
)
@click.option("--snapshot-timeout", default="60s", show_default=True, help="Fail snapshots not done by then.")
@click.option(
    "--min-count", default=10, show_default=True, help="Retention: keep at least this many checkpoints."
)
@click.option(
    "--min-age", default="12h", show_default=True, help="Retention: keep every checkpoint younger than this."
)
@storage_options
@kafka_config_options
@json_option
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def materialize(
    bootstrap_servers: str,
    topic: str,
    table: str | None,
    checkpoints: str,
    store: str,
    engine: str,
    spark_checkpoint_location: str | None,
    follow: bool,
    checkpoint_interval: str,
    commit_interval: str,
    instance: int | None,
    instances: int | None,
    generation: int | None,
    snapshot_timeout: str,
    min_count: int,
    min_age: str,
    storage_pairs: tuple[str, ...],
    kafka_pairs: tuple[str, ...],
    kafka_files: tuple[str, ...],
    as_json: bool,
    quiet: bool,
) -> None:
    """Restore TOPIC's table, catch up to the end of the changelog and write a checkpoint.

    Starts from the newest valid checkpoint (so running it again is incremental) and exits, or with
    --follow keeps consuming and checkpointing until interrupted (a final checkpoint on exit).
    """
    retention = RetentionPolicy(min_count, parse_duration(min_age))
    if engine == "auto":
        from statesnap.cli.spark_engine import spark_available

        tasks = instance is not None or instances is not None or generation is not None
        engine = "spark" if spark_available() and not tasks else "python"
    if engine == "spark":
        from statesnap.cli.spark_engine import materialize_on_spark

        materialize_on_spark(
            bootstrap_servers=bootstrap_servers,
            topic=topic,
            table=table or topic,
            checkpoints=checkpoints,
            storage_pairs=storage_pairs,
            kafka_pairs=kafka_pairs,
            kafka_files=kafka_files,
            follow=follow,
            checkpoint_interval=checkpoint_interval,
            retention=retention,
            as_json=as_json,
            spark_checkpoint_location=spark_checkpoint_location,
        )
        return
    t = _table(
        bootstrap_servers,
        topic,
        table,
        checkpoints,
        storage_pairs,
        kafka_pairs,
        kafka_files,
        store=store,
        retention=retention,
        checkpoint_interval=checkpoint_interval,
        commit_interval=commit_interval,
        background=follow,
        instance=instance,
        instances=instances,
        generation=generation,
        snapshot_timeout=snapshot_timeout,
    )
    try:
        report = start_with_progress(t, quiet or as_json)
        if follow:
            stop = threading.Event()
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda *_: stop.set())
            if not as_json:
                click.echo(
                    f"following {topic}; checkpoints every {checkpoint_interval} (Ctrl-C to stop)", err=True
                )
            while not stop.wait(0.5):
                t.raise_if_failed()
        started = time.monotonic()
        # One task of several cannot complete a snapshot alone; its peers report on their own.
        manifest = t.checkpoint() if not instances or instances == 1 or not follow else None
        write_seconds = time.monotonic() - started
        keys = len(t.store)
    finally:
        t.close(checkpoint=False)
    current = manifest or t.last_checkpoint
    result = {
        "table": t.name,
        "topic": topic,
        "checkpoint": current.generation if current else None,
        "written": manifest is not None,
        "keys": keys,
        "offsets": current.offsets if current else {},
        "restore": report.to_json(),
        "checkpoint_seconds": round(write_seconds, 3),
        "url": t.repo.url if t.repo else None,
    }
    if as_json:
        emit_json(result)
    elif manifest is None:
        click.echo(f"no new records since checkpoint {result['checkpoint']}; nothing written")
    else:
        click.echo(
            f"checkpoint {manifest.generation} of {t.name}: {manifest.total_rows} rows, "
            f"{manifest.total_bytes:,} bytes in {write_seconds:.2f}s (restore {report.restore_seconds:.2f}s, "
            f"replayed {report.replayed_records} records) → {t.repo.url if t.repo else ''}"
        )


@click.command()
@bootstrap_option
@topic_option
@table_option(required=False)
@click.option(
    "--checkpoints",
    "-c",
    envvar="STATESNAP_CHECKPOINTS",
    help="Restore from this checkpoint store (read-only: dump never writes). [env: STATESNAP_CHECKPOINTS]",
)
@click.option("--no-checkpoint", is_flag=True, help="Ignore checkpoints: replay the whole topic.")
@click.option(
    "--generation", type=int, default=None, help="Restore this generation instead of the newest valid one."
)
@click.option("--store", type=click.Choice(["memory", "rocksdb"]), default="memory", show_default=True)
@click.option("--digest", is_flag=True, help="Print a SHA-256 digest of the table instead of its rows.")
@storage_options
@kafka_config_options
@json_option
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def dump(
    bootstrap_servers: str,
    topic: str,
    table: str | None,
    checkpoints: str | None,
    no_checkpoint: bool,
    generation: int | None,
    store: str,
    digest: bool,
    storage_pairs: tuple[str, ...],
    kafka_pairs: tuple[str, ...],
    kafka_files: tuple[str, ...],
    as_json: bool,
    quiet: bool,
) -> None:
    """Restore TOPIC's table and print it: rows as JSON lines, or with --digest a summary.

    \b
    --digest --json prints one object: keys, digest, checkpoint (generation used or null),
    replayed_records, restore_seconds. The digest is SHA-256 over (key, value) pairs in key
    order, each as len(key):u32be key len(value):u32be value — equal digests, equal tables.
    Rows print as {"key": ..., "value": ...} with UTF-8 text, or {"key_b64": ...} for binary.
    """
    t = _table(
        bootstrap_servers,
        topic,
        table,
        None if no_checkpoint else checkpoints,
        storage_pairs,
        kafka_pairs,
        kafka_files,
        store=store,
        generation=generation,
        background=False,
    )
    try:
        report = start_with_progress(t, quiet or not digest or as_json)
        if digest:
            hexdigest, keys = table_digest(t.raw_items())
            result = {
                "table": t.name,
                "topic": topic,
                "keys": keys,
                "digest": hexdigest,
                "checkpoint": report.checkpoint,
                "replayed_records": report.replayed_records,
                "restore_seconds": round(report.restore_seconds, 3),
                "offsets": t.offsets,
                "skipped": report.to_json()["skipped"],
            }
            if as_json:
                emit_json(result)
            else:
                click.echo(
                    f"{keys} keys, digest {hexdigest} (checkpoint {report.checkpoint}, "
                    f"replayed {report.replayed_records} records in {report.restore_seconds:.2f}s)"
                )
        else:
            out = sys.stdout
            for key, value in sorted(t.raw_items()):
                out.write(json.dumps({**_field("key", key), **_field("value", value)}) + "\n")
    finally:
        t.close(checkpoint=False)


def _field(name: str, data: bytes) -> dict[str, str]:
    try:
        return {name: data.decode("utf-8")}
    except UnicodeDecodeError:
        return {f"{name}_b64": base64.b64encode(data).decode()}
