"""A real Apache Kafka broker on loopback: single-node KRaft, jars from the Maven cache.

Tansu (``broker.py``) needs no Java but is not Kafka: it never compacts or deletes, misreports high
watermarks and shows aborted transactions (see DESIGN.md). Tests that prove Kafka behaviour run on
this broker instead. ``bash scripts/setup.sh`` fetches the pinned version's jars (kafka_2.13 and its
runtime dependencies, via ``scripts/apache-kafka/pom.xml``) into
``~/.cache/statesnap/apache-kafka-<version>/libs/``; :meth:`ApacheKafkaBroker.start` formats a
fresh KRaft log directory in a temporary directory, starts ``kafka.Kafka`` on it and removes it on
``stop()``. The settings let the log cleaner act within seconds, so a test can watch compaction
happen, and keep records of any timestamp: time retention is off unless a topic asks for it
(``retention.ms``), and then acts within seconds too.

One node's properties, JVM command and storage format are :class:`KafkaNode`'s, shared with the
three-node cluster (``cluster.py``).
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from statesnap.devstack.process import DevServiceError, LoopbackService, free_port

__all__ = [
    "APACHE_KAFKA_VERSION",
    "ApacheKafkaBroker",
    "ApacheKafkaUnavailableError",
    "KafkaNode",
    "apache_kafka_libs",
    "apache_kafka_missing",
    "new_cluster_id",
]

#: The pinned broker version; scripts/apache-kafka/pom.xml must name the same one.
APACHE_KAFKA_VERSION = "4.1.1"

#: Broker settings that make the log cleaner act within a test's seconds rather than the production
#: minutes/hours, and let one node hold every internal topic. Time retention is off
#: (``log.retention.ms=-1``): Kafka's default of 7 days would delete, within a second here, any
#: record whose timestamp is older than that — event-time test data with historical timestamps.
#: A test that exercises retention sets ``retention.ms`` on its topic; the checks still run every
#: 200 ms, so that retention acts within seconds.
TEST_SETTINGS: Mapping[str, str] = {
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "group.initial.rebalance.delay.ms": "0",
    "num.partitions": "1",
    "auto.create.topics.enable": "false",
    "log.retention.ms": "-1",
    "log.cleaner.backoff.ms": "200",
    "log.cleaner.min.compaction.lag.ms": "0",
    "log.cleaner.min.cleanable.ratio": "0.01",
    "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
    "log.cleaner.threads": "1",
    "log.retention.check.interval.ms": "200",
    "log.segment.delete.delay.ms": "0",
    "log.initial.task.delay.ms": "0",
    "log.flush.offset.checkpoint.interval.ms": "500",
    "log.flush.start.offset.checkpoint.interval.ms": "500",
    "file.delete.delay.ms": "0",
}


class ApacheKafkaUnavailableError(DevServiceError):
    """Java or the Apache Kafka jars are missing: install Java 17+ (``java`` on PATH or
    ``JAVA_HOME``) and Maven, then run ``bash scripts/setup.sh`` to fetch the jars."""


def apache_kafka_libs(version: str = APACHE_KAFKA_VERSION) -> Path:
    """Where ``scripts/setup.sh`` puts the broker's jars (``$XDG_CACHE_HOME`` or ``~/.cache``)."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "statesnap" / f"apache-kafka-{version}" / "libs"


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


def apache_kafka_missing(version: str = APACHE_KAFKA_VERSION) -> str | None:
    """Why the broker cannot start here (one line), or None when Java and the jars are present."""
    if _java() is None:
        return "Apache Kafka needs Java 17+: install a JDK (java on PATH or JAVA_HOME), then run setup.sh"
    libs = apache_kafka_libs(version)
    if not (libs / f"kafka_2.13-{version}.jar").is_file():
        return f"Apache Kafka {version} jars not in {libs}: run bash scripts/setup.sh (needs Java and mvn)"
    return None


def new_cluster_id() -> str:
    """A KRaft cluster id as ``kafka-storage random-uuid`` makes one: 16 random bytes, URL-safe
    base64 without padding — never starting with ``-``, which the storage tool's argument parser
    takes for an option (about one id in 64 would)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.out.ref = OUT
"""


