"""``statesnap materialize`` and ``statesnap dump``: restore a table, then checkpoint or print it."""

from __future__ import annotations

import base64
import json
import logging
import sys
import time
from datetime import timedelta
from typing import Any

import click

from statesnap.blob import open_blob_store
from statesnap.checkpoint import CheckpointRepository, RetentionPolicy
from statesnap.cli.engine import choose_engine
from statesnap.cli.interrupts import shutdown_timeout_option, stop_on_signals
from statesnap.cli.options import (
    bootstrap_option,
    emit_json,
    json_option,
    kafka_config_options,
    kafka_settings,
    pairs_to_dict,
    snapshot_store_option,
    storage_options,
    table_option,
    timeout_option,
    topic_option,
)
from statesnap.cli.progress import ReplayProgress, replay_bar
from statesnap.deadline import Deadline
from statesnap.digest import table_digest
from statesnap.durations import parse_duration
from statesnap.kafka.admin import KafkaAdmin
from statesnap.kafka.backlog import estimate_backlog, high_watermarks
from statesnap.kafka.config import KafkaSettings
from statesnap.python.table import RestoreReport, Table

log = logging.getLogger(__name__)


def start_with_progress(table: Table, quiet: bool) -> RestoreReport:
    """``table.start()`` with a bar: records replayed of an estimated total, rate and ETA, and
    partitions at their end. The total is records replayed plus the lag the broker's high
    watermarks suggest — an estimate (the dev broker under-reports them), never shrinking."""
    with replay_bar(quiet) as bar:
        replay = ReplayProgress(bar, f"replaying {table.topic}")
        estimate: list[int] = []  # the largest estimate so far, once there is one

        def update(records: int, done: int, total: int) -> None:
            behind = sum(table.lag().values())
            if behind or estimate:
                estimate[:] = [max(estimate[0] if estimate else 0, records + behind)]
            replay(records, done, total, estimate[0] if estimate else None)

        report = table.start(progress=update)
        replay.finish(report.replayed_records, f"restored {table.name}")
    return report


