"""Options shared by several commands (output goes through :mod:`statesnap.cli.output`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from statesnap.cli.interrupts import shutdown_timeout_option
from statesnap.durations import parse_duration
from statesnap.errors import InvalidDurationError

if TYPE_CHECKING:  # the kafka package loads Kafka's client and pyarrow: not for every command's options
    from statesnap.kafka.config import KafkaSettings

__all__ = [
    "DEFAULT_TIMEOUT",
    "ENGINES",
    "STATE_STORES",
    "F",
    "bootstrap_option",
    "checkpointing_options",
    "engine_option",
    "env_timeout",
    "follow_options",
    "from_generation_option",
    "json_option",
    "kafka_config_options",
    "kafka_settings",
    "pairs_to_dict",
    "quiet_option",
    "snapshot_cluster_options",
    "snapshot_store_args",
    "snapshot_store_option",
    "spark_conf_option",
    "state_store_option",
    "storage_options",
    "table_option",
    "timeout_option",
    "topic_option",
]

#: Seconds a command waits for the cluster's first answers before it calls the broker unreachable.
DEFAULT_TIMEOUT = 15.0

#: ``--state-store``'s choices: the local store kinds (statesnap.stores' names), repeated so that
#: loading the CLI imports no store; a unit test keeps them equal.
STATE_STORES = ("auto", "memory", "columnar", "rocksdb")

#: ``--engine``'s choices: statesnap.run.Engine's values, repeated so that loading the CLI
#: does not import the engines (~0.3 s on every `statesnap` command); a unit test keeps them equal.
ENGINES = ("auto", "python", "spark")

F = TypeVar("F", bound=Callable[..., Any])


def bootstrap_option(f: F) -> F:
    return click.option(
        "--bootstrap-servers",
        "-b",
        required=True,
        envvar="STATESNAP_BOOTSTRAP_SERVERS",
        help="Kafka bootstrap address(es), e.g. 127.0.0.1:9092. [env: STATESNAP_BOOTSTRAP_SERVERS]",
    )(f)


def from_generation_option(f: F) -> F:
    """A writer's start from any snapshot (``materialize`` and ``run`` alike)."""
    return click.option(
        "--from-generation",
        "--generation",
        "generation",
        type=int,
        default=None,
        help="Restore exactly this snapshot generation, not the newest, and continue from its offsets: "
        "later generations stay, new ones are numbered above them (--generation is its older name).",
    )(f)


def topic_option(f: F) -> F:
    return click.option(
        "--topic",
        "-t",
        required=True,
        envvar="STATESNAP_TOPIC",
        help="The changelog topic. [env: STATESNAP_TOPIC]",
    )(f)


def table_option(required: bool = True) -> Callable[[F], F]:
    def deco(f: F) -> F:
        return click.option(
            "--table",
            required=required,
            envvar="STATESNAP_TABLE",
            help="Table name in the checkpoint store (default: the topic). [env: STATESNAP_TABLE]",
        )(f)

    return deco


def kafka_config_options(f: F) -> F:
    f = click.option(
        "--kafka-config",
        "kafka_pairs",
        multiple=True,
        metavar="KEY=VALUE",
        help="librdkafka property (TLS, SASL, …); repeatable. Also STATESNAP_KAFKA_<KEY> env vars "
        "(STATESNAP_KAFKA_SASL_MECHANISM=PLAIN → sasl.mechanism).",
    )(f)
    return click.option(
        "--kafka-config-file",
        "kafka_files",
        multiple=True,
        type=click.Path(dir_okay=False),
        help="Java-style properties file of librdkafka settings; repeatable.",
    )(f)


def _seconds(ctx: click.Context, param: click.Parameter, value: str) -> float:
    try:
        seconds = parse_duration(value).total_seconds()
    except InvalidDurationError as e:
        raise click.BadParameter(str(e), ctx=ctx, param=param) from e
    if seconds <= 0:
        raise click.BadParameter("must be more than 0", ctx=ctx, param=param)
    return seconds


