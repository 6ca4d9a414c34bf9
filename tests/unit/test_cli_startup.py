"""The ``statesnap`` command starts without the engines: ``import statesnap`` and loading the CLI
(every command registered, as ``--help`` needs) import no pyarrow, numpy, Kafka client, Spark,
FastAPI or rich; a command loads what it uses when it runs. The values the CLI repeats so that it
need not import the library's modules stay equal to them."""

from __future__ import annotations

import subprocess
import sys
from typing import get_args

import pytest

#: What the test suite's hundreds of `statesnap` processes must not pay for at start-up.
HEAVY = (
    "pyarrow",
    "numpy",
    "confluent_kafka",
    "rocksdict",
    "boto3",
    "pyspark",
    "fastapi",
    "uvicorn",
    "rich",
    "orjson",
    "duckdb",
    "statesnap.kafka",
    "statesnap.checkpoint",
    "statesnap.materialize",
    "statesnap.run",
    "statesnap.processor",
    "statesnap.python",
    "statesnap.snapshot",
)


@pytest.mark.parametrize("module", ["statesnap", "statesnap.cli"])
def test_importing_loads_no_engine(module: str) -> None:
    """In a fresh interpreter: this one has imported everything already."""
    probe = f"import sys, {module}; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.split() == [], f"import {module} loaded {result.stdout.strip()}"


def test_the_public_names_still_load() -> None:
    import statesnap
    from statesnap.processor import Processor
    from statesnap.python.table import Table

    assert statesnap.Table is Table
    assert statesnap.Processor is Processor
    assert set(statesnap.__all__) <= set(dir(statesnap))
    with pytest.raises(AttributeError, match="no attribute 'Tabel'"):
        statesnap.Tabel  # type: ignore[attr-defined]  # noqa: B018


def test_repeated_values_match_the_library() -> None:
    from statesnap.cli.interrupts import SHUTDOWN_TIMEOUT
    from statesnap.cli.options import ENGINES, STATE_STORES
    from statesnap.durations import format_duration
    from statesnap.run import Engine
    from statesnap.run.options import SHUTDOWN_TIMEOUT as LIBRARY_SHUTDOWN_TIMEOUT
    from statesnap.task.options import StoreName

    assert tuple(e.value for e in Engine) == ENGINES
    assert get_args(StoreName) == STATE_STORES
    assert format_duration(LIBRARY_SHUTDOWN_TIMEOUT) == SHUTDOWN_TIMEOUT