def _table(
    bootstrap_servers: str,
    topic: str,
    table: str | None,
    checkpoints: str | None,
    storage_pairs: tuple[str, ...],
    kafka_pairs: tuple[str, ...],
    kafka_files: tuple[str, ...],
    timeout: float,
    **kwargs: Any,
) -> Table:
    settings = kafka_settings(bootstrap_servers, kafka_pairs, kafka_files, timeout)
    return Table(
        topic,
        bootstrap_servers=settings.bootstrap_servers,
        kafka_config=dict(settings.config),
        timeout=settings.timeout,
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
    "--engine",
    type=click.Choice(["auto", "python", "spark"]),
    default="auto",
    show_default=True,
    envvar="STATESNAP_ENGINE",
    help="Who reads the topic and writes checkpoints: this process (python) or a PySpark job (spark). "
    "auto estimates both from the backlog and picks the faster (Spark for large backlogs or when "
    "STATESNAP_SPARK_MASTER names a cluster) and says why. Both write the same checkpoints and take "
    "part in the same snapshots.",
)
@click.option(
    "--store",
    type=click.Choice(["auto", "memory", "columnar", "rocksdb"]),
    default=None,
    help="python engine: local state store [default: auto = columnar from 1 M rows, else memory].",
)
@click.option(
    "--spark-checkpoint-location",
    default=None,
    help="spark engine with --follow: Spark's streaming checkpoint (default: ~/.cache/statesnap/spark/…); "
    "state that disagrees with the checkpoint store is moved aside.",
)
@click.option(
    "--spark-conf",
    "spark_conf",
    multiple=True,
    metavar="KEY=VALUE",
    help="spark engine: any Spark setting (spark.executor.memory=4g, …); repeatable.",
)
@click.option(
    "--follow", is_flag=True, help="Keep running, checkpointing every --checkpoint-interval, until Ctrl-C."
)
@click.option(
    "--checkpoint-interval", default="1h", show_default=True, help="With --follow: time between checkpoints."
)
@click.option(
    "--commit-interval",
    default="5s",
    show_default=True,
    help="With --follow: time between commit points (on Spark: the micro-batch trigger interval).",
)
@click.option("--instance", type=int, default=None, help="python engine: with --instances, own p % N == I.")
@click.option("--instances", type=int, default=None, help="python engine: tasks the partitions spread over.")
@click.option(
    "--group",
    default=None,
    envvar="STATESNAP_GROUP",
    help="python engine, with --follow: take partitions from this Kafka consumer group, rebalanced "
    "as instances come and go (each restores the partitions it gains from the newest checkpoint and "
    "checkpoints those it hands over). Not with --instance/--instances. [env: STATESNAP_GROUP]",
)
@click.option(
    "--generation", type=int, default=None, help="Continue from this snapshot generation, not the newest."
)
@click.option("--snapshot-timeout", default="60s", show_default=True, help="Fail snapshots not done by then.")
@shutdown_timeout_option
@snapshot_store_option
@click.option(
    "--min-count", default=10, show_default=True, help="Retention: keep at least this many checkpoints."
)
@click.option(
    "--min-age", default="12h", show_default=True, help="Retention: keep every checkpoint younger than this."
)
@click.option(
    "--orphan-grace",
    default=None,
    help="Retention: keep unreferenced files younger than this [default: 1h, or 2 × --checkpoint-interval "
    "when longer].",
)
@storage_options
@kafka_config_options
@timeout_option
@json_option
@click.option("--quiet", "-q", is_flag=True, help="No progress bar, no status lines.")
def materialize(
    bootstrap_servers: str,
    topic: str,
    table: str | None,
    checkpoints: str,
    engine: str,
    store: str | None,
    spark_checkpoint_location: str | None,
    spark_conf: tuple[str, ...],
    follow: bool,
    checkpoint_interval: str,
    commit_interval: str,
    instance: int | None,
    instances: int | None,
    group: str | None,
    generation: int | None,
    snapshot_timeout: str,
    shutdown_timeout: str,
    snapshot_store: str | None,
    min_count: int,
    min_age: str,
    orphan_grace: str | None,
    storage_pairs: tuple[str, ...],
    kafka_pairs: tuple[str, ...],
    kafka_files: tuple[str, ...],
    timeout: float,
    as_json: bool,
    quiet: bool,
) -> None:
    """Restore TOPIC's table, catch up to the end of the changelog and write a checkpoint.

    Starts from the newest valid checkpoint (so running it again is incremental) and exits, or with
    --follow keeps consuming and checkpointing until interrupted (a final checkpoint on exit).
    Every option means the same on both engines or is refused, in one line, by the one that cannot
    honour it; --json prints the same keys on both.
    """
    if group is not None and (instance is not None or instances is not None):
        raise click.UsageError(
            "--group and --instance/--instances are two ways of sharing partitions; pick one"
        )
    if group is not None and not follow:
        raise click.UsageError(
            "--group needs --follow: a group member holds only the partitions it is assigned, so a "
            "one-shot materialize could not checkpoint the whole table"
        )
    if group is not None and generation is not None:
        raise click.UsageError(
            "--group restores each partition it gains from the newest checkpoint; not with --generation"
        )
    interval = parse_duration(checkpoint_interval)
    grace = parse_duration(orphan_grace) if orphan_grace else max(timedelta(hours=1), 2 * interval)
    retention = RetentionPolicy(min_count, parse_duration(min_age), grace)
    settings = kafka_settings(bootstrap_servers, kafka_pairs, kafka_files, timeout)
    name = table or topic
    options = pairs_to_dict(storage_pairs, "--storage-option")
    backlog = None
    if engine == "auto":
        backlog = estimate_table_backlog(settings, topic, name, checkpoints, options)
    choice = choose_engine(
        engine,
        python_only={
            "store": store is not None,
            "instances": instance is not None or instances is not None,
            "group": group is not None,
        },
        spark_only={
            "spark_checkpoint_location": bool(spark_checkpoint_location),
            "spark_conf": bool(spark_conf),
        },
        backlog=backlog,
        follow=follow,
    )
    log.info("engine %s: %s", choice.engine, choice.reason)
    if not quiet and not as_json:
        click.echo(f"engine: {choice.engine} ({choice.reason})", err=True)
    if choice.engine == "spark":
        from statesnap.cli.spark_engine import materialize_on_spark

        result = materialize_on_spark(
            settings=settings,
            topic=topic,
            table=name,
            checkpoints=checkpoints,
            storage_options=options,
            follow=follow,
            checkpoint_interval=checkpoint_interval,
            trigger_interval=commit_interval,
            retention=retention,
            generation=generation,
            snapshot_timeout=snapshot_timeout,
            shutdown_timeout=shutdown_timeout,
            snapshot_store=snapshot_store,
            spark_checkpoint_location=spark_checkpoint_location,
            spark_conf=pairs_to_dict(spark_conf, "--spark-conf"),
            quiet=quiet or as_json,
        )
    else:
        result = _materialize_in_python(
            settings,
            topic,
            name,
            checkpoints,
            options,
            store=store or "auto",
            retention=retention,
            checkpoint_interval=checkpoint_interval,
            commit_interval=commit_interval,
            follow=follow,
            shutdown_timeout=shutdown_timeout,
            instance=instance,
            instances=instances,
            group=group,
            generation=generation,
            snapshot_timeout=snapshot_timeout,
            snapshot_store=snapshot_store,
            quiet=quiet or as_json,
        )
    result["engine_reason"] = choice.reason
    report_materialized(result, as_json)


