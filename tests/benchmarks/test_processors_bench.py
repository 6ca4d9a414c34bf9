"""benchmarks/processors.py (issue #18's benchmark) stays runnable: its smoke run, as a user runs it.

The full run takes ~10 minutes and Quix Streams' own venv, so the suite runs ``--quick --skip-peers``
(200 k events, 20 k keys, statesnap and the plain loop only) in a fresh interpreter and checks that
every row of the printed table is there and that every state it checked equals the plain loop's;
the ``long`` variant adds ``--window``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "processors.py"

ROWS = (
    "load average (start / end)",
    "plain loop recompute s (history + tail)",
    "floor s (Parquet counts -> dict + tail by plain loop)",
    "Quix process records/s (after the join)",
    "Quix recovery: start to complete s (last tail record)",
    "statesnap full processing s (history + tail, no checkpoint)",
    "statesnap processing records/s",
    "statesnap restore s (checkpoint + tail), 10x history",
    "statesnap restore s (checkpoint + tail), 1x history",
    "statesnap checkpoint bytes after 1 % of keys changed",
    "statesnap changelog bytes",
    "Quix recovery / statesnap restore",
    "statesnap restore / floor",
    "statesnap full processing / restore (10x history)",
    "restore growth, 10x history vs 1x",
    "statesnap / Quix processing throughput",
)
WINDOW_ROWS = (
    "window: statesnap restore s (checkpoint + tail)",
    "window: statesnap processing records/s",
    "window: Quix recovery / statesnap restore",
)


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def test_keys_beyond_a_tenth_of_the_events_are_refused_in_one_line() -> None:
    """The 1x history holds every key once: a key count it cannot hold fails before a broker starts."""
    done = run("--events", "1000", "--keys", "500")
    assert done.returncode == 2
    assert "--keys must be at most --events / 10" in done.stderr.strip().splitlines()[-1]


@pytest.mark.integration
@pytest.mark.long  # a benchmark smoke run (~20 s): not behaviour
def test_quick_run_prints_every_row() -> None:
    """The smoke run on the dev broker the script starts itself (Tansu): every figure's row is
    printed (Quix's as skipped), statesnap's figures are measured and every state it checked
    (restore at both history lengths, full processing, the 1 % change, the floor) equals the plain
    loop's count per key."""
    done = run("--quick", "--skip-peers", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    table = done.stdout
    for row in ROWS:
        assert row in table, f"row {row!r} missing from:\n{table}"
    checked = next(line for line in table.splitlines() if "state equals the plain loop's counts" in line)
    for name in ("floor yes", "restore yes", "restore_1x yes", "full yes", "delta yes"):
        assert name in checked, checked
    assert "NO" not in checked
    restore = next(
        line for line in table.splitlines() if "statesnap restore s (checkpoint + tail), 10x" in line
    )
    assert "skipped" not in restore
    assert "window:" not in table


@pytest.mark.integration
@pytest.mark.long
def test_quick_window_run_checks_the_live_windows() -> None:
    """``--window`` on the dev broker the script starts (Tansu): the window store's live windows
    after a restore and after a full processing equal the plain loop's (long: the count's run again
    first, ~40 s under load)."""
    done = run("--quick", "--skip-peers", "--window", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for row in WINDOW_ROWS:
        assert row in done.stdout, f"row {row!r} missing from:\n{done.stdout}"
    windows = next(line for line in done.stdout.splitlines() if "plain loop's live windows" in line)
    assert "restore yes" in windows
    assert "full yes" in windows
