"""Deprecated: re-exports :mod:`statesnap.run.on_spark` for one release; import from there."""

from __future__ import annotations

from statesnap.run.on_spark import (
    POLL_SECONDS,
    default_query_location,
    run_on_spark,
)

__all__ = [
    "POLL_SECONDS",
    "default_query_location",
    "run_on_spark",
]
