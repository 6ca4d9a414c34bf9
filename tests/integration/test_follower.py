"""Followers on the real broker and the real S3 endpoint (moto server): convergence while the owner
writes, never writing anything, read-your-writes, and the owner's GC racing a follower's restore.

Ground truth is independent of statesnap: the table a KTable must hold by definition (last write
wins, a tombstone deletes), computed from the records the broker acknowledged and from reading the
topic back with a plain consumer (tests/integration/conftest.py).
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
import traceback
import uuid
import zlib
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, Producer, TopicPartition

from integration.conftest import frames_of, restored_digest
from statesnap import CheckpointOptions, RetentionPolicy, RowFilter, StoreOptions, Table
from statesnap.blob import BlobStore, open_blob_store
from statesnap.digest import table_digest
from statesnap.errors import ConfigError, ReadOnlyTableError, TableStateError, TopicNotFoundError
from statesnap.kafka.admin import KafkaAdmin
from statesnap.python.follower import Follower, FollowerStatus

pytestmark = pytest.mark.integration

PARTITIONS = 3
#: GC as eager as the rule allows, so an owner's checkpoint deletes the previous one at once.
EAGER_GC = RetentionPolicy(min_count=1, min_age=timedelta(0), orphan_grace=timedelta(0))


def partition_of(key: bytes) -> int:
    """A key always lives in one partition, as a keyed producer guarantees."""
    return zlib.crc32(key) % PARTITIONS


def updates(
    rng: random.Random, count: int, *, keys: int = 300, tag: str = ""
) -> list[tuple[int, bytes, bytes | None]]:
    """*count* upserts/tombstones (10 %) over *keys* keys, partitioned by key."""
    out: list[tuple[int, bytes, bytes | None]] = []
    for i in range(count):
        key = b"k%04d" % rng.randrange(keys)
        value = None if rng.random() < 0.1 else f"{tag}{i}:{rng.random():.6f}".encode()
        out.append((partition_of(key), key, value))
    return out


def keep_even(key: bytes) -> bool:
    return key[-1] in b"02468"


def project(value: bytes) -> bytes | None:
    """Keep a reversed copy of the value; values ending in 5 drop their key."""
    return None if value.endswith(b"5") else value[::-1]


def last_offsets(records: Iterable[Any]) -> dict[int, int]:
    """Offset of the last record per partition: what a writer passes to wait_for()."""
    out: dict[int, int] = {}
    for r in records:
        out[r.partition] = max(out.get(r.partition, -1), r.offset)
    return out


def owner_table(kafka: Any, topic: str, url: str, options: dict[str, str]) -> Table:
    return Table(
        topic,
        bootstrap_servers=kafka.bootstrap,
        checkpoints=CheckpointOptions(
            url, storage_options=options, retention=EAGER_GC, commit_interval="1h", interval="1h"
        ),
        background=False,
    )


def follower_for(
    kafka: Any, topic: str, url: str | BlobStore, options: dict[str, str], **kwargs: Any
) -> Follower:
    return Follower(
        topic,
        bootstrap_servers=kafka.bootstrap,
        checkpoints=CheckpointOptions(url, storage_options=options),
        **kwargs,
    )


class _Delegating:
    """A BlobStore that forwards everything to *inner* (subclasses intercept some calls)."""

    def __init__(self, inner: BlobStore) -> None:
        self.inner = inner

    @property
    def url(self) -> str:
        return self.inner.url

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


# --- convergence -----------------------------------------------------------------------------------


@pytest.mark.parametrize("filtered", [False, True], ids=["all-keys", "key-filter-and-projection"])
def test_follower_started_while_owner_writes_converges(kafka: Any, s3_location: Any, filtered: bool) -> None:
    """A follower booted from the owner's checkpoint while the owner keeps writing (and keeps
    checkpointing, with GC deleting old checkpoints) ends up, once writes stop and it is caught
    up, equal to a full replay and to the ground truth — restricted to its key filter and
    rewritten by its value projection, if any."""
    topic = kafka.create_topic(f"fol-{uuid.uuid4().hex[:12]}", PARTITIONS)
    rng = random.Random(7)
    produced = kafka.produce(topic, updates(rng, 4000, tag="h"))
    owner = owner_table(kafka, topic, s3_location.url, s3_location.options)
    owner.start()
    first = owner.checkpoint()
    assert first is not None

    writing = threading.Event()
    booted = threading.Event()
    failure: list[BaseException] = []

    def write() -> None:
        try:
            for batch in range(10):
                if batch == 6:  # the rest is written while the follower tails
                    assert booted.wait(60)
                produced.extend(kafka.produce(topic, updates(rng, 400, tag=f"b{batch}-")))
                writing.set()
                kafka.drain(owner, kafka.end_offsets(produced, range(PARTITIONS)))
                if batch % 3 == 1:
                    owner.checkpoint()
                time.sleep(0.05)
        except BaseException as e:  # surfaced by the main thread
            failure.append(e)
            writing.set()

    writer = threading.Thread(target=write, name="owner-writer")
    writer.start()
    try:
        assert writing.wait(30)
        follower = follower_for(
            kafka,
            topic,
            s3_location.url,
            s3_location.options,
            row_filter=RowFilter(keep_even, project) if filtered else None,
        )
        report = follower.start()
        at_boot = sum(follower.offsets.values())
        booted.set()
    finally:
        booted.set()
        writer.join(120)
    assert not failure, failure
    try:
        assert report.checkpoint is not None, "the follower must boot from the owner's checkpoint"
        assert at_boot < len(produced) - 1000, "the owner kept writing after the follower booted"
        assert follower.wait_for(last_offsets(produced), timeout=30)
        assert follower.wait_caught_up(timeout=30)
        truth = kafka.truth(kafka.read_all(topic, range(PARTITIONS)))
        assert truth == kafka.truth(produced)
        if filtered:
            projected = {k: project(v) for k, v in truth.items() if keep_even(k)}
            truth = {k: v for k, v in projected.items() if v is not None}
            assert 0 < len(truth) < len(projected) < len(kafka.truth(produced))
        got = table_digest(follower.raw_items())
        assert got == table_digest(truth.items())
        assert got == restored_digest(  # a full replay with the same filters
            topic, kafka.bootstrap, row_filter=RowFilter(keep_even, project) if filtered else None
        )
        assert len(follower) == len(truth)

        status = follower.status()
        assert isinstance(status, FollowerStatus)
        assert status.state == "running"
        assert status.ready
        assert status.caught_up
        assert status.checkpoint_generation == report.checkpoint
        assert status.keys == len(truth)
        assert dict(status.offsets) == kafka.end_offsets(produced, range(PARTITIONS))
        assert dict(status.lag) == dict.fromkeys(range(PARTITIONS), 0)
        assert status.restore_seconds is not None
        assert status.restore_seconds > 0
        assert status.newest_record_age is not None
        assert status.newest_record_age < 120
    finally:
        follower.close()
        owner.close(checkpoint=False)


# --- never writes ----------------------------------------------------------------------------------


class SpyStore(_Delegating):
    """Records every mutating call; a follower must make none."""

    def __init__(self, inner: BlobStore) -> None:
        super().__init__(inner)
        self.mutations: list[str] = []

    def write(self, key: str, data: bytes, *, if_absent: bool = False) -> None:
        self.mutations.append(f"write {key}")
        raise AssertionError(f"a follower wrote {key}")

    def delete(self, keys: Iterable[str]) -> None:
        self.mutations.append(f"delete {list(keys)}")
        raise AssertionError("a follower deleted blobs")

    def abort_stale_uploads(self, prefix: str, older_than: datetime, *, dry_run: bool = False) -> int:
        self.mutations.append(f"abort_stale_uploads {prefix}")
        raise AssertionError("a follower aborted uploads")

    def check(self, *, writable: bool) -> None:
        if writable:
            self.mutations.append("check(writable=True)")
        self.inner.check(writable=writable)


def store_fingerprint(store: BlobStore) -> dict[str, tuple[int, datetime, str]]:
    """Every object under the root: size, last-modified time and content hash."""
    return {
        b.key: (b.size, b.modified, hashlib.sha256(store.read(b.key)).hexdigest()) for b in store.list("")
    }


def committed_offsets(kafka: Any, topic: str) -> dict[str, dict[int, int]]:
    """Every consumer group's committed offsets on *topic* (groups with none are left out)."""
    groups = kafka.admin.list_consumer_groups(request_timeout=10).result()
    out: dict[str, dict[int, int]] = {}
    for g in groups.valid:
        parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        request = ConsumerGroupTopicPartitions(g.group_id, parts)
        result = kafka.admin.list_consumer_group_offsets([request])[g.group_id].result(10)
        offsets = {tp.partition: tp.offset for tp in result.topic_partitions if tp.offset >= 0}
        if offsets:
            out[g.group_id] = offsets
    return out


