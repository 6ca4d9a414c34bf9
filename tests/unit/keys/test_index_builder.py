"""KeyIndexBuilder lays its entries out in the table's own memory (issue 21: a restore's peak). Its
moves must give exactly the ordered linear-probing table a separate array of entries gave, also
when a run crowds onto entries not moved yet or spills past the last slot: hashes are drawn here,
so those rare paths run on purpose, checked against a plain Python layout."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from statesnap.keys.index import EMPTY, HASH_BITS, HashSeed, KeyIndex, KeyIndexBuilder

SEED = HashSeed(p=1_000_000_007 % (1 << 30) | 1, mix=1 << 20, add=0)  # p need not be prime here
STEP = 1 << 16  # the builder's slice of moves


def _layout(hashes: np.ndarray, first_row: int, index: KeyIndex) -> dict[int, int]:
    """Slot -> entry of the ordered linear-probing table of *hashes*, one entry after the other."""
    entries = sorted((int(h) << 32) | (first_row + i) for i, h in enumerate(hashes.tolist()))
    slots: dict[int, int] = {}
    previous = -1
    for e in entries:
        slot = max((e >> 32) * index.scale >> HASH_BITS, previous + 1)
        slots[slot] = e
        previous = slot
    return slots


def _check(hashes: np.ndarray, *, blocks: int = 1, first_row: int = 0) -> KeyIndex:
    builder = KeyIndexBuilder(len(hashes), SEED)
    for part in np.array_split(hashes, blocks):
        builder.add(first_row, part)
        first_row += len(part)
    index = builder.build()
    expected = _layout(hashes, first_row - len(hashes), index)
    table = index.table
    filled = np.flatnonzero(table != np.uint64(EMPTY))
    assert {int(s): int(table[s]) for s in filled} == expected
    assert int(table[-1]) == EMPTY  # a probe's scan always ends
    assert index.rows == len(hashes)
    return index


@pytest.mark.parametrize("n", [0, 1, 7, STEP - 1, STEP, 3 * STEP + 5])
def test_random_hashes_lay_out_as_one_entry_after_the_other(n: int) -> None:
    rng = np.random.default_rng(n)
    _check(rng.integers(0, SEED.p, n, dtype=np.uint64).astype(np.uint32), blocks=3)


def test_a_run_crowding_onto_entries_not_moved_yet_moves_them_out_of_the_way() -> None:
    # Every key of one hash: a single run from the middle slot on, longer than the free room
    # before the table's tail where the entries wait.
    n = 3 * STEP
    _check(np.full(n, SEED.p // 2, np.uint32), blocks=2)


def test_a_run_spilling_past_the_last_slot_grows_the_table() -> None:
    n = 2 * STEP + 3
    index = _check(np.full(n, SEED.p - 1, np.uint32))
    assert len(index.table) > int(n * 1.6) + 64  # it grew


def test_lookups_through_a_built_index_find_every_row() -> None:
    keys = [b"key-%d" % i for i in range(5000)]
    index = KeyIndex.of_keys(pa.array(keys, pa.binary()), SEED)
    for row, k in enumerate(keys):
        assert row in index.candidates(k)


def test_a_builder_refuses_more_or_fewer_rows_than_it_was_sized_for() -> None:
    builder = KeyIndexBuilder(3, SEED)
    builder.add(0, np.zeros(2, np.uint32))
    with pytest.raises(ValueError, match="3 rows given 2"):
        builder.build()
    with pytest.raises(ValueError, match="3 rows given 5"):
        builder.add(2, np.zeros(3, np.uint32))
