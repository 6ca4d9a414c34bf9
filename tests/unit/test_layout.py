"""Storage layout keys: the contract between every writer (Python, Spark) and reader."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statesnap.checkpoint import layout


def test_keys_follow_the_documented_layout() -> None:
    assert layout.table_dir("tansu_cluster", "orders") == "tansu_cluster_orders"
    assert layout.manifest_key(7) == "snapshots/00000000000000000007.json"
    assert layout.data_key(3, 12, "base", 0) == "data/00000000000000000003/p00012-base-0.parquet"
    assert layout.data_key(3, 0, "delta", 2) == "data/00000000000000000003/p00000-delta-2.parquet"


@given(st.integers(0, 10**20 - 1))
def test_generation_round_trips_through_keys(gen: int) -> None:
    assert layout.manifest_generation(layout.manifest_key(gen)) == gen
    assert layout.data_generation(layout.data_key(gen, 1, "base", 0)) == gen


@given(st.integers(0, 10**6), st.integers(0, 10**6))
def test_keys_sort_like_generations(a: int, b: int) -> None:
    """Zero-padding makes a lexicographic listing (S3, sorted()) a generation-ordered one."""
    assert (layout.manifest_key(a) < layout.manifest_key(b)) == (a < b)


@pytest.mark.parametrize(
    "key",
    [
        "snapshots/7.json",
        "snapshots/00000000000000000007.json.tmp-abc",
        "snapshots/x.json",
        "data/00000000000000000007/p00000-base-0.parquet",
        "other/00000000000000000007.json",
        "x/snapshots/00000000000000000007.json",
    ],
)
def test_non_manifest_keys_are_not_manifests(key: str) -> None:
    assert layout.manifest_generation(key) is None


@pytest.mark.parametrize(
    "key", ["snapshots/00000000000000000007.json", "data/7/p0.parquet", "datax/00000000000000000007/a"]
)
def test_non_data_keys_are_not_data(key: str) -> None:
    assert layout.data_generation(key) is None


@pytest.mark.parametrize("name", ["orders", "a", "orders.v2", "my_table-1", "A" * 200])
def test_valid_table_names(name: str) -> None:
    assert layout.valid_table_name(name)


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "a b", "ä", "A" * 201, "x\n", "../etc"])
def test_invalid_table_names(name: str) -> None:
    assert not layout.valid_table_name(name)
