"""Deprecated: re-exports :mod:`statesnap.run.options` for one release; import from there."""

from __future__ import annotations

from statesnap.run.options import (
    SHUTDOWN_TIMEOUT,
    FollowOptions,
    SparkOptions,
)

__all__ = [
    "SHUTDOWN_TIMEOUT",
    "FollowOptions",
    "SparkOptions",
]
