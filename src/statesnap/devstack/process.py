"""A child process bound to a loopback port: start, wait until it accepts connections, stop."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Self

from statesnap.devstack.orphans import guarded
from statesnap.errors import StatesnapError

__all__ = ["DevServiceError", "LoopbackService", "free_port", "port_open"]

log = logging.getLogger(__name__)


class DevServiceError(StatesnapError):
    """An embedded dev service failed to start (binary missing, port busy, crashed at start)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        socket.create_connection((host, port), timeout=0.2).close()
    except OSError:
        return False
    return True


class LoopbackService:
    """Base for services run as child processes on 127.0.0.1."""

    name = "service"
    #: Seconds between SIGTERM and SIGKILL.
    stop_grace = 5.0

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.host = "127.0.0.1"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None
        self._launched_at = 0.0

    def command(self) -> Sequence[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    def start(self, timeout: float = 30.0) -> None:
        if self._proc is not None:
            return
        self.launch()
        self.wait_started(time.monotonic() + timeout)

    def launch(self) -> None:
        """Start the process without waiting for it to answer (then :meth:`wait_started`): the
        nodes of a cluster must all run before any of them is ready."""
        if self._proc is not None:
            return
        if port_open(self.port):
            raise DevServiceError(f"{self.name}: port {self.port} is already in use")
        import tempfile

        fd, path = tempfile.mkstemp(prefix=f"statesnap-{self.name}-", suffix=".log")
        self._log_path = Path(path)
        self._proc = subprocess.Popen(
            guarded(self.command()),  # dies with this process, even on SIGKILL
            stdout=fd,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.environment(),
            start_new_session=True,
        )
        os.close(fd)
        self._launched_at = time.monotonic()
        atexit.register(self.stop)

    def wait_started(self, deadline: float) -> None:
        """Wait, until the monotonic *deadline*, for the launched process to open its port and
        pass :meth:`wait_ready`; one typed line naming what it waited for when it does not."""
        if self._proc is None:
            raise DevServiceError(f"{self.name} was not launched")
        while not port_open(self.port):
            if self._proc.poll() is not None:
                raise DevServiceError(f"{self.name} exited with {self._proc.returncode}: {self.log_tail()}")
            if time.monotonic() > deadline:
                waited = max(0.0, deadline - self._launched_at)
                self.stop()
                raise DevServiceError(f"{self.name} did not answer on port {self.port} within {waited:.3g}s")
            time.sleep(0.05)
        self.wait_ready(deadline)
        log.info("%s listening on %s:%d", self.name, self.host, self.port)

    def wait_ready(self, deadline: float) -> None:
        """Hook for a protocol-level readiness check after the port opens."""

    def log_tail(self, lines: int = 20) -> str:
        if self._log_path is None or not self._log_path.exists():
            return ""
        return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-lines:])

    @property
    def pid(self) -> int | None:
        """The service's process id (its process group's too) while it runs."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(self.stop_grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        if self._log_path is not None:
            with contextlib.suppress(OSError):
                self._log_path.unlink()

    def kill(self) -> None:
        """SIGKILL to the process group, as a crash or the OOM killer would end it: no shutdown
        hook, no flush. What it wrote to disk stays (a later ``start()`` runs on it)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        if self._log_path is not None:
            with contextlib.suppress(OSError):
                self._log_path.unlink()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
