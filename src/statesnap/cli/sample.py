"""``statesnap produce-sample``: reproducible input for demos, tests, benchmarks and the README: a
changelog for tables, or JSON events with event times for processors (:mod:`statesnap.sample`)."""

from __future__ import annotations

import functools
import time
from datetime import datetime

import click

from statesnap.cli.docs import docs_page
from statesnap.cli.options import (
    bootstrap_option,
    json_option,
    kafka_config_options,
    kafka_settings,
    timeout_option,
)
from statesnap.cli.output import Output
from statesnap.durations import parse_duration
from statesnap.errors import InvalidDurationError

__all__ = ["produce_sample_cmd"]


def _ms(value: str, option: str) -> int:
    try:
        return int(parse_duration(value).total_seconds() * 1000)
    except InvalidDurationError as e:
        raise click.BadParameter(str(e), param_hint=option) from e


def _start_ms(value: str | None) -> int | None:
    if value is None:
        return None
    if value.isdigit():
        return int(value)
    try:
        return int(datetime.fromisoformat(value).timestamp() * 1000)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is neither milliseconds since the epoch nor an ISO 8601 time "
            "(e.g. 2026-01-01T00:00:00+00:00)",
            param_hint="--start",
        ) from None


@docs_page("tutorials/processors.md")
@click.command(
    "produce-sample",
    epilog="""
\b
Examples:
  statesnap produce-sample -b 127.0.0.1:9092 -t orders --keys 1000 --updates 100000
  statesnap produce-sample -b 127.0.0.1:9092 -t payments --events --updates 10000
  statesnap produce-sample -b 127.0.0.1:9092 -t ad-impressions -t ad-clicks --events \\
      --out-of-order 0.1 --late 0.01 --tombstone-ratio 0.01 --null-key-ratio 0.01
""",
)
@bootstrap_option
@click.option(
    "--topic",
    "-t",
    "topics",
    required=True,
    multiple=True,
    envvar="STATESNAP_TOPIC",
    help="Topic to append to (created if missing); repeat for several co-partitioned inputs: each "
    "gets its own records over the same keys. [env: STATESNAP_TOPIC]",
)
@click.option("--partitions", "-p", default=8, show_default=True, help="Partitions if the topic is created.")
@click.option("--keys", "-k", default=1000, show_default=True, help="Distinct keys key-0 … key-<K-1>.")
@click.option("--updates", "-u", default=10_000, show_default=True, help="Records to append.")
@click.option(
    "--tombstone-ratio", default=0.0, show_default=True, help="Fraction of records that are tombstones."
)
@click.option("--value-bytes", default=100, show_default=True, help="Size of each value.")
@click.option("--null-key-ratio", default=0.0, show_default=True, help="Fraction of records with a null key.")
@click.option("--seed", default=0, show_default=True, help="Random seed; same seed, same records.")
@click.option(
    "--events",
    is_flag=True,
    help='JSON events for processors instead of a changelog: values {"id": I, "amount": A, "ts": T} '
    "(A from 1 to 99), the record timestamp the event time T; --value-bytes does not apply.",
)
@click.option(
    "--start",
    metavar="TIME",
    help="With --events: the first event time (ms since the epoch or ISO 8601). Default: the last "
    "event is about now, so a broker's retention keeps them all.",
)
@click.option("--step", default="100ms", show_default=True, help="With --events: event time between records.")
@click.option(
    "--out-of-order",
    "disorder_ratio",
    default=0.0,
    show_default=True,
    help="With --events: fraction of records moved back in time by up to --max-disorder.",
)
@click.option("--max-disorder", default="5s", show_default=True, help="With --events: see --out-of-order.")
@click.option(
    "--late",
    "late_ratio",
    default=0.0,
    show_default=True,
    help="With --events: fraction of records moved back by --late-by or more (late for a window "
    "whose grace is shorter).",
)
@click.option("--late-by", default="2m", show_default=True, help="With --events: see --late.")
@kafka_config_options
@timeout_option
@json_option
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def produce_sample_cmd(
    bootstrap_servers: str,
    topics: tuple[str, ...],
    partitions: int,
    keys: int,
    updates: int,
    tombstone_ratio: float,
    value_bytes: int,
    null_key_ratio: float,
    seed: int,
    events: bool,
    start: str | None,
    step: str,
    disorder_ratio: float,
    max_disorder: str,
    late_ratio: float,
    late_by: str,
    kafka_pairs: tuple[str, ...],
    kafka_files: tuple[str, ...],
    timeout: float,
    as_json: bool,
    quiet: bool,
) -> None:
    """Create TOPIC if missing and append reproducible records: a changelog of upserts and
    tombstones for a table, or (--events) JSON events with event times for a processor.

    Several --topic: one stream per topic over the same keys, in topics of one partition count
    (co-partitioned: a processor reading them all sees a key's records in one task)."""
    from dataclasses import replace

    from statesnap.cli.progress import progress_bar
    from statesnap.errors import ConfigError
    from statesnap.kafka.admin import KafkaAdmin
    from statesnap.sample import EventSpec, SampleSpec, produce_sample

    event_spec = None
    if events:
        event_spec = EventSpec(
            _start_ms(start),
            _ms(step, "--step"),
            disorder_ratio,
            _ms(max_disorder, "--max-disorder"),
            late_ratio,
            _ms(late_by, "--late-by"),
        ).anchored(updates)  # one start for every topic: their event times line up
    elif start is not None or disorder_ratio or late_ratio:
        raise click.UsageError("--start, --out-of-order and --late go with --events")
    settings = kafka_settings(bootstrap_servers, kafka_pairs, kafka_files, timeout)
    spec = SampleSpec(
        topics[0], partitions, keys, updates, tombstone_ratio, value_bytes, seed, event_spec, null_key_ratio
    )
    started = time.monotonic()
    produced: dict[str, int] = {}
    with progress_bar(quiet or as_json) as bar:
        for i, topic in enumerate(topics):
            task = bar.add_task(f"producing to {topic}", total=updates)
            produced[topic] = produce_sample(
                settings,
                replace(spec, topic=topic, seed=seed + i),
                progress=functools.partial(bar.advance, task),
            )
    if len(topics) > 1:
        admin = KafkaAdmin(settings)
        counts = {t: len(admin.partitions(t)) for t in topics}
        if len(set(counts.values())) > 1:
            shown = ", ".join(f"{t} has {n}" for t, n in counts.items())
            raise ConfigError(f"the topics are not co-partitioned: {shown} partitions (produced anyway)")
    seconds = time.monotonic() - started
    n = sum(produced.values())
    what = ", ".join(topics)
    Output(as_json).show(
        {
            "topic": topics[0],
            "topics": produced,
            "records": n,
            "seconds": round(seconds, 3),
            **({"events_start_ms": event_spec.start_ms} if event_spec is not None else {}),
        },
        f"produced {n} {'events' if events else 'records'} to {what} in {seconds:.1f}s "
        f"({n / max(seconds, 1e-9):,.0f}/s)",
    )