def estimate_table_backlog(
    settings: KafkaSettings, topic: str, table: str, checkpoints: str, storage: dict[str, str]
) -> int:
    """Records a materialization would read: watermarks (an estimate) minus the newest
    checkpoint's offsets. A missing topic or broker fails here, at once."""
    admin = KafkaAdmin(settings)
    cluster_id = admin.cluster_id()
    partitions = admin.partitions(topic)
    ends = high_watermarks(settings, topic, partitions)
    repo = CheckpointRepository.for_table(open_blob_store(checkpoints, **storage), cluster_id, table)
    latest = repo.latest()
    return estimate_backlog(ends, latest.offsets if latest is not None else {})


def _materialize_in_python(
    settings: KafkaSettings,
    topic: str,
    table: str,
    checkpoints: str,
    storage: dict[str, str],
    *,
    follow: bool,
    shutdown_timeout: str,
    quiet: bool,
    instances: int | None,
    **kwargs: Any,
) -> dict[str, Any]:
    started = time.monotonic()
    t = Table(
        topic,
        bootstrap_servers=settings.bootstrap_servers,
        kafka_config=dict(settings.config),
        timeout=settings.timeout,
        name=table,
        checkpoints=checkpoints,
        storage_options=storage,
        background=follow,
        instances=instances,
        **kwargs,
    )
    deadline = Deadline(None)  # a one-shot run waits for its checkpoint as long as it takes
    followed: dict[str, Any] | None = None
    try:
        report = start_with_progress(t, quiet)
        restored_at, restored_offsets = time.monotonic(), t.offsets
        if follow:
            stop = stop_on_signals()
            if not quiet:
                member = f" as {t.task_id} of consumer group {t.group}" if t.group else ""
                click.echo(
                    f"following {topic}{member}; checkpoints every {kwargs['checkpoint_interval']} "
                    "(Ctrl-C to stop)",
                    err=True,
                )
            while not stop.wait(0.5):
                t.raise_if_failed()
            deadline = Deadline(parse_duration(shutdown_timeout).total_seconds())
            followed = {
                "records": records_between(restored_offsets, t.offsets),
                "seconds": round(time.monotonic() - restored_at, 3),
            }
        write_started = time.monotonic()
        # One task of several cannot complete a snapshot alone; its peers report on their own.
        solo = not instances or instances == 1 or not follow
        manifest = t.checkpoint(timeout=deadline.remaining()) if solo else None
        write_seconds = time.monotonic() - write_started
        keys = len(t.store)
    finally:
        t.close(checkpoint=False, timeout=deadline.remaining())
    current = manifest or t.last_checkpoint
    return {
        "table": t.name,
        "topic": topic,
        "engine": "python",
        "checkpoint": current.generation if current else None,
        "written": manifest is not None,
        "keys": keys,
        "offsets": current.offsets if current else {},
        "restore": {
            "checkpoint": report.checkpoint,
            "replayed_records": report.replayed_records,
            "restore_seconds": round(report.restore_seconds, 3),
        },
        "checkpoint_seconds": round(write_seconds, 3),
        "seconds": round(time.monotonic() - started, 3),
        "bytes": current.total_bytes if current else 0,
        "url": t.repo.url if t.repo else None,
        **({"followed": followed} if followed is not None else {}),
    }


def records_between(start: dict[int, int], end: dict[int, int]) -> int:
    """Records read from *start* to *end* (next offsets), over the partitions held at both ends (a
    partition a group member gained meanwhile was restored, not read from *start*). Offsets count
    records exactly on the dev broker; on Kafka, transaction markers and compacted gaps make it an
    upper bound."""
    return sum(max(0, end[p] - start[p]) for p in start.keys() & end.keys())


def report_materialized(result: dict[str, Any], as_json: bool) -> None:
    """The same keys (``--json``) and the same sentence whichever engine ran."""
    if as_json:
        emit_json(result)
    elif not result["written"]:
        click.echo(f"no new records since checkpoint {result['checkpoint']}; nothing written")
    else:
        click.echo(summary(result))


