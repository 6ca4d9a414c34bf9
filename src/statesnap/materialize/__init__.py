"""Deprecated: the run layer is :mod:`statesnap.run` (it runs processors too, not only tables).

``statesnap.materialize`` and its modules re-export :mod:`statesnap.run`'s names for one release
(``materialize.api`` is :mod:`statesnap.run.table`, ``materialize.python_run``
:mod:`statesnap.run.in_python`, ``materialize.spark_run`` :mod:`statesnap.run.on_spark`); import
from :mod:`statesnap.run` instead.
"""

from __future__ import annotations

from statesnap.run import (
    Engine,
    EngineChoice,
    Followed,
    FollowOptions,
    MaterializeProgress,
    MaterializeResult,
    RestoreFigures,
    SparkOptions,
    Stage,
    choose_engine,
    materialize,
    spark_available,
)

__all__ = [
    "Engine",
    "EngineChoice",
    "FollowOptions",
    "Followed",
    "MaterializeProgress",
    "MaterializeResult",
    "RestoreFigures",
    "SparkOptions",
    "Stage",
    "choose_engine",
    "materialize",
    "spark_available",
]
