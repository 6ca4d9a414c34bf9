"""Deprecated: re-exports :mod:`statesnap.run.engine` for one release; import from there."""

from __future__ import annotations

from statesnap.run.engine import (
    ENV,
    MASTER_ENV,
    OPTION_NAMES,
    PYTHON_ONLY,
    PYTHON_RATE,
    SPARK_ONLY,
    SPARK_RATE_PER_CORE,
    SPARK_STARTUP,
    WHY_PYTHON,
    Engine,
    EngineChoice,
    choose_engine,
    crossover,
    estimate_seconds,
    estimate_table_backlog,
    option_name,
    spark_available,
)

__all__ = [
    "ENV",
    "MASTER_ENV",
    "OPTION_NAMES",
    "PYTHON_ONLY",
    "PYTHON_RATE",
    "SPARK_ONLY",
    "SPARK_RATE_PER_CORE",
    "SPARK_STARTUP",
    "WHY_PYTHON",
    "Engine",
    "EngineChoice",
    "choose_engine",
    "crossover",
    "estimate_seconds",
    "estimate_table_backlog",
    "option_name",
    "spark_available",
]
