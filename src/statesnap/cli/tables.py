"""``statesnap materialize`` and ``statesnap dump``: restore a table, then checkpoint or print it."""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from statesnap.cli.docs import docs_page
from statesnap.cli.dumping import (
    SERDES,
    StoreDumpRequest,
    TableDigest,
    check_dump_flags,
    check_store_flags,
    dump_store,
    printed_field,
)
from statesnap.cli.interrupts import Interrupted, StoppedEarly, stop_on_signals
from statesnap.cli.options import (
    bootstrap_option,
    checkpointing_options,
    engine_option,
    follow_options,
    from_generation_option,
    json_option,
    kafka_config_options,
    kafka_settings,
    pairs_to_dict,
    quiet_option,
    spark_conf_option,
    state_store_option,
    storage_options,
    table_option,
    timeout_option,
    topic_option,
)
from statesnap.cli.output import Output
from statesnap.digest import table_digest
from statesnap.durations import parse_duration
from statesnap.errors import ConfigError, StatesnapError

if TYPE_CHECKING:  # the engines load when a command runs, not to register it
    from statesnap.run import Stage
    from statesnap.run.in_python import Restorable
    from statesnap.task.options import CheckpointOptions, GroupOptions, StaticShare
    from statesnap.task.restore import RestoreReport

__all__ = [
    "RunSignals",
    "TableDigest",
    "cli_session",
    "dump",
    "materialize",
    "share_of",
    "start_with_progress",
]

log = logging.getLogger(__name__)

DUMP_EXAMPLES = """
\b
Examples:
  statesnap dump -b 127.0.0.1:9092 -t orders -c ./ckpt --digest --json
  statesnap dump --table tally --store balances -c ./ckpt --value-serde json
  statesnap dump --table tally --store balances -c ./ckpt --generation 7 --no-tail --digest --json
"""


def start_with_progress(table: Restorable, quiet: bool) -> RestoreReport:
    """``table.start()`` with a bar: records replayed of an estimated total, rate and ETA, and
    partitions at their end (see :func:`statesnap.run.in_python.restore_with_progress`)."""
    from statesnap.cli.progress import ConsoleProgress
    from statesnap.run.in_python import restore_with_progress

    with ConsoleProgress(quiet) as progress:
        return restore_with_progress(table, progress)