def timeout_option(f: F) -> F:
    """``--timeout``: how long every command that talks to Kafka waits for the cluster's first
    answers (metadata, cluster id) before failing with a typed error naming the address."""
    return click.option(
        "--timeout",
        default=f"{DEFAULT_TIMEOUT:g}s",
        show_default=True,
        envvar="STATESNAP_TIMEOUT",
        callback=_seconds,
        help="How long to wait for the Kafka cluster's first answers before calling it unreachable "
        "(90s, 2m, …). [env: STATESNAP_TIMEOUT]",
    )(f)


def storage_options(f: F) -> F:
    return click.option(
        "--storage-option",
        "storage_pairs",
        multiple=True,
        metavar="KEY=VALUE",
        help="Blob-store option such as endpoint_url, region, profile, sse; repeatable. "
        "Also accepted as URL query parameters.",
    )(f)


def snapshot_store_option(f: F) -> F:
    return click.option(
        "--snapshot-store",
        default=None,
        envvar="STATESNAP_SNAPSHOT_STORE",
        metavar="blob|topic:NAME",
        help="Where snapshot records live: blob (beside the checkpoints, the default) or topic:NAME (a "
        "Kafka topic; needs --bootstrap-servers). A table keeps the store it was created with. "
        "[env: STATESNAP_SNAPSHOT_STORE]",
    )(f)


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    ctx.meta[f"statesnap.{param.name}"] = value
    return value


def snapshot_cluster_options(f: F) -> F:
    """``--snapshot-store`` and, for a topic store, the cluster it lives on (``-b``, Kafka
    settings); read them back with :func:`snapshot_store_args`."""
    for decorator in (
        click.option(
            "--kafka-config-file",
            "kafka_files",
            multiple=True,
            expose_value=False,
            callback=_remember,
            type=click.Path(dir_okay=False),
            help="With a topic snapshot store: librdkafka properties file; repeatable.",
        ),
        click.option(
            "--kafka-config",
            "kafka_pairs",
            multiple=True,
            expose_value=False,
            callback=_remember,
            metavar="KEY=VALUE",
            help="With a topic snapshot store: librdkafka property; repeatable.",
        ),
        click.option(
            "--bootstrap-servers",
            "-b",
            envvar="STATESNAP_BOOTSTRAP_SERVERS",
            expose_value=False,
            callback=_remember,
            help="With a topic snapshot store: the Kafka cluster (waited for STATESNAP_TIMEOUT, default "
            "15s). [env: STATESNAP_BOOTSTRAP_SERVERS]",
        ),
        click.option(
            "--snapshot-store",
            envvar="STATESNAP_SNAPSHOT_STORE",
            expose_value=False,
            callback=_remember,
            metavar="blob|topic:NAME",
            help="Where the table's snapshot records live (default: what the table was created with, "
            "else blob). [env: STATESNAP_SNAPSHOT_STORE]",
        ),
    ):
        f = decorator(f)
    return f


def snapshot_store_args() -> dict[str, Any]:
    """``snapshot_store=`` and ``kafka=`` for :meth:`SnapshotApi.open`, from the current command."""
    meta = click.get_current_context().meta
    servers = meta.get("statesnap.bootstrap_servers")
    kafka = None
    if servers:
        kafka = kafka_settings(
            servers,
            tuple(meta.get("statesnap.kafka_pairs") or ()),
            tuple(meta.get("statesnap.kafka_files") or ()),
            env_timeout(),
        )
    return {"snapshot_store": meta.get("statesnap.snapshot_store"), "kafka": kafka}


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")(f)


def env_timeout() -> float:
    """``STATESNAP_TIMEOUT`` for commands whose ``--timeout`` means something else (``snapshot
    create``: the snapshot's deadline), read at the CLI boundary."""
    value = os.environ.get("STATESNAP_TIMEOUT")
    if not value:
        return DEFAULT_TIMEOUT
    try:
        seconds = parse_duration(value).total_seconds()
    except InvalidDurationError as e:
        raise click.BadParameter(str(e), param_hint="STATESNAP_TIMEOUT") from e
    return seconds if seconds > 0 else DEFAULT_TIMEOUT