def summary(result: dict[str, Any]) -> str:
    """The sentence for a written checkpoint. A one-shot run reads and writes in the time it
    gives; a --follow run says how long it followed and what it read in that time, and how long
    the final checkpoint took, so neither number is the other's."""
    restore = result["restore"]
    base = restore["checkpoint"]
    since = f"after checkpoint {base}" if base is not None else "from the start of the topic"
    head = f"checkpoint {result['checkpoint']} of {result['table']} by {result['engine']}: "
    size = f"{result['keys']:,} keys, {result['bytes']:,} bytes"
    followed = result.get("followed")
    if followed is None:
        read = f"read {restore['replayed_records']:,} records {since}"
        return f"{head}{size} in {result['seconds']:.2f}s ({read}) → {result['url']}"
    read = restore["replayed_records"] + followed["records"]
    return (
        f"{head}{size}, written in {result['checkpoint_seconds']:.2f}s after following for "
        f"{followed['seconds']:.2f}s (read {read:,} records {since}) → {result['url']}"
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
    "--require-checkpoint",
    is_flag=True,
    help="Fail instead of replaying the whole topic when no checkpoint verifies (e.g. a typo'd URL).",
)
@click.option(
    "--generation",
    type=click.IntRange(min=1),
    default=None,
    help="Restore this generation instead of the newest valid one (then replay the tail, unless --no-tail).",
)
@click.option(
    "--no-tail",
    is_flag=True,
    help="With --generation: the table exactly as that snapshot holds it, without replaying later records.",
)
@click.option(
    "--store", type=click.Choice(["auto", "memory", "columnar", "rocksdb"]), default="auto", show_default=True
)
@click.option("--digest", is_flag=True, help="Print a SHA-256 digest of the table instead of its rows.")
@storage_options
@kafka_config_options
@timeout_option
@json_option
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def dump(
    bootstrap_servers: str,
    topic: str,
    table: str | None,
    checkpoints: str | None,
    no_checkpoint: bool,
    require_checkpoint: bool,
    generation: int | None,
    no_tail: bool,
    store: str,
    digest: bool,
    storage_pairs: tuple[str, ...],
    kafka_pairs: tuple[str, ...],
    kafka_files: tuple[str, ...],
    timeout: float,
    as_json: bool,
    quiet: bool,
) -> None:
    """Restore TOPIC's table and print it: rows as JSON lines, or with --digest a summary.

    \b
    --digest --json prints one object: keys, digest, checkpoint (generation used or null),
    replayed_records, restore_seconds, tail. The digest is SHA-256 over (key, value) pairs in key
    order, each as len(key):u32be key len(value):u32be value — equal digests, equal tables.
    Rows print as {"key": ..., "value": ...} with UTF-8 text, or {"key_b64": ...} for binary.
    --generation G --no-tail shows the table as snapshot G holds it (a point in time).
    """
    _check_dump_flags(checkpoints, no_checkpoint, require_checkpoint, generation, no_tail)
    t = _table(
        bootstrap_servers,
        topic,
        table,
        None if no_checkpoint else checkpoints,
        storage_pairs,
        kafka_pairs,
        kafka_files,
        timeout,
        store=store,
        generation=generation,
        tail=not no_tail,
        require_checkpoint=require_checkpoint,
        background=False,
        read_only=True,
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
                "tail": not no_tail,
                "skipped": report.to_json()["skipped"],
            }
            if as_json:
                emit_json(result)
            else:
                how = "as it is, no tail" if no_tail else f"replayed {report.replayed_records} records"
                click.echo(
                    f"{keys} keys, digest {hexdigest} (checkpoint {report.checkpoint}, "
                    f"{how} in {report.restore_seconds:.2f}s)"
                )
        else:
            out = sys.stdout
            for key, value in sorted(t.raw_items()):
                out.write(json.dumps({**_field("key", key), **_field("value", value)}) + "\n")
    finally:
        t.close(checkpoint=False)


def _check_dump_flags(
    checkpoints: str | None,
    no_checkpoint: bool,
    require_checkpoint: bool,
    generation: int | None,
    no_tail: bool,
) -> None:
    """Refuse flag combinations that cannot all be honoured, in one line, before any I/O."""
    if generation is not None and no_checkpoint:
        raise click.UsageError("--generation restores a checkpoint; it cannot go with --no-checkpoint")
    if require_checkpoint and (no_checkpoint or not checkpoints):
        raise click.UsageError("--require-checkpoint needs --checkpoints URL and no --no-checkpoint")
    if no_tail and generation is None:
        raise click.UsageError("--no-tail needs --generation G: it shows the table as snapshot G holds it")
    if generation is not None and not checkpoints:
        raise click.UsageError("--generation needs --checkpoints URL (the store that holds it)")


def _field(name: str, data: bytes) -> dict[str, str]:
    try:
        return {name: data.decode("utf-8")}
    except UnicodeDecodeError:
        return {f"{name}_b64": base64.b64encode(data).decode()}
