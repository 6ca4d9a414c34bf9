"""TopicSnapshotStore on the real (dev) broker, and the SnapshotStore contract for both backends.

The dev broker shows records of aborted transactions to ``read_committed`` readers, does not
answer a fenced producer's commit, and can leave its last stable offset stuck; the store reads
``read_uncommitted`` and lets the chain alone decide what counts. Every test here says what it
proves and whether it holds on Apache Kafka too. Ground truth is rebuilt by the test from the
raw records (``raw_records``: a plain ``read_uncommitted`` consumer, the store's view of the
log) by the rule the store documents: a record counts iff its ``prev`` is the offset of the last
record that counted.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka import KafkaError as RdKafkaError

from statesnap.blob import open_blob_store
from statesnap.checkpoint.manifest import DataFile, FileKind, PartitionCheckpoint
from statesnap.devstack import EmbeddedBroker
from statesnap.errors import (
    BrokerUnavailableError,
    ConfigError,
    CorruptCheckpointError,
    GenerationConflictError,
    SnapshotError,
    SnapshotNotFoundError,
    StaleGenerationError,
    TopicNotFoundError,
)
from statesnap.kafka.admin import KafkaAdmin
from statesnap.kafka.config import KafkaSettings
from statesnap.snapshot import topic_clients, topic_records
from statesnap.snapshot.model import EMPTY, CheckpointRef, Snapshot, SnapshotState, TaskSnapshot
from statesnap.snapshot.store import BlobSnapshotStore, SnapshotStore
from statesnap.snapshot.topic_store import TopicSnapshotStore

pytestmark = pytest.mark.integration

T0 = EMPTY.created_at + timedelta(days=20_000)  # a fixed instant with whole milliseconds


def new_generation(generation: int, **changes: Any) -> Callable[[Snapshot], Snapshot]:
    def fn(_current: Snapshot) -> Snapshot:
        return Snapshot(generation, SnapshotState.CREATED, T0, T0, expected_partitions=(0, 1), **changes)

    return fn


def counter(s: Snapshot) -> int:
    return int(s.label or 0)


def increment(current: Snapshot) -> Snapshot:
    if current.generation == 0:
        return new_generation(1, label="1")(current)
    return current.evolve(label=str(counter(current) + 1))


def raw_records(bootstrap: str, topic: str, timeout: float = 20.0) -> list[tuple[int, bytes | None]]:
    """Every record of partition 0 as (offset, value), whatever its transaction's fate, read to
    partition EOF with a plain consumer (never from the high watermark)."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "test-raw",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 10,
            "isolation.level": "read_uncommitted",
        }
    )
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        out: list[tuple[int, bytes | None]] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = c.poll(0.1)
            if m is None:
                continue
            err = m.error()
            offset = m.offset()
            assert offset is not None
            if err is None:
                out.append((offset, m.value()))
            elif err.code() == RdKafkaError._PARTITION_EOF:
                return out
        raise AssertionError(f"reading {topic} timed out")
    finally:
        c.close()


def chain(records: list[tuple[int, bytes | None]], table: str | None) -> list[tuple[int, dict[str, Any]]]:
    """The records that count, by the documented rule, rebuilt independently of the store."""
    head, out = -1, []
    for offset, value in sorted(records, key=lambda r: r[0]):
        try:
            obj = json.loads(value or b"")
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("table") == table and obj.get("prev") == head:
            head = offset
            out.append((offset, obj))
    return out


# --- one contract, both backends -----------------------------------------------------------------


@dataclass
class Backend:
    kind: str
    make: Callable[[], SnapshotStore]
    opened: list[SnapshotStore] = field(default_factory=list)

    def open(self) -> SnapshotStore:
        store = self.make()
        self.opened.append(store)
        return store


