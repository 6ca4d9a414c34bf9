"""BlobSnapshotStore on a real ``file://`` blob store: write-once versions as optimistic concurrency.

Threads stand in for processes: each store instance below has its own cache and shares nothing
with the others but the directory, exactly as two processes would.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from statesnap.blob import open_blob_store
from statesnap.errors import GenerationConflictError, SnapshotNotFoundError, StaleGenerationError
from statesnap.snapshot.model import EMPTY, Snapshot, SnapshotState, TaskSnapshot
from statesnap.snapshot.store import BlobSnapshotStore, SnapshotStore

from .conftest import T0

DIRECTORY = "c1_orders/_snapshots"


@pytest.fixture
def open_store(tmp_path: Path) -> Callable[[], BlobSnapshotStore]:
    """A new, independent store instance on the same directory per call."""
    url = (tmp_path / "root").as_uri()
    return lambda: BlobSnapshotStore(open_blob_store(url), DIRECTORY)


@pytest.fixture
def store(open_store: Callable[[], BlobSnapshotStore]) -> BlobSnapshotStore:
    return open_store()


def new_generation(generation: int, **changes: object) -> Callable[[Snapshot], Snapshot]:
    def fn(_current: Snapshot) -> Snapshot:
        return Snapshot(generation, SnapshotState.CREATED, T0, T0, expected_partitions=(0, 1)).evolve(
            **changes
        )

    return fn


def counter(s: Snapshot) -> int:
    return int(s.label or 0)


def increment(current: Snapshot) -> Snapshot:
    if current.generation == 0:
        return new_generation(1, label="1")(current)
    return current.evolve(label=str(counter(current) + 1))


def test_is_a_snapshot_store(store: BlobSnapshotStore) -> None:
    assert isinstance(store, SnapshotStore)


def test_an_empty_store(store: BlobSnapshotStore) -> None:
    assert store.current() == EMPTY
    assert store.current(block=False) == EMPTY
    assert store.list() == []
    assert store.get(0) == EMPTY
    with pytest.raises(SnapshotNotFoundError):
        store.get(1)
    with pytest.raises(SnapshotNotFoundError):
        store.delete(1)
    with pytest.raises(SnapshotNotFoundError):
        store.update(1, lambda s: s.evolve(pinned=True))


def test_update_current_creates_a_generation_then_versions_it(store: BlobSnapshotStore) -> None:
    first = store.update_current(new_generation(1))
    assert (first.generation, first.version, first.state) == (1, 0, SnapshotState.CREATED)
    second = store.update_current(lambda s: s.evolve(state=SnapshotState.COMPLETED))
    assert (second.generation, second.version, second.state) == (1, 1, SnapshotState.COMPLETED)
    assert store.current().to_json() == second.to_json()
    third = store.update_current(new_generation(2))
    assert (third.generation, third.version) == (2, 0)  # a new generation starts at version 0
    assert [s.generation for s in store.list()] == [2, 1]


def test_the_store_numbers_versions_not_the_caller(store: BlobSnapshotStore) -> None:
    store.update_current(new_generation(1))
    out = store.update_current(lambda s: s.evolve(version=99))
    assert out.version == 1
    assert store.get(1).version == 1


def test_none_leaves_the_store_unchanged(store: BlobSnapshotStore, tmp_path: Path) -> None:
    assert store.update_current(lambda s: None) == EMPTY
    store.update_current(new_generation(1))
    files = sorted(p for p in (tmp_path / "root").rglob("*") if p.is_file())
    assert store.update_current(lambda s: None).version == 0
    assert store.update(1, lambda s: None).version == 0
    assert sorted(p for p in (tmp_path / "root").rglob("*") if p.is_file()) == files


def test_generations_only_grow(store: BlobSnapshotStore) -> None:
    store.update_current(new_generation(3))
    with pytest.raises(GenerationConflictError, match="backwards"):
        store.update_current(new_generation(2))
    assert store.current().generation == 3
    assert [s.generation for s in store.list()] == [3]


def test_errors_raised_by_fn_propagate_and_write_nothing(store: BlobSnapshotStore) -> None:
    store.update_current(new_generation(1))

    def fenced(current: Snapshot) -> Snapshot:
        raise StaleGenerationError("report for generation 0 fenced")

    with pytest.raises(StaleGenerationError):
        store.update_current(fenced)
    assert store.current().version == 0


def test_get_list_and_delete(store: BlobSnapshotStore) -> None:
    for g in (1, 2, 5):
        store.update_current(new_generation(g, label=f"g{g}"))
    assert [s.generation for s in store.list()] == [5, 2, 1]
    assert store.get(2).label == "g2"
    store.delete(2)
    with pytest.raises(SnapshotNotFoundError):
        store.get(2)
    with pytest.raises(SnapshotNotFoundError):
        store.delete(2)
    assert [s.generation for s in store.list()] == [5, 1]
    assert store.current().generation == 5


def test_update_of_an_older_generation(store: BlobSnapshotStore) -> None:
    store.update_current(new_generation(1))
    store.update_current(new_generation(2))
    pinned = store.update(1, lambda s: s.evolve(pinned=True, expires_at=T0 + timedelta(days=1)))
    # version 1 is the seal written when generation 2 was started
    assert (pinned.generation, pinned.version, pinned.pinned) == (1, 2, True)
    assert store.get(1).to_json() == pinned.to_json()
    assert store.current().generation == 2  # the current generation is untouched
    assert store.current().version == 0
    with pytest.raises(GenerationConflictError):
        store.update(1, new_generation(3))
    with pytest.raises(SnapshotNotFoundError):
        store.update(4, lambda s: s.evolve(pinned=True))


def test_block_false_answers_from_the_last_read(open_store: Callable[[], BlobSnapshotStore]) -> None:
    writer, reader = open_store(), open_store()
    assert reader.current() == EMPTY
    written = writer.update_current(new_generation(1))
    assert writer.current(block=False) == written  # a writer sees its own update
    assert reader.current(block=False) == EMPTY  # stale until the reader reads again
    assert reader.current().to_json() == written.to_json()
    assert reader.current(block=False).to_json() == written.to_json()


def test_two_threads_racing_lose_no_update(open_store: Callable[[], BlobSnapshotStore]) -> None:
    """Each thread has its own store instance; every increment must land exactly once."""
    n = 25
    seen: dict[str, list[int]] = {"a": [], "b": []}
    start = threading.Barrier(2)

    def work(name: str) -> None:
        store = open_store()
        start.wait()
        for i in range(n):

            def add_report(current: Snapshot, i: int = i) -> Snapshot:
                nxt = increment(current)
                task = TaskSnapshot(f"{name}-{i}", {("orders", 0): counter(nxt)})
                return nxt.evolve(tasks={**nxt.tasks, task.task_id: task}, version=nxt.version)

            seen[name].append(counter(store.update_current(add_report)))

    threads = [threading.Thread(target=work, args=(name,)) for name in seen]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    final = open_store().current()
    assert counter(final) == 2 * n
    assert sorted(seen["a"] + seen["b"]) == list(range(1, 2 * n + 1))  # each update saw a distinct state
    assert all(x < y for x, y in zip(seen["a"], seen["a"][1:], strict=False))
    assert len(final.tasks) == 2 * n  # every report is in the one generation
    assert final.version == 2 * n - 1


def test_racing_generation_bumps_keep_generations_growing(
    open_store: Callable[[], BlobSnapshotStore],
) -> None:
    """Both threads start new generations (current + 1) concurrently: every generation is created
    exactly once, none is skipped, and no result goes backwards."""
    n = 20
    results: dict[str, list[int]] = {"a": [], "b": []}
    start = threading.Barrier(2)

    def work(name: str) -> None:
        store = open_store()
        start.wait()
        for _ in range(n):
            out = store.update_current(lambda s: new_generation(s.generation + 1)(s))
            results[name].append(out.generation)

    threads = [threading.Thread(target=work, args=(name,)) for name in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results["a"] + results["b"]) == list(range(1, 2 * n + 1))
    for gens in results.values():
        assert gens == sorted(gens)
        assert len(set(gens)) == n
    store = open_store()
    assert [s.generation for s in store.list()] == list(range(2 * n, 0, -1))
    # every generation but the newest was sealed (a later version) when its successor was started
    versions = [s.version for s in store.list()]
    assert versions[0] == 0
    assert all(v >= 1 for v in versions[1:])


def test_same_generation_updates_racing_a_new_generation_lose_nothing(
    open_store: Callable[[], BlobSnapshotStore],
) -> None:
    """Thread a increments the counter in the current generation; thread b carries the counter
    into a new generation. Linearizable updates end at exactly 2n; a lost one ends lower."""
    n = 30

    def bump(current: Snapshot) -> Snapshot:
        nxt = increment(current)
        return new_generation(current.generation + 1, label=nxt.label)(current)

    def work(fn: Callable[[Snapshot], Snapshot], start: threading.Barrier) -> None:
        store = open_store()
        start.wait()
        for _ in range(n):
            store.update_current(fn)

    start = threading.Barrier(2)
    threads = [threading.Thread(target=work, args=(fn, start)) for fn in (increment, bump)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counter(open_store().current()) == 2 * n
