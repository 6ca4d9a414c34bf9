"""Running the HTTP API with uvicorn: in the foreground (``statesnap serve``) or on a background
thread (tests, benchmarks, a service embedding a replica).

The listening socket is bound before uvicorn starts, so a busy port fails at once with a clear
error and ``port=0`` (any free port) is known before the first request.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any, Self

import uvicorn

from statesnap.errors import ConfigError

__all__ = ["HttpServer"]

log = logging.getLogger(__name__)


class HttpServer:
    """uvicorn serving one ASGI *app* on *host*:*port* (0: any free port)."""

    def __init__(
        self,
        app: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        access_log: bool = False,
        log_level: str = "warning",
    ) -> None:
        self.host = host
        self.requested_port = port
        # log_config=None: leave logging to the application (the CLI installs its own handler).
        self._config = uvicorn.Config(
            app,
            host=host,
            port=port,
            lifespan="off",
            access_log=access_log,
            log_level=log_level,
            log_config=None,
            timeout_graceful_shutdown=5,
        )
        self._server = uvicorn.Server(self._config)
        self._socket: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def bind(self) -> None:
        """Bind the listening socket (idempotent); raises ConfigError if the address is unusable."""
        if self._socket is not None:
            return
        try:
            family, kind, proto, _, address = socket.getaddrinfo(
                self.host, self.requested_port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
            )[0]
            # proto must say TCP: asyncio sets TCP_NODELAY on accepted connections only when it
            # does, and without it every response waits ~40 ms for a delayed ACK (measured).
            sock = socket.socket(family, kind, proto)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
        except OSError as e:
            raise ConfigError(f"cannot listen on {self.host}:{self.requested_port}: {e.strerror or e}") from e
        sock.set_inheritable(True)
        self._socket = sock

    @property
    def port(self) -> int:
        self.bind()
        assert self._socket is not None
        return int(self._socket.getsockname()[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def run(self) -> None:
        """Serve in the calling thread until SIGINT/SIGTERM (main thread) or :meth:`request_exit`."""
        self.bind()
        assert self._socket is not None
        self._server.run(sockets=[self._socket])

    @property
    def running(self) -> bool:
        """Whether a server started with :meth:`start` is still serving."""
        return self._thread is not None and self._thread.is_alive()

    def request_exit(self) -> None:
        """Ask the server to finish in-flight requests and stop (thread-safe)."""
        self._server.should_exit = True

    def start(self, timeout: float = 10.0) -> Self:
        """Serve on a daemon thread; returns once the server accepts connections."""
        if self._thread is not None:
            return self
        self.bind()
        self._thread = threading.Thread(target=self.run, name="statesnap-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise ConfigError(f"HTTP server on {self.url} stopped during start-up")
            if time.monotonic() > deadline:
                self.stop()
                raise ConfigError(f"HTTP server on {self.url} did not start within {timeout}s")
            time.sleep(0.01)
        log.info("serving on %s", self.url)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop a server started with :meth:`start` and release the socket."""
        self.request_exit()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():  # uvicorn still owns the socket; it closes it on exit
                log.warning("HTTP server on %s did not stop within %ss", self.url, timeout)
                return
            self._thread = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