def kafka_settings(
    bootstrap_servers: str, pairs: tuple[str, ...], files: tuple[str, ...], timeout: float = DEFAULT_TIMEOUT
) -> KafkaSettings:
    """Environment first, then files, then explicit pairs: the most specific setting wins."""
    from statesnap.kafka.config import KafkaSettings, config_from_env, parse_properties

    config: dict[str, str] = config_from_env()
    config.update(parse_properties(list(pairs), list(files)))
    return KafkaSettings(bootstrap_servers, config, timeout)


def pairs_to_dict(pairs: tuple[str, ...], what: str) -> dict[str, str]:
    out = {}
    for n, pair in enumerate(pairs, 1):
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            # Never echo the entry: it may be "secret_key SECRET" with a typo'd separator.
            raise click.BadParameter(f"entry {n} is not KEY=VALUE (value not shown)", param_hint=what)
        out[key.strip()] = value
    return out


#: What ``--store`` on ``materialize``/``demo`` says when it is used: everywhere else it names a
#: processor's store, so the local store kind is ``--state-store`` only.
STORE_ALIAS_WARNING = "--store is deprecated here: use --state-store"


def state_store_option(
    help: str, *, dest: str = "state_store", default: str | None = None, old_alias: bool = False
) -> Callable[[F], F]:
    """``--state-store``: the local store kind, into parameter *dest*. *old_alias*: also take
    ``--store`` (its older name on ``materialize`` and ``demo``, hidden from the help), which
    still works but prints :data:`STORE_ALIAS_WARNING` once; both given is a usage error."""

    def deco(f: F) -> F:
        option = click.option(
            "--state-store",
            dest,
            type=click.Choice(STATE_STORES),
            default=default,
            show_default=default is not None,
            callback=_alias_target if old_alias else None,
            help=help,
        )
        if not old_alias:
            return option(f)
        alias = click.option(
            "--store",
            "deprecated_store",
            type=click.Choice(STATE_STORES),
            default=None,
            hidden=True,
            expose_value=False,
            allow_from_autoenv=False,  # the old name on the command line only
            callback=_store_alias(dest),
        )
        return alias(option(f))

    return deco


_ALIAS_VALUE = "statesnap.deprecated_store"


def _given(ctx: click.Context, name: str) -> bool:
    source = ctx.get_parameter_source(name)
    return source is not None and source not in (
        click.core.ParameterSource.DEFAULT,
        click.core.ParameterSource.DEFAULT_MAP,
    )


def _both() -> click.UsageError:
    return click.UsageError("--store and --state-store both given: give --state-store only")


