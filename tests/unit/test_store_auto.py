"""``store="auto"``: the threshold comes from benchmarks/auto_store.py, not a round number."""

from __future__ import annotations

from statesnap.stores import AUTO_COLUMNAR_ROWS, auto_store_kind


def test_auto_picks_columnar_where_it_restores_and_tails_faster() -> None:
    """Issue 21: a checkpoint of 989,836 rows went to the dict store (1.00 s) where the columnar
    store was ready in 0.82 s; columnar restore + tail wins from 10 k rows (auto_store.py)."""
    assert auto_store_kind(989_836) == "columnar"
    assert auto_store_kind(10_000) == "columnar"
    assert auto_store_kind(AUTO_COLUMNAR_ROWS - 1) == "memory"
    assert auto_store_kind(3_000) == "memory"
    assert auto_store_kind(None) == "memory"  # no checkpoint: nothing to restore
