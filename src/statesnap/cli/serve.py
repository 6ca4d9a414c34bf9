"""``statesnap serve``: a read-only replica of a table behind an HTTP API."""

from __future__ import annotations

import functools
import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from statesnap.cli.docs import docs_page
from statesnap.cli.options import (
    kafka_config_options,
    kafka_settings,
    pairs_to_dict,
    state_store_option,
    storage_options,
    table_option,
    timeout_option,
)
from statesnap.durations import parse_duration
from statesnap.errors import InvalidDurationError, StatesnapError

if TYPE_CHECKING:  # the serve package imports FastAPI: not on every `statesnap` command
    from statesnap.processor.store_follower import StoreFollower
    from statesnap.python.follower import Follower
    from statesnap.python.reads import StoreName
    from statesnap.serve.generations import GenerationSource
    from statesnap.serve.waits import OwnedReplica

__all__ = [
    "DEFAULT_GENERATIONS",
    "DEFAULT_WAIT_MS",
    "MAX_PENDING_WAITS",
    "MAX_WAIT_MS",
    "prefix_filter",
    "serve",
]

#: statesnap.serve.app.MAX_WAIT_MS / DEFAULT_WAIT_MS, repeated so that loading the CLI does not
#: import FastAPI and uvicorn (~0.3 s on every `statesnap` command); a unit test keeps them equal.
MAX_WAIT_MS = 60_000
DEFAULT_WAIT_MS = 5_000
#: statesnap.serve.waits.DEFAULT_MAX_PENDING, repeated for the same reason.
MAX_PENDING_WAITS = 10_000
#: statesnap.serve.generations.DEFAULT_GENERATIONS, repeated for the same reason.
DEFAULT_GENERATIONS = 2


def prefix_filter(prefixes: tuple[str, ...]) -> Callable[[bytes], bool] | None:
    """A key filter keeping keys that start with any of *prefixes* (UTF-8), or None for all keys."""
    if not prefixes:
        return None
    wanted = tuple(p.encode("utf-8") for p in prefixes)
    return lambda key: key.startswith(wanted)


