"""``statesnap broker``: the embedded dev broker in the foreground."""

from __future__ import annotations

import signal
import threading

import click

from statesnap.cli.options import emit_json, json_option
from statesnap.devstack import EmbeddedBroker


@click.command()
@click.option("--port", type=int, default=None, help="Port on 127.0.0.1 (default: a free one).")
@click.option(
    "--storage-engine", default=None, help="Tansu storage, e.g. s3://bucket/ (default: memory, lost on exit)."
)
@json_option
def broker(port: int | None, storage_engine: str | None, as_json: bool) -> None:
    """Run the embedded Kafka-protocol broker (Tansu) until Ctrl-C; prints its address.

    For development, tests and demos only: storage is in memory by default, and the broker
    under-reports high watermarks (statesnap decides "caught up" by partition EOF instead).
    """
    b = EmbeddedBroker(port, storage_engine=storage_engine)
    b.start()
    if as_json:
        emit_json({"bootstrap_servers": b.bootstrap_servers, "port": b.port})
    else:
        click.echo(f"broker listening on {b.bootstrap_servers} (Ctrl-C to stop)")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            if not b.running:
                raise click.ClickException(f"broker exited: {b.log_tail()}")
    finally:
        b.stop()
