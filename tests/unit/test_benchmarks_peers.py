"""benchmarks/peers.py stays runnable: it is not in the suite (it needs Java, Maven and minutes), so
these only check that it imports and parses its options in a fresh interpreter, as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PEERS = Path(__file__).resolve().parents[2] / "benchmarks" / "peers.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(PEERS), *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_help_names_the_options() -> None:
    done = run("--help")
    assert done.returncode == 0, done.stderr
    for option in ("--keys", "--history-multiplier", "--repeat", "--stores", "--count"):
        assert option in done.stdout


def test_non_positive_repeat_is_refused_before_anything_starts() -> None:
    """A bad option fails at once with argparse's one-line error, before a broker or JVM starts."""
    done = run("--repeat", "0")
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert "--repeat" in last
    assert "must be positive" in last


def test_malformed_multiplier_is_one_line() -> None:
    done = run("--history-multiplier", "1,ten")
    assert done.returncode == 2
    assert "expected comma-separated integers, got '1,ten'" in done.stderr.strip().splitlines()[-1]


def test_unknown_changelog_variant_is_one_line() -> None:
    done = run("--changelogs", "written,squashed")
    assert done.returncode == 2
    assert "expected written and/or compacted, got 'written,squashed'" in done.stderr.strip().splitlines()[-1]