def _alias_target(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--state-store``'s value, or the deprecated ``--store``'s when that came first."""
    if _ALIAS_VALUE not in ctx.meta:
        return value
    assert param.name is not None
    if _given(ctx, param.name):
        raise _both()
    return str(ctx.meta[_ALIAS_VALUE])


def _store_alias(dest: str) -> Callable[[click.Context, click.Parameter, str | None], None]:
    def callback(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
        if value is None:
            return
        click.echo(STORE_ALIAS_WARNING, err=True)
        if dest not in ctx.params:  # --state-store not processed yet: it takes the value then
            ctx.meta[_ALIAS_VALUE] = value
        elif _given(ctx, dest):
            raise _both()
        else:
            ctx.params[dest] = value

    return callback


# Flags `materialize` and `run` share. A table's run shows the library's defaults; a processor's
# run leaves each flag unset (None) by default, so the processor's own setting holds unless a flag
# is given: *processor* picks the variant, and each flag's meaning is written once.


def engine_option(
    help: str, *, choices: tuple[str, ...] = ENGINES, default: str = "auto", env: bool = False
) -> Callable[[F], F]:
    """``--engine``: who runs the task (*env*: also ``STATESNAP_ENGINE``)."""
    suffix = " [env: STATESNAP_ENGINE]" if env and "[env:" not in help else ""
    return click.option(
        "--engine",
        type=click.Choice(choices),
        default=default,
        show_default=True,
        envvar="STATESNAP_ENGINE" if env else None,
        help=help + suffix,
    )


def spark_conf_option(f: F) -> F:
    return click.option(
        "--spark-conf",
        "spark_conf",
        multiple=True,
        metavar="KEY=VALUE",
        help="spark engine: any Spark setting (spark.executor.memory=4g, …); repeatable.",
    )(f)


def quiet_option(f: F) -> F:
    return click.option("--quiet", "-q", is_flag=True, help="No progress bar, no status lines.")(f)


def follow_options(*, processor: bool) -> Callable[[F], F]:
    """``--follow`` with its intervals, and how the partitions are shared among instances
    (``--instance``/``--instances`` or ``--group``), whose rules :func:`statesnap.cli.tables.share_of`
    applies."""
    commit_help = (
        "With --follow: time between commit points (the processor's own, 5s unless set; a shorter "
        "--checkpoint-interval lowers it, since checkpoints are taken at commit points)."
        if processor
        else "With --follow: time between commit points (on Spark: the micro-batch trigger interval); "
        "a shorter --checkpoint-interval lowers it, since checkpoints are taken at commit points."
    )
    decorators = (
        click.option(
            "--follow",
            is_flag=True,
            help="Keep running, checkpointing every --checkpoint-interval, until Ctrl-C / SIGTERM (then "
            "a final checkpoint).",
        ),
        click.option(
            "--checkpoint-interval",
            default=None if processor else "1h",
            show_default=not processor,
            help="With --follow: time between checkpoints"
            + (" [default: the processor's]." if processor else "."),
        ),
        click.option(
            "--commit-interval",
            default=None if processor else "5s",
            show_default=not processor,
            help=commit_help,
        ),
        click.option(
            "--instance", type=int, default=None, help="python engine: with --instances, own p % N == I."
        ),
        click.option(
            "--instances", type=int, default=None, help="python engine: tasks the partitions spread over."
        ),
        click.option(
            "--group",
            default=None,
            envvar="STATESNAP_GROUP",
            help="python engine, with --follow: take partitions from this Kafka consumer group, "
            "rebalanced as instances come and go (each restores the partitions it gains from the newest "
            "checkpoint and checkpoints those it hands over). Not with --instance/--instances. "
            "[env: STATESNAP_GROUP]",
        ),
    )
    return _applied(decorators)


def checkpointing_options(*, processor: bool) -> Callable[[F], F]:
    """How snapshots are taken and how long checkpoints are kept: ``--snapshot-timeout``,
    ``--shutdown-timeout``, ``--snapshot-store`` and the retention flags."""
    unset = " [default: the processor's]" if processor else ""
    interval = "the checkpoint interval" if processor else "--checkpoint-interval"
    decorators = (
        click.option(
            "--snapshot-timeout",
            default=None if processor else "60s",
            show_default=not processor,
            help="Fail snapshots not done by then" + (" [default: 60s]." if processor else "."),
        ),
        shutdown_timeout_option,
        snapshot_store_option,
        click.option(
            "--min-count",
            type=int,
            default=None if processor else 10,
            show_default=not processor,
            help=f"Retention: keep at least this many checkpoints{unset}.",
        ),
        click.option(
            "--min-age",
            default=None if processor else "12h",
            show_default=not processor,
            help=f"Retention: keep every checkpoint younger than this{unset}.",
        ),
        click.option(
            "--orphan-grace",
            default=None,
            help="Retention: keep unreferenced files younger than this [default: "
            + ("the processor's; unset: " if processor else "")
            + f"1h, or 2 × {interval} when longer].",
        ),
    )
    return _applied(decorators)


def _applied(decorators: tuple[Callable[[Any], Any], ...]) -> Callable[[F], F]:
    """One decorator applying *decorators* so that the flags show in the help in their order."""

    def deco(f: F) -> F:
        for decorator in reversed(decorators):
            f = decorator(f)
        return f

    return deco
