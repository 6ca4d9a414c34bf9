"""The Python engine: tables and followers that consume Kafka in this process.

Beside :mod:`statesnap.spark` (the same tables, written by Spark jobs), both built on the
engine-neutral task core (:mod:`statesnap.task`), checkpoint format (:mod:`statesnap.checkpoint`)
and snapshots (:mod:`statesnap.snapshot`).
"""

from __future__ import annotations

from statesnap.python.follower import Follower, FollowerStatus, ReadOnlyTable
from statesnap.python.table import Table

__all__ = ["Follower", "FollowerStatus", "ReadOnlyTable", "Table"]
