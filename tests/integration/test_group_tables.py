"""Consumer-group tables on the real broker: partitions move between instances as they come and go.

Proves, on the suite's broker (Apache Kafka; Tansu proved it too) with the classic group protocol,
eager round-robin and 6 s sessions, with a file:// checkpoint store, under a producer that keeps writing:

- a member that dies (SIGKILL, no goodbye) loses its partitions to the others after the session
  timeout; a snapshot created right after the death completes once they moved, without it;
- a member that joins takes a share; once the group has settled, the union of the members'
  tables equals a full replay computed independently (a plain consumer read to partition EOF),
  each key served by exactly one member and refused by the others with a typed error;
- a snapshot created after the rebalance completes with every partition, named by the members
  that own them now, and restores to exactly that table;
- ``group`` and static ``instance``/``instances`` are refused together (API and CLI), and
  ``--engine spark --group`` is refused in one line.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from statesnap import CheckpointOptions, Follower, SnapshotOptions, StaticShare, Table
from statesnap.errors import ConfigError, PartitionNotOwnedError
from statesnap.kafka.partitioner import resolve_partitioner
from statesnap.snapshot.api import SnapshotApi
from statesnap.snapshot.model import SnapshotState

pytestmark = pytest.mark.integration

STATESNAP = [sys.executable, "-m", "statesnap.cli"]
PARTITIONS = 8
KEYS = 400


class Writer(threading.Thread):
    """Upserts (and some tombstones) through Kafka's default Java partitioner, until stopped."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "linger.ms": 5, "partitioner": "murmur2_random"}
        )
        self.topic = topic
        self.stop = threading.Event()
        self.written = 0

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            for _ in range(100):
                key = b"key-%d" % (i % KEYS)
                self.producer.produce(self.topic, None if i % 17 == 0 else b"v-%d" % i, key)
                i += 1
            self.producer.poll(0)
            time.sleep(0.02)
        assert self.producer.flush(30) == 0
        self.written = i


def member(bootstrap: str, topic: str, url: str, group: str) -> Table:
    return Table(
        topic,
        bootstrap_servers=bootstrap,
        checkpoints=CheckpointOptions(
            url, commit_interval="1s", interval="1h", snapshots=SnapshotOptions(timeout="60s")
        ),
        group=group,
    )


def wait_until(predicate: object, timeout: float, what: str, tables: list[Table]) -> None:
    """Poll *predicate*; on the deadline, fail naming what was awaited and what each member held
    (a loaded CI machine once took longer than 40 s for three members to settle)."""
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            held = [
                (sorted(t.partitions), sorted(t.task.membership.reader.restoring))  # type: ignore[union-attr]
                for t in tables
            ]
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}; (owned, restoring): {held}")
        time.sleep(0.1)


def settled(tables: list[Table], *, covering: bool, stable_for: float = 1.5) -> bool:
    """Every member owns partitions, none overlap, none restores; the union covers the topic
    (*covering*) or leaves room for a member not in *tables*; unchanged for *stable_for* s."""
    shares = [set(t.partitions) for t in tables]
    union = set().union(*shares)
    ok = (
        all(len(s) >= 2 for s in shares)
        and sum(map(len, shares)) == len(union)
        and (union == set(range(PARTITIONS)) if covering else len(union) < PARTITIONS)
        and all(not t.task.membership.reader.restoring for t in tables)  # type: ignore[union-attr]
    )
    key = tuple(tuple(sorted(s)) for s in shares)
    now = time.monotonic()
    if not ok or _SETTLING.last != key:
        _SETTLING.last, _SETTLING.since = key, now
        return False
    return now - _SETTLING.since >= stable_for


@dataclass
class _Settling:
    """The shares ``settled`` saw last and since when: they count only once they hold still."""

    last: tuple[tuple[int, ...], ...] | None = None
    since: float = 0.0


_SETTLING = _Settling()


@pytest.fixture
def tables() -> Iterator[list[Table]]:
    made: list[Table] = []
    yield made
    for t in made:
        t.close(checkpoint=False)


