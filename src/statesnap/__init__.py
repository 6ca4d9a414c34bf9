"""statesnap: checkpointed, snapshot-able Kafka tables for Python services and PySpark pipelines."""

from __future__ import annotations

__version__ = "0.1.0"

from statesnap.checkpoint.retention import RetentionPolicy
from statesnap.errors import StatesnapError
from statesnap.follower import Follower, FollowerStatus
from statesnap.hooks import RestoreListener
from statesnap.restoring import RestoreReport
from statesnap.serde import BytesSerde, JsonSerde, Serde, StringSerde
from statesnap.table import Table

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
