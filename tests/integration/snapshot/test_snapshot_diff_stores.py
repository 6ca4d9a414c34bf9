"""``statesnap snapshot diff`` of a processor's generations, run as a user runs it (fresh processes
of the venv's interpreter): counted store by store against an independent recomputation from the
input topic, never counting the processor's own ``_statesnap`` rows, and ``--store`` for one store.
The Spark engine's answer for a processor: tests/integration/spark/test_snapshot_diff_spark.py.

Proven on Apache Kafka (the suite's broker) and on Tansu (the dev broker): nothing here depends on broker
behaviour beyond ordered partitions and partition EOF; the diff itself reads only the checkpoint store (a
filesystem).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from integration.cli_runner import ok, statesnap
from integration.conftest import KafkaTool
from integration.processor.test_store_readback import recompute, write_history

pytestmark = pytest.mark.integration


def diff(url: str, *extra: str) -> Any:
    return ok(statesnap("snapshot", "diff", url, "--table", "tally", "1", "2", "--json", *extra))


def expected(old: dict[Any, int], new: dict[Any, int]) -> dict[str, int]:
    """The counts a diff must give, from two recomputed states."""
    both = old.keys() & new.keys()
    return {
        "old": len(old),
        "new": len(new),
        "added": len(new.keys() - old.keys()),
        "removed": len(old.keys() - new.keys()),
        "changed": sum(old[k] != new[k] for k in both),
        "unchanged": sum(old[k] == new[k] for k in both),
    }


def counts(d: dict[str, Any]) -> dict[str, int]:
    return {k: d[k] for k in ("old", "new", "added", "removed", "changed", "unchanged")}


def test_processor_diff_counts_each_store_and_never_its_bookkeeping(
    kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    """Two generations of a running tally (a key-value and a window store): each store's counts
    equal the recomputed states' (the stream-time rows, which change with every batch, are not
    counted), the totals are their sums, examples are the store's keys in order; ``--store`` diffs
    one store; an unknown store is a one-line ConfigError listing the stores."""
    url = str(tmp_path / "ckpt")
    write_history(kafka, topic_name, url, (200, 100))
    old_balances, old_minutes = recompute(kafka, topic_name, upto=200)
    balances, minutes = recompute(kafka, topic_name)

    got = diff(url)
    assert sorted(got["stores"]) == ["balances", "per_minute"]
    assert counts(got["stores"]["balances"]) == expected(old_balances, balances)
    assert counts(got["stores"]["per_minute"]) == expected(old_minutes, minutes)
    for kind in ("old", "new", "added", "removed", "changed", "unchanged"):
        assert got[kind] == sum(s[kind] for s in got["stores"].values()), kind
    changed = sorted(k for k in balances if old_balances.get(k) != balances[k])
    assert got["stores"]["balances"]["examples"]["changed"] == changed[:5]
    assert got["examples"]["changed"] == [f"balances:{k}" for k in changed[:5]]
    added = sorted((start, key) for key, start in minutes.keys() - old_minutes.keys())
    assert got["stores"]["per_minute"]["examples"]["added"] == [f"{k}@{s}" for s, k in added[:5]]

    one = diff(url, "--store", "per_minute")
    assert list(one["stores"]) == ["per_minute"]
    assert counts(one) == counts(got["stores"]["per_minute"])

    refused = statesnap("snapshot", "diff", url, "--table", "tally", "1", "2", "--store", "nope")
    assert refused.returncode == 1
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: ConfigError: processor 'tally' has no store 'nope'"), last
    assert "balances, per_minute" in last
