"""The columnar store (and every store) behaves byte for byte like the dict store.

A restored base plus any sequence of upserts and tombstones, read back through get, in, len,
items, scan, export and changes, equals what the memory store gives for the same input; the
change set applied to the previous export gives the current export.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statesnap.checkpoint import datafile
from statesnap.keys import index as keyindex_module
from statesnap.keys.index import HashSeed, KeyIndex, array_hashes, key_hash, spreads
from statesnap.stores import StateStore, columnar_base, columnar_merge, open_state_store
from statesnap.stores import columnar as columnar_module
from statesnap.stores.base import NO_TIMESTAMP
from statesnap.stores.columnar import ColumnarStore

OTHER_KINDS = ["columnar", "rocksdb"]
PARTITIONS = 3


@dataclass(frozen=True)
class FakeMessage:
    """The part of confluent-kafka's Message the stores read."""

    k: bytes | None
    v: bytes | None
    o: int
    ts: int

    def key(self) -> bytes | None:
        return self.k

    def value(self) -> bytes | None:
        return self.v

    def offset(self) -> int:
        return self.o

    def timestamp(self) -> tuple[int, int]:
        return (0, 0) if self.ts == NO_TIMESTAMP else (1, self.ts)


def part_of(key: bytes) -> int:
    return sum(key) % PARTITIONS  # partition-affine keys, as Kafka's partitioner gives


def base_tables(rows: dict[bytes, bytes], ts_of: int = 1000) -> dict[int, pa.Table]:
    """Checkpoint tables per partition, through real Parquet bytes (as a restore reads them)."""
    by_part: dict[int, list[tuple[bytes, bytes]]] = {}
    for k, v in rows.items():
        by_part.setdefault(part_of(k), []).append((k, v))
    out = {}
    for p, kvs in by_part.items():
        kvs.sort()
        table = pa.table(
            {
                "key": pa.array([k for k, _ in kvs], pa.binary()),
                "value": pa.array([v for _, v in kvs], pa.binary()),
                "offset": pa.array(range(len(kvs)), pa.int64()),
                "timestamp": pa.array([ts_of + i for i in range(len(kvs))], pa.int64()).cast(
                    pa.timestamp("ms")
                ),
            }
        )
        out[p] = datafile.decode(datafile.encode(table).data)
    return out


def assert_same(expected: StateStore, actual: StateStore, probe: list[bytes]) -> None:
    assert len(actual) == len(expected)
    assert sorted(actual.items()) == sorted(expected.items())
    for k in probe:
        assert actual.get(k) == expected.get(k), k
        assert (k in actual) == (k in expected), k
    assert list(actual.scan()) == sorted(expected.items())
    exp_export, act_export = expected.export(), actual.export()
    assert set(act_export) == set(exp_export)
    for p, table in exp_export.items():
        assert act_export[p].schema == datafile.SCHEMA
        assert act_export[p].combine_chunks().equals(table.combine_chunks()), p


def apply_changes(previous: dict[int, pa.Table], changes: dict[int, pa.Table]) -> dict[int, pa.Table]:
    """Merge-on-read, as a restore does: base then delta, newest row per key, tombstones delete."""
    out = {}
    for p in set(previous) | set(changes):
        merged = datafile.merge([t for t in (previous.get(p), changes.get(p)) if t is not None])
        if merged.num_rows:
            out[p] = merged.combine_chunks()
    return out


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[dict[str, StateStore]]:
    made = {k: open_state_store(k, path=tmp_path / k) for k in ["memory", *OTHER_KINDS]}
    yield made
    for s in made.values():
        s.close()


