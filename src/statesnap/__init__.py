"""statesnap: checkpointed, snapshot-able Kafka tables for Python services and PySpark pipelines."""

from __future__ import annotations

from statesnap.checkpoint.retention import RetentionPolicy
from statesnap.errors import StatesnapError
from statesnap.processor import Processor, ProcessorContext, Record, StoreSpec, Windows
from statesnap.python.follower import Follower, FollowerStatus
from statesnap.python.hooks import Hooks, RestoreListener
from statesnap.python.table import Table
from statesnap.serde import BytesSerde, JsonSerde, Serde, StringSerde
from statesnap.task.migration import StateVersion
from statesnap.task.options import CheckpointOptions, GroupOptions, SnapshotOptions, StaticShare, StoreOptions
from statesnap.task.restore import RestoreReport
from statesnap.task.rowfilter import RowFilter
from statesnap.version import __version__

__all__ = [
    "BytesSerde",
    "CheckpointOptions",
    "Follower",
    "FollowerStatus",
    "GroupOptions",
    "Hooks",
    "JsonSerde",
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