@docs_page("reference/http.md")
@click.command()
@click.option(
    "--bootstrap-servers",
    "-b",
    envvar="STATESNAP_BOOTSTRAP_SERVERS",
    help="Kafka bootstrap address(es), e.g. 127.0.0.1:9092; with --store only to pick the cluster's "
    "checkpoints. [env: STATESNAP_BOOTSTRAP_SERVERS]",
)
@click.option(
    "--topic",
    "-t",
    envvar="STATESNAP_TOPIC",
    help="The changelog topic (not with --store). [env: STATESNAP_TOPIC]",
)
@table_option(required=False)
@click.option(
    "--checkpoints",
    "-c",
    required=True,
    envvar="STATESNAP_CHECKPOINTS",
    help="The owner's checkpoint store URL (read only: serve never writes there). "
    "[env: STATESNAP_CHECKPOINTS]",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    "-p",
    type=click.IntRange(0, 65535),
    default=8080,
    show_default=True,
    help="Port to listen on (0: any free port, printed at start).",
)
@click.option(
    "--store",
    "store_name",
    default=None,
    metavar="STORE",
    help="Serve this store of processor --table as its newest checkpoint holds it, loading each newer "
    "generation as it appears (polled every --poll-interval): a store has no changelog to tail. "
    "Served at /tables/STORE/…; a window store's keys are its stored keys (8-byte window start, "
    "then the key).",
)
@click.option(
    "--poll-interval",
    default="5s",
    show_default=True,
    help="With --store: how often to look for a newer checkpoint.",
)
@state_store_option("The local store a table's replica is held in.", default="auto")
@click.option(
    "--key-prefix",
    "key_prefixes",
    multiple=True,
    metavar="PREFIX",
    help="Keep only keys starting with PREFIX (UTF-8); repeatable. Default: every key.",
)
@click.option(
    "--require-checkpoint",
    is_flag=True,
    help="Fail instead of replaying the whole topic when no checkpoint verifies.",
)
@click.option(
    "--max-wait-ms",
    type=click.IntRange(0, 3_600_000),
    default=MAX_WAIT_MS,
    show_default=True,
    help="Upper bound of a request's wait_ms (min_offsets / caught_up).",
)
@click.option(
    "--max-pending-waits",
    type=click.IntRange(1, 1_000_000),
    default=MAX_PENDING_WAITS,
    show_default=True,
    help="Requests that may wait for min_offsets / caught_up at once; more answer 503. "
    "Waiting requests hold no thread.",
)
@click.option(
    "--max-generations",
    type=click.IntRange(0, 100),
    default=DEFAULT_GENERATIONS,
    show_default=True,
    help="?generation=G reads: how many generations to keep loaded (each is one in-memory copy of "
    "the table or store, loaded on its first read); 0 turns such reads off (400).",
)
@click.option(
    "--generation-load-timeout",
    default="60s",
    show_default=True,
    help="How long a ?generation=G read without wait_ms waits for G to load (at most --max-wait-ms); "
    "then 504 (the load goes on: retry).",
)
@click.option("--access-log", is_flag=True, help="Log every request (uvicorn's access log).")
@storage_options
@kafka_config_options
@timeout_option
def serve(
    bootstrap_servers: str | None,
    topic: str | None,
    table: str | None,
    checkpoints: str,
    host: str,
    port: int,
    store_name: str | None,
    poll_interval: str,
    state_store: StoreName,
    key_prefixes: tuple[str, ...],
    require_checkpoint: bool,
    max_wait_ms: int,
    max_pending_waits: int,
    max_generations: int,
    generation_load_timeout: str,
    access_log: bool,
    storage_pairs: tuple[str, ...],
    kafka_pairs: tuple[str, ...],
    kafka_files: tuple[str, ...],
    timeout: float,
) -> None:
    """Follow TOPIC's table read-only and answer lookups over HTTP until Ctrl-C / SIGTERM.

    Boots from the owner's newest checkpoint, then tails the changelog; never writes to the topic
    or the checkpoint store. The server listens at once: /health answers 503 while restoring and
    200 once caught up. Add ?min_offsets=0:123&wait_ms=2000 (or the JSON form {"0":123}, which
    needs `curl -g`) to a read to see your own writes, ?caught_up=true to wait for the end of the
    log; every answer carries X-Statesnap-Offsets, X-Statesnap-Lag and X-Statesnap-Caught-Up
    headers. Bad parameters answer 400. Add ?generation=G to a read for the state exactly as
    snapshot G holds it (X-Statesnap-Generation and G's offsets in X-Statesnap-Offsets; 404 lists
    the generations there are); the --max-generations most recently read ones stay loaded.

    \b
      GET /tables/TABLE/keys/KEY        raw value bytes (404 when absent)
      GET /tables/TABLE/keys?after=K    paged scan (JSON; &prefix=P for one prefix)
      GET /tables/TABLE                 status
      GET /health  /metrics  /docs      readiness, Prometheus metrics (replica and requests),
                                        Swagger UI (served locally, works offline)

    --store STORE --table PROCESSOR serves a processor's store instead (no broker needed): as its
    newest checkpoint holds it, refreshed when a newer generation appears, at /tables/STORE/….
    """
    from statesnap.blob import open_blob_store
    from statesnap.kafka.admin import KafkaAdmin
    from statesnap.python.follower import Follower
    from statesnap.serve.generations import StoreGenerations, TableGenerations
    from statesnap.task.options import CheckpointOptions
    from statesnap.task.rowfilter import RowFilter

    load_ms = _load_timeout_ms(generation_load_timeout, max_wait_ms)
    follower: OwnedReplica
    if store_name is not None:
        stores = _store_follower(
            table, store_name, checkpoints, storage_pairs, poll_interval, key_prefixes, topic,
            bootstrap_servers, kafka_pairs, kafka_files, timeout,
        )  # fmt: skip
        source: GenerationSource | None = StoreGenerations(
            stores.blob_store, stores.table, store_name, stores.cluster_id, stores.key_filter
        )
        _serve(stores, f"store {store_name!r} of processor {table!r}", host, port, access_log, max_wait_ms,
               max_pending_waits, source, max_generations, load_ms)  # fmt: skip
        return
    if not bootstrap_servers:
        raise click.UsageError("Missing option '--bootstrap-servers' / '-b'.")
    if not topic:
        raise click.UsageError("Missing option '--topic' / '-t'.")
    settings = kafka_settings(bootstrap_servers, kafka_pairs, kafka_files, timeout)
    blob_options = pairs_to_dict(storage_pairs, "--storage-option")
    name = table or topic

    def replica(generation: int | None) -> Follower[Any, Any]:
        """The live replica (None), or generation G as it is (``tail=False``), as dump reads it."""
        return Follower(
            topic,
            bootstrap_servers=settings.bootstrap_servers,
            kafka_config=dict(settings.config),
            timeout=settings.timeout,
            name=name,
            checkpoints=CheckpointOptions(
                checkpoints,
                storage_options=blob_options,
                require=require_checkpoint or generation is not None,
                generation=generation,
            )
            if checkpoints
            else None,
            store=state_store,
            row_filter=RowFilter(key_filter=prefix_filter(key_prefixes)),
            tail=generation is None,
        )

    try:
        follower = replica(None)
        source = (
            TableGenerations(
                open_blob_store(checkpoints, **blob_options),
                name,
                replica,
                functools.cache(lambda: KafkaAdmin(settings).cluster_id()),
            )
            if checkpoints
            else None
        )
    except StatesnapError as e:
        raise click.ClickException(f"{type(e).__name__}: {e}") from e
    _serve(follower, f"table {follower.name!r} of topic {topic!r}", host, port, access_log, max_wait_ms,
           max_pending_waits, source, max_generations, load_ms)  # fmt: skip


