"""The read and hook plumbing on real state stores, without a broker: ordered reads with and
without a store's ``scan``, where a row came from (for decode errors), the (key, old, new) of a
batch, and async waiters woken from another thread."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterator

import pytest

import statesnap.python.aio
from statesnap.python.aio import AsyncWaiters
from statesnap.python.hooks import changes_of
from statesnap.python.reads import ordered_rows, row_origin
from statesnap.stores import MemoryStore, StateStore, open_state_store


class NoScan:
    """A store that only offers unordered items() (stores written before scan() existed)."""

    def __init__(self, inner: MemoryStore) -> None:
        self.inner = inner

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        return self.inner.items()


def filled(store: StateStore, rng: random.Random) -> dict[bytes, bytes]:
    truth: dict[bytes, bytes] = {}
    for p in range(3):
        recs = []
        for off in range(200):
            key = bytes([rng.choice(b"abc")]) + b"%03d" % rng.randrange(100)
            value = None if rng.random() < 0.2 else b"v%d" % off
            recs.append((key, value, off, 0))
            if value is None:
                truth.pop(key, None)
            else:
                truth[key] = value
        store.apply(p, recs)
    return truth


@pytest.mark.parametrize("kind", ["memory", "rocksdb", "columnar"])
def test_ordered_rows_with_and_without_a_store_scan(kind: str, tmp_path: object) -> None:
    rng = random.Random(1)
    store = open_state_store(kind, path=f"{tmp_path}/db")
    mem = MemoryStore()
    filled(store, random.Random(1))
    truth = filled(mem, rng)
    expected = sorted(truth.items())
    for after in (None, b"a050", b"b", b"zzz"):
        for prefix in (None, b"b", b"c09", b"x"):
            for limit in (None, 1, 7):
                want = [kv for kv in expected if (after is None or kv[0] > after)]
                want = [kv for kv in want if prefix is None or kv[0].startswith(prefix)]
                want = want if limit is None else want[:limit]
                assert list(ordered_rows(store, after, prefix, limit)) == want, (after, prefix, limit)
                fallback = ordered_rows(NoScan(mem), after, prefix, limit)  # type: ignore[arg-type]
                assert list(fallback) == want, (after, prefix, limit)
    store.close()


def test_row_origin_reads_the_row_header() -> None:
    store = MemoryStore()
    store.apply(
        2, [(b"k", b"v1", 10, 0), (b"k", b"v2", 11, 0), (b"gone", b"x", 12, 0), (b"gone", None, 13, 0)]
    )
    assert row_origin(store, b"k") == (2, 11)
    assert row_origin(store, b"gone") is None
    assert row_origin(store, b"never") is None

    class WithHeader(MemoryStore):
        def row_origin(self, key: bytes) -> tuple[int, int] | None:
            return (7, 70) if key == b"k" else None

    assert row_origin(WithHeader(), b"k") == (7, 70)  # the store's own answer wins


def test_changes_of_a_batch_see_each_records_old_value() -> None:
    store = MemoryStore()
    store.apply(0, [(b"a", b"1", 0, 0), (b"b", b"2", 1, 0)])
    batch = [
        (b"a", b"3", 2, 0),
        (b"a", b"4", 3, 0),
        (b"b", None, 4, 0),
        (b"z", None, 5, 0),
        (b"c", b"5", 6, 0),
    ]
    assert changes_of(store, batch) == [
        (b"a", b"1", b"3"),
        (b"a", b"3", b"4"),
        (b"b", b"2", None),
        (b"c", None, b"5"),
    ]


def test_async_waiters_are_woken_from_another_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(statesnap.python.aio, "RECHECK_SECONDS", 30.0)
    waiters = AsyncWaiters()
    flag = threading.Event()

    def later() -> None:
        time.sleep(0.2)
        flag.set()
        waiters.notify()

    async def main() -> float:
        threading.Thread(target=later).start()
        started = time.monotonic()
        assert await waiters.wait_until(flag.is_set, lambda: None, timeout=20)
        return time.monotonic() - started

    assert asyncio.run(main()) < 2.0
    assert asyncio.run(waiters.wait_until(lambda: False, lambda: None, timeout=0.1)) is False
    waiters.notify()  # nobody waiting: a no-op
