"""``statesnap run MODULE:OBJECT``: run a processor as ``materialize`` runs a table.

The command finds the user's :class:`~statesnap.Processor` (as uvicorn finds an app), rebuilds it
with whatever the command line overrides, and hands it to
:func:`statesnap.run.run_processor`; it only parses and prints.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import click

from statesnap.cli.docs import docs_page
from statesnap.cli.options import (
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
)
from statesnap.cli.output import Output
from statesnap.cli.tables import RunSignals, cli_session, share_of
from statesnap.durations import parse_duration
from statesnap.errors import ConfigError, InvalidDurationError

__all__ = ["RUN_EXAMPLES", "run"]

RUN_EXAMPLES = """
\b
Example module (tally.py, in the current directory):
  from statesnap import Processor

\b
  proc = Processor("tally", inputs=["payments"], bootstrap_servers="127.0.0.1:9092",
                   checkpoints="./ckpt", stores=["balances"], value_serde="json")

\b
  @proc.handler
  def on_payment(record, ctx):
      balances = ctx.stores["balances"]
      balances[record.key] = balances.get(record.key, 0) + record.value["amount"]

\b
Then:
  statesnap run tally:proc                          # restore, catch up, checkpoint, exit
  statesnap run tally:proc --follow                 # keep processing; Ctrl-C: final checkpoint
  statesnap run tally:proc -c s3://bucket/ckpt --json   # another checkpoint store, JSON result
  statesnap dump --table tally --store balances -c ./ckpt --value-serde json
