"""statesnap: checkpointed, snapshot-able Kafka tables for Python services and PySpark pipelines."""

from __future__ import annotations

__version__ = "0.1.0"

from statesnap.checkpoint.retention import RetentionPolicy
from statesnap.errors import StatesnapError
from statesnap.python.follower import Follower, FollowerStatus
from statesnap.python.hooks import RestoreListener
from statesnap.python.table import Table
from statesnap.serde import BytesSerde, JsonSerde, Serde, StringSerde
from statesnap.task.restore import RestoreReport

__all__ = [
    "BytesSerde",
    "Follower",
    "FollowerStatus",
    "JsonSerde",
    "RestoreListener",
    "RestoreReport",
    "RetentionPolicy",
    "Serde",
    "StatesnapError",
    "StringSerde",
    "Table",
    "__version__",
]
