"""benchmarks/window_checkpoint.py, aggregations.py, rocksdb_state.py and store_write_path.py (issue
#36) stay runnable and keep checking what they measure: small runs on the dev broker each script
starts itself (Tansu proved them), in a fresh interpreter, their JSON read back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def run(script: str, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--json", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out: dict[str, Any] = json.loads(done.stdout)
    return out


@pytest.mark.integration
@pytest.mark.long  # benchmark smoke runs (~30 s): the unit tests prove the behaviour
@pytest.mark.parametrize("store", ["auto", "rocksdb"])
def test_window_checkpoint_run_holds_only_live_windows(store: str) -> None:
    """20 k events over 2 k keys, a minute's worth per 1,000 of them: of the ~20 k windows that
    came and went, only the newest minute's per partition are in the store the checkpoint wrote."""
    r = run("window_checkpoint.py", "--events", "20000", "--keys", "2000", "--store", store)
    assert r["store"] == store
    assert r["count"]["records"] == r["window"]["records"] == 20_000
    assert r["count"]["live_rows"] == 2_000
    assert 0 < r["window"]["live_rows"] <= 1_000
    assert r["window"]["checkpoint_bytes"] < r["count"]["checkpoint_bytes"]


@pytest.mark.integration
@pytest.mark.long
def test_aggregations_run_equals_the_plain_loop() -> None:
    r = run("aggregations.py", "--events", "20000", "--keys", "2000")
    contenders = {row["contender"]: row for row in r["rows"]}
    assert len(contenders) == 8
    assert all(row["equal"] for row in r["rows"] if "equal" in row)


@pytest.mark.integration
@pytest.mark.long
def test_rocksdb_state_run_checks_its_counts_and_checkpoints_while_catching_up() -> None:
    """The script fails unless the sampled counts and the key count equal numpy.bincount's, in the
    catch-up and in the restore from the checkpoint its close wrote (a run this small is caught
    up before its first interval: the 20 M-key run shows the checkpoints during the catch-up)."""
    r = run(
        "rocksdb_state.py",
        "--events",
        "60000",
        "--keys",
        "40000",
        "--broker",
        "tansu",
        "--checkpoint-interval",
        "1",
        "--verify",
        "500",
    )
    rows = {(row["store"], row["phase"]): row for row in r["rows"]}
    assert set(rows) == {
        ("rocksdb", "catch-up"),
        ("rocksdb", "restore"),
        ("auto", "catch-up"),
        ("auto", "restore"),
    }
    assert all(row["wrong"] is None for row in r["rows"])
    assert rows[("rocksdb", "restore")]["manifests"] > rows[("rocksdb", "catch-up")]["manifests"]
    assert rows[("rocksdb", "catch-up")]["rss_peak_mb"] > 0


@pytest.mark.long  # a benchmark smoke run (~5 s, no broker): the store tests prove the behaviour
def test_store_write_path_run_checks_every_stores_counts() -> None:
    """The script fails unless each store's sampled counts equal numpy.bincount's; its rows split
    each store's time into the batch fold's two store calls."""
    r = run("store_write_path.py", "--records", "60000", "--keys", "40000")
    rows = {row["store"]: row for row in r["rows"]}
    assert set(rows) == {"memory", "columnar", "rocksdb"}
    for row in rows.values():
        assert row["counts_wrong"] == 0
        assert row["counts_checked"] == 2_000
        assert set(row["spent_s"]) == {"get_many", "apply", "python"}
        assert 0 < sum(row["spent_s"].values()) <= row["wall_s"]
