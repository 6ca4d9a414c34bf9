"""``statesnap broker``: an embedded dev broker in the foreground (Tansu, or Apache Kafka)."""

from __future__ import annotations

import signal
import threading
from typing import Protocol

import click

from statesnap.cli.docs import docs_page
from statesnap.cli.options import json_option
from statesnap.cli.output import Output

__all__ = ["broker"]


class _DevBroker(Protocol):
    """What this command needs of a dev broker: one node or a cluster."""

    @property
    def bootstrap_servers(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def running(self) -> bool: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def log_tail(self, lines: int = 20) -> str: ...


@docs_page("tutorials/tables.md")
@click.command()
@click.option("--port", type=int, default=None, help="Port on 127.0.0.1 (default: a free one).")
@click.option(
    "--impl",
    type=click.Choice(["tansu", "apache"]),
    default="tansu",
    show_default=True,
    help="tansu: no Java, in memory, not Kafka in every respect; apache: Apache Kafka (KRaft, Java "
    "and the jars scripts/setup.sh fetches) that compacts within seconds and keeps records of any "
    "timestamp: no time retention unless a topic sets retention.ms (then it acts within seconds).",
)
@click.option(
    "--nodes",
    type=click.IntRange(1, 5),
    default=1,
    show_default=True,
    help="Apache Kafka nodes (each broker and controller); 3: replication 3, min.insync.replicas 2.",
)
@click.option(
    "--storage-engine", default=None, help="Tansu storage, e.g. s3://bucket/ (default: memory, lost on exit)."
)
@json_option
def broker(port: int | None, impl: str, nodes: int, storage_engine: str | None, as_json: bool) -> None:
    """Run an embedded Kafka broker until Ctrl-C; prints its address.

    For development, tests and demos only; its data is gone when it stops. Tansu (the default)
    under-reports high watermarks, never compacts and shows aborted transactions; Apache Kafka
    behaves as production Kafka does, except that it never deletes old records unless a topic
    asks for retention (retention.ms).
    """
    from statesnap.devstack import ApacheKafkaBroker, EmbeddedBroker
    from statesnap.devstack.cluster import ApacheKafkaCluster

    b: _DevBroker
    if impl == "apache":
        if storage_engine is not None:
            raise click.UsageError(
                "--storage-engine is a Tansu option; Apache Kafka keeps a temporary log dir"
            )
        if nodes > 1:
            if port is not None:
                raise click.UsageError("--port is for one node; a cluster's nodes take free ports")
            b = ApacheKafkaCluster(nodes)
        else:
            b = ApacheKafkaBroker(port)
    else:
        if nodes != 1:
            raise click.UsageError("--nodes is an Apache Kafka option (--impl apache)")
        b = EmbeddedBroker(port, storage_engine=storage_engine)
    b.start()
    address = b.bootstrap_servers
    shown = f"{impl}, {nodes} nodes" if nodes > 1 else impl
    Output(as_json).show(
        {"bootstrap_servers": address, "port": b.port, "impl": impl, "nodes": nodes},
        f"broker ({shown}) listening on {address} (Ctrl-C to stop)",
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
