"""Moved: a task's consumer-group side is :mod:`statesnap.task.group` (re-exported here)."""

from __future__ import annotations

from statesnap.task.group import FIRST_ASSIGNMENT_TIMEOUT, GroupHost, GroupMembership, check_group

__all__ = ["FIRST_ASSIGNMENT_TIMEOUT", "GroupHost", "GroupMembership", "check_group"]
