"""``statesnap broker``: an embedded dev broker in the foreground (Tansu, or Apache Kafka)."""

from __future__ import annotations

import signal
import threading
from typing import TYPE_CHECKING

import click

from statesnap.cli.options import json_option
from statesnap.cli.output import Output

if TYPE_CHECKING:  # the devstack is imported when a broker starts
    from statesnap.devstack.process import LoopbackService

__all__ = ["broker"]


@click.command()
@click.option("--port", type=int, default=None, help="Port on 127.0.0.1 (default: a free one).")
@click.option(
    "--impl",
    type=click.Choice(["tansu", "apache"]),
    default="tansu",
    show_default=True,
    help="tansu: no Java, in memory, not Kafka in every respect; apache: Apache Kafka (single-node "
    "KRaft, Java and the jars scripts/setup.sh fetches), compaction and retention within seconds.",
)
@click.option(
    "--storage-engine", default=None, help="Tansu storage, e.g. s3://bucket/ (default: memory, lost on exit)."
)
@json_option
def broker(port: int | None, impl: str, storage_engine: str | None, as_json: bool) -> None:
    """Run an embedded Kafka broker until Ctrl-C; prints its address.

    For development, tests and demos only; its data is gone when it stops. Tansu (the default)
    under-reports high watermarks, never compacts and shows aborted transactions; Apache Kafka
    behaves as production Kafka does.
    """
    from statesnap.devstack import ApacheKafkaBroker, EmbeddedBroker

    b: LoopbackService
    if impl == "apache":
        if storage_engine is not None:
            raise click.UsageError(
                "--storage-engine is a Tansu option; Apache Kafka keeps a temporary log dir"
            )
        apache = ApacheKafkaBroker(port)
        b, address = apache, apache.bootstrap_servers
    else:
        tansu = EmbeddedBroker(port, storage_engine=storage_engine)
        b, address = tansu, tansu.bootstrap_servers
    b.start()
    Output(as_json).show(
        {"bootstrap_servers": address, "port": b.port, "impl": impl},
        f"broker ({impl}) listening on {address} (Ctrl-C to stop)",
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            if not b.running:
                raise click.ClickException(f"broker exited: {b.log_tail()}")
    finally:
        b.stop()
