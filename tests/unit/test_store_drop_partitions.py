"""``drop_partitions``: a consumer-group member forgets the partitions that moved elsewhere.

Every store must drop exactly the rows of those partitions — loaded (checkpoint) rows, rows
written since, and their change-set entries (live and tombstone) — and keep working: the other
partitions read, scan, export and take deltas as before, and a dropped partition can be loaded
again (the partition comes back in a later rebalance).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statesnap.stores import StateStore, open_state_store

KINDS = ["memory", "columnar", "rocksdb"]


@pytest.fixture(params=KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StateStore]:
    s = open_state_store(str(request.param), path=tmp_path / "db")
    yield s
    s.close()


def rows(keys: list[bytes], value: bytes = b"v") -> pa.Table:
    from statesnap.checkpoint import datafile

    return pa.table(
        {
            "key": pa.array(sorted(keys), pa.binary()),
            "value": pa.array([value + k for k in sorted(keys)], pa.binary()),
            "offset": pa.array(range(len(keys)), pa.int64()),
            "timestamp": pa.array([1000] * len(keys), pa.int64()).cast(pa.timestamp("ms")),
        }
    ).cast(datafile.SCHEMA)


def test_drop_removes_loaded_and_written_rows_of_those_partitions_only(store: StateStore) -> None:
    store.load(0, rows([b"a0", b"b0", b"c0"]))
    store.load(1, rows([b"a1", b"b1"]))
    store.load(2, rows([b"a2"]))
    store.mark_checkpointed()
    store.apply(0, [(b"d0", b"new", 10, 1), (b"a0", None, 11, 1)])
    store.apply(1, [(b"c1", b"new", 10, 1), (b"a1", b"upd", 11, 1), (b"b1", None, 12, 1)])
    store.apply(2, [(b"b2", b"x", 10, 1)])
    assert len(store) == 3 + 2 + 2

    assert store.drop_partitions([1]) == 2  # a1 (updated) and c1; b1 was deleted already
    assert len(store) == 5
    assert dict(store.items()) == {b"b0": b"vb0", b"c0": b"vc0", b"d0": b"new", b"a2": b"va2", b"b2": b"x"}
    assert [k for k, _ in store.scan()] == [b"a2", b"b0", b"b2", b"c0", b"d0"]
    for key in (b"a1", b"b1", b"c1"):
        assert store.get(key) is None
        assert key not in store
    assert set(store.export()) == {0, 2}
    # The change set keeps the other partitions' entries (a0's tombstone too), none of partition 1.
    changes = store.changes()
    assert set(changes) == {0, 2}
    assert changes[0].column("key").to_pylist() == [b"a0", b"d0"]
    assert changes[0].column("value").to_pylist() == [None, b"new"]


def test_a_dropped_partition_can_come_back(store: StateStore) -> None:
    store.load(0, rows([b"a0"]))
    store.load(1, rows([b"a1", b"b1"]))
    store.drop_partitions([1])
    store.load(1, rows([b"a1", b"z1"], value=b"w"))  # restored again from a newer checkpoint
    store.apply(1, [(b"z1", None, 5, 1)])
    assert dict(store.items()) == {b"a0": b"va0", b"a1": b"wa1"}
    assert len(store) == 2
    assert store.export()[1].column("key").to_pylist() == [b"a1"]


def test_dropping_an_absent_partition_changes_nothing(store: StateStore) -> None:
    store.apply(0, [(b"a", b"1", 0, 0)])
    assert store.drop_partitions([7]) == 0
    assert store.drop_partitions([]) == 0
    assert dict(store.items()) == {b"a": b"1"}
    assert len(store) == 1


_ops = st.lists(
    st.tuples(
        st.sampled_from([b"a", b"b", b"c", b"d", b"e", b"f"]), st.one_of(st.none(), st.binary(max_size=3))
    ),
    max_size=30,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=_ops, after=_ops, dropped=st.sets(st.integers(0, 2)))
def test_drop_matches_a_dict_model(
    tmp_path_factory: pytest.TempPathFactory,
    before: list[tuple[bytes, bytes | None]],
    after: list[tuple[bytes, bytes | None]],
    dropped: set[int],
) -> None:
    """Loaded rows, writes, a drop, more writes: the store equals the model for every kind."""
    for kind in KINDS:
        s = open_state_store(kind, path=tmp_path_factory.mktemp(kind))
        model: dict[bytes, tuple[int, bytes]] = {}
        try:
            s.load(1, rows([b"a", b"d"]))  # partition = first byte % 3
            s.load(2, rows([b"b", b"e"]))
            model.update({k: (k[0] % 3, b"v" + k) for k in (b"a", b"d", b"b", b"e")})
            for phase, ops in enumerate((before, after)):
                for i, (k, v) in enumerate(ops):
                    p = k[0] % 3  # partition-affine keys, as in Kafka
                    s.apply(p, [(k, v, 100 * phase + i, 0)])
                    if v is None:
                        model.pop(k, None)
                    else:
                        model[k] = (p, v)
                if phase == 0:
                    s.drop_partitions(dropped)
                    model = {k: pv for k, pv in model.items() if pv[0] not in dropped}
            assert dict(s.items()) == {k: v for k, (_p, v) in model.items()}, kind
            assert len(s) == len(model), kind
        finally:
            s.close()
