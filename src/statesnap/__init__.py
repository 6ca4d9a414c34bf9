"""statesnap: checkpointed, snapshot-able Kafka tables for Python services and PySpark pipelines.

The public names load on first use (PEP 562): ``import statesnap`` — which every
``import statesnap.x`` runs first, the ``statesnap`` command's included — does not import pyarrow,
numpy, Kafka's client or the engines until a name that needs them is read.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from statesnap.version import __version__

if TYPE_CHECKING:  # what type checkers and IDEs see: the names, eagerly
    from statesnap.checkpoint.retention import RetentionPolicy
    from statesnap.errors import StatesnapError
    from statesnap.processor import (
        Emit,
        JoinWindows,
        ProcessingOptions,
        Processor,
        ProcessorContext,
        Record,
        StoreSpec,
        Windows,
    )
    from statesnap.python.follower import Follower, FollowerStatus
    from statesnap.python.hooks import Hooks, RestoreListener
    from statesnap.python.table import Table
    from statesnap.serde import BytesSerde, JsonSerde, Serde, StringSerde
    from statesnap.task.migration import StateVersion
    from statesnap.task.options import (
        CheckpointOptions,
        GroupOptions,
        SnapshotOptions,
        StaticShare,
        StoreOptions,
    )
    from statesnap.task.restore import RestoreReport
    from statesnap.task.rowfilter import RowFilter

__all__ = [
    "BytesSerde",
    "CheckpointOptions",
    "Emit",
    "Follower",
    "FollowerStatus",
    "GroupOptions",
    "Hooks",
    "JoinWindows",
    "JsonSerde",
    "ProcessingOptions",
    "Processor",
    "ProcessorContext",
    "Record",
    "RestoreListener",
    "RestoreReport",
    "RetentionPolicy",
    "RowFilter",
    "Serde",
    "SnapshotOptions",
    "StateVersion",
    "StatesnapError",
    "StaticShare",
    "StoreOptions",
    "StoreSpec",
    "StringSerde",
    "Table",
    "Windows",
    "__version__",
]

#: The module each lazily loaded public name comes from (the imports above, as data).
_SOURCES: dict[str, str] = {
    "RetentionPolicy": "statesnap.checkpoint.retention",
    "StatesnapError": "statesnap.errors",
    "Emit": "statesnap.processor",
    "JoinWindows": "statesnap.processor",
    "ProcessingOptions": "statesnap.processor",
    "Processor": "statesnap.processor",
    "ProcessorContext": "statesnap.processor",
    "Record": "statesnap.processor",
    "StoreSpec": "statesnap.processor",
    "Windows": "statesnap.processor",
    "Follower": "statesnap.python.follower",
    "FollowerStatus": "statesnap.python.follower",
    "Hooks": "statesnap.python.hooks",
    "RestoreListener": "statesnap.python.hooks",
    "Table": "statesnap.python.table",
    "BytesSerde": "statesnap.serde",
    "JsonSerde": "statesnap.serde",
    "Serde": "statesnap.serde",
    "StringSerde": "statesnap.serde",
    "StateVersion": "statesnap.task.migration",
    "CheckpointOptions": "statesnap.task.options",
    "GroupOptions": "statesnap.task.options",
    "SnapshotOptions": "statesnap.task.options",
    "StaticShare": "statesnap.task.options",
    "StoreOptions": "statesnap.task.options",
    "RestoreReport": "statesnap.task.restore",
    "RowFilter": "statesnap.task.rowfilter",
}


if not TYPE_CHECKING:  # hidden from type checkers, which would type every unknown name as Any

    def __getattr__(name: str) -> Any:
        """Import a public name's module the first time the name is read, and keep the name here."""
        source = _SOURCES.get(name)
        if source is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(source), name)
        globals()[name] = value  # read from here from now on: __getattr__ is not called again
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
