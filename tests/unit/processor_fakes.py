"""Fakes for the processor's unit tests that run a handler over records without a broker: a
message with the fields ``ProcessorHandler`` reads, and outputs whose producer is a list."""

from __future__ import annotations

from typing import Any

from statesnap import Processor
from statesnap.kafka.config import KafkaSettings
from statesnap.processor.outputs import Outputs

__all__ = ["Message", "Recorded"]


class Message:
    __slots__ = ("_key", "_offset", "_ts", "_value")

    def __init__(self, key: bytes | None, value: bytes | None, offset: int, ts: int | None) -> None:
        self._key, self._value, self._offset, self._ts = key, value, offset, ts

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (0, -1) if self._ts is None else (1, self._ts)

    def topic(self) -> str:
        return "events"

    def headers(self) -> None:
        return None


class Recorded(Outputs):
    """Outputs whose producer is a list: what would have been sent, in order."""

    def __init__(self, proc: Processor) -> None:
        super().__init__(KafkaSettings("localhost:1"), proc.key_serde, proc.value_serde)
        self.sent: list[tuple[str, bytes | None, bytes | None, int]] = []

    @property
    def producer(self) -> Any:
        return None

    def _produce(
        self,
        producer: Any,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]] | None,
        ts: int,
    ) -> None:
        self.sent.append((topic, key, value, ts))
