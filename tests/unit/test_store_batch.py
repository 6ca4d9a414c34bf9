"""Batched store paths: ``get_many`` equals ``get`` on every store, and the columnar store's tail
(writes that never probe the base, ``len`` settled later in batches) equals the dict store."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from statesnap.checkpoint import datafile
from statesnap.keys import index as keyindex_module
from statesnap.keys.index import key_hash
from statesnap.stores import StateStore, columnar_base, open_state_store
from statesnap.stores.columnar import ColumnarStore

from .test_columnar_store import PARTITIONS, FakeMessage, assert_same, base_tables, part_of


@pytest.fixture(params=["memory", "columnar", "rocksdb"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StateStore]:
    s = open_state_store(str(request.param), path=tmp_path / "db")
    yield s
    s.close()


def colliding_keys() -> list[bytes]:
    """Keys that share a hash (equal modulo the hash prime, or differing by trailing zeros)."""
    prime = keyindex_module.P
    keys = [(12345 + i * prime).to_bytes(8, "little") for i in range(6)]
    keys += [b"a", b"a\x00", b"a\x00\x00"]
    assert len({key_hash(k) for k in keys[:6]}) == 1
    return keys


def test_get_many_equals_get(store: StateStore) -> None:
    """A restored base, overlay upserts and tombstones, collisions, absent keys, duplicates; batches
    below and above the size where the columnar store switches to a vectorized probe."""
    rng = random.Random(7)
    collide = colliding_keys()
    restored = {b"key-%d" % i: b"v%d" % i for i in range(0, 3000, 2)}
    restored.update({k: b"c" + k for k in collide[::2]})
    for p, table in base_tables(restored).items():
        store.load(p, table)
    store.apply(0, [(b"key-%d" % i, b"new", 10 + i, 5) for i in range(0, 400, 3)])
    store.apply(1, [(b"key-%d" % i, None, 10 + i, 5) for i in range(0, 400, 5)])
    store.apply(2, [(collide[1], b"over", 1, 1), (collide[0], None, 2, 2)])
    universe = [b"key-%d" % i for i in range(3200)] + collide + [b"", b"\xff" * 40]
    for size in (0, 1, 5, 23, 24, 200, 3000):
        keys = [rng.choice(universe) for _ in range(size)]
        assert store.get_many(keys) == [store.get(k) for k in keys], size
    assert store.get_many(universe) == [store.get(k) for k in universe]
    for copies in (3, 30):  # colliding keys compared one by one, then a segment at a time
        keys = collide * copies
        assert store.get_many(keys) == [store.get(k) for k in keys], copies


def test_get_many_on_an_empty_store(store: StateStore) -> None:
    assert store.get_many([]) == []
    assert store.get_many([b"a", b"b"] * 20) == [None] * 40


def test_columnar_get_many_over_many_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Row ids name the segment: a base split into many chunks is looked up right."""
    monkeypatch.setattr(columnar_base, "_LOCAL_BITS", 6)
    monkeypatch.setattr(columnar_base, "_LOCAL_MASK", (1 << 6) - 1)
    monkeypatch.setattr(columnar_base, "_MAX_SEGMENTS", 1 << 26)
    rows = {b"k%05d" % i: b"v%d" % i for i in range(5000)}
    s = ColumnarStore()
    keys = sorted(rows)
    table = pa.table(
        {
            "key": pa.array(keys, pa.binary()),
            "value": pa.array([rows[k] for k in keys], pa.binary()),
            "offset": pa.array(range(len(keys)), pa.int64()),
            "timestamp": pa.array([1] * len(keys), pa.int64()).cast(pa.timestamp("ms")),
        }
    ).cast(datafile.SCHEMA)
    s.load(0, table)
    probe = [*keys, b"k99999", b"nope"]
    random.Random(3).shuffle(probe)
    assert s.get_many(probe) == [rows.get(k) for k in probe]
    assert len(s._base.segments) > 50


def test_columnar_tail_never_looks_up_the_base(monkeypatch: pytest.MonkeyPatch) -> None:
    """Applying a tail costs what the dict store's does: no base probe per record (the old path
    probed every key new to the overlay, ~0.7 us each). ``len`` settles afterwards, exactly."""
    restored = {b"key-%d" % i: b"v" for i in range(0, 2000, 2)}
    s, model = ColumnarStore(), open_state_store("memory")
    for p, table in base_tables(restored).items():
        s.load(p, table)
        model.load(p, table)
    s.get(b"key-0")  # the index is built

    def refuse(*_: object) -> None:
        raise AssertionError("a tail write probed the base")

    with monkeypatch.context() as m:
        for name in ("contains", "find_many", "locate"):
            m.setattr(columnar_base.Base, name, refuse, raising=False)
        for store in (s, model):
            for p in range(PARTITIONS):
                msgs = [
                    FakeMessage(b"key-%d" % i, None if i % 7 == 0 else b"t", i, 9) for i in range(1000, 3000)
                ]
                store.apply_messages(p, [m for m in msgs if part_of(m.k or b"") == p])
                dels = [(b"key-%d" % i, None, i, 9) for i in range(0, 400)]
                store.apply(p, [r for r in dels if part_of(r[0]) == p])
    assert_same(model, s, [b"key-%d" % i for i in range(3100)])


def test_columnar_len_settles_in_batches_like_the_dict_store() -> None:
    """Random batches (upserts, tombstones of present and absent keys, re-inserts), ``len`` asked
    between some of them: each settle looks up only the keys new since the last one."""
    rng = random.Random(11)
    restored = {b"k%d" % i: b"v" for i in range(0, 6000, 3)}
    s, model = ColumnarStore(), open_state_store("memory")
    for p, table in base_tables(restored).items():
        s.load(p, table)
        model.load(p, table)
    offset = 0
    for round_ in range(40):
        batch = []
        for _ in range(rng.randrange(1, 300)):
            offset += 1
            key = b"k%d" % rng.randrange(7000)
            batch.append((key, None if rng.random() < 0.3 else b"x%d" % offset, offset, 1))
        for p in range(PARTITIONS):
            s.apply(p, [r for r in batch if part_of(r[0]) == p])
            model.apply(p, [r for r in batch if part_of(r[0]) == p])
        if rng.random() < 0.5:
            assert len(s) == len(model), round_
        if round_ % 13 == 12:
            s.compact()
    assert_same(model, s, [b"k%d" % i for i in range(7000)])
