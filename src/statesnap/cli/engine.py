"""Moved to :mod:`statesnap.materialize.engine`; this name stays until the tests import it there."""

from __future__ import annotations

from statesnap.materialize.engine import spark_available

__all__ = ["spark_available"]
