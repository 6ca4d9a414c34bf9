"""statesnap: checkpointed, snapshot-able Kafka tables for Python services and PySpark pipelines."""

from __future__ import annotations

__version__ = "0.1.0"

from statesnap.checkpoint.retention import RetentionPolicy  # noqa: E402
from statesnap.errors import StatesnapError  # noqa: E402
from statesnap.serde import BytesSerde, JsonSerde, Serde, StringSerde  # noqa: E402
from statesnap.table import Table  # noqa: E402

__all__ = [
    "BytesSerde",
    "JsonSerde",
    "RetentionPolicy",
    "Serde",
    "StatesnapError",
    "StringSerde",
    "Table",
    "__version__",
]