"""


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """A duration option with no default (None: as the processor was built), in seconds."""
    if value is None:
        return None
    try:
        seconds = parse_duration(value).total_seconds()
    except InvalidDurationError as e:
        raise click.BadParameter(str(e), ctx=ctx, param=param) from e
    if seconds <= 0:
        raise click.BadParameter("must be more than 0", ctx=ctx, param=param)
    return seconds


@docs_page("tutorials/processors.md")
@click.command(epilog=RUN_EXAMPLES)
@click.argument("app", metavar="MODULE:OBJECT")
@click.option(
    "--bootstrap-servers",
    "-b",
    default=None,
    envvar="STATESNAP_BOOTSTRAP_SERVERS",
    help="Kafka bootstrap address(es) [default: the processor's]. [env: STATESNAP_BOOTSTRAP_SERVERS]",
)
@click.option(
    "--checkpoints",
    "-c",
    default=None,
    envvar="STATESNAP_CHECKPOINTS",
    help="Checkpoint store URL: a path, file:///path or s3://bucket/prefix [default: the processor's]. "
    "[env: STATESNAP_CHECKPOINTS]",
)
@engine_option(
    "Who runs the handler: this process (python) or a PySpark job over the input's history, "
    "one task per partition, for the stores alone (spark: emits nothing; not with --follow or "
    "--exactly-once). auto runs processors in python (their handlers may emit) and says why.",
    env=True,
)
@state_store_option(
    "python engine: the local store holding every named store [default: the processor's].", dest="store"
)
@click.option(
    "--exactly-once",
    is_flag=True,
    help="Emitted records and input offsets commit in one Kafka transaction per commit point (the "
    "broker must implement transactions; readers use read_committed). With --group, the group's own "
    "offsets, fenced by its generation (KIP-447).",
)
@spark_conf_option
@follow_options(processor=True)
@from_generation_option
@click.option(
    "--yes",
    is_flag=True,
    help="With --from-generation and exactly-once outputs: emit again the outputs after that generation.",
)
@checkpointing_options(processor=True)
@storage_options
@kafka_config_options
@click.option(
    "--timeout",
    default=None,
    envvar="STATESNAP_TIMEOUT",
    callback=_duration,
    help="How long to wait for the Kafka cluster's first answers [default: the processor's]. "
    "[env: STATESNAP_TIMEOUT]",
)
@json_option
@quiet_option
def run(
    app: str,
    bootstrap_servers: str | None,
    checkpoints: str | None,
    engine: str,
    store: str | None,
    spark_conf: tuple[str, ...],
    follow: bool,
    checkpoint_interval: str | None,
    commit_interval: str | None,
    instance: int | None,
    instances: int | None,
    group: str | None,
    generation: int | None,
    yes: bool,
    snapshot_timeout: str | None,
    shutdown_timeout: str,
    snapshot_store: str | None,
    min_count: int | None,
    min_age: str | None,
    orphan_grace: str | None,
    storage_pairs: tuple[str, ...],
    kafka_pairs: tuple[str, ...],
    kafka_files: tuple[str, ...],
    timeout: float | None,
    as_json: bool,
    quiet: bool,
    exactly_once: bool,
) -> None:
    """Run the Processor OBJECT of MODULE: restore its stores from the newest checkpoint, run its
    handlers over the input's tail, write a checkpoint and exit — or, with --follow, keep
    processing until Ctrl-C / SIGTERM, then close with a final checkpoint.

    MODULE is imported from the current directory or PYTHONPATH, as uvicorn imports an app; it
    should build the processor, not start it. Options given here override what the processor was
    built with (connection, checkpoint store and settings, local store, partition share). --json
    prints materialize's keys (engine, checkpoint, restore.checkpoint, …) plus processed, emitted,
    dead_lettered and stores (rows per store).
    """
    from statesnap.cli.interrupts import StoppedEarly
    from statesnap.cli.progress import ConsoleProgress
    from statesnap.errors import CatchUpStoppedError
    from statesnap.kafka.config import config_from_env, parse_properties
    from statesnap.run import FollowOptions, SparkOptions, StopRequest, run_processor
    from statesnap.run.loading import CheckpointOverrides, ProcessorOverrides, load_processor, with_overrides
    from statesnap.task.options import StoreOptions

    share = share_of(instance, instances, group, follow, generation, run="run")
    config = config_from_env()
    config.update(parse_properties(list(kafka_pairs), list(kafka_files)))
    if bootstrap_servers is not None:
        kafka_settings(bootstrap_servers, kafka_pairs, kafka_files)  # refuses a malformed entry early
    storage = pairs_to_dict(storage_pairs, "--storage-option")
    overrides = ProcessorOverrides(
        bootstrap_servers=bootstrap_servers,
        kafka_config=config or None,
        timeout=timeout,
        checkpoints=CheckpointOverrides(
            location=checkpoints,
            storage_options=storage or None,
            interval=_delta(checkpoint_interval),
            commit_interval=_delta(commit_interval),
            generation=generation,
            snapshot_store=snapshot_store,
            snapshot_timeout=_delta(snapshot_timeout),
            min_count=min_count,
            min_age=_delta(min_age),
            orphan_grace=_delta(orphan_grace),
        ),
        store=StoreOptions.of(store) if store is not None else None,
        share=share,
    )
    proc = load_processor(app)
    processing = proc.processing.with_exactly_once() if exactly_once else proc.processing
    if generation is not None and processing.exactly_once:
        if not yes:
            raise ConfigError(
                f"--from-generation {generation} re-processes the input from that snapshot's offsets: "
                "this processor's exactly-once outputs after it will be emitted again (consumers see "
                "them twice); add --yes to go ahead"
            )
        processing = processing.with_reemit_confirmed()
    proc = with_overrides(proc.replace(processing=processing), overrides)
    out = Output(as_json, quiet)
    stop = threading.Event()
    signals = RunSignals(stop, follow=follow)
    conf = pairs_to_dict(spark_conf, "--spark-conf")
    session = cli_session(conf, not out.shows_progress, None)
    with ConsoleProgress(not out.shows_progress, signals.on_stage) as progress:
        try:
            result = run_processor(
                proc,
                engine=engine,
                follow=FollowOptions(stop, parse_duration(shutdown_timeout)) if follow else False,
                spark=SparkOptions(conf, None, session),
                progress=progress,
                stop=StopRequest(stop, parse_duration(shutdown_timeout)),
            )
        except CatchUpStoppedError as e:
            raise StoppedEarly(str(e)) from e
    out.result(result)


def _delta(value: str | None) -> timedelta | None:
    """A duration flag as given (None: not given, the processor's own setting stands)."""
    return None if value is None else parse_duration(value)
