"""benchmarks/decode_pool.py (the figures in statesnap/decode_memory.py) stays runnable: a small run,
as a user runs it, in a fresh interpreter, prints a row per pool, each restored into its own pool."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "decode_pool.py"


@pytest.mark.long  # a benchmark smoke run (~10 s): not behaviour
def test_a_small_run_prints_a_row_per_pool() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--keys", "20000", "--repeat", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert {r["backend"] for r in rows} == {"jemalloc", "mimalloc"}
    assert all(r["ready_best"] > 0 and r["gets_per_s"] > 0 for r in rows)