def _load_timeout_ms(text: str, max_wait_ms: int) -> int:
    """--generation-load-timeout in ms (at most --max-wait-ms, the bound of any request's wait)."""
    try:
        seconds = parse_duration(text).total_seconds()
    except InvalidDurationError as e:
        raise click.BadParameter(str(e), param_hint="--generation-load-timeout") from e
    if seconds <= 0:
        raise click.BadParameter("must be more than 0", param_hint="--generation-load-timeout")
    return min(int(seconds * 1000), max_wait_ms)


def _store_follower(
    table: str | None,
    store: str,
    checkpoints: str,
    storage_pairs: tuple[str, ...],
    poll_interval: str,
    key_prefixes: tuple[str, ...],
    topic: str | None,
    bootstrap_servers: str | None,
    kafka_pairs: tuple[str, ...],
    kafka_files: tuple[str, ...],
    timeout: float,
) -> StoreFollower:
    """``--store``: a read-only replica of one processor store, refreshed from new checkpoints."""
    from statesnap.blob import open_blob_store
    from statesnap.cli.dumping import check_store_flags
    from statesnap.kafka.admin import KafkaAdmin
    from statesnap.processor.store_follower import StoreFollower

    table, _ = check_store_flags(
        table=table, checkpoints=checkpoints, no_checkpoint=False, state_store=None, store=store,
        topic=topic, verb="serve",
    )  # fmt: skip
    if topic:
        raise click.UsageError("--topic does not go with --store: a store is served from its checkpoints")
    try:
        poll = parse_duration(poll_interval).total_seconds()
    except InvalidDurationError as e:
        raise click.BadParameter(str(e), param_hint="--poll-interval") from e
    if poll <= 0:
        raise click.BadParameter("must be more than 0", param_hint="--poll-interval")
    cluster_id = None
    if bootstrap_servers:
        cluster_id = KafkaAdmin(
            kafka_settings(bootstrap_servers, kafka_pairs, kafka_files, timeout)
        ).cluster_id()
    blobs = open_blob_store(checkpoints, **pairs_to_dict(storage_pairs, "--storage-option"))
    return StoreFollower(
        blobs, table, store, cluster_id=cluster_id, poll_seconds=poll, key_filter=prefix_filter(key_prefixes)
    )


def _serve(
    follower: OwnedReplica,
    what: str,
    host: str,
    port: int,
    access_log: bool,
    max_wait_ms: int,
    max_pending_waits: int,
    source: GenerationSource | None,
    max_generations: int,
    load_timeout_ms: int,
) -> None:
    """Serve *follower* (and its generations from *source*) over HTTP until SIGINT/SIGTERM, or
    until it fails."""
    from statesnap.serve import HttpServer, create_app
    from statesnap.serve.generations import GenerationCache

    cache = GenerationCache(source, capacity=max_generations) if source and max_generations else None
    try:
        app = create_app(
            follower,
            default_wait_ms=min(DEFAULT_WAIT_MS, max_wait_ms),
            max_wait_ms=max_wait_ms,
            max_pending_waits=max_pending_waits,
            generations=cache,
            load_timeout_ms=load_timeout_ms,
        )
        server = HttpServer(
            app, host=host, port=port, access_log=access_log, log_level="info" if access_log else "warning"
        )
        server.bind()
    except StatesnapError as e:
        raise click.ClickException(f"{type(e).__name__}: {e}") from e
    click.echo(
        f"serving {what} on {server.url} "
        f"(restoring; {server.url}/health turns 200 once caught up; docs at {server.url}/docs)",
        err=True,
    )
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        # uvicorn runs on a thread: in the main thread it would re-raise SIGTERM after shutting
        # down, killing the process before the follower is closed.
        server.start()
        # A failed replica must not answer 503 forever: stop and exit non-zero instead, saying
        # the failure once (below), not also as the replica's own log line.
        follower.start_in_background(on_failure=lambda _error: stop.set())
        while not stop.wait(0.25):
            if follower.state == "failed" or not server.running:
                break
    except StatesnapError as e:
        raise click.ClickException(f"{type(e).__name__}: {e}") from e
    finally:
        server.stop()
        follower.close()
        if cache is not None:
            cache.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    err = follower.error
    if err is not None:
        raise click.ClickException(f"{type(err).__name__}: {err}")
    if not stop.is_set():
        raise click.ClickException(f"the HTTP server on {server.url} stopped unexpectedly")