_keys = st.sampled_from([b"", b"a", b"a\x00", b"b", b"ab", b"abc", b"k1", b"k2", b"\xff", b"zz" * 9])
_ops = st.lists(st.tuples(_keys, st.one_of(st.none(), st.binary(max_size=6))), max_size=40)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    base=st.dictionaries(_keys, st.binary(max_size=6), max_size=8),
    ops=_ops,
    batch=st.integers(1, 6),
    checkpoint_every=st.integers(1, 20),
    seed=st.integers(0, 1000),
)
def test_every_store_equals_the_dict_store(
    tmp_path_factory: pytest.TempPathFactory,
    base: dict[bytes, bytes],
    ops: list[tuple[bytes, bytes | None]],
    batch: int,
    checkpoint_every: int,
    seed: int,
) -> None:
    """Restore a base, apply upserts and tombstones in batches (through apply and through
    apply_messages), taking incremental checkpoints now and then: every read and every export
    matches the memory store, and previous export + changes == current export."""
    rng = random.Random(seed)
    root = tmp_path_factory.mktemp("eq")
    stores = {k: open_state_store(k, path=root / k) for k in ["memory", *OTHER_KINDS]}
    try:
        for s in stores.values():
            for p, t in base_tables(base).items():
                s.load(p, t)
        previous = {k: s.export() for k, s in stores.items()}
        for s in stores.values():
            s.mark_checkpointed()
        probe = [b"", b"a", b"a\x00", b"b", b"ab", b"abc", b"k1", b"k2", b"\xff", b"zz" * 9, b"nope"]
        offset = 100
        for n, start in enumerate(range(0, len(ops), batch)):
            chunk = ops[start : start + batch]
            by_part: dict[int, list[tuple[bytes, bytes | None, int, int]]] = {}
            for k, v in chunk:
                ts = rng.choice([NO_TIMESTAMP, 5, 1_700_000_000_000])
                by_part.setdefault(part_of(k), []).append((k, v, offset, ts))
                offset += 1
            via_messages = rng.random() < 0.5
            for s in stores.values():
                for p, recs in by_part.items():
                    if via_messages:
                        s.apply_messages(p, [FakeMessage(k, v, o, t) for k, v, o, t in recs])
                    else:
                        s.apply(p, recs)
            if n % checkpoint_every == checkpoint_every - 1:
                assert_same(stores["memory"], stores["columnar"], probe)
                for kind, s in stores.items():
                    now = s.export()
                    assert apply_changes(previous[kind], s.changes()) == {
                        p: t.combine_chunks() for p, t in now.items()
                    }, kind
                    s.mark_checkpointed()
                    previous[kind] = now
        for kind in OTHER_KINDS:
            assert_same(stores["memory"], stores[kind], probe)
        for kind, s in stores.items():
            now = {p: t.combine_chunks() for p, t in s.export().items()}
            assert apply_changes(previous[kind], s.changes()) == now, kind
    finally:
        for s in stores.values():
            s.close()


@settings(max_examples=40, deadline=None)
@given(
    keys=st.lists(st.binary(max_size=6), max_size=30, unique=True),
    after=st.one_of(st.none(), st.binary(max_size=3)),
    prefix=st.one_of(st.none(), st.binary(max_size=2)),
    limit=st.one_of(st.none(), st.integers(0, 10)),
    split=st.integers(0, 30),
)
def test_scan_matches_a_sorted_model_for_every_store(
    keys: list[bytes], after: bytes | None, prefix: bytes | None, limit: int | None, split: int
) -> None:
    """Keys greater than *after*, starting with *prefix*, ascending, at most *limit*: over a
    restored base and an overlay of later writes alike."""
    model = {k: b"v" + k for k in keys}
    expected = [
        (k, v)
        for k, v in sorted(model.items())
        if (after is None or k > after) and (prefix is None or k.startswith(prefix))
    ][:limit]
    for kind in ["memory", *OTHER_KINDS]:
        s = open_state_store(kind)
        try:
            loaded = dict(list(model.items())[:split])
            for p, t in base_tables(loaded).items():
                s.load(p, t)
            s.apply(0, [(k, v, 0, 0) for k, v in list(model.items())[split:]])
            assert list(s.scan(after=after, prefix=prefix, limit=limit)) == expected, kind
        finally:
            s.close()


