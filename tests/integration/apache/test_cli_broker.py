"""``statesnap broker --impl apache``, run as a user runs it (a fresh interpreter)."""

from __future__ import annotations

import json
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from integration.cli_runner import statesnap
from statesnap.devstack.apache import apache_kafka_missing
from statesnap.devstack.process import port_open

pytestmark = pytest.mark.integration


def _first_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    if not sel.select(timeout):
        raise AssertionError(f"no output within {timeout}s")
    return proc.stdout.readline()


@pytest.mark.parametrize(
    ("impl", "nodes"),
    [("apache", 1), (None, 1), pytest.param("apache", 3, marks=pytest.mark.long)],
    ids=["apache", "tansu", "apache-3-nodes"],
)
def test_broker_serves_kafka_until_stopped(impl: str | None, nodes: int) -> None:
    """Apache Kafka 4.1.1 proved it (and Tansu, the default without --impl): the command prints
    the address as JSON, a Kafka client gets the cluster's metadata there, and SIGTERM stops the
    broker (its port closes). With --nodes 3, metadata lists three brokers."""
    if impl == "apache" and (missing := apache_kafka_missing()) is not None:
        pytest.skip(missing)
    proc = subprocess.Popen(
        [
            *[sys.executable, "-m", "statesnap.cli", "broker", "--json"],
            *(["--impl", impl] if impl else []),
            *(["--nodes", str(nodes)] if nodes > 1 else []),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out = json.loads(_first_line(proc, 90 * nodes))
        assert out["impl"] == (impl or "tansu")
        admin = AdminClient({"bootstrap.servers": out["bootstrap_servers"]})
        assert len(admin.list_topics(timeout=10).brokers) == nodes
        assert admin.describe_cluster().result(10).cluster_id
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        deadline = time.monotonic() + 15
        while port_open(out["port"]):
            assert time.monotonic() < deadline, "the broker outlived the command"
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_broker_impl_apache_without_jars_is_one_line(tmp_path: Path) -> None:
    """No jar cache (a fresh XDG cache dir): one typed line saying to run setup.sh, exit 1."""
    result = statesnap("broker", "--impl", "apache", env={"XDG_CACHE_HOME": str(tmp_path)}, timeout=60)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "ApacheKafkaUnavailableError" in lines[0]
    assert "scripts/setup.sh" in lines[0]


def test_storage_engine_is_refused_for_apache() -> None:
    result = statesnap("broker", "--impl", "apache", "--storage-engine", "s3://b/", timeout=60)
    assert result.returncode == 2
    assert "--storage-engine is a Tansu option" in result.stderr


def test_help_says_the_apache_broker_keeps_old_records() -> None:
    """Issue 34: the dev Apache broker used to delete records timestamped over 7 days ago within a
    second while --help said only "retention within seconds"; it now keeps every record unless a
    topic sets retention.ms, and says so."""
    result = statesnap("broker", "--help", timeout=60)
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "keeps records of any timestamp" in text
    assert "unless a topic sets retention.ms" in text
    assert "--nodes" in text


def test_nodes_are_an_apache_option() -> None:
    result = statesnap("broker", "--nodes", "3", timeout=60)
    assert result.returncode == 2
    assert "--nodes is an Apache Kafka option" in result.stderr
