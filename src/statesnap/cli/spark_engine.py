"""The CLI's Spark sessions (imported only when used): started with a display and the CLI's
signal handling, for ``materialize --engine spark``, ``demo`` and ``snapshot diff --engine spark``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import click

from statesnap.cli.interrupts import (
    Interrupted,
    cancel_spark_jobs_on_signals,
    wait_on_signals,
)
from statesnap.cli.progress import activity_bar, stderr_as_it_is
from statesnap.errors import ConfigError
from statesnap.processor.diff import (
    KINDS,
    SnapshotDiff,
    diff_stores,
    identity_columns,
    is_processor,
    show_row,
)
from statesnap.processor.diff import SAMPLE as DIFF_SAMPLE
from statesnap.processor.readback import processor_stores, spark_sql

__all__ = ["POLL_SECONDS", "SESSION_START_TIMEOUT_SECONDS", "diff_on_spark", "interrupted", "spark_session"]

#: Set by the first Ctrl-C of a CLI Spark session (which then cancels its jobs).
_interrupted = threading.Event()

#: A session that has not started in this long is an error, not waited on for ever: cold starts
#: measured 11.5-35 s (median 14-20 s) on a 2-core machine at load 4-10 (``benchmarks/spark_startup.py``).
SESSION_START_TIMEOUT_SECONDS = 300.0

#: How often the progress display and the streaming query's state are looked at.
POLL_SECONDS = 0.5


def _not_from_py4j(record: logging.LogRecord) -> bool:
    # py4j logs through the root logger, so only where the record comes from tells it apart.
    return "py4j" not in record.pathname


@contextlib.contextmanager
def _jvm_in_a_session_of_its_own() -> Iterator[None]:
    """The JVM PySpark launches meanwhile gets a session (and process group) of its own.

    A process manager stops a service by signalling its whole process group (systemd's
    ``KillMode=control-group`` sends SIGTERM to every process; ``timeout`` signals the group):
    PySpark's JVM ignores SIGINT but shuts down on SIGTERM, taking the SparkContext with it in
    the middle of the final checkpoint (exit 1, py4j tracebacks). Signals are the CLI's to
    handle; the JVM still ends with it (it exits when its stdin, a pipe from this process,
    closes). PySpark offers no setting for this, so its launcher's ``Popen`` is wrapped while
    the session starts.
    """
    from pyspark import java_gateway

    original = java_gateway.__dict__["Popen"]

    def popen(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("start_new_session", True)
        return original(*args, **kwargs)

    setattr(java_gateway, "Popen", popen)  # noqa: B010 (not an exported name)
    try:
        yield
    finally:
        setattr(java_gateway, "Popen", original)  # noqa: B010


def spark_session(
    conf: dict[str, str] | None = None, *, quiet: bool = False, stop: threading.Event | None = None
) -> Any:
    """The CLI's session: Spark's logs only with ``--log-level debug``; master from
    STATESNAP_SPARK_MASTER (``local[*]`` by default); one line saying which and how long it took
    to start, unless *quiet*; on a terminal, the seconds spent starting while it starts.

    The session starts on a thread of its own: this thread keeps the display and the CLI's
    signal handling (PySpark installs its own SIGINT handler, a KeyboardInterrupt inside a py4j
    call, only when started on the main thread). A SIGINT/SIGTERM while it starts ends the
    command once the session can be stopped (:class:`Interrupted`, exit 130); a second one at
    once. Without *stop*, the signals then cancel the session's jobs (a batch run); with it, they
    set *stop* (the caller's clean stop)."""
    from statesnap.spark.session import default_master
    from statesnap.spark.session import spark_session as make

    verbose = logging.getLogger("statesnap").getEffectiveLevel() <= logging.DEBUG
    if not verbose:  # py4j logs each interrupted call with a traceback; the CLI says it once
        for handler in logging.getLogger().handlers:
            handler.addFilter(_not_from_py4j)
    interrupted = stop if stop is not None else _interrupted
    if stop is None:
        wait_on_signals(interrupted, "stopped again while the Spark session was starting")
    started = time.monotonic()
    outcome: list[Any] = []
    failure: list[BaseException] = []

    def start() -> None:
        try:
            with _jvm_in_a_session_of_its_own():
                outcome.append(make(conf=conf, verbose=verbose))
        except BaseException as e:  # handed to the main thread
            failure.append(e)

    master = default_master()
    starter = threading.Thread(target=start, name="statesnap-spark-start", daemon=True)
    # The display's stderr is taken before the start-up swaps the descriptor for a pipe.
    with (
        stderr_as_it_is() as console,
        activity_bar(quiet or not console.is_terminal, transient=True, console=console) as bar,
    ):
        task = bar.add_task(f"starting a Spark session ({master})", total=None, detail="")
        starter.start()
        while starter.is_alive():
            starter.join(POLL_SECONDS)
            if interrupted.is_set():
                bar.update(task, detail="stopping once it is up (Ctrl-C again to exit at once)")
            if time.monotonic() - started > SESSION_START_TIMEOUT_SECONDS:
                raise click.ClickException(
                    f"the Spark session did not start within {SESSION_START_TIMEOUT_SECONDS:g}s"
                )
    if failure:
        raise failure[0]
    spark = outcome[0]
    seconds = time.monotonic() - started
    if interrupted.is_set():
        spark.stop()
        raise Interrupted("stopped while the Spark session was starting")
    if stop is None:  # from now on a signal has jobs to cancel
        cancel_spark_jobs_on_signals(spark, _interrupted, verbose=verbose)
    if not quiet:
        click.echo(
            f"spark: {spark.version}, master {spark.sparkContext.master} (started in {seconds:.1f}s)",
            err=True,
        )
    return spark


def interrupted() -> bool:
    """Whether a signal cancelled this CLI session's Spark jobs (a failure is then the cancel)."""
    return _interrupted.is_set()


def diff_on_spark(
    api: Any,
    old: int,
    new: int,
    storage_options: dict[str, str] | None = None,
    *,
    store: str | None = None,
    spark: Any = None,
) -> SnapshotDiff:
    """The snapshot diff as a Spark join (for tables larger than one process's memory): the same
    counts, stores and examples as :func:`statesnap.processor.diff.diff_snapshots`. On *spark*, a
    session of the caller's, left running; by default on the CLI's own, stopped at the end.

    Each generation's checkpoint is read once and cached (a processor's stores are cut from it as
    ``read_table(store=)`` cuts them), each store's join is cached for its count and its examples:
    with a read per store and per query the diff of a two-store processor took ~80 s of jobs."""
    old_manifest, new_manifest = api.repo.read_manifest(old), api.repo.read_manifest(new)
    processor = is_processor(old_manifest) or is_processor(new_manifest)
    if not processor and store is not None:
        raise ConfigError(
            f"{new_manifest.table!r} is a table, not a processor: it has no stores; diff it without --store"
        )
    stores = diff_stores(old_manifest, new_manifest, store) if processor else {}  # refused before Spark
    from statesnap.spark import read_table

    own = spark is None
    if own:
        spark = spark_session()
    cached: list[Any] = []

    def keep(frame: Any) -> Any:
        cached.append(frame.persist())
        return frame

    try:
        url, table = api.repo.store.url, api.table
        raw = {
            m.generation: keep(
                read_table(
                    spark,
                    url,
                    table,
                    generation=m.generation,
                    cluster_id=api.cluster_id,
                    storage_options=storage_options,
                )
            )
            for m in (old_manifest, new_manifest)
        }
        if not processor:
            return _spark_diff(raw[old], raw[new], ["key"], show_row(None), keep)
        per_store = {}
        for name, info in stores.items():
            where, columns = spark_sql(info)
            held = [is_processor(m) and name in processor_stores(m) for m in (old_manifest, new_manifest)]
            # a store not in one generation: none of its rows there (the filter keeps none)
            a, b = (
                raw[g].where(where if h else "false").selectExpr(*columns)
                for g, h in zip((old, new), held, strict=True)
            )
            per_store[name] = _spark_diff(a, b, identity_columns(info), show_row(info), keep)
        return SnapshotDiff.of_stores(per_store, DIFF_SAMPLE)
    finally:
        for frame in cached:
            frame.unpersist()
        if own:
            spark.stop()


def _spark_diff(old: Any, new: Any, keys: list[str], show: Any, keep: Any) -> SnapshotDiff:
    """Rows *old* and *new* identified by *keys* (each with a ``value``), joined on Spark: one
    job counts, one collects the examples (the first of each kind by *keys*: a top-k per task,
    never a sort of the whole table)."""
    from pyspark.sql import functions as sf

    a = old.select(*keys, sf.col("value").alias("a"))
    b = new.select(*keys, sf.col("value").alias("b"))
    kind = (
        sf.when(sf.col("a").isNull(), "added")
        .when(sf.col("b").isNull(), "removed")
        .when(sf.col("a") != sf.col("b"), "changed")
        .otherwise("unchanged")
    )
    joined = keep(a.join(b, keys, "full_outer").select(*keys, kind.alias("kind")))
    totals = {r["kind"]: int(r["count"]) for r in joined.groupBy("kind").count().collect()}
    firsts = None
    for k in KINDS:
        first = joined.where(sf.col("kind") == k).orderBy(*keys).limit(DIFF_SAMPLE)
        firsts = first if firsts is None else firsts.unionByName(first)
    assert firsts is not None
    examples: dict[str, list[str]] = {k: [] for k in KINDS}
    for r in sorted(firsts.collect(), key=lambda r: tuple(r[c] for c in keys)):
        examples[r["kind"]].append(show(r.asDict()))
    added, removed, changed, unchanged = (totals.get(k, 0) for k in (*KINDS, "unchanged"))
    return SnapshotDiff(
        old=removed + changed + unchanged,
        new=added + changed + unchanged,
        added=added,
        removed=removed,
        changed=changed,
        unchanged=unchanged,
        examples=examples,
    )
