"""``statesnap demo``: the whole story on embedded services, start to finish."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from statesnap.cli.docs import docs_page
from statesnap.cli.options import engine_option, json_option, state_store_option
from statesnap.cli.output import Output
from statesnap.cli.tables import start_with_progress
from statesnap.digest import table_digest

if TYPE_CHECKING:  # imported when the demo runs: registering it loads no engine
    from rich.table import Table as RichTable

    from statesnap.kafka.config import KafkaSettings
    from statesnap.python.reads import StoreName
    from statesnap.sample import SampleSpec

__all__ = ["demo"]


def _produce(settings: KafkaSettings, spec: SampleSpec, label: str, quiet: bool) -> float:
    from statesnap.cli.progress import progress_bar
    from statesnap.sample import produce_sample

    started = time.monotonic()
    with progress_bar(quiet) as bar:
        task = bar.add_task(label, total=spec.updates)
        produce_sample(settings, spec, progress=lambda k: bar.advance(task, k))
    return time.monotonic() - started


@docs_page("index.md")
@click.command()
@click.option("--updates", default=2_000_000, show_default=True, help="History length (records).")
@click.option("--keys", default=200_000, show_default=True, help="Distinct keys (the table's size).")
@click.option("--partitions", default=8, show_default=True)
@click.option("--tail", default=100_000, show_default=True, help="Records appended after the checkpoint.")
@state_store_option(
    "The local state store the restores load into (--store, its older name here, is deprecated: "
    "elsewhere --store names a processor's store).",
    dest="store",
    default="auto",
    old_alias=True,
)
@engine_option(
    "Who writes the checkpoint: a PySpark job (auto: with pyspark and Java installed) or this process."
)
@click.option(
    "--dir",
    "workdir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where checkpoints go (default: a temporary directory, removed afterwards).",
)
@json_option
def demo(
    updates: int,
    keys: int,
    partitions: int,
    tail: int,
    store: StoreName,
    engine: str,
    workdir: str | None,
    as_json: bool,
) -> None:
    """Start the embedded broker, write a long history, checkpoint it, then restore twice —
    from the checkpoint and by full replay — and compare times and digests side by side."""
    from statesnap.cli.progress import ConsoleProgress, stderr
    from statesnap.cli.spark_engine import spark_session
    from statesnap.devstack import EmbeddedBroker
    from statesnap.kafka.config import KafkaSettings
    from statesnap.python.table import Table
    from statesnap.run import SparkOptions, choose_engine, materialize
    from statesnap.sample import SampleSpec

    quiet = as_json
    tmp = None if workdir else tempfile.mkdtemp(prefix="statesnap-demo-")
    root = Path(workdir or tmp or ".") / "checkpoints"

    def say(msg: str) -> None:
        if not quiet:  # soft_wrap: a path is never broken when stderr is not a terminal
            stderr.print(f"[bold cyan]▶[/] {msg}", soft_wrap=True)

    try:
        with EmbeddedBroker() as broker:
            bs = broker.bootstrap_servers
            settings = KafkaSettings(bs)
            say(f"embedded broker on {bs}")
            topic = "demo-orders"
            _produce(
                settings,
                SampleSpec(topic, partitions, keys, updates, 0.02, 100, 1),
                f"history: {updates:,} updates over {keys:,} keys",
                quiet,
            )

            # The one engine choice, with the demo's own auto: Spark whenever it can run here.
            engine = choose_engine(
                engine,
                python_only={},
                spark_only={},
                backlog=None,
                follow=False,
                spark_when_available="the demo shows Spark writing the checkpoint",
            ).engine
            started = time.monotonic()
            if engine == "spark":
                say(f"materialize on Spark: read the history in parallel and checkpoint to {root}")
            else:
                say(f"materialize: replay the history once and checkpoint to {root}")
            with ConsoleProgress(quiet, engine_line=False) as progress:
                made = materialize(
                    topic,
                    bootstrap_servers=bs,
                    checkpoints=str(root),
                    engine=engine,
                    store=store if engine == "python" else None,
                    spark=SparkOptions(session=spark_session),
                    progress=progress,
                )
            materialize_seconds = time.monotonic() - started
            say(
                f"checkpoint {made.checkpoint}: {made.keys:,} keys, "
                f"{made.bytes:,} bytes by {engine} in {materialize_seconds:.1f}s"
            )

            _produce(
                settings,
                SampleSpec(topic, partitions, keys, tail, 0.02, 100, 2),
                f"tail: {tail:,} more updates after the checkpoint",
                quiet,
            )

            results: dict[str, dict[str, Any]] = {}
            for mode, url in (("checkpoint", str(root)), ("full replay", None)):
                say(f"restore by {mode}")
                t = Table(topic, bootstrap_servers=bs, checkpoints=url, store=store, background=False)
                report = start_with_progress(t, quiet)
                digest, n = table_digest(t.raw_items())
                kind = t.store.kind  # what "auto" chose
                t.close(checkpoint=False)
                results[mode] = {
                    "store": kind,
                    "seconds": round(report.restore_seconds, 3),
                    "replayed": report.replayed_records,
                    "checkpoint": report.checkpoint,
                    "keys": n,
                    "digest": digest,
                }
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)

    fast, slow = results["checkpoint"], results["full replay"]
    speedup = slow["seconds"] / max(fast["seconds"], 1e-9)
    equal = fast["digest"] == slow["digest"]
    data = {
        "updates": updates,
        "keys": keys,
        "tail": tail,
        "store": store,
        "engine": engine,
        "materialize_seconds": round(materialize_seconds, 3),
        "speedup": round(speedup, 2),
        "digests_equal": equal,
        "checkpoint_bytes": made.bytes,
        "results": results,
    }
    output = Output(as_json)
    if output.shows_progress:  # the detail, side by side; the verdict below is the result
        stderr.print(_side_by_side(results, engine, f"{updates + tail:,} updates over {keys:,} keys"))
    output.show(
        data,
        f"checkpoint restore {fast['seconds']:.2f}s vs full replay {slow['seconds']:.2f}s: "
        f"{speedup:.1f}x faster, digests {'equal' if equal else 'DIFFERENT'}",
    )
    if not equal and not as_json:
        raise SystemExit(1)


def _side_by_side(results: dict[str, dict[str, Any]], engine: str, history: str) -> RichTable:
    from rich.table import Table as RichTable

    kinds = sorted({r["store"] for r in results.values()})
    into = f"a {kinds[0]} store" if len(kinds) == 1 else f"{' and '.join(kinds)} stores"
    out = RichTable(title=f"statesnap demo: {history} (checkpoint written by {engine}, restored into {into})")
    for col in ("restore", "checkpoint", "records replayed", "keys", "seconds", "digest"):
        out.add_column(col, justify="right" if col in {"records replayed", "keys", "seconds"} else "left")
    for mode, r in results.items():
        out.add_row(
            mode,
            "none" if r["checkpoint"] is None else str(r["checkpoint"]),
            f"{r['replayed']:,}",
            f"{r['keys']:,}",
            f"{r['seconds']:.2f}",
            str(r["digest"])[:16] + "…",
        )
    return out
