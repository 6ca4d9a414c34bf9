"""key_order: the radix sort of binary keys every checkpoint runs, against Python's own sort."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statesnap.keys.order import MAX_PASSES, key_order


def _expected(keys: list[bytes], groups: list[int] | None = None) -> list[int]:
    """Python's stable sort: by group, then by bytes (a prefix first), ties in input order."""
    return sorted(range(len(keys)), key=lambda i: (0 if groups is None else groups[i], keys[i]))


# NUL and 0xFF bytes, empty keys and prefixes of each other are where a radix sort goes wrong.
_keys = st.lists(
    st.binary(max_size=24) | st.sampled_from([b"", b"\x00", b"a", b"a\x00", b"\xff"]), max_size=300
)


@given(_keys)
@settings(max_examples=60, deadline=None)
def test_equals_pythons_sort(keys: list[bytes]) -> None:
    assert key_order(pa.array(keys, pa.binary())).tolist() == _expected(keys)


@given(st.lists(st.tuples(st.integers(0, 40), st.binary(max_size=12)), max_size=300))
@settings(max_examples=40, deadline=None)
def test_groups_come_first(pairs: list[tuple[int, bytes]]) -> None:
    groups = [g for g, _ in pairs]
    keys = [k for _, k in pairs]
    got = key_order(pa.array(keys, pa.binary()), np.array(groups, np.int64))
    assert got.tolist() == _expected(keys, groups)


@pytest.mark.parametrize("long", [False, True], ids=["radix", "arrow"])
def test_long_keys_and_chunked_and_large_binary(long: bool) -> None:
    rng = np.random.default_rng(7)
    width = 8 * MAX_PASSES + 1 if long else 9  # past MAX_PASSES passes, Arrow sorts
    keys = [rng.bytes(int(rng.integers(0, width))) for _ in range(5000)] + [b"dup"] * 3
    groups = rng.integers(0, 4, len(keys))
    expected = _expected(keys, groups.tolist())
    chunked = pa.chunked_array([pa.array(keys[:2000], pa.binary()), pa.array(keys[2000:], pa.binary())])
    assert key_order(chunked, groups).tolist() == expected
    assert key_order(pa.array(keys, pa.large_binary()), groups).tolist() == expected
    sliced = pa.array([b"zz", *keys], pa.binary()).slice(1)  # a non-zero array offset
    assert key_order(sliced).tolist() == _expected(keys)


def test_negative_groups_are_sorted_too() -> None:
    keys = [b"b", b"a", b"c", b"a"]
    groups = [0, -1, -1, 2]
    assert key_order(pa.array(keys, pa.binary()), np.array(groups)).tolist() == _expected(keys, groups)


@pytest.mark.parametrize(
    ("n", "width", "group_count"),
    [
        (300, 6, 4),  # one chunk pass carries both the length and the group
        (300, 20, 4),  # the last chunk's pass the length, the first one's the group
        (5000, 7, 41),  # the length rides along, the group (6 bits) gets a pass of its own
        (5000, 9, 3),  # the length (4 bits) gets a pass of its own, the group rides along
        (5000, 9, 41),  # neither fits: four passes, as without the folding
    ],
)
def test_length_and_group_in_spare_bits_or_in_own_passes(n: int, width: int, group_count: int) -> None:
    rng = np.random.default_rng(n + width + group_count)
    keys = [rng.bytes(int(rng.integers(0, width + 1))) for _ in range(n - 2)] + [b"", b"\x00" * width]
    groups = rng.integers(0, group_count, n)
    assert key_order(pa.array(keys, pa.binary()), groups).tolist() == _expected(keys, groups.tolist())
    assert key_order(pa.array(keys, pa.binary())).tolist() == _expected(keys)
