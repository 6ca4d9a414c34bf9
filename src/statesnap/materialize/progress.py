"""Deprecated: re-exports :mod:`statesnap.run.progress` for one release; import from there."""

from __future__ import annotations

from statesnap.run.progress import (
    MaterializeProgress,
    Stage,
)

__all__ = [
    "MaterializeProgress",
    "Stage",
]
