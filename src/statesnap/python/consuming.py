"""Moved: the consuming loop is :mod:`statesnap.task.loop` and :mod:`statesnap.task.commits`, the
record handler's protocol :mod:`statesnap.task.handler`, a table's upserts
:mod:`statesnap.python.upsert` (re-exported here)."""

from __future__ import annotations

from statesnap.python.upsert import UpsertHandler
from statesnap.task.handler import RecordHandler
from statesnap.task.loop import CATCH_UP_POLL, TAIL_POLL

__all__ = ["CATCH_UP_POLL", "TAIL_POLL", "RecordHandler", "UpsertHandler"]