def test_tombstones_and_updates_on_a_restored_base(stores: dict[str, StateStore]) -> None:
    base = {b"k%04d" % i: b"v%d" % i for i in range(500)}
    for s in stores.values():
        for p, t in base_tables(base).items():
            s.load(p, t)
        s.apply(part_of(b"k0001"), [(b"k0001", None, 900, 5)])
        s.apply(part_of(b"k0002"), [(b"k0002", b"new", 901, NO_TIMESTAMP)])
        s.apply(part_of(b"fresh"), [(b"fresh", b"f", 902, 7), (b"fresh", None, 903, 8)])
        s.apply(part_of(b"k0003"), [(b"k0003", None, 904, 9), (b"k0003", b"back", 905, 9)])
    memory = stores["memory"]
    for kind in OTHER_KINDS:
        s = stores[kind]
        assert len(s) == 499
        assert s.get(b"k0001") is None
        assert b"k0001" not in s
        assert s.get(b"k0002") == b"new"
        assert s.get(b"k0003") == b"back"
        assert s.get(b"fresh") is None
        assert list(s.scan(after=b"k0000", limit=3)) == [
            (b"k0002", b"new"),
            (b"k0003", b"back"),
            (b"k0004", b"v4"),
        ]
        assert list(s.scan(prefix=b"k049")) == list(memory.scan(prefix=b"k049"))
        changes = s.changes()
        rows = {
            k: v
            for t in changes.values()
            for k, v in zip(t["key"].to_pylist(), t["value"].to_pylist(), strict=True)
        }
        assert rows == {b"k0001": None, b"k0002": b"new", b"fresh": None, b"k0003": b"back"}
        assert_same(memory, s, [b"k0001", b"k0002", b"k0003", b"fresh", b"k0499", b"zz"])


def test_mark_checkpointed_keeps_writes_made_after_the_change_set_was_taken(
    stores: dict[str, StateStore],
) -> None:
    """A background writer may apply records while a checkpoint is written: those records must
    stay in the change set, or the next delta would miss them."""
    for s in stores.values():
        s.apply(0, [(b"a", b"1", 0, 0), (b"b", b"1", 1, 0)])
        first = s.changes()
        assert sum(t.num_rows for t in first.values()) == 2
        s.apply(0, [(b"b", b"2", 2, 0), (b"c", None, 3, 0)])  # while the checkpoint is written
        s.mark_checkpointed()
        left = s.changes()
        assert {
            k: v
            for t in left.values()
            for k, v in zip(t["key"].to_pylist(), t["value"].to_pylist(), strict=True)
        } == {
            b"b": b"2",
            b"c": None,
        }
        s.mark_checkpointed()
        assert s.changes() == {}
        s.mark_checkpointed()
        s.apply(0, [(b"d", b"1", 4, 0)])
        s.mark_checkpointed()  # without a changes() call: nothing was handed out, nothing forgotten
        assert [t["key"].to_pylist() for t in s.changes().values()] == [[b"d"]]


def test_changes_schema_and_tombstone_metadata(stores: dict[str, StateStore]) -> None:
    for s in stores.values():
        s.apply(
            2, [(b"x", b"1", 10, 1_700_000_000_123), (b"y", None, 11, NO_TIMESTAMP), (b"x", None, 12, 42)]
        )
        out = s.changes()
        assert set(out) == {2}
        t = out[2]
        assert t.schema == datafile.SCHEMA
        assert t.column("key").to_pylist() == [b"x", b"y"]
        assert t.column("value").to_pylist() == [None, None]
        assert t.column("offset").to_pylist() == [12, 11]
        assert t.column("timestamp").cast(pa.int64()).to_pylist() == [42, None]


