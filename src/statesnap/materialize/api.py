"""Deprecated: re-exports :mod:`statesnap.run.table` for one release; import from there."""

from __future__ import annotations

from statesnap.run.table import (
    materialize,
)

__all__ = [
    "materialize",
]