def test_follower_never_writes(kafka: Any, checkpoint_location: Any) -> None:
    """While a follower restores and tails, the owner's store is untouched (same objects, sizes,
    mtimes and contents; no mutating call even attempted), the topic holds exactly what the
    owner produced, and no consumer group has offsets committed on the topic."""
    topic = kafka.create_topic(f"ro-{uuid.uuid4().hex[:12]}", PARTITIONS)
    rng = random.Random(11)
    produced = kafka.produce(topic, updates(rng, 1500))
    owner = owner_table(kafka, topic, checkpoint_location.url, checkpoint_location.options)
    owner.start()
    assert owner.checkpoint() is not None
    owner.close(checkpoint=False)
    produced += kafka.produce(topic, updates(rng, 300, tag="tail"))

    raw = open_blob_store(checkpoint_location.url, **checkpoint_location.options)
    before = store_fingerprint(raw)
    assert any(k.endswith(".parquet") for k in before)
    records_before = kafka.read_all(topic, range(PARTITIONS))
    groups_before = committed_offsets(kafka, topic)
    assert groups_before == {}

    spy = SpyStore(raw)
    follower = follower_for(kafka, topic, spy, {})
    report = follower.start()
    try:
        assert report.checkpoint is not None
        assert report.replayed_records == 300
        # It tails what the owner writes meanwhile...
        more = kafka.produce(topic, updates(rng, 200, tag="live"))
        produced += more
        assert follower.wait_for(last_offsets(more), timeout=20)
        assert dict(follower.raw_items()) == kafka.truth(produced)
        # ...and refuses every write.
        with pytest.raises(ReadOnlyTableError):
            follower.checkpoint()
        with pytest.raises(ReadOnlyTableError, match="read-only"):
            follower.put(b"k0001", b"x")
        with pytest.raises(ReadOnlyTableError):
            follower[b"k0001"] = b"x"
        with pytest.raises(ReadOnlyTableError):
            del follower[b"k0001"]
        with pytest.raises(ReadOnlyTableError):
            follower.delete(b"k0001")
        time.sleep(1.0)  # several commit intervals' worth of tailing would be several chances to write
        assert follower.state == "running"
    finally:
        follower.close()
    assert spy.mutations == []
    assert store_fingerprint(raw) == before
    by_position = lambda r: (r.partition, r.offset)  # noqa: E731
    assert kafka.read_all(topic, range(PARTITIONS)) == sorted(records_before + more, key=by_position)
    assert committed_offsets(kafka, topic) == {}