def test_export_adopts_the_merge_when_the_overlay_is_large(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a big enough overlay, export folds it into the columnar base (and the store keeps
    answering the same, with writes after the merge going to a fresh overlay)."""
    monkeypatch.setattr(columnar_module, "_MIN_MERGE", 4)
    s = ColumnarStore()
    memory = open_state_store("memory")
    base = {b"k%03d" % i: b"v" for i in range(100)}
    for store in (s, memory):
        for p, t in base_tables(base).items():
            store.load(p, t)
        store.apply(0, [(b"k%03d" % i, b"w%d" % i, 200 + i, 1) for i in range(0, 100, 3)])
        store.apply(1, [(b"k%03d" % i, None, 300 + i, 1) for i in range(1, 100, 7)])
    s.export()
    assert s._over == {}  # merged into the base
    assert_same(memory, s, [b"k000", b"k001", b"k002", b"k099", b"zz"])
    for store in (s, memory):
        store.apply(0, [(b"k002", None, 500, 1), (b"new", b"n", 501, 1)])
    assert_same(memory, s, [b"k000", b"k002", b"new"])


def test_negative_timestamps_export_as_null_like_the_dict_store() -> None:
    table = pa.table(
        {
            "key": pa.array([b"a", b"b"], pa.binary()),
            "value": pa.array([b"1", b"2"], pa.binary()),
            "offset": pa.array([0, 1], pa.int64()),
            "timestamp": pa.array([-5, None], pa.int64()).cast(pa.timestamp("ms")),
        }
    )
    memory, columnar = open_state_store("memory"), open_state_store("columnar")
    for s in (memory, columnar):
        s.load(0, table.cast(datafile.SCHEMA))
    assert columnar.export()[0].equals(memory.export()[0])


def test_many_chunks_and_large_partitions_are_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows spread over many Arrow chunks (Parquet row groups; here at most 64 rows a chunk,
    as 2**20 rows are at full size) are all reachable, by get and by scan."""
    bits = 6
    monkeypatch.setattr(columnar_base, "_LOCAL_BITS", bits)
    monkeypatch.setattr(columnar_base, "_LOCAL_MASK", (1 << bits) - 1)
    monkeypatch.setattr(columnar_base, "_MAX_SEGMENTS", 1 << (32 - bits))
    rows = {b"key-%d" % i: b"v%d" % i for i in range(5000)}
    s = ColumnarStore()
    for p, t in base_tables(rows).items():
        chunks = [t.slice(i, 97) for i in range(0, t.num_rows, 97)]
        s.load(p, pa.concat_tables(chunks))
    assert len(s) == 5000
    for i in range(0, 5000, 37):
        assert s.get(b"key-%d" % i) == b"v%d" % i
    assert s.get(b"key-5000") is None
    assert len(s._base.segments) > 5000 // 64
    assert [k for k, _ in s.scan(after=b"key-4998", limit=3)] == [b"key-4999", b"key-5", b"key-50"]
    assert list(s.scan()) == sorted(rows.items())
    s.apply(0, [(b"key-77", None, 1, 1)])
    assert len(s) == 4999
    assert s.get(b"key-77") is None


def test_vectorized_hash_equals_the_scalar_hash() -> None:
    rng = random.Random(7)
    keys = [b"", b"a", b"\xff" * 7, b"\xff" * 8, b"\xff" * 9, bytes(range(256))]
    keys += [rng.randbytes(rng.randint(0, 40)) for _ in range(3000)]
    arr = pa.array(keys, pa.binary())
    assert array_hashes(arr).tolist() == [key_hash(k) for k in keys]
    assert array_hashes(arr.slice(5)).tolist() == [key_hash(k) for k in keys[5:]]
    large = arr.cast(pa.large_binary())
    assert array_hashes(large).tolist() == [key_hash(k) for k in keys]


def test_hash_collisions_are_resolved_by_comparing_keys() -> None:
    """Keys equal modulo the hash prime (and b"a" vs b"a\\x00") share a hash: all must stay distinct."""
    prime = keyindex_module.P
    colliding = [(12345 + i * prime).to_bytes(8, "little") for i in range(8)]
    colliding += [b"a", b"a\x00", b"a\x00\x00"]
    assert len({key_hash(k) for k in colliding[:8]}) == 1
    assert key_hash(b"a") == key_hash(b"a\x00")
    present = colliding[::2]
    s = ColumnarStore()
    table = pa.table(
        {
            "key": pa.array(sorted(present), pa.binary()),
            "value": pa.array([b"v" + k for k in sorted(present)], pa.binary()),
            "offset": pa.array(range(len(present)), pa.int64()),
            "timestamp": pa.array([1] * len(present), pa.int64()).cast(pa.timestamp("ms")),
        }
    ).cast(datafile.SCHEMA)
    s.load(0, table)
    for k in colliding:
        assert s.get(k) == (b"v" + k if k in present else None)
        assert (k in s) == (k in present)
    assert len(KeyIndex.of_keys(table.column("key"), HashSeed.process()).candidates(colliding[0])) >= 4


def test_readers_see_a_consistent_store_while_the_writer_applies_and_merges(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reader thread never misses a live key while the writer updates it and export() folds
    the overlay into a new base (base and overlay are swapped under the writer's lock)."""
    import threading

    monkeypatch.setattr(columnar_module, "_MIN_MERGE", 8)
    s = ColumnarStore()
    for p, t in base_tables({b"base%d" % i: b"b" for i in range(50)}).items():
        s.load(p, t)
    live = [b"k%03d" % i for i in range(200)]  # first only in the overlay, then merged, ...
    for k in live:
        s.apply(part_of(k), [(k, b"0", 0, 1)])
    stop = threading.Event()
    errors: list[str] = []

    def read() -> None:
        while not stop.is_set():
            for k in live:
                if s.get(k) is None or k not in s:
                    errors.append(k.decode())
                    return

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for round_ in range(30):
            for k in live:
                s.apply(part_of(k), [(k, b"%d" % round_, round_, 1), (b"tmp" + k, b"x", round_, 1)])
                s.apply(part_of(b"tmp" + k), [(b"tmp" + k, None, round_, 1)])
            s.export()
    finally:
        stop.set()
        reader.join()
    assert errors == []
    assert s._over == {}  # the last export merged everything
    assert s.get(live[0]) == b"29"
    assert len(s) == 250


_steps = st.lists(
    st.one_of(
        st.tuples(st.just("write"), _keys, st.one_of(st.none(), st.binary(max_size=4))),
        st.tuples(st.just("changes"), st.none(), st.none()),
        st.tuples(st.just("export"), st.none(), st.none()),
        st.tuples(st.just("mark"), st.none(), st.none()),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(base=st.dictionaries(_keys, st.binary(max_size=4), max_size=6), steps=_steps)
def test_change_set_is_relative_to_the_last_marked_hand_out(
    base: dict[bytes, bytes], steps: list[tuple[str, bytes | None, bytes | None]]
) -> None:
    """Checkpoints that fail (changes taken, never marked), writes racing a checkpoint (between
    the hand-out and the mark), several hand-outs before one mark, marks without a hand-out: the
    change set always turns the contents of the last *marked* hand-out into the current ones.
    (The change set hands its dict out whole and marks in O(1); this pins that semantics.)"""
    for kind in ["memory", *OTHER_KINDS]:
        s, mirror = open_state_store(kind), open_state_store("memory")  # mirror: contents only
        try:
            for p, t in base_tables(base).items():
                s.load(p, t)
                mirror.load(p, t)

            def contents(mirror: StateStore = mirror) -> dict[int, pa.Table]:
                return {p: t.combine_chunks() for p, t in mirror.export().items()}

            durable = contents()
            s.mark_checkpointed()
            handed: dict[int, pa.Table] | None = None
            offset = 100
            for op, key, value in steps:
                if op == "write":
                    assert key is not None
                    for store in (s, mirror):
                        store.apply(part_of(key), [(key, value, offset, 7)])
                    offset += 1
                elif op == "changes":
                    assert apply_changes(durable, s.changes()) == contents(), kind
                    handed = contents()
                elif op == "export":
                    assert {p: t.combine_chunks() for p, t in s.export().items()} == contents(), kind
                    handed = contents()
                else:
                    s.mark_checkpointed()
                    # Without a hand-out since the last mark, everything counts as checkpointed.
                    durable, handed = (handed if handed is not None else contents()), None
            assert apply_changes(durable, s.changes()) == contents(), kind
        finally:
            s.close()
            mirror.close()


def test_the_key_hash_modulus_is_a_random_prime_per_process() -> None:
    """Keys crafted to collide under a known modulus (differing by multiples of it) must not all
    land in one bucket: the modulus is drawn at start-up, and the primality test is exact."""
    import subprocess
    import sys

    from statesnap.keys import index as keyindex

    sieve = [True] * 10_000
    sieve[0] = sieve[1] = False
    for i in range(2, 100):
        if sieve[i]:
            sieve[i * i :: i] = [False] * len(sieve[i * i :: i])
    assert [n for n in range(10_000) if keyindex._is_prime(n)] == [n for n in range(10_000) if sieve[n]]
    assert keyindex._is_prime(1_000_000_007)
    assert not keyindex._is_prime(1_000_000_007 * 3)
    assert 1 << 29 <= keyindex.P < 1 << 30
    assert keyindex._is_prime(keyindex.P)
    code = "from statesnap.keys.index import P; print(P)"
    run = [sys.executable, "-c", code]
    drawn = {int(subprocess.run(run, check=True, capture_output=True, text=True).stdout) for _ in range(2)}
    assert len(drawn | {keyindex.P}) > 1, drawn


def _displacements(index: KeyIndex) -> list[int]:
    """How far each entry sits past its home slot (what a probe scans)."""
    out = []
    for pos, e in enumerate(index.table.tolist()):
        if e != keyindex_module.EMPTY:
            out.append(pos - ((e >> 32) * index.scale >> keyindex_module.HASH_BITS))
    return out


def _seed_with_prime(prime: int) -> HashSeed:
    rng = random.Random(prime)
    while True:
        seed = HashSeed(prime, rng.randrange(1 << 20, prime), rng.randrange(prime))
        if spreads(seed):
            return seed


@pytest.mark.parametrize("low_prime", [False, True])
@pytest.mark.parametrize(
    "make_key",
    [lambda i: b"key-%d" % i, lambda i: i.to_bytes(4, "little"), lambda i: i.to_bytes(8, "big")],
)
def test_home_slots_spread_over_the_whole_table_whatever_the_prime_and_keys(
    low_prime: bool, make_key: Callable[[int], bytes]
) -> None:
    """Hashes lie below P, which may be near 2**29 (homes are scaled by P, not by 2**30), and
    small little-endian integers are their own residues (the multiplier spreads them): else part
    of the table stays empty and probes scan long runs (the index would stay correct, but slow).
    20,000 keys is none of the sizes :func:`spreads` tries."""
    if low_prime:
        prime = next(n for n in range((1 << 29) + 1, 1 << 30, 2) if keyindex_module._is_prime(n))
        seed = _seed_with_prime(prime)
    else:
        seed = HashSeed.process()
    keys = [make_key(i) for i in range(20_000)]
    index = KeyIndex.of_keys(pa.array(keys, pa.binary()), seed)
    shifts = _displacements(index)
    assert len(shifts) == 20_000
    assert min(shifts) >= 0
    # Uniform hashes at this load: ~0.87 on average; seeds that spreads() keeps gave 0.9-1.13 at
    # 20,000 integer keys over 300 draws (a CI run's unchecked seed gave 2.07, and one in 1,000 up
    # to 7); the bugs this guards against gave 300 and 100,000, MIX without the square up to 170.
    assert sum(shifts) / len(shifts) < 1.5, (seed, sum(shifts) / len(shifts))
    assert max(shifts) < 64
    for i in range(0, 20_000, 97):
        assert i in index.candidates(keys[i])


#: A seed a CI run drew: it piles 20,000 sequential little-endian integers (mean probe 2.07).
_PILING_SEED = HashSeed(p=959648117, mix=643089860, add=954782230)


def test_a_seed_that_piles_sequential_integers_is_never_drawn() -> None:
    """:func:`spreads` refuses the seed a CI run drew, and every seed :meth:`HashSeed.fresh`
    hands out (and the process's) passes it."""
    keys = pa.array([i.to_bytes(4, "little") for i in range(20_000)], pa.binary())
    piled = _displacements(KeyIndex.of_keys(keys, _PILING_SEED))
    assert sum(piled) / len(piled) > 1.5
    assert not spreads(_PILING_SEED)
    assert spreads(HashSeed.process())
    assert all(spreads(HashSeed.fresh()) for _ in range(5))


@pytest.mark.parametrize("dtype", ["<u4", ">u4", ">u8"])
def test_the_trial_of_a_seed_hashes_as_the_index_does(dtype: str) -> None:
    """:func:`spreads` hashes its trial keys from their one word; they equal :func:`array_hashes`."""
    n = 5_000
    keys = pa.array([np.arange(n, dtype=dtype)[i : i + 1].tobytes() for i in range(n)], pa.binary())
    for seed in (HashSeed.process(), _PILING_SEED):
        assert (keyindex_module._trial_hashes(n, dtype, seed) == array_hashes(keys, seed)).all()


def _sqrt_mod(a: int, p: int) -> int | None:
    """A square root of *a* modulo the odd prime *p* (Tonelli-Shanks), or None if there is none."""
    a %= p
    if a == 0:
        return 0
    if pow(a, (p - 1) // 2, p) != 1:
        return None
    q, s = p - 1, 0
    while q % 2 == 0:
        q, s = q // 2, s + 1
    z = next(z for z in range(2, p) if pow(z, (p - 1) // 2, p) == p - 1)
    m, c, t, r = s, pow(z, q, p), pow(a, q, p), pow(a, (q + 1) // 2, p)
    while t != 1:
        i, t2 = 0, t
        while t2 != 1:
            t2, i = t2 * t2 % p, i + 1
        b = pow(c, 1 << (m - i - 1), p)
        m, c, t, r = i, b * b % p, t * b * b % p, r * b % p
    return r


def test_probes_find_keys_whose_run_spills_past_the_last_home_slot() -> None:
    """Keys hashing to the top of the range all have the last home slot: their run continues
    past it (the table grows) and ends on a free slot, for present and absent keys alike."""
    prime, mix, add = keyindex_module.P, keyindex_module.MIX, keyindex_module.ADD
    unmix = pow(mix, -1, prime)
    residues: list[int] = []  # x * MIX mod P of keys whose hashes are the highest ones
    h = prime - 1
    while len(residues) < 600:  # half of the hashes are squares plus ADD: the other half is skipped
        y = _sqrt_mod(h - add, prime)
        if y is not None:
            residues.append(y)
        h -= 1
    keys = [(y * unmix % prime).to_bytes(5, "little") for y in residues]
    present, absent = keys[0::2], keys[1::2]
    assert key_hash(present[0]) > key_hash(absent[0]) > key_hash(present[1])
    absent += [b"\x00", b"zz", (int.from_bytes(present[0], "little") + prime).to_bytes(5, "little")]
    assert key_hash(absent[-1]) == key_hash(present[0])  # the top key's hash, other bytes
    s = ColumnarStore()
    rows = sorted(present)
    table = pa.table(
        {
            "key": pa.array(rows, pa.binary()),
            "value": pa.array([b"v" + k for k in rows], pa.binary()),
            "offset": pa.array(range(len(rows)), pa.int64()),
            "timestamp": pa.array([1] * len(rows), pa.int64()).cast(pa.timestamp("ms")),
        }
    ).cast(datafile.SCHEMA)
    s.load(0, table)
    assert s.get(rows[0]) == b"v" + rows[0]
    index = s._base.index
    assert max(_displacements(index)) > 64  # the run spilled past the spare slots
    assert index.table.tolist()[-1] == keyindex_module.EMPTY
    for k in present:
        assert s.get(k) == b"v" + k
        assert k in s
    for k in absent:
        assert s.get(k) is None
        assert k not in s
    s.apply(0, [(present[0], None, 9, 1), (absent[0], b"new", 10, 1)])
    assert s.get(present[0]) is None
    assert present[0] not in s
    assert s.get(absent[0]) == b"new"
    assert len(s) == len(present)


@settings(max_examples=60, deadline=None)
@given(
    base=st.dictionaries(_keys, st.binary(max_size=6), max_size=8),
    writes=st.lists(
        st.tuples(
            st.one_of(_keys, st.sampled_from([b"zzz1", b"zzz2", b"\xff\xff"])),  # some after every base key
            st.one_of(st.none(), st.binary(max_size=6)),
            st.integers(0, PARTITIONS - 1),
        ),
        max_size=30,
    ),
    probe_share=st.sampled_from([0, 1 << 30]),
    stamp=st.sampled_from([NO_TIMESTAMP, -7, 5]),
)
def test_export_merges_the_overlay_in_place_like_a_model(
    base: dict[bytes, bytes],
    writes: list[tuple[bytes, bytes | None, int]],
    probe_share: int,
    stamp: int,
) -> None:
    """The overlay is merged into the base rows in place (updates), by dropping them (tombstones,
    keys written to another partition) and by adding new keys (sorted in, or appended after the
    last key), whether overlay rows are matched by index probes or by ``index_in``: the export
    equals a per-partition model of latest writes, row for row."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(columnar_merge, "_PROBE_SHARE", probe_share)
        exported = _export_after(base, writes, stamp)
    model: dict[bytes, tuple[int, bytes, int, int | None]] = {}  # key → partition, value, offset, ts
    for p, table in base_tables(base).items():
        for row in table.to_pylist():
            model[row["key"]] = (p, row["value"], row["offset"], 1000 + row["offset"])
    for offset, (key, value, partition) in enumerate(writes, start=500):
        if value is None:
            model.pop(key, None)
        else:
            model[key] = (partition, value, offset, stamp if stamp >= 0 else None)
    expected: dict[int, list[dict[str, object]]] = {}
    for key in sorted(model):
        p, value, offset, ts = model[key]
        expected.setdefault(p, []).append({"key": key, "value": value, "offset": offset, "timestamp": ts})
    assert {p: rows for p, rows in exported.items() if rows} == expected


def _export_after(
    base: dict[bytes, bytes], writes: list[tuple[bytes, bytes | None, int]], stamp: int
) -> dict[int, list[dict[str, object]]]:
    """The columnar store's export after restoring *base* and applying *writes*, as plain rows
    (timestamps in ms)."""
    store = ColumnarStore()
    for p, table in base_tables(base).items():
        store.load(p, table)
    for offset, (key, value, partition) in enumerate(writes, start=500):
        store.apply(partition, [(key, value, offset, stamp)])
    exported = {p: t.combine_chunks().to_pylist() for p, t in store.export().items()}
    return {
        p: [
            {**r, "timestamp": None if r["timestamp"] is None else round(r["timestamp"].timestamp() * 1000)}
            for r in rows
        ]
        for p, rows in exported.items()
    }