_DIR_PREFIX = "statesnap-apache-kafka-"
_OWNER = "owner.pid"


def _sweep_orphaned_dirs() -> None:
    """Remove the log dirs of brokers whose starting process died without ``stop()`` (a test run
    killed by SIGKILL: its broker died with it, see ``orphans``, but the directory stayed)."""
    for d in Path(tempfile.gettempdir()).glob(f"{_DIR_PREFIX}*"):
        try:
            owner = int((d / _OWNER).read_text())
        except (OSError, ValueError):
            continue  # not ours, or still being created
        try:
            os.kill(owner, 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except OSError:
            continue  # alive, under another user


def owned_temp_dir() -> Path:
    """A fresh temporary directory for brokers' log dirs, marked with this process as its owner
    (so that a later start sweeps it if this process dies without ``stop()``)."""
    _sweep_orphaned_dirs()
    d = Path(tempfile.mkdtemp(prefix=_DIR_PREFIX))
    (d / _OWNER).write_text(str(os.getpid()))
    return d


def cause(output: str) -> str:
    """The line of a JVM's output that says what went wrong: the first ERROR or exception line
    (not a stack frame), else the last line; at most 300 characters."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip() and not ln.lstrip().startswith("at ")]
    for line in lines:
        if " ERROR " in line or "Exception" in line:
            return line[:300]
    return lines[-1][:300] if lines else ""


@dataclass(frozen=True)
class KafkaNode:
    """One KRaft node (broker and controller in one JVM) as configured on disk: its properties,
    the JVM command that runs it and the storage format of its log directory. Shared by the
    single broker and each node of :class:`~statesnap.devstack.cluster.ApacheKafkaCluster`."""

    node_id: int
    host: str
    port: int
    controller_port: int
    #: ``controller.quorum.voters``: every controller of the cluster, ``id@host:port`` joined by ``,``.
    voters: str
    #: The node's own directory: properties, log4j configuration and ``data/`` (its log dir).
    directory: Path
    settings: Mapping[str, str]
    version: str = APACHE_KAFKA_VERSION
    heap: str = "512m"

    @property
    def voter(self) -> str:
        return f"{self.node_id}@{self.host}:{self.controller_port}"

    def properties(self) -> dict[str, str]:
        return {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": self.voters,
            "listeners": f"PLAINTEXT://{self.host}:{self.port},CONTROLLER://{self.host}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{self.host}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.directory / "data"),
            **self.settings,
        }

    def write_config(self) -> None:
        """``server.properties`` and the log4j configuration, in the node's directory."""
        self.directory.mkdir(parents=True, exist_ok=True)
        props = "".join(f"{k}={v}\n" for k, v in self.properties().items())
        (self.directory / "server.properties").write_text(props)
        (self.directory / "log4j2.properties").write_text(_LOG4J2)

    def java_command(self, main: str, *args: str) -> list[str]:
        java = _java()
        missing = apache_kafka_missing(self.version)
        if java is None or missing is not None:
            raise ApacheKafkaUnavailableError(missing or "java not found")
        return [
            java,
            f"-Xmx{self.heap}",
            "-Xss1m",
            "-XX:+UseG1GC",
            "-XX:TieredStopAtLevel=1",  # C1 only: starts ~1 s sooner, fast enough for tests
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.directory / 'log4j2.properties'}",
            "-cp",
            str(apache_kafka_libs(self.version) / "*"),
            main,
            *args,
        ]

    def server_command(self) -> list[str]:
        return self.java_command("kafka.Kafka", str(self.directory / "server.properties"))

    def format(self, cluster_id: str, deadline: float) -> None:
        """``kafka-storage format``: write the cluster id and bootstrap metadata into the log dir."""
        cmd = self.java_command(
            "kafka.tools.StorageTool",
            "format",
            "-t",
            cluster_id,
            "-c",
            str(self.directory / "server.properties"),
        )
        try:
            out = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,
                timeout=max(1.0, deadline - time.monotonic()),
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise DevServiceError(
                f"Apache Kafka {self.version}: formatting the KRaft log directory did not finish in time"
            ) from None
        if out.returncode != 0:
            raise DevServiceError(
                f"Apache Kafka {self.version}: formatting the KRaft log directory failed "
                f"({out.returncode}): {cause(out.stderr + out.stdout) or 'no output'}"
            )


