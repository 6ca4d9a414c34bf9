"""What a handler gets: the record, and a context with the task's stores, stream time and emit."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from statesnap.processor.outputs import Outputs
from statesnap.processor.stores import Cursor, KeyValueStore, WindowStore

__all__ = ["ProcessorContext", "Record"]


@dataclass(slots=True)
class Record:
    """One input record, deserialized with the processor's serdes (bytes when none were given).

    Not frozen: a frozen dataclass costs four times as much to build, once per record."""

    key: Any
    value: Any
    topic: str
    partition: int
    offset: int
    #: Milliseconds since the epoch (the record's timestamp; -1 when it has none).
    timestamp: int
    headers: Sequence[tuple[str, bytes | None]] = ()


class ProcessorContext:
    """Handed to every handler call with the record; valid only during that call."""

    __slots__ = ("_cursor", "_outputs", "stores", "window_stores")

    def __init__(
        self,
        cursor: Cursor,
        stores: Mapping[str, KeyValueStore],
        window_stores: Mapping[str, WindowStore],
        outputs: Outputs,
    ) -> None:
        #: The task's key-value stores by name, each a view of the current record's partition.
        self.stores = stores
        #: The task's window stores by name (stores declared with a ``window``).
        self.window_stores = window_stores
        self._cursor = cursor
        self._outputs = outputs

    @property
    def stream_time(self) -> int:
        """The task's stream time: the largest record timestamp it has processed (milliseconds).
        Use it, never the wall clock, so a restore and a full re-processing decide alike."""
        return self._cursor.stream_time

    @property
    def partition(self) -> int:
        """The partition (task) of the record being processed."""
        return self._cursor.partition

    def emit(
        self,
        topic: str,
        key: Any,
        value: Any,
        *,
        headers: Mapping[str, bytes] | None = None,
        timestamp: int | None = None,
    ) -> None:
        """Send a record to *topic* (serialized with the processor's output serdes; timestamp:
        the input record's). Delivered at least once: after a crash, records emitted since the
        last checkpoint are emitted again (``exactly_once=True`` avoids it)."""
        self._outputs.emit(
            topic,
            key,
            value,
            headers,
            self._cursor.timestamp if timestamp is None else timestamp,
        )
