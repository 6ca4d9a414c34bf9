"""``statesnap serve``: a read-only replica of a table behind an HTTP API."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

import click

from statesnap.cli.options import (
    bootstrap_option,
    kafka_config_options,
    kafka_settings,
    pairs_to_dict,
    storage_options,
    table_option,
    timeout_option,
    topic_option,
)
from statesnap.errors import StatesnapError
from statesnap.python.reads import StoreName

__all__ = ["DEFAULT_WAIT_MS", "MAX_PENDING_WAITS", "MAX_WAIT_MS", "prefix_filter", "serve"]

#: statesnap.serve.app.MAX_WAIT_MS / DEFAULT_WAIT_MS, repeated so that loading the CLI does not
#: import FastAPI and uvicorn (~0.3 s on every `statesnap` command); a unit test keeps them equal.
MAX_WAIT_MS = 60_000
DEFAULT_WAIT_MS = 5_000
#: statesnap.serve.waits.DEFAULT_MAX_PENDING, repeated for the same reason.
MAX_PENDING_WAITS = 10_000


def prefix_filter(prefixes: tuple[str, ...]) -> Callable[[bytes], bool] | None:
    """A key filter keeping keys that start with any of *prefixes* (UTF-8), or None for all keys."""
    if not prefixes:
        return None
    wanted = tuple(p.encode("utf-8") for p in prefixes)
    return lambda key: key.startswith(wanted)


@click.command()
@bootstrap_option
@topic_option
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
    "--store", type=click.Choice(["auto", "memory", "columnar", "rocksdb"]), default="auto", show_default=True
)
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
@click.option("--access-log", is_flag=True, help="Log every request (uvicorn's access log).")
@storage_options
@kafka_config_options
@timeout_option
def serve(
    bootstrap_servers: str,
    topic: str,
    table: str | None,
    checkpoints: str,
    host: str,
    port: int,
    store: StoreName,
    key_prefixes: tuple[str, ...],
    require_checkpoint: bool,
    max_wait_ms: int,
    max_pending_waits: int,
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
    headers. Bad parameters answer 400.

    \b
      GET /tables/TABLE/keys/KEY        raw value bytes (404 when absent)
      GET /tables/TABLE/keys?after=K    paged scan (JSON; &prefix=P for one prefix)
      GET /tables/TABLE                 status
      GET /health  /metrics  /docs      readiness, Prometheus metrics (replica and requests),
                                        Swagger UI (served locally, works offline)
    """
    from statesnap.python.follower import Follower
    from statesnap.serve import HttpServer, create_app
    from statesnap.task.options import CheckpointOptions
    from statesnap.task.rowfilter import RowFilter

    settings = kafka_settings(bootstrap_servers, kafka_pairs, kafka_files, timeout)
    try:
        follower = Follower(
            topic,
            bootstrap_servers=settings.bootstrap_servers,
            kafka_config=dict(settings.config),
            timeout=settings.timeout,
            name=table or topic,
            checkpoints=CheckpointOptions(
                checkpoints,
                storage_options=pairs_to_dict(storage_pairs, "--storage-option"),
                require=require_checkpoint,
            )
            if checkpoints
            else None,
            store=store,
            row_filter=RowFilter(key_filter=prefix_filter(key_prefixes)),
        )
        app = create_app(
            follower,
            default_wait_ms=min(DEFAULT_WAIT_MS, max_wait_ms),
            max_wait_ms=max_wait_ms,
            max_pending_waits=max_pending_waits,
        )
        server = HttpServer(
            app, host=host, port=port, access_log=access_log, log_level="info" if access_log else "warning"
        )
        server.bind()
    except StatesnapError as e:
        raise click.ClickException(f"{type(e).__name__}: {e}") from e
    click.echo(
        f"serving table {follower.name!r} of topic {topic!r} on {server.url} "
        f"(restoring; {server.url}/health turns 200 once caught up; docs at {server.url}/docs)",
        err=True,
    )
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        # uvicorn runs on a thread: in the main thread it would re-raise SIGTERM after shutting
        # down, killing the process before the follower is closed.
        server.start()
        follower.start_in_background()
        # A failed replica must not answer 503 forever: stop and exit non-zero instead.
        while not stop.wait(0.25):
            if follower.state == "failed" or not server.running:
                break
    except StatesnapError as e:
        raise click.ClickException(f"{type(e).__name__}: {e}") from e
    finally:
        server.stop()
        follower.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    err = follower.error
    if err is not None:
        raise click.ClickException(f"{type(err).__name__}: {err}")
    if not stop.is_set():
        raise click.ClickException(f"the HTTP server on {server.url} stopped unexpectedly")