def test_members_come_and_go_under_load(
    kafka: Any, bootstrap: str, topic_name: str, tmp_path: Path, tables: list[Table]
) -> None:
    kafka.create_topic(topic_name, PARTITIONS)
    url = str(tmp_path / "ckpt")
    group = f"g-{uuid.uuid4().hex[:8]}"
    writer = Writer(bootstrap, topic_name)
    writer.start()
    # The member that will die is a real process: SIGKILL leaves the group without a goodbye.
    doomed = subprocess.Popen(
        [
            *STATESNAP,
            *("materialize", "-b", bootstrap, "-t", topic_name, "--checkpoints", url, "--follow"),
            *("--group", group, "--engine", "python", "--commit-interval", "1s"),
            *("--checkpoint-interval", "1h", "--snapshot-timeout", "60s", "-q"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        a, b = member(bootstrap, topic_name, url, group), member(bootstrap, topic_name, url, group)
        tables += [a, b]
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda t: t.start(), [a, b]))

        def three_share() -> bool:
            assert doomed.poll() is None, doomed.stderr.read() if doomed.stderr else ""
            return settled([a, b], covering=False)

        wait_until(three_share, 90, "three members to share the topic", [a, b])

        # A key of the doomed member's partitions: a and b refuse it, naming the partition.
        theirs = next(
            k for k in range(KEYS) if a.partition_for(b"key-%d" % k) not in {*a.partitions, *b.partitions}
        )
        with pytest.raises(PartitionNotOwnedError) as refused:
            a.get(b"key-%d" % theirs)
        assert refused.value.partition == a.partition_for(b"key-%d" % theirs)
        assert not refused.value.restoring

        doomed.send_signal(signal.SIGKILL)
        doomed.wait(10)
        api = SnapshotApi.open(url, topic_name)
        pending = api.create(timeout="60s")  # its partitions are still with the dead member
        wait_until(lambda: settled([a, b], covering=True), 90, "the dead member's partitions to move", [a, b])
        done = api.wait(pending.generation, "40s")
        assert done.state is SnapshotState.COMPLETED, done.error
        assert set(done.tasks) <= {a.task_id, b.task_id}
        assert done.reported_partitions == set(range(PARTITIONS))

        d = member(bootstrap, topic_name, url, group)
        tables.append(d)
        d.start()
        wait_until(
            lambda: settled([a, b, d], covering=True), 90, "the fourth member to take a share", [a, b, d]
        )
    finally:
        writer.stop.set()
        writer.join()
        if doomed.poll() is None:
            doomed.kill()
            doomed.wait(10)

    # Independent ground truth: everything the broker holds, read to partition EOF.
    records = kafka.read_all(topic_name, range(PARTITIONS))
    truth = kafka.truth(records)
    ends = kafka.end_offsets(records, range(PARTITIONS))
    for t in (a, b, d):
        assert t.wait_for({p: ends[p] - 1 for p in t.partitions if ends[p]}, timeout=30)
    assert settled([a, b, d], covering=True, stable_for=0)
    union: dict[bytes, bytes] = {}
    for t in (a, b, d):
        rows = dict(t.raw_items())
        assert not set(rows) & set(union), "a key held by two members"
        union.update(rows)
    assert union == truth

    # Every key is served by the member owning its partition and refused by the others.
    partition_of = resolve_partitioner("murmur2_random")
    owner = {p: t for t in (a, b, d) for p in t.partitions}
    for k in range(KEYS):
        key = b"key-%d" % k
        p = partition_of(key, PARTITIONS)
        assert owner[p].get(key) == truth.get(key)
        for other in {a, b, d} - {owner[p]}:
            with pytest.raises(PartitionNotOwnedError):
                other.get(key)

    # A snapshot after the rebalance: every partition, named by its current owner, equal to truth.
    snap = api.wait(api.create(timeout="30s").generation, "30s")
    assert snap.state is SnapshotState.COMPLETED, snap.error
    assert set(snap.tasks) == {a.task_id, b.task_id, d.task_id}
    for t in (a, b, d):
        assert snap.tasks[t.task_id].partitions == set(t.partitions)
    frozen = Follower(
        topic_name,
        bootstrap_servers=bootstrap,
        checkpoints=CheckpointOptions(url, generation=snap.generation),
        tail=False,
    )
    frozen.start()
    try:
        assert dict(frozen.raw_items()) == truth
    finally:
        frozen.close()
    api.close()


def test_partitioners_match_the_clients(kafka: Any, bootstrap: str, topic_name: str) -> None:
    """``partition_for`` agrees with librdkafka's murmur2_random (= the Java client's default)
    and consistent_random (librdkafka's default) on where the broker stored each key."""
    kafka.create_topic(topic_name, 7)
    for name in ("murmur2_random", "consistent_random"):
        producer = Producer({"bootstrap.servers": bootstrap, "partitioner": name})
        placed: dict[bytes, int] = {}

        def on_delivery(err: object, msg: object, placed: dict[bytes, int] = placed) -> None:
            assert err is None
            placed[msg.key()] = msg.partition()  # type: ignore[attr-defined]

        keys = [b"a", b"ab", b"abc", b"abcd", b"abcde"] + [b"key-%d" % i for i in range(200)]
        for key in keys:
            producer.produce(topic_name, b"v", key, on_delivery=on_delivery)
        assert producer.flush(15) == 0
        partition_of = resolve_partitioner(name)
        assert {k: partition_of(k, 7) for k in keys} == placed, name


def test_group_and_static_instances_are_refused_together(
    bootstrap: str, topic_name: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match="pick one"):
        Table(topic_name, bootstrap_servers=bootstrap, group="g", partitions=StaticShare(0, 2))
    with pytest.raises(ConfigError, match="partitions"):
        Table(topic_name, bootstrap_servers=bootstrap, group="g", partitions=[0])
    base = [*STATESNAP, "materialize", "-b", bootstrap, "-t", topic_name, "-c", str(tmp_path / "c")]
    cases = {
        ("--follow", "--group", "g", "--instance", "0", "--instances", "2"): "pick one",
        ("--group", "g"): "--group needs --follow",
        ("--follow", "--group", "g", "--engine", "spark"): "--group cannot be used with --engine spark",
    }
    for extra, message in cases.items():
        out = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=60, check=False)
        assert out.returncode != 0, out
        assert message in out.stderr, out.stderr
        errors = [line for line in out.stderr.splitlines() if "Error" in line]
        assert len(errors) == 1, out.stderr
