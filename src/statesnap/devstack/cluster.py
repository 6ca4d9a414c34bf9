"""A three-node Apache Kafka cluster on loopback: KRaft, every node broker and controller.

The single broker (``apache.py``) proves what one log does; production runs replicated logs, and
what breaks there — a partition leader killed under acknowledged writes, a controller quorum lost,
a group coordinator moved under a static member — needs replicas on other JVMs. Each node is a
:class:`~statesnap.devstack.apache.KafkaNode` (the single broker's properties, command and storage
format) run as its own child process: it dies with the process that started it (``orphans``), and
it can be stopped, SIGKILLed and started again on the data it kept. The settings are the single
broker's plus replication 3, ``min.insync.replicas=2`` and a replicated transaction log; brokers
are fenced 2 s after their last heartbeat (production: 9 s), so a killed leader is replaced within
a few seconds.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from statesnap.devstack.apache import (
    APACHE_KAFKA_VERSION,
    TEST_SETTINGS,
    ApacheKafkaUnavailableError,
    KafkaNode,
    apache_kafka_missing,
    cause,
    new_cluster_id,
    owned_temp_dir,
    probe_config,
    registered_brokers,
)
from statesnap.devstack.process import DevServiceError, LoopbackService, free_port

__all__ = ["CLUSTER_SETTINGS", "ApacheKafkaCluster"]

log = logging.getLogger(__name__)

#: On top of the single broker's :data:`TEST_SETTINGS`: what a production cluster replicates, a
#: short broker session (a killed node is fenced, and its partitions get new leaders, within
#: seconds) and fewer threads per node (three JVMs share the machine with the suite's broker).
CLUSTER_SETTINGS: Mapping[str, str] = {
    **TEST_SETTINGS,
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "broker.session.timeout.ms": "2000",
    "broker.heartbeat.interval.ms": "500",
    "num.network.threads": "2",
    "num.io.threads": "4",
    "background.threads": "4",
    "log.cleaner.threads": "1",
}


class _NodeProcess(LoopbackService):
    """One node's JVM. Ready when the node lists every node the cluster expects running in a
    metadata answer of its own (it caught up with the quorum and is registered, unfenced)."""

    name = "apache-kafka-node"
    #: A controlled shutdown needs the controller quorum; without one it waits, then is killed.
    stop_grace = 10.0

    def __init__(self, node: KafkaNode, expected: Sequence[int]) -> None:
        super().__init__(node.port)
        self.node = node
        self.expected: set[int] = set(expected)

    def command(self) -> Sequence[str]:
        return self.node.server_command()

    def wait_ready(self, deadline: float) -> None:
        last = "no answer"
        while True:
            try:
                seen = registered_brokers(f"{self.host}:{self.port}")
                if self.expected <= seen:
                    return
                last = f"registered: {sorted(seen)}, waiting for {sorted(self.expected - seen)}"
            except Exception as e:
                last = str(e)
            if not self.running:
                raise DevServiceError(f"node {self.node.node_id} exited while starting")
            if time.monotonic() > deadline:
                raise DevServiceError(f"node {self.node.node_id} not ready before the deadline ({last})")
            time.sleep(0.1)


class ApacheKafkaCluster:
    """Three KRaft nodes (ids 0, 1, 2; each broker and controller) on 127.0.0.1, one cluster id.

    Node *i* of :meth:`stop_node`, :meth:`kill_node`, :meth:`start_node` is Kafka's node id *i*,
    as :meth:`leader_of` and :meth:`coordinator_of` answer it. ``settings`` override or add broker
    properties on top of :data:`CLUSTER_SETTINGS`; ``heap`` is each JVM's.
    """

    def __init__(
        self,
        nodes: int = 3,
        *,
        version: str = APACHE_KAFKA_VERSION,
        settings: Mapping[str, str] | None = None,
        heap: str = "320m",
    ) -> None:
        if nodes < 1:
            raise ValueError("a cluster needs at least one node")
        self.version = version
        self.heap = heap
        self.settings = {**CLUSTER_SETTINGS, **(settings or {})}
        self.cluster_id = new_cluster_id()
        self.host = "127.0.0.1"
        self._ports = [(free_port(), free_port()) for _ in range(nodes)]
        self._dir: Path | None = None
        self._nodes: list[_NodeProcess] = []

    @property
    def size(self) -> int:
        return len(self._ports)

    @property
    def bootstrap_servers(self) -> str:
        """Every node's address: a client finds the cluster while any node is up."""
        return ",".join(f"{self.host}:{port}" for port, _ in self._ports)

    def node_address(self, i: int) -> str:
        return f"{self.host}:{self._ports[i][0]}"

    @property
    def port(self) -> int:
        """The first node's port (what a single-broker caller prints)."""
        return self._ports[0][0]

    def start(self, timeout: float = 90.0) -> None:
        """Format every node's log dir with the cluster id, start the three JVMs and wait until
        each lists all three as registered brokers. Raises :class:`ApacheKafkaUnavailableError`
        when Java or the jars are missing, :class:`DevServiceError` (one line) otherwise."""
        if self._nodes:
            return
        missing = apache_kafka_missing(self.version)
        if missing is not None:
            raise ApacheKafkaUnavailableError(missing)
        deadline = time.monotonic() + timeout
        self._dir = owned_temp_dir()
        voters = ",".join(f"{i}@{self.host}:{controller}" for i, (_, controller) in enumerate(self._ports))
        everyone = range(self.size)
        try:
            for i, (port, controller) in enumerate(self._ports):
                node = KafkaNode(
                    node_id=i,
                    host=self.host,
                    port=port,
                    controller_port=controller,
                    voters=voters,
                    directory=self._dir / f"node-{i}",
                    settings=self.settings,
                    version=self.version,
                    heap=self.heap,
                )
                node.write_config()
                node.format(self.cluster_id, deadline)
                self._nodes.append(_NodeProcess(node, everyone))
            for n in self._nodes:  # a quorum forms only once a majority runs: launch all, then wait
                n.launch()
            for n in self._nodes:
                self._wait(n, deadline)
        except BaseException:
            self.stop()
            raise
        log.info("Apache Kafka cluster of %d nodes on %s", self.size, self.bootstrap_servers)

    def _wait(self, n: _NodeProcess, deadline: float) -> None:
        try:
            n.wait_started(deadline)
        except DevServiceError as e:
            reason = cause(n.log_tail(200)) or str(e).splitlines()[0]
            where = self.node_address(n.node.node_id)
            raise DevServiceError(
                f"Apache Kafka {self.version} cluster node {n.node.node_id} on {where}: {reason}"
            ) from None

    def _node(self, i: int) -> _NodeProcess:
        if not self._nodes:
            raise DevServiceError("the Apache Kafka cluster is not started")
        return self._nodes[i]

    @property
    def pids(self) -> list[int | None]:
        """Each node's process id (its process group's too) while it runs."""
        return [n.pid for n in self._nodes]

    def node_running(self, i: int) -> bool:
        return self._node(i).running

    @property
    def running(self) -> bool:
        """Every node runs (as a single broker's ``running``)."""
        return bool(self._nodes) and all(n.running for n in self._nodes)

    def stop_node(self, i: int) -> None:
        """SIGTERM: Kafka's controlled shutdown (leadership moved away first), SIGKILL after
        10 s (a node without a controller quorum cannot finish one). Its data stays."""
        self._node(i).stop()

    def kill_node(self, i: int) -> None:
        """SIGKILL, as a crash would end it: no controlled shutdown, no flush. Its data stays."""
        self._node(i).kill()

    def start_node(self, i: int, timeout: float = 60.0) -> None:
        """Start node *i* again on the log dir it kept; wait until it and every other running
        node are registered (with a quorum: a node started while a majority is down waits)."""
        n = self._node(i)
        if n.running:
            return
        n.expected = {j for j, other in enumerate(self._nodes) if other.running or j == i}
        try:
            n.launch()
            self._wait(n, time.monotonic() + timeout)
        finally:
            n.expected = set(range(self.size))

    def registered(self, timeout: float = 2.0) -> set[int]:
        """The node ids a metadata answer lists now (registered, unfenced)."""
        return registered_brokers(self.bootstrap_servers, timeout)

    def leader_of(self, topic: str, partition: int, timeout: float = 5.0) -> int:
        """The node leading *partition* of *topic* now, as the cluster's metadata says (-1: none)."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(probe_config(self.bootstrap_servers))
        meta = admin.list_topics(topic, timeout=timeout).topics[topic]
        if meta.error is not None:
            raise DevServiceError(f"no metadata for topic {topic}: {meta.error}")
        return int(meta.partitions[partition].leader)

    def wait_for_leader(
        self, topic: str, partition: int, *, not_on: int | None = None, timeout: float = 30.0
    ) -> int:
        """Wait until *partition* has a leader (other than node *not_on*); its node id."""
        deadline = time.monotonic() + timeout
        last: object = None
        while True:
            try:
                last = self.leader_of(topic, partition, timeout=2.0)
                if last >= 0 and last != not_on:
                    return int(last)
            except Exception as e:
                last = e
            if time.monotonic() > deadline:
                raise DevServiceError(
                    f"{topic}[{partition}] had no new leader within {timeout:g}s (last: {last})"
                )
            time.sleep(0.2)

    def coordinator_of(self, group: str, timeout: float = 5.0) -> int:
        """The node coordinating consumer group *group* now (the group must exist)."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(probe_config(self.bootstrap_servers))
        description = admin.describe_consumer_groups([group], request_timeout=timeout)[group].result(timeout)
        return int(description.coordinator.id)

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of every running node's output, each line prefixed by its node."""
        return "\n".join(
            f"[node {n.node.node_id}] {line}" for n in self._nodes for line in n.log_tail(lines).splitlines()
        )

    def stop(self) -> None:
        """Stop every node (a controlled shutdown each, in turn) and remove the log dirs."""
        nodes, self._nodes = self._nodes, []
        for n in reversed(nodes):  # the last node standing has no quorum: killed after its grace
            n.stop_grace = 3.0
            n.stop()
        d, self._dir = self._dir, None
        if d is not None:
            with contextlib.suppress(OSError):
                shutil.rmtree(d)

    def __enter__(self) -> ApacheKafkaCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
