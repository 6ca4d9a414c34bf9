"""Deprecated: re-exports :mod:`statesnap.run.result` for one release; import from there."""

from __future__ import annotations

from statesnap.run.result import (
    Followed,
    MaterializeResult,
    RestoreFigures,
    records_between,
)

__all__ = [
    "Followed",
    "MaterializeResult",
    "RestoreFigures",
    "records_between",
]