@pytest.fixture(params=["blob", "topic"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "blob":
        url = (tmp_path / "root").as_uri()
        b = Backend("blob", lambda: BlobSnapshotStore(open_blob_store(url), "c1_orders/_snapshots"))
    else:
        settings = KafkaSettings(request.getfixturevalue("bootstrap"))
        topic = request.getfixturevalue("topic_name")
        b = Backend("topic", lambda: TopicSnapshotStore(settings, topic, table="orders"))
    yield b
    for store in b.opened:
        if isinstance(store, TopicSnapshotStore):
            store.close()


@pytest.fixture
def store(backend: Backend) -> SnapshotStore:
    return backend.open()


class TestSnapshotStoreContract:
    """What the orchestrator and API rely on, asserted identically for the blob and topic stores."""

    def test_is_a_snapshot_store(self, store: SnapshotStore) -> None:
        assert isinstance(store, SnapshotStore)

    def test_an_empty_store(self, store: SnapshotStore) -> None:
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

    def test_update_current_creates_then_versions(self, store: SnapshotStore) -> None:
        first = store.update_current(new_generation(1))
        assert (first.generation, first.version, first.state) == (1, 0, SnapshotState.CREATED)
        second = store.update_current(lambda s: s.evolve(state=SnapshotState.COMPLETED, version=42))
        assert (second.generation, second.version, second.state) == (1, 1, SnapshotState.COMPLETED)
        assert store.current().to_json() == second.to_json()
        assert store.current(block=False).to_json() == second.to_json()  # read-your-writes
        third = store.update_current(new_generation(2))
        assert (third.generation, third.version) == (2, 0)

    def test_a_full_snapshot_survives_the_store(self, store: SnapshotStore) -> None:
        ref = CheckpointRef(
            "file:///ckpt/c1_orders",
            {
                0: PartitionCheckpoint(
                    0, 17, (DataFile("data/1/p00000-base-0.parquet", FileKind.BASE, 3, 99, "c" * 64),)
                )
            },
        )
        task = TaskSnapshot("task-0", {("orders", 0): 17}, {"orders": ref}, T0)
        want = new_generation(
            1,
            tasks={"task-0": task},
            label="nightly",
            pinned=True,
            expires_at=T0 + timedelta(days=7),
            deadline=T0 + timedelta(minutes=1),
            error=None,
        )(EMPTY)
        store.update_current(lambda s: want)
        assert store.get(1).to_json() == want.to_json()

    def test_none_writes_nothing(self, store: SnapshotStore) -> None:
        assert store.update_current(lambda s: None) == EMPTY
        store.update_current(new_generation(1))
        assert store.update_current(lambda s: None).version == 0
        assert store.update(1, lambda s: None).version == 0
        assert store.current().version == 0

    def test_generations_only_grow(self, store: SnapshotStore) -> None:
        store.update_current(new_generation(3))
        with pytest.raises(GenerationConflictError):
            store.update_current(new_generation(2))
        assert (store.current().generation, store.current().version) == (3, 0)
        assert [s.generation for s in store.list()] == [3]

    def test_errors_from_fn_propagate_and_write_nothing(self, store: SnapshotStore) -> None:
        store.update_current(new_generation(1))

        def fenced(current: Snapshot) -> Snapshot:
            raise StaleGenerationError("report for generation 0 fenced")

        with pytest.raises(StaleGenerationError):
            store.update_current(fenced)
        assert store.current().version == 0

    def test_list_get_delete(self, store: SnapshotStore) -> None:
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

    def test_update_of_an_older_generation(self, store: SnapshotStore) -> None:
        store.update_current(new_generation(1))
        store.update_current(new_generation(2))
        before = store.get(1).version  # the blob store seals a generation when its successor starts
        pinned = store.update(1, lambda s: s.evolve(pinned=True))
        assert (pinned.generation, pinned.version, pinned.pinned) == (1, before + 1, True)
        assert store.get(1).to_json() == pinned.to_json()
        assert (store.current().generation, store.current().version) == (2, 0)
        with pytest.raises(GenerationConflictError):
            store.update(1, new_generation(3))

    def test_other_instances_see_updates_block_false_is_the_last_read(self, backend: Backend) -> None:
        a, b = backend.open(), backend.open()
        assert b.current() == EMPTY
        written = a.update_current(new_generation(1))
        assert b.current(block=False) == EMPTY  # no read since: the cached answer
        assert b.current().to_json() == written.to_json()
        b.update_current(lambda s: s.evolve(label="from b"))
        assert a.current().label == "from b"
        assert a.current().version == 1

    def test_two_threads_lose_no_update(self, backend: Backend) -> None:
        n = 8
        seen: dict[str, list[int]] = {"a": [], "b": []}
        start = threading.Barrier(2)
        errors: list[BaseException] = []

        def work(name: str) -> None:
            store = backend.open()
            store.current()
            start.wait()
            try:
                for _ in range(n):
                    seen[name].append(counter(store.update_current(increment)))
            except BaseException as e:
                errors.append(e)
                raise

        threads = [threading.Thread(target=work, args=(name,)) for name in seen]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert counter(backend.open().current()) == 2 * n
        assert sorted(seen["a"] + seen["b"]) == list(range(1, 2 * n + 1))


# --- the topic store ----------------------------------------------------------------------------


@pytest.fixture
def settings(bootstrap: str) -> KafkaSettings:
    return KafkaSettings(bootstrap)


@pytest.fixture
def open_topic_store(settings: KafkaSettings, topic_name: str) -> Iterator[Callable[..., TopicSnapshotStore]]:
    opened: list[TopicSnapshotStore] = []

    def make(**options: Any) -> TopicSnapshotStore:
        s = TopicSnapshotStore(settings, topic_name, **options)
        opened.append(s)
        return s

    yield make
    for s in opened:
        s.close()


def test_creates_a_single_partition_topic_that_never_expires(
    open_topic_store: Callable[..., TopicSnapshotStore], settings: KafkaSettings, topic_name: str
) -> None:
    """The dev broker reports only explicit configs; ours are explicit, so this holds on both."""
    store = open_topic_store()
    assert store.current() == EMPTY
    admin = KafkaAdmin(settings)
    assert admin.partitions(topic_name) == (0,)
    configs = admin.topic_configs(topic_name)
    assert configs.get("retention.ms") == "-1"
    assert configs.get("retention.bytes") == "-1"
    assert configs.get("cleanup.policy") == "delete"


def test_refuses_topics_it_cannot_keep_a_chain_in(kafka: Any, settings: KafkaSettings) -> None:
    """A fake is not needed: the dev broker reports configs set explicitly at creation."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    with pytest.raises(TopicNotFoundError):
        TopicSnapshotStore(settings, name, create=False).current()
    cases = {
        "partitions": (3, {}),
        "compact": (1, {"cleanup.policy": "compact"}),
        "retention.ms": (1, {"retention.ms": "604800000"}),
    }
    for what, (partitions, config) in cases.items():
        topic = kafka.create_topic(f"{name}-{what.replace('.', '-')}", partitions, config)
        store = TopicSnapshotStore(settings, topic)
        with pytest.raises(ConfigError, match=what):
            store.current()
        store.close()
    with pytest.raises(ConfigError):
        TopicSnapshotStore(settings, " ")


def test_tables_sharing_a_topic_do_not_see_each_other(
    open_topic_store: Callable[..., TopicSnapshotStore],
) -> None:
    orders, users = open_topic_store(table="orders"), open_topic_store(table="users")
    orders.update_current(new_generation(1, label="orders"))
    users.update_current(new_generation(7, label="users"))
    orders.update_current(new_generation(2, label="orders"))
    assert [s.generation for s in orders.list()] == [2, 1]
    assert [s.generation for s in users.list()] == [7]
    assert users.current().label == "users"
    assert open_topic_store().current() == EMPTY  # table=None is a table of its own


def test_records_that_do_not_chain_are_ignored_committed_or_aborted(
    open_topic_store: Callable[..., TopicSnapshotStore], kafka: Any, bootstrap: str, topic_name: str
) -> None:
    """A zombie writer's stale records, one committed and one aborted, are in the log (the store
    reads read_uncommitted, so on any broker); the store ignores them because they do not chain.
    Garbage is skipped. The fenced store recovers, and a fresh reader rebuilds the same state."""
    store = open_topic_store(table="orders")
    store.update_current(increment)
    head = store.update_current(increment)
    stale = {
        "statesnap_record": "snapshot",
        "format_version": 1,
        "table": "orders",
        "op": "put",
        "generation": 9,
        "prev": -1,  # computed from an empty topic: does not chain any more
        "writer": "zombie",
        "snapshot": new_generation(9, label="zombie")(EMPTY).to_json(),
    }
    zombie = Producer({"bootstrap.servers": bootstrap, "transactional.id": store.transactional_id})
    zombie.init_transactions(10)  # also fences the store's producer
    zombie.begin_transaction()
    zombie.produce(topic_name, json.dumps(stale).encode(), b"orders/9", partition=0)
    zombie.commit_transaction(10)
    zombie.begin_transaction()
    zombie.produce(topic_name, json.dumps({**stale, "generation": 10}).encode(), b"orders/10", partition=0)
    zombie.flush(10)
    zombie.abort_transaction(10)
    kafka.produce(topic_name, [(0, b"junk", b"\x00not json"), (0, b"junk", None)])
    assert store.current().to_json() == head.to_json()
    assert [s.generation for s in store.list()] == [1]
    after = store.update_current(increment)  # the store's producer was fenced: it must recover
    assert counter(after) == 3
    fresh = open_topic_store(table="orders")
    assert fresh.current().to_json() == after.to_json()
    assert [s.generation for s in fresh.list()] == [1]
    counted = chain(raw_records(bootstrap, topic_name), "orders")
    assert [int(obj["snapshot"]["label"]) for _, obj in counted] == [1, 2, 3]


def test_a_newer_format_is_refused_not_skipped(
    open_topic_store: Callable[..., TopicSnapshotStore], kafka: Any, topic_name: str
) -> None:
    """Skipping a record of a newer format would silently freeze the chain; it is an error."""
    store = open_topic_store()
    store.current()
    record = {"statesnap_record": "snapshot", "format_version": 2, "prev": -1}
    kafka.produce(topic_name, [(0, b"00000000000000000001", json.dumps(record).encode())])
    with pytest.raises(CorruptCheckpointError, match="format version 2"):
        store.current()


def test_a_commit_whose_answer_is_lost_is_applied_once(
    open_topic_store: Callable[..., TopicSnapshotStore],
    bootstrap: str,
    topic_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The commit succeeds but the client is told it timed out: the store finds its own record in
    the chain and returns it instead of applying the update again. Holds on any broker."""
    lost = {"left": 1}

    class LosesOneCommitAnswer(Producer):
        def commit_transaction(self, *args: Any) -> None:
            super().commit_transaction(*args)
            if lost["left"]:
                lost["left"] -= 1
                raise KafkaException(
                    RdKafkaError(RdKafkaError._TIMED_OUT, "injected: answer lost", retriable=True)
                )

    monkeypatch.setattr(topic_clients, "Producer", LosesOneCommitAnswer)
    store = open_topic_store()
    store.update_current(increment)
    assert lost["left"] == 0
    second = store.update_current(increment)
    assert counter(second) == 2
    assert counter(store.current()) == 2
    records = raw_records(bootstrap, topic_name)
    assert [int(obj["snapshot"]["label"]) for _, obj in chain(records, None)] == [1, 2]
    assert len(records) == 2  # the update was not written twice


def test_an_aborted_attempt_that_chains_is_applied_once(
    open_topic_store: Callable[..., TopicSnapshotStore],
    bootstrap: str,
    topic_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first attempt's transaction is aborted, but its record is in the log and chains, so it
    counts (on any broker: the chain, not the transaction outcome, decides). The store recognises
    its own record and does not apply the update a second time."""
    aborted = {"left": 1}

    class AbortsOnce(Producer):
        def commit_transaction(self, *args: Any) -> None:
            if aborted["left"]:
                aborted["left"] -= 1
                self.abort_transaction(*args)
                raise KafkaException(
                    RdKafkaError(RdKafkaError._TIMED_OUT, "injected: aborted", retriable=True)
                )
            super().commit_transaction(*args)

    monkeypatch.setattr(topic_clients, "Producer", AbortsOnce)
    store = open_topic_store()
    out = store.update_current(increment)
    assert aborted["left"] == 0
    assert counter(out) == 1
    assert counter(store.update_current(increment)) == 2
    records = raw_records(bootstrap, topic_name)
    assert [int(obj["snapshot"]["label"]) for _, obj in chain(records, None)] == [1, 2]
    assert len(records) == 2  # the aborted record, then the second update; no re-application


def test_block_false_answers_without_a_broker() -> None:
    """A broker of its own, stopped after the first read: ``current(block=False)`` still answers at
    once from the last read; a blocking read fails with a typed error naming the broker."""
    broker = EmbeddedBroker()
    broker.start()
    settings = KafkaSettings(broker.bootstrap_servers, timeout=2.0)
    store = TopicSnapshotStore(settings, "snapshots", table="orders")
    try:
        assert store.current(block=False) == EMPTY  # before any read: no I/O at all
        written = store.update_current(new_generation(4))
        broker.stop()
        started = time.monotonic()
        for _ in range(1000):
            assert store.current(block=False) is store.current(block=False)
        assert store.current(block=False).to_json() == written.to_json()
        # 2,000 answers from memory take milliseconds; one read of the stopped broker would take
        # its 2 s timeout. The bound leaves room for a full garbage collection on a loaded machine.
        assert time.monotonic() - started < 1.5
        with pytest.raises(BrokerUnavailableError, match=broker.bootstrap_servers):
            store.current(block=True)
    finally:
        broker.stop()
        store.close()
    with pytest.raises(SnapshotError, match="closed"):
        store.current()
    assert store.current(block=False).generation == 4


class TestChainRule:
    """The reader's rule, driven record by record without a broker (``_apply`` is what a read
    calls for each record). Holds whatever the broker shows, since it only looks at offsets."""

    @staticmethod
    def put(generation: int, prev: int, table: str | None = None, label: str = "") -> bytes:
        write = topic_records.Write("put", generation, new_generation(generation, label=label)(EMPTY))
        return topic_records.encode_record(table, write, prev=prev, writer=f"w-{generation}-{prev}")

    @staticmethod
    def delete(generation: int, prev: int) -> bytes:
        return topic_records.encode_record(
            None, topic_records.Write("delete", generation), prev=prev, writer="d"
        )

    def store(self) -> TopicSnapshotStore:
        return TopicSnapshotStore(KafkaSettings("127.0.0.1:1"), "unused")  # no I/O until used

    def test_only_records_that_chain_count(self) -> None:
        s = self.store()
        s._apply(0, self.put(1, -1, label="a"))
        s._apply(1, self.put(2, -1, label="stale: computed before offset 0"))
        s._apply(2, self.put(2, 0, label="b"))
        s._apply(3, self.put(3, 0, label="fork: offset 0 already has a successor"))
        s._apply(4, self.delete(1, 2))
        s._apply(5, self.put(1, 2, label="computed before the delete"))
        s._apply(6, self.put(9, 4, table="users"))  # another table's chain
        assert {g: x.label for g, x in s._snapshots.items()} == {2: "b"}
        assert (s._head, s._position) == (4, 7)

    def test_a_topic_that_starts_over_is_read_again(self) -> None:
        s = self.store()
        s._apply(0, self.put(1, -1))
        s._apply(1, self.put(2, 0))
        s._apply(0, self.put(5, -1))  # offsets went backwards: the topic was re-created
        assert list(s._snapshots) == [5]
        assert (s._head, s._position) == (0, 1)

    def test_a_chain_whose_start_was_deleted_is_an_error(self) -> None:
        """What Apache Kafka's retention would do to a topic without retention.ms=-1."""
        s = self.store()
        s._position = 40  # as if the records below 40 had been deleted
        with pytest.raises(CorruptCheckpointError, match="lost its oldest records"):
            s._apply(40, self.put(7, 39))


def test_pickles_by_configuration(open_topic_store: Callable[..., TopicSnapshotStore]) -> None:
    store = open_topic_store(table="orders", commit_timeout=3.0)
    store.update_current(new_generation(1))
    clone = pickle.loads(pickle.dumps(store))
    try:
        assert isinstance(clone, TopicSnapshotStore)
        assert (clone.topic, clone.table, clone.commit_timeout) == (store.topic, "orders", 3.0)
        assert clone.current(block=False) == EMPTY  # no live state travels
        assert clone.current().generation == 1
    finally:
        clone.close()


# --- two processes racing --------------------------------------------------------------------------

WORKER = r"""
import json, sys
from datetime import UTC, datetime
from statesnap.kafka.config import KafkaSettings
from statesnap.snapshot.model import Snapshot, SnapshotState, TaskSnapshot
from statesnap.snapshot.topic_store import TopicSnapshotStore

bootstrap, topic, name, n, every = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
store = TopicSnapshotStore(KafkaSettings(bootstrap), topic, table="race")
store.current()
print("ready", flush=True)
sys.stdin.readline()
for i in range(n):
    def step(cur, i=i):
        count = int(cur.label or 0) + 1
        task = TaskSnapshot(f"{name}-{i}", {("orders", 0): count})
        if cur.generation == 0 or count % every == 0:
            now = datetime.now(UTC)
            return Snapshot(cur.generation + 1, SnapshotState.CREATED, now, now, tasks={task.task_id: task},
                            label=str(count))
        return cur.evolve(tasks={**cur.tasks, task.task_id: task}, label=str(count))
    out = store.update_current(step)
    print(json.dumps({"task": f"{name}-{i}", "generation": out.generation, "version": out.version,
                      "count": int(out.label)}), flush=True)
store.close()
"""


def test_two_processes_racing_lose_no_update_and_generations_grow(
    bootstrap: str, topic_name: str, settings: KafkaSettings
) -> None:
    """Two processes each apply N updates (a task report and a counter; every 4th count starts a
    new generation) as fast as they can. Holds on any broker: every update is applied exactly once
    (the counts handed back are exactly 1..2N), each process sees its counts grow, and the chain
    rebuilt from the raw topic has strictly increasing (generation, version) and every report."""
    n, every = 15, 4
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, bootstrap, topic_name, name, str(n), str(every)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "ready", p.stderr.read() if p.stderr else ""
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        outputs = [p.communicate(timeout=90) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    results: dict[str, list[dict[str, Any]]] = {}
    for p, (out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err[-3000:]
        for line in out.splitlines():
            obj = json.loads(line)
            results.setdefault(obj["task"][0], []).append(obj)

    counts = sorted(r["count"] for rs in results.values() for r in rs)
    assert counts == list(range(1, 2 * n + 1)), "an update was lost or applied twice"
    for rs in results.values():
        assert len(rs) == n
        assert [r["count"] for r in rs] == sorted(r["count"] for r in rs)

    counted = chain(raw_records(bootstrap, topic_name), "race")
    assert [int(obj["snapshot"]["label"]) for _, obj in counted] == list(range(1, 2 * n + 1))
    keys = [(obj["snapshot"]["generation"], obj["snapshot"]["version"]) for _, obj in counted]
    assert keys == sorted(set(keys)), "(generation, version) must strictly increase along the chain"
    final_of: dict[int, dict[str, Any]] = {obj["generation"]: obj["snapshot"] for _, obj in counted}
    for rs in results.values():
        for r in rs:
            assert r["task"] in {t["task_id"] for t in final_of[r["generation"]]["tasks"]}

    with TopicSnapshotStore(settings, topic_name, table="race") as reader:
        final = reader.current()
        assert counter(final) == 2 * n
        assert [s.generation for s in reader.list()] == sorted(final_of, reverse=True)
