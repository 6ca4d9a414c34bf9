"""The engine of a processor: a table task whose handler runs the processor's code.

Everything a table does around its handler — open, restore, catch up, commit points,
checkpoints, snapshots, GC, consumer groups — a processor task does through the same code
(:class:`~statesnap.Table`); only :meth:`ProcessorTask._new_handler` differs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from statesnap.checkpoint import CheckpointManifest
from statesnap.python.consuming import RecordHandler
from statesnap.python.table import Table
from statesnap.task.opening import OpenedTask

__all__ = ["ProcessorTask"]


class ProcessorTask(Table[bytes, bytes]):
    """A processor's task. *make_handler* builds the handler for the task's (current) store;
    *describes* goes into every manifest it writes (inputs, stores)."""

    def __init__(
        self,
        topic: str,
        *,
        make_handler: Callable[[ProcessorTask], RecordHandler],
        describes: Mapping[str, Any],
        **table_options: Any,
    ) -> None:
        self._make_handler = make_handler
        self._describes = dict(describes)
        super().__init__(topic, **table_options)

    def _new_handler(self) -> RecordHandler:
        return self._make_handler(self)

    @property
    def handler(self) -> RecordHandler:
        return self._handler

    def _join_snapshots(self, task: OpenedTask, manifest: CheckpointManifest | None) -> None:
        super()._join_snapshots(task, manifest)
        assert self.snapshots is not None
        self.snapshots.describes = self._describes

    def __repr__(self) -> str:
        return f"ProcessorTask(name={self.name!r}, input={self.topic!r}, state={self._state.value!r})"