@docs_page("tutorials/tables.md")
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
@engine_option(
    "Who reads the topic and writes checkpoints: this process (python) or a PySpark job (spark). "
    "auto estimates both from the backlog and picks the faster (Spark for large backlogs or when "
    "STATESNAP_SPARK_MASTER names a cluster) and says why. Both write the same checkpoints and take "
    "part in the same snapshots.",
    env=True,
)
@state_store_option(
    "python engine: local state store [default: auto = columnar from 10 k rows, else memory] "
    "(--store, its older name here, is deprecated).",
    dest="store",
    old_alias=True,
)
@click.option(
    "--spark-checkpoint-location",
    default=None,
    help="spark engine with --follow: Spark's streaming checkpoint (default: ~/.cache/statesnap/spark/…); "
    "state that disagrees with the checkpoint store is moved aside.",
)
@spark_conf_option
@follow_options(processor=False)
@from_generation_option
@click.option(
    "--state-version",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="The state version checkpoints are written at; a checkpoint of another version is refused "
    "(migrate it first: statesnap checkpoints migrate).",
)
@checkpointing_options(processor=False)
@storage_options
@kafka_config_options
@timeout_option
@json_option
@quiet_option
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
    state_version: int,
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
    honour it; --json prints the same keys on both (see :func:`statesnap.run.materialize`).
    """
    from statesnap.cli.progress import ConsoleProgress
    from statesnap.cli.spark_engine import interrupted as spark_jobs_cancelled
    from statesnap.errors import CatchUpStoppedError
    from statesnap.run import FollowOptions, SparkOptions, Stage, StopRequest
    from statesnap.run import materialize as materialize_table
    from statesnap.task.migration import StateVersion
    from statesnap.task.options import StoreOptions

    checkpoint_options = _checkpoint_options(
        checkpoints, storage_pairs, checkpoint_interval, commit_interval, generation, snapshot_timeout,
        snapshot_store, min_count, min_age, orphan_grace,
    )  # fmt: skip
    share = share_of(instance, instances, group, follow, generation)
    settings = kafka_settings(bootstrap_servers, kafka_pairs, kafka_files, timeout)
    out = Output(as_json, quiet)
    stop = threading.Event()
    signals = RunSignals(stop, follow=follow)
    conf = pairs_to_dict(spark_conf, "--spark-conf")
    session = cli_session(conf, not out.shows_progress, stop if follow else None)
    with ConsoleProgress(not out.shows_progress, signals.on_stage) as progress:
        try:
            result = materialize_table(
                topic,
                bootstrap_servers=settings.bootstrap_servers,
                checkpoints=checkpoint_options,
                name=table,
                engine=engine,
                follow=FollowOptions(stop, parse_duration(shutdown_timeout)) if follow else False,
                kafka_config=settings.config,
                timeout=settings.timeout,
                store=StoreOptions.of(store) if store is not None else None,
                share=share,
                spark=SparkOptions(conf, spark_checkpoint_location, session),
                progress=progress,
                state=StateVersion(state_version),
                stop=StopRequest(stop, parse_duration(shutdown_timeout)),
            )
        except CatchUpStoppedError as e:
            raise StoppedEarly(str(e)) from e
        except (click.ClickException, StatesnapError):
            raise
        except Exception as e:  # a batch job we cancelled on Ctrl-C, not a failure of its own
            if progress.stage_now is Stage.READING and spark_jobs_cancelled():
                raise Interrupted("the Spark job was cancelled before its checkpoint") from e
            raise
    out.result(result)


def _checkpoint_options(
    url: str,
    storage_pairs: tuple[str, ...],
    checkpoint_interval: str,
    commit_interval: str,
    generation: int | None,
    snapshot_timeout: str,
    snapshot_store: str | None,
    min_count: int,
    min_age: str,
    orphan_grace: str | None,
) -> CheckpointOptions:
    """``materialize``'s checkpoint flags as the bundle; without ``--orphan-grace`` unreferenced
    files are kept as the library keeps them for a writer (an hour, or twice the checkpoint
    interval when that is longer: :func:`statesnap.checkpoint.retention.orphan_grace_for`)."""
    from statesnap.checkpoint import RetentionPolicy
    from statesnap.task.options import CheckpointOptions, SnapshotOptions

    grace = parse_duration(orphan_grace) if orphan_grace else None
    return CheckpointOptions(
        url,
        storage_options=pairs_to_dict(storage_pairs, "--storage-option"),
        interval=parse_duration(checkpoint_interval),
        commit_interval=parse_duration(commit_interval),
        retention=RetentionPolicy(min_count, parse_duration(min_age), grace),
        generation=generation,
        snapshots=SnapshotOptions(snapshot_store, parse_duration(snapshot_timeout)),
    )


def share_of(
    instance: int | None,
    instances: int | None,
    group: str | None,
    follow: bool,
    generation: int | None,
    run: str = "materialize",
) -> StaticShare | GroupOptions | None:
    """``--instance/--instances`` or ``--group`` as the bundle, refusing what cannot go together
    (the sharing rules, :mod:`statesnap.task.sharing`, in the flags' own words: a usage
    error)."""
    from statesnap.task.options import GroupOptions, StaticShare
    from statesnap.task.sharing import FLAGS, share_refusal

    refusal = share_refusal(
        group=group is not None,
        static=instance is not None or instances is not None,
        follow=follow,
        generation=generation,
        run=run,
        words=FLAGS,
    )
    if refusal is not None:
        raise click.UsageError(refusal)
    if group is not None:
        return GroupOptions(group)
    if (instance is None) != (instances is None):
        raise ConfigError("instance and instances go together")
    if instance is not None and instances is not None:
        return StaticShare(instance, instances)
    return None


class RunSignals:
    """A run's Ctrl-C: the first sets *stop* (a clean stop: a follow run's final checkpoint, or
    a Python catch-up stopped between two batches with a checkpoint of what it read), a second
    exits at once saying what it interrupted. Handled from the moment there is something to stop
    cleanly (the Python engine catching up; with *follow*, a Spark session starting or the
    Python engine following); before that a Ctrl-C ends the command like any other (a Spark
    batch job's is cancelled: :func:`~statesnap.cli.interrupts.cancel_spark_jobs_on_signals`)."""

    def __init__(self, stop: threading.Event, *, follow: bool) -> None:
        self.stop = stop
        self.follow = follow
        self.stage: Stage | None = None
        self.installed = False

    def again(self) -> str:
        """What a second Ctrl-C interrupts, by the stage the run is in."""
        from statesnap.run import Stage

        if self.stage is Stage.SESSION_STARTING:
            return "stopped again while the Spark session was starting"
        if self.stage is Stage.QUERY_STARTING:
            return "stopped again while the streaming query was starting"
        if self.stage is Stage.CATCHING_UP:
            return "stopped again before the checkpoint of the catch-up finished"
        return "stopped again before the final checkpoint finished"

    def on_stage(self, stage: Stage) -> None:
        from statesnap.run import Stage

        self.stage = stage
        handled = (Stage.SESSION_STARTING, Stage.FOLLOWING) if self.follow else ()
        if not self.installed and (stage is Stage.CATCHING_UP or stage in handled):
            stop_on_signals(self.again, self.stop)
            self.installed = True


def cli_session(conf: dict[str, str], quiet: bool, stop: threading.Event | None) -> Callable[[], Any]:
    """The Spark session as the CLI starts it: a display while it starts, Spark's logs only at
    debug, the CLI's signal handling (a follow run's *stop*, else cancelling the jobs)."""

    def start() -> Any:
        from statesnap.cli.spark_engine import spark_session

        return spark_session(conf, quiet=quiet, stop=stop)

    return start


@docs_page("reading-checkpoints.md")
@click.command(epilog=DUMP_EXAMPLES)
@click.option(
    "--bootstrap-servers",
    "-b",
    envvar="STATESNAP_BOOTSTRAP_SERVERS",
    help="Kafka bootstrap address(es); needed for a table, optional with --store (picks the "
    "cluster's checkpoints). [env: STATESNAP_BOOTSTRAP_SERVERS]",
)
@click.option(
    "--topic",
    "-t",
    envvar="STATESNAP_TOPIC",
    help="The changelog topic (a processor's input with --store: checked, not needed). "
    "[env: STATESNAP_TOPIC]",
)
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
    "--store",
    "store_name",
    default=None,
    metavar="STORE",
    help="Print this store of processor --table instead of a table, as its checkpoint (--generation "
    "G, else the newest) holds it: a store cannot be tailed without running the handler, so no "
    "tail is ever replayed. The stores are listed if STORE is not one of them.",
)
@state_store_option("The local store a table is restored into [default: auto].")
@click.option(
    "--key-serde",
    type=click.Choice(SERDES),
    default="bytes",
    show_default=True,
    help="How rows' keys print (bytes: UTF-8 text, else key_b64). The digest is over bytes.",
)
@click.option("--value-serde", type=click.Choice(SERDES), default="bytes", show_default=True)
@click.option("--digest", is_flag=True, help="Print a SHA-256 digest of the table instead of its rows.")
@storage_options
@kafka_config_options
@timeout_option
@json_option
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def dump(
    bootstrap_servers: str | None,
    topic: str | None,
    table: str | None,
    checkpoints: str | None,
    no_checkpoint: bool,
    require_checkpoint: bool,
    generation: int | None,
    no_tail: bool,
    store_name: str | None,
    state_store: str | None,
    key_serde: str,
    value_serde: str,
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

    \b
    --store STORE --table PROCESSOR prints a processor's store as its checkpoint holds it (never
    tailed), rows with "partition" (window stores: "window_start"/"window_end", epoch ms); the
    digest covers the stored key bytes (a window store's: the 8-byte window start, then the key).
    """
    from statesnap.python.follower import ReadOnlyTable
    from statesnap.serde import resolve_serde
    from statesnap.task.options import CheckpointOptions, StoreOptions

    if store_name is not None:
        name, url = check_store_flags(
            table=table,
            checkpoints=checkpoints,
            no_checkpoint=no_checkpoint,
            state_store=state_store,
            store=store_name,
            topic=topic,
        )
        kafka = (
            kafka_settings(bootstrap_servers, kafka_pairs, kafka_files, timeout)
            if bootstrap_servers
            else None
        )
        request = StoreDumpRequest(
            name, store_name, url, pairs_to_dict(storage_pairs, "--storage-option"), generation, topic, kafka,
            key_serde, value_serde,
        )  # fmt: skip
        dump_store(request, digest=digest, as_json=as_json)
        return
    if not bootstrap_servers:
        raise click.UsageError("Missing option '--bootstrap-servers' / '-b'.")
    if not topic:
        raise click.UsageError("Missing option '--topic' / '-t'.")
    check_dump_flags(checkpoints, no_checkpoint, require_checkpoint, generation, no_tail)
    settings = kafka_settings(bootstrap_servers, kafka_pairs, kafka_files, timeout)
    options = None
    if checkpoints and not no_checkpoint:
        options = CheckpointOptions(
            checkpoints,
            storage_options=pairs_to_dict(storage_pairs, "--storage-option"),
            generation=generation,
            require=require_checkpoint,
        )
    # Still while it prints: a read-only table consuming only on this thread (start() catches up).
    t: ReadOnlyTable[bytes, bytes] = ReadOnlyTable(
        topic,
        bootstrap_servers=settings.bootstrap_servers,
        checkpoints=options,
        name=table,
        store=StoreOptions.of(state_store or "auto"),
        kafka_config=settings.config,
        timeout=settings.timeout,
        tail=not no_tail,
        background=False,
    )
    try:
        report = start_with_progress(t, quiet or not digest or as_json)
        if digest:
            hexdigest, keys = table_digest(t.raw_items())
            Output(as_json).result(
                TableDigest(t.name, topic, keys, hexdigest, report, t.offsets, not no_tail)
            )
        else:
            out = sys.stdout
            ks = None if key_serde == "bytes" else resolve_serde(key_serde)
            vs = None if value_serde == "bytes" else resolve_serde(value_serde)
            for key, value in sorted(t.raw_items()):
                row = {**printed_field("key", key, ks), **printed_field("value", value, vs)}
                out.write(json.dumps(row, default=str) + "\n")
    finally:
        t.close(checkpoint=False)
