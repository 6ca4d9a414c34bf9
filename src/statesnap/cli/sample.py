"""``statesnap produce-sample``: a reproducible changelog for demos, tests and benchmarks."""

from __future__ import annotations

import time

import click

from statesnap.cli.options import (
    bootstrap_option,
    json_option,
    kafka_config_options,
    kafka_settings,
    timeout_option,
    topic_option,
)
from statesnap.cli.output import Output

__all__ = ["produce_sample_cmd"]


@click.command("produce-sample")
@bootstrap_option
@topic_option
@click.option("--partitions", "-p", default=8, show_default=True, help="Partitions if the topic is created.")
@click.option("--keys", "-k", default=1000, show_default=True, help="Distinct keys key-0 … key-<K-1>.")
@click.option("--updates", "-u", default=10_000, show_default=True, help="Records to append.")
@click.option(
    "--tombstone-ratio", default=0.0, show_default=True, help="Fraction of records that are tombstones."
)
@click.option("--value-bytes", default=100, show_default=True, help="Size of each value.")
@click.option("--seed", default=0, show_default=True, help="Random seed; same seed, same changelog.")
@kafka_config_options
@timeout_option
@json_option
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def produce_sample_cmd(
    bootstrap_servers: str,
    topic: str,
    partitions: int,
    keys: int,
    updates: int,
    tombstone_ratio: float,
    value_bytes: int,
    seed: int,
    kafka_pairs: tuple[str, ...],
    kafka_files: tuple[str, ...],
    timeout: float,
    as_json: bool,
    quiet: bool,
) -> None:
    """Create TOPIC if missing and append a reproducible changelog of upserts and tombstones."""
    from statesnap.cli.progress import progress_bar
    from statesnap.sample import SampleSpec, produce_sample

    settings = kafka_settings(bootstrap_servers, kafka_pairs, kafka_files, timeout)
    spec = SampleSpec(topic, partitions, keys, updates, tombstone_ratio, value_bytes, seed)
    started = time.monotonic()
    with progress_bar(quiet or as_json) as bar:
        task = bar.add_task(f"producing to {topic}", total=updates)
        n = produce_sample(settings, spec, progress=lambda k: bar.advance(task, k))
    seconds = time.monotonic() - started
    Output(as_json).show(
        {"topic": topic, "records": n, "seconds": round(seconds, 3)},
        f"produced {n} records to {topic} in {seconds:.1f}s ({n / max(seconds, 1e-9):,.0f}/s)",
    )