def probe_config(bootstrap_servers: str) -> dict[str, str | int | float | bool]:
    """Client settings of the dev stack's own short-lived admin clients: quiet, since a probe of a
    node that is down (starting, or killed by a test) is expected to fail."""
    return {"bootstrap.servers": bootstrap_servers, "log_level": 0}


def registered_brokers(bootstrap_servers: str, timeout: float = 1.0) -> set[int]:
    """The ids of the brokers a metadata answer lists (registered with the controller, unfenced).
    Raises what the admin client raises when nothing answers."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(probe_config(bootstrap_servers))
    return set(admin.list_topics(timeout=timeout).brokers)


class ApacheKafkaBroker(LoopbackService):
    """Single-node KRaft Apache Kafka (broker and controller in one JVM) on 127.0.0.1.

    ``settings`` override or add broker properties on top of :data:`TEST_SETTINGS`.
    """

    name = "apache-kafka"
    #: A controlled shutdown of one node takes a second or two; its data is thrown away anyway.
    stop_grace = 10.0

    def __init__(
        self,
        port: int | None = None,
        *,
        version: str = APACHE_KAFKA_VERSION,
        settings: Mapping[str, str] | None = None,
        heap: str = "512m",
    ) -> None:
        super().__init__(port)
        self.version = version
        self.controller_port = free_port()
        self.heap = heap
        self.settings = {**TEST_SETTINGS, **(settings or {})}
        self.cluster_id = new_cluster_id()
        self._dir: Path | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    def node(self) -> KafkaNode:
        """This broker as a KRaft node (built when asked: ``controller_port`` may be changed
        before ``start()``)."""
        assert self._dir is not None
        return KafkaNode(
            node_id=1,
            host=self.host,
            port=self.port,
            controller_port=self.controller_port,
            voters=f"1@{self.host}:{self.controller_port}",
            directory=self._dir,
            settings=self.settings,
            version=self.version,
            heap=self.heap,
        )

    def command(self) -> Sequence[str]:
        return self.node().server_command()

    def server_properties(self) -> dict[str, str]:
        return self.node().properties()

    def start(self, timeout: float = 60.0) -> None:
        """Format a fresh log directory, start the broker, wait until it serves metadata.

        Raises :class:`ApacheKafkaUnavailableError` when Java or the jars are missing, and
        :class:`DevServiceError` (one line) when formatting or start-up fails or outlives *timeout*.
        """
        if self._proc is not None:
            return
        missing = apache_kafka_missing(self.version)
        if missing is not None:
            raise ApacheKafkaUnavailableError(missing)
        deadline = time.monotonic() + timeout
        self._dir = owned_temp_dir()
        try:
            node = self.node()
            node.write_config()
            node.format(self.cluster_id, deadline)
            try:
                super().start(max(1.0, deadline - time.monotonic()))
            except DevServiceError as e:
                reason = self._failure_line() or str(e).splitlines()[0]
                raise DevServiceError(
                    f"Apache Kafka {self.version} on {self.bootstrap_servers}: {reason}"
                ) from None
        except BaseException:
            self.stop()
            raise

    def _failure_line(self) -> str:
        return cause(self.log_tail(200))

    def wait_ready(self, deadline: float) -> None:
        """Ready when the broker lists itself in a metadata answer (registered with the controller)."""
        last = "no answer"
        while True:
            try:
                if registered_brokers(self.bootstrap_servers):
                    return
                last = "no broker registered yet"
            except Exception as e:
                last = str(e)
            if self._proc is not None and self._proc.poll() is not None:
                raise DevServiceError(f"exited with {self._proc.returncode} while starting")
            if time.monotonic() > deadline:
                raise DevServiceError(f"did not serve metadata before the start-up deadline ({last})")
            time.sleep(0.1)

    def stop(self) -> None:
        super().stop()
        d, self._dir = self._dir, None
        if d is not None:
            with contextlib.suppress(OSError):
                shutil.rmtree(d)