# --- read-your-writes --------------------------------------------------------------------------------


@pytest.mark.parametrize("store", ["memory", "rocksdb"])
def test_read_your_writes_through_wait_for(kafka: Any, s3_location: Any, store: str, tmp_path: Any) -> None:
    """A writer produces, takes the offset from the delivery report, and after wait_for({p: offset})
    the follower's get() returns what it wrote — every time, with no sleep in between."""
    topic = kafka.create_topic(f"ryw-{uuid.uuid4().hex[:12]}", PARTITIONS)
    kafka.produce(topic, updates(random.Random(3), 500))
    owner = owner_table(kafka, topic, s3_location.url, s3_location.options)
    owner.start()
    owner.checkpoint()
    owner.close(checkpoint=False)
    follower = follower_for(
        kafka,
        topic,
        s3_location.url,
        s3_location.options,
        store=StoreOptions(store, path=tmp_path / "replica"),
        key_serde="string",
        value_serde="string",
    )
    follower.start()
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 0})
    try:
        latencies = []
        for i in range(30):
            key, value = f"ryw-{i % 7}", f"value-{i}"
            box: dict[str, int] = {}

            def delivered(err: object, msg: Any, box: dict[str, int] = box) -> None:
                assert err is None, err
                box.update(partition=msg.partition(), offset=msg.offset())

            started = time.monotonic()
            producer.produce(
                topic,
                value.encode(),
                key.encode(),
                partition=partition_of(key.encode()),
                on_delivery=delivered,
            )
            producer.flush(10)
            assert follower.wait_for({box["partition"]: box["offset"]}, timeout=10)
            assert follower.get(key) == value
            assert follower.offsets[box["partition"]] > box["offset"]
            latencies.append(time.monotonic() - started)
        assert sorted(latencies)[len(latencies) // 2] < 0.5

        # By timestamp: a record at least as new as "now" is applied.
        now = datetime.now(UTC)
        producer.produce(topic, b"by-time", b"ts-key", partition=partition_of(b"ts-key"))
        producer.flush(10)
        assert follower.wait_for(timestamp=now, timeout=10)
        assert follower.get("ts-key") == "by-time"
        assert follower.last_update_age() is not None

        # A record that is never written: False after the timeout, not a hang.
        started = time.monotonic()
        assert follower.wait_for({0: 10**9}, timeout=0.3) is False
        assert time.monotonic() - started < 2
        with pytest.raises(ConfigError, match=r"partitions \[7\]"):
            follower.wait_for({7: 0}, timeout=1)
    finally:
        follower.close()
    with pytest.raises(TableStateError):
        follower.get("ryw-1")


# --- the owner's checkpoints change under the follower --------------------------------------------------


class GcDuringRestore(_Delegating):
    """Before the follower reads its first data file, the owner writes a newer checkpoint and its
    GC deletes the generation being loaded — deterministically, mid-restore."""

    def __init__(self, inner: BlobStore, on_first_data_read: Callable[[str], None]) -> None:
        super().__init__(inner)
        self.hook = on_first_data_read
        self.lock = threading.Lock()
        self.triggered_by: str | None = None

    def read(self, key: str) -> bytes:
        if key.endswith(".parquet"):
            with self.lock:  # the other loader threads wait until the owner is done
                if self.triggered_by is None:
                    self.triggered_by = key
                    self.hook(key)
        return self.inner.read(key)


def test_owner_gc_during_restore_makes_the_follower_retry_with_the_newest(
    kafka: Any, checkpoint_location: Any
) -> None:
    topic = kafka.create_topic(f"gc-{uuid.uuid4().hex[:12]}", PARTITIONS)
    rng = random.Random(5)
    produced = kafka.produce(topic, updates(rng, 1200))
    owner = owner_table(kafka, topic, checkpoint_location.url, checkpoint_location.options)
    owner.start()
    old = owner.checkpoint()
    assert old is not None
    # New records on every partition, so the owner's next checkpoint shares no file with `old`.
    produced += kafka.produce(
        topic, [(p, b"fresh-%d" % p, b"x") for p in range(PARTITIONS)] + updates(rng, 300, tag="n")
    )
    assert {r.partition for r in produced[-300:]} == set(range(PARTITIONS))
    newer: list[Any] = []

    def owner_checkpoints_and_collects(key: str) -> None:
        assert f"/data/{old.generation:020d}/" in key
        kafka.drain(owner, kafka.end_offsets(produced, range(PARTITIONS)))
        newer.append(owner.checkpoint(full=True))  # new bases: GC may delete every old file

    raw = open_blob_store(checkpoint_location.url, **checkpoint_location.options)
    store = GcDuringRestore(raw, owner_checkpoints_and_collects)
    follower = follower_for(kafka, topic, store, {})
    try:
        report = follower.start()
        assert store.triggered_by is not None
        (new,) = newer
        assert new is not None
        assert new.generation > old.generation
        assert owner.repo is not None
        assert old.generation not in owner.repo.generations(), "the owner's GC deleted the old checkpoint"
        assert report.checkpoint == new.generation
        assert report.skipped == []  # a vanished checkpoint is retried, not skipped
        assert report.replayed_records == 0
        assert dict(follower.raw_items()) == kafka.truth(produced)
    finally:
        follower.close()
        owner.close(checkpoint=False)


def test_newer_checkpoint_leaves_a_running_follower_alone_and_is_used_on_restart(
    kafka: Any, s3_location: Any
) -> None:
    topic = kafka.create_topic(f"restart-{uuid.uuid4().hex[:12]}", PARTITIONS)
    rng = random.Random(9)
    produced = kafka.produce(topic, updates(rng, 800))
    owner = owner_table(kafka, topic, s3_location.url, s3_location.options)
    owner.start()
    first = owner.checkpoint()
    assert first is not None
    follower = follower_for(kafka, topic, s3_location.url, s3_location.options)
    try:
        assert follower.start().checkpoint == first.generation
        produced += kafka.produce(topic, updates(rng, 300, tag="a"))
        kafka.drain(owner, kafka.end_offsets(produced, range(PARTITIONS)))
        second = owner.checkpoint()  # eager GC: deletes `first`, the follower's boot checkpoint
        assert second is not None
        assert second.generation > first.generation
        produced += kafka.produce(topic, updates(rng, 100, tag="b"))
        assert follower.wait_for(last_offsets(produced), timeout=20)
        assert dict(follower.raw_items()) == kafka.truth(produced)
        assert follower.status().checkpoint_generation == first.generation
        assert follower.state == "running"
    finally:
        follower.close()
    again = follower_for(kafka, topic, s3_location.url, s3_location.options)
    try:
        report = again.start()
        assert report.checkpoint == second.generation
        assert report.replayed_records == 100
        assert dict(again.raw_items()) == kafka.truth(produced)
    finally:
        again.close()
        owner.close(checkpoint=False)


# --- failures --------------------------------------------------------------------------------------------


def test_failed_restore_is_reported_not_hidden(kafka: Any, tmp_path: Any) -> None:
    """A background restore of a missing topic fails visibly (state, error, status, reads), and the
    closed follower keeps that error but not the admin client its failed calls held. Broker: the
    suite's (Apache Kafka; Tansu answers a missing topic the same way)."""
    missing = f"missing-{uuid.uuid4().hex[:12]}"
    f = Follower(missing, bootstrap_servers=kafka.bootstrap, checkpoints=tmp_path.as_uri(), timeout=5)
    f.start_in_background()
    with pytest.raises(TopicNotFoundError, match=missing):
        f.wait_until_ready(timeout=30)
    assert f.state == "failed"
    assert isinstance(f.error, TopicNotFoundError)
    status = f.status()
    assert not status.ready
    assert status.error is not None
    assert "TopicNotFoundError" in status.error
    with pytest.raises(TableStateError):
        f.get(b"x")
    error = f.error
    assert any(isinstance(v, KafkaAdmin) for frame in frames_of(error) for v in frame.f_locals.values())
    f.close()
    assert f.state == "closed"
    # The closed follower keeps its error, but not the admin client the failed calls held in
    # their locals (it stayed connected, reconnecting and logging once the broker was gone).
    assert f.error is error
    assert not [v for frame in frames_of(error) for v in frame.f_locals.values() if isinstance(v, KafkaAdmin)]
    assert "in cluster_facts" in "".join(traceback.format_exception(error))
