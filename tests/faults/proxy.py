"""A TCP proxy for outages of a service whose data must survive them (moto keeps it in memory)."""

from __future__ import annotations

import contextlib
import threading
from typing import Any


class TcpProxy:
    """A loopback TCP proxy in front of a service: ``down()`` resets every connection and refuses
    new ones (the endpoint died), ``up()`` listens again on the same port (it came back) — with
    the service's data intact, unlike restarting moto, which keeps everything in memory."""

    def __init__(self, target_port: int) -> None:
        from statesnap.devstack.process import free_port

        self.target = target_port
        self.port = free_port()
        self._listener: Any = None
        self._sockets: list[Any] = []
        self._lock = threading.Lock()
        self.silent = False

    def up(self, *, silent: bool = False) -> None:
        """Listen again; *silent*: accept connections and never answer (a blackholed endpoint)."""
        import socket

        self.silent = silent

        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        import socket

        with self._lock:
            sockets, self._sockets = self._sockets, []
            listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for s in sockets:
            with contextlib.suppress(OSError):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)  # wakes the pump blocked in recv(): close() alone does not
            with contextlib.suppress(OSError):
                s.close()  # RST, as from a dead host's kernel

    def _accept(self, listener: Any) -> None:
        import socket

        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            if self.silent:
                with self._lock:
                    self._sockets.append(client)
                continue
            try:
                server = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    server.close()
                    return
                self._sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: Any, dst: Any) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.close()
            with contextlib.suppress(OSError):
                src.close()
