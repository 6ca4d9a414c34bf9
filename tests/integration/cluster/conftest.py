"""Tests here run on a three-node Apache Kafka cluster (``ApacheKafkaCluster``: KRaft, every node
broker and controller, replication 3, ``min.insync.replicas=2``, replicated offsets and transaction
logs), started once per session on first use and skipped, with what to install, where Java or the
jars ``bash scripts/setup.sh`` fetches are missing.

Each test kills or stops nodes and leaves all three running (the ``cluster`` fixture restarts any a
failed test left down). The cases are faults, so they count in the fault suite's ledger
(``faults.ledger``): ``ledger.tried("cluster_faults")`` per node kill, quorum loss or fencing; the
summary prints at the end of any session that ran one.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

from faults.ledger import CaseLedger, pytest_runtest_makereport, pytest_sessionfinish, session_ledger
from faults.ledger import pytest_terminal_summary as fault_summary
from integration.conftest import KafkaTool
from statesnap.devstack.apache import apache_kafka_missing
from statesnap.devstack.cluster import ApacheKafkaCluster

__all__ = ["pytest_runtest_makereport", "pytest_sessionfinish", "pytest_terminal_summary"]

pytestmark = pytest.mark.integration

#: How long the session's cluster took to start (seconds), reported in the run's summary.
START_TIMES: list[float] = []


@pytest.fixture(scope="session")
def kafka_cluster() -> Iterator[ApacheKafkaCluster]:
    """Three Apache Kafka nodes on loopback (see the module docstring); they die with the run."""
    if (missing := apache_kafka_missing()) is not None:
        pytest.skip(missing)
    cluster = ApacheKafkaCluster()
    began = time.monotonic()
    cluster.start()
    START_TIMES.append(time.monotonic() - began)
    yield cluster
    cluster.stop()


@pytest.fixture
def cluster(kafka_cluster: ApacheKafkaCluster) -> Iterator[ApacheKafkaCluster]:
    """The session's cluster with all three nodes running, before and after the test."""
    _restore(kafka_cluster)
    yield kafka_cluster
    _restore(kafka_cluster)


def _restore(cluster: ApacheKafkaCluster) -> None:
    for i in range(cluster.size):
        if not cluster.node_running(i):
            cluster.start_node(i)


class ClusterTool:
    """The integration suite's :class:`KafkaTool` (acks=all producer, plain-consumer ground truth)
    on the cluster, with topics replicated to all three nodes."""

    def __init__(self, cluster: ApacheKafkaCluster) -> None:
        self.cluster = cluster
        self.tool = KafkaTool(cluster.bootstrap_servers)
        self.bootstrap = cluster.bootstrap_servers

    def create_topic(self, prefix: str, partitions: int) -> str:
        """A new topic, replication 3 (``min.insync.replicas=2`` from the brokers), every
        partition with a leader and all three replicas in sync."""
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        admin = self.tool.admin
        admin.create_topics([NewTopic(name, partitions, 3)])[name].result(30)
        deadline = time.monotonic() + 30
        while True:
            md = admin.list_topics(topic=name, timeout=5).topics.get(name)
            if (
                md is not None
                and md.error is None
                and len(md.partitions) == partitions
                and all(p.leader >= 0 and len(p.isrs) == 3 for p in md.partitions.values())
            ):
                return name
            assert time.monotonic() < deadline, f"topic {name} did not get 3 in-sync replicas"
            time.sleep(0.1)

    def close(self) -> None:
        self.tool.close()


@pytest.fixture(scope="session")
def ctool(kafka_cluster: ApacheKafkaCluster) -> Iterator[ClusterTool]:
    tool = ClusterTool(kafka_cluster)
    yield tool
    tool.close()


@pytest.fixture
def ledger(request: pytest.FixtureRequest) -> CaseLedger:
    return CaseLedger(session_ledger(request.config), request.node.nodeid)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """The fault suite's summary (once, whichever conftest asks first), then the cluster's start."""
    fault_summary(terminalreporter, config)
    if START_TIMES:
        terminalreporter.write_line(f"three-node Apache Kafka cluster started in {START_TIMES[0]:.1f} s")
