"""A Spark standalone cluster on 127.0.0.1, started from the pyspark installation.

pyspark ships ``bin/spark-class`` and every jar but not ``sbin/start-master.sh``; the master and
the workers are started here as ``spark-class org.apache.spark.deploy.master.Master`` and
``...worker.Worker`` child processes, each in its own process group (a worker's executors are its
children, so stopping the group stops them too). Workers get one core and little memory each,
work directories and logs under one temporary directory, and an environment without AWS, PySpark
or statesnap settings: what reaches an executor must travel with the job, as on a real cluster.

Used by the cluster tests (``conftest.py``) and ``benchmarks/spark_bootstrap.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from statesnap.devstack.orphans import guarded
from statesnap.devstack.process import free_port, port_open

#: Environment variables a worker must not inherit from the test process (a real cluster's
#: workers do not have the driver's credentials or interpreter settings).
_PRIVATE_PREFIXES = ("AWS_", "PYSPARK_", "STATESNAP_", "SPARK_")


class ClusterError(RuntimeError):
    """The standalone cluster did not start (Java or spark-class missing, a daemon died)."""


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def java_available() -> bool:
    return shutil.which("java") is not None or bool(os.environ.get("JAVA_HOME"))


@dataclass
class _Daemon:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path


@dataclass
class StandaloneCluster:
    """``with StandaloneCluster(root, workers=2) as cluster: cluster.master_url``."""

    root: Path
    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    daemon_memory: str = "256m"
    master_port: int = field(default_factory=free_port)
    master_ui_port: int = field(default_factory=free_port)
    _daemons: list[_Daemon] = field(default_factory=list)

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pids(self) -> list[int]:
        """The daemons' process ids (master first)."""
        return [d.proc.pid for d in self._daemons]

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(_PRIVATE_PREFIXES)}
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_DAEMON_MEMORY=self.daemon_memory,
            SPARK_LOG_DIR=str(self.logs),
        )
        return env

    def _spawn(self, name: str, main_class: str, *args: str) -> _Daemon:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{name}.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                # SIGTERM if the test run dies: the JVMs' shutdown hooks stop executors too.
                guarded([str(spark_home() / "bin" / "spark-class"), main_class, *args], signal.SIGTERM),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self._env(),
                start_new_session=True,
            )
        daemon = _Daemon(name, proc, log)
        self._daemons.append(daemon)
        return daemon

    def start(self, timeout: float = 90.0) -> None:
        if not java_available():
            raise ClusterError("no Java runtime: java on PATH or JAVA_HOME")
        deadline = time.monotonic() + timeout
        master = self._spawn(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.master_port),
            "--webui-port",
            str(self.master_ui_port),
        )
        self._wait(lambda: port_open(self.master_port) and port_open(self.master_ui_port), master, deadline)
        for i in range(self.workers):
            work = self.root / f"worker-{i}"
            work.mkdir(parents=True, exist_ok=True)
            self._spawn(
                f"worker-{i}",
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                "127.0.0.1",
                "--webui-port",
                str(free_port()),
                "--cores",
                str(self.cores),
                "--memory",
                self.memory,
                "--work-dir",
                str(work),
                self.master_url,
            )
        self._wait(lambda: self.alive_workers() == self.workers, master, deadline)

    def _wait(self, ready: object, daemon: _Daemon, deadline: float) -> None:
        assert callable(ready)
        while not ready():
            for d in self._daemons:
                if d.proc.poll() is not None:
                    self.stop()
                    raise ClusterError(f"{d.name} exited with {d.proc.returncode}:\n{self.tail(d.name)}")
            if time.monotonic() > deadline:
                self.stop()
                raise ClusterError(f"{daemon.name} not ready in time:\n{self.tail(daemon.name)}")
            time.sleep(0.2)

    def status(self) -> dict[str, object]:
        """The master's view (``/json``): workers, their state and cores, running applications."""
        url = f"http://127.0.0.1:{self.master_ui_port}/json/"
        with urllib.request.urlopen(url, timeout=2) as r:
            data: dict[str, object] = json.loads(r.read())
        return data

    def alive_workers(self) -> int:
        try:
            workers = self.status().get("workers", [])
        except (OSError, ValueError):  # not up, or still serving its HTML page at /json/ (start-up)
            return 0
        assert isinstance(workers, list)
        return sum(1 for w in workers if w.get("state") == "ALIVE")

    def tail(self, name: str, lines: int = 40) -> str:
        path = self.logs / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM every daemon's process group (workers first: their executors go with them),
        then SIGKILL what is left after a grace period."""
        daemons, self._daemons = self._daemons[::-1], []
        for d in daemons:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(d.proc.pid, signal.SIGTERM)
        for d in daemons:
            try:
                d.proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(d.proc.pid, signal.SIGKILL)
                d.proc.wait(5)

    def __enter__(self) -> StandaloneCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def executor_pids(app_id: str | None = None) -> list[int]:
    """Executor JVMs (``CoarseGrainedExecutorBackend``) on this machine, of *app_id* if given."""
    return [pid for pid, _ in _executors(app_id)]


def _executors(app_id: str | None) -> Iterator[tuple[int, list[str]]]:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv]
        if "org.apache.spark.executor.CoarseGrainedExecutorBackend" not in args:
            continue
        if app_id is not None and app_id not in args:
            continue
        yield int(entry.name), args
