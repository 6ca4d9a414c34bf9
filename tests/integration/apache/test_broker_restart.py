"""An Apache Kafka broker SIGKILLed and restarted on the same log dirs under tailing tables.

Apache Kafka 4.1.1 proved it (Tansu's memory storage loses every topic on restart, so only a broker
whose log survives can show this): a background table that was caught up when the broker died
keeps serving its rows while the broker is down, waits (a warning, not an error, even when the
outage outlasts its ``timeout``), and after the restart consumes what was written since; it
equals a plain consumer's replay. A checkpoint taken while the broker is down:

- with snapshot records beside the checkpoints (``blob``, the default) needs no broker: it commits,
  and a restore from it plus the tail equals the replay (the records it claims survived the
  kill: SIGKILL loses no page cache);
- with snapshot records on a topic (``topic:NAME``) cannot commit: one typed line
  (:class:`BrokerUnavailableError`) within the table's ``timeout``, the table unharmed, and the
  next checkpoint after the restart commits.

An outage that finds a background table mid-tail (a partition not at its end), or at a periodic
checkpoint with topic snapshot records, is waited out the same way: the reader of a running table
warns instead of giving up, and a commit point that cannot reach the snapshot topic warns and
tries again at the next one (the last test).

A restore (``Table.start()`` replaying a long tail) whose broker is killed at its first progress
report finishes once the broker is back within its ``timeout`` and equals a plain replay; one whose
broker stays down fails in one typed line naming the broker. A snapshot of two tasks whose broker
is killed right after the create completes whole (every partition reported) once it is back, and
``statesnap checkpoints verify`` passes on the store.

The broker is this module's own: killing the session broker would break every test after this.
It is killed and restarted only from the test's thread: a dev service dies with the thread that
started it (devstack/orphans.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from integration.conftest import KafkaTool, Rec
from statesnap import RestoreReport, StaticShare, Table
from statesnap.checkpoint.manifest import CheckpointManifest
from statesnap.checkpoint.selection import resume_offsets
from statesnap.devstack import ApacheKafkaBroker
from statesnap.devstack.apache import apache_kafka_missing
from statesnap.devstack.process import LoopbackService
from statesnap.errors import BrokerUnavailableError, NoUsableCheckpointError, OffsetOutOfRangeError
from statesnap.kafka.config import KafkaSettings
from statesnap.kafka.reader import ChangelogReader
from statesnap.snapshot.api import SnapshotApi
from statesnap.snapshot.model import SnapshotState
from statesnap.task.options import CheckpointOptions, SnapshotOptions

pytestmark = pytest.mark.integration

PARTITIONS = 3
#: The tables' Kafka deadline: the topic-store checkpoint gives up after this long.
STALL = 3.0


class RestartableBroker(ApacheKafkaBroker):
    """The dev broker, killable and restartable on the log dirs it already has."""

    def kill(self) -> None:
        """SIGKILL to the JVM's process group: no controlled shutdown, no flush."""
        proc, self._proc = self._proc, None
        assert proc is not None
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        if self._log_path is not None:
            with contextlib.suppress(OSError):
                self._log_path.unlink()

    def restart(self, timeout: float = 60.0) -> None:
        """Start the JVM again on the same directory, ports and cluster id (no re-format)."""
        LoopbackService.start(self, timeout)

    def ensure_running(self) -> None:
        """Restart it if a test before this one left it killed (a failure mid-outage)."""
        if not self.running:
            self.restart()


@pytest.fixture(scope="module")
def broker() -> Iterator[RestartableBroker]:
    """A broker for this module only (it dies with the test run, like every dev service); each
    test leaves it running. A short broker session: a node restarted after SIGKILL re-registers
    once its old session expired, 9 s by default (12 s restarts measured; 4 s with 2 s)."""
    if (missing := apache_kafka_missing()) is not None:
        pytest.skip(missing)
    b = RestartableBroker(
        settings={"broker.session.timeout.ms": "2000", "broker.heartbeat.interval.ms": "500"}
    )
    b.start()
    try:
        yield b
    finally:
        b.stop()


def _records(tag: str, n: int, keys: int) -> list[tuple[int, bytes | None, bytes | None]]:
    """Upserts and some tombstones; a key always lives in one partition, as Kafka keys do."""
    return [
        ((i % keys) % PARTITIONS, b"k%d" % (i % keys), None if i % 11 == 5 else f"{tag}{i}".encode())
        for i in range(n)
    ]


def _tailing(broker: ApacheKafkaBroker, topic: str, url: str, snapshot_store: str | None = None) -> Table:
    """A background table with checkpoints at *url* and a short Kafka deadline."""
    checkpoints = CheckpointOptions(url, snapshots=SnapshotOptions(store=snapshot_store))
    return Table(topic, bootstrap_servers=broker.bootstrap_servers, checkpoints=checkpoints, timeout=STALL)


def _ends(records: list[Rec]) -> dict[int, int]:
    return KafkaTool.end_offsets(records, range(PARTITIONS))


def _caught_up(table: Table, ends: dict[int, int]) -> bool:
    return table.wait_for({p: end - 1 for p, end in ends.items() if end}, timeout=30)


def test_tables_ride_out_a_broker_killed_and_restarted(
    broker: RestartableBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broker.ensure_running()
    kafka = KafkaTool(broker.bootstrap_servers)
    topic = kafka.create_topic(f"restart-{uuid.uuid4().hex[:10]}", PARTITIONS)
    blob_url, topic_url = (tmp_path / "blob").as_uri(), (tmp_path / "topic").as_uri()
    tables: list[Table] = []
    try:
        kafka.produce(topic, _records("a", 300, 50))
        blob_table = _tailing(broker, topic, blob_url)
        topic_table = _tailing(broker, topic, topic_url, f"topic:snap-{topic}")
        tables += [blob_table, topic_table]
        for t in tables:
            t.start()
            assert t.checkpoint() is not None  # generation 1

        before = kafka.produce(topic, _records("b", 200, 60))
        truth_before = kafka.truth(kafka.read_all(topic, range(PARTITIONS)))
        for t in tables:
            assert _caught_up(t, _ends(before))

        caplog.set_level(logging.WARNING, logger="statesnap.kafka.reader")
        broker.kill()
        down_at = time.monotonic()
        for t in tables:  # reads are served from the table while the broker is down
            assert dict(t.raw_items()) == truth_before

        written = blob_table.checkpoint(timeout="20s")
        assert written is not None
        assert written.generation == 2
        assert written.offsets == _ends(before)

        started = time.monotonic()
        with pytest.raises(BrokerUnavailableError) as refused:
            topic_table.checkpoint(timeout="20s")
        assert time.monotonic() - started < STALL + 5, "the topic store's wait has no deadline"
        assert broker.bootstrap_servers in str(refused.value)
        assert "\n" not in str(refused.value)
        assert dict(topic_table.raw_items()) == truth_before

        assert time.monotonic() - down_at > STALL  # down longer than the tables' deadline
        broker.restart()
        after = kafka.produce(topic, _records("c", 300, 70))
        everything = kafka.read_all(topic, range(PARTITIONS))
        truth = kafka.truth(everything)
        assert _ends(everything) == _ends(after)
        for t in tables:
            assert _caught_up(t, _ends(after)), f"stuck at {t.offsets} after the restart"
            assert dict(t.raw_items()) == truth
        assert any("unreachable" in r.getMessage() for r in caplog.records), "no warning while down"

        again = topic_table.checkpoint(timeout="20s")
        assert again is not None
        assert again.generation == 2  # the refused attempt committed nothing
    finally:
        for t in tables:
            t.close(checkpoint=False)

    restored = Table(
        topic, checkpoints=blob_url, bootstrap_servers=broker.bootstrap_servers, background=False
    )
    report = restored.start()
    try:
        assert report.checkpoint == 2  # the one written while the broker was down
        assert report.replayed_records == len(after)
        assert dict(restored.raw_items()) == truth
    finally:
        restored.close(checkpoint=False)
        kafka.close()


class Held:
    """An ``on_update`` hook that holds a table's consuming thread at its next batch until
    released: the test then knows where the thread is when it kills the broker."""

    def __init__(self) -> None:
        self.held, self.release = threading.Event(), threading.Event()

    def __call__(self, _key: object, _old: object, _new: object) -> None:
        self.held.set()
        self.release.wait(30)


def test_tailing_tables_keep_going_through_an_outage_mid_tail_or_at_a_checkpoint(
    broker: RestartableBroker, tmp_path: Path
) -> None:
    """Apache Kafka 4.1.1: the broker dies, for longer than the tables' ``timeout``, while

    - table A is in the middle of new records: more on the broker than one fetch brings
      (``queued.min.messages=1`` keeps librdkafka from prefetching the rest), so no
      end-of-partition can arrive;
    - table B (snapshot records on a topic, checkpoint interval 1 s) has applied new records
      and is at the end: its next commit point writes a periodic checkpoint.

    ``on_update`` hooks hold both consuming threads across the kill, so this is deterministic.
    Both tables should keep serving their rows while the broker is down and, once it is back,
    consume the rest and equal a plain replay — as they do when the outage finds them at the
    end with nothing to checkpoint (the test above)."""
    broker.ensure_running()
    kafka = KafkaTool(broker.bootstrap_servers)
    topic_a = kafka.create_topic(f"midtail-{uuid.uuid4().hex[:10]}", 1)
    topic_b = kafka.create_topic(f"midcp-{uuid.uuid4().hex[:10]}", 1)
    for topic in (topic_a, topic_b):
        kafka.produce(topic, [(0, b"k%d" % i, b"a") for i in range(10)])
    a = Table(
        topic_a,
        bootstrap_servers=broker.bootstrap_servers,
        kafka_config={"queued.min.messages": 1},
        timeout=2.0,
    )
    every_second = CheckpointOptions(
        (tmp_path / "b").as_uri(),
        interval="1s",
        commit_interval="1s",
        snapshots=SnapshotOptions(store=f"topic:snap-{topic_b}"),
    )
    b = Table(topic_b, bootstrap_servers=broker.bootstrap_servers, checkpoints=every_second, timeout=2.0)
    holds = {topic_a: Held(), topic_b: Held()}
    try:
        for t in (a, b):
            t.start()
            t.on_update = holds[t.topic]
        started = time.monotonic()
        value = b"v" * 500_000  # 40 x 500 kB: more than one 16 MB fetch
        kafka.produce(topic_a, [(0, b"big%d" % (i % 4), value) for i in range(40)])
        kafka.produce(topic_b, [(0, b"k%d" % i, b"b") for i in range(10)])
        assert all(h.held.wait(30) for h in holds.values()), "a table did not start on the new records"
        time.sleep(
            max(0.3, 1.2 - (time.monotonic() - started))
        )  # B's end-of-partition arrives; its checkpoint is due
        broker.kill()
        for h in holds.values():
            h.release.set()
        time.sleep(3.0)  # down longer than the tables' deadline
        for t in (a, b):
            assert len(dict(t.raw_items())) >= 10, "rows not served while the broker is down"
        broker.restart()
        for t in (a, b):
            records = kafka.read_all(t.topic, [0])
            assert _caught_up(t, _ends(records)), f"{t.topic} stuck at {t.offsets} after the restart"
            assert dict(t.raw_items()) == kafka.truth(records)
    finally:
        for h in holds.values():
            h.release.set()
        for t in (a, b):
            t.close(checkpoint=False)
        kafka.close()


#: Small fetches and no prefetch: a restore of the tail below (one record per batch) takes many
#: fetches, so the broker can be killed with most of it still on the broker (measured: the first
#: progress report at about 150 of 3,000 records, the restore about 1 s).
SLOW_FETCH = {
    "queued.min.messages": 1,
    "max.partition.fetch.bytes": 8192,
    "fetch.max.bytes": 16384,
    "message.max.bytes": 16384,
}


class RestoreHeldAtFirstProgress(threading.Thread):
    """``table.start()`` on its own thread, held at its first progress report until released:
    the test kills the broker there. The broker is killed and restarted by the test's own thread,
    never this one: a dev service dies with the thread that started it (devstack/orphans.py)."""

    def __init__(self, table: Table) -> None:
        super().__init__(daemon=True)
        self.table = table
        self.reported, self.release = threading.Event(), threading.Event()
        self.records_at_hold: int | None = None
        self.report: RestoreReport | None = None
        self.error: BaseException | None = None
        self.killed_at = self.finished_at = 0.0

    def _progress(self, records: int, _done: int, _total: int) -> None:
        if self.records_at_hold is None:
            self.records_at_hold = records
            self.reported.set()
            self.release.wait(30)

    def run(self) -> None:
        try:
            self.report = self.table.start(progress=self._progress)
        except BaseException as e:  # handed to the test's thread
            self.error = e
        finally:
            self.finished_at = time.monotonic()
            self.reported.set()

    def kill_at_first_progress(self, broker: RestartableBroker) -> None:
        """Kill the broker once the restore has reported its first records, then let it go on."""
        assert self.reported.wait(30), "the restore never reported progress"
        broker.kill()
        self.killed_at = time.monotonic()
        self.release.set()


def _long_tail(kafka: KafkaTool, n: int = 3000) -> tuple[str, list[Rec]]:
    """A topic whose history is a tail of *n* 1 kB upserts (some tombstones) over 3 partitions."""
    topic = kafka.create_topic(f"restore-{uuid.uuid4().hex[:10]}", PARTITIONS)
    filler = b"x" * 1000
    # One record per batch: the broker hands out whole batches whatever the fetch size asks for.
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "batch.size": 1, "linger.ms": 0})
    for p, k, v in _records("r", n, 400):
        producer.produce(topic, None if v is None else v + filler, k, partition=p)
        producer.poll(0)
    assert producer.flush(30) == 0
    return topic, kafka.read_all(topic, range(PARTITIONS))


def test_a_restore_rides_out_a_broker_killed_and_restarted_within_its_timeout(
    broker: RestartableBroker,
) -> None:
    """Apache Kafka 4.1.1: the broker is SIGKILLed at the first progress report of a
    ``Table.start()`` replaying a 3,000-record tail (3 MB in 8 kB fetches: most of it still on
    the broker) and restarted half a second later, well within the table's 30 s ``timeout``: the
    restore finishes and equals a plain consumer's replay, every record applied once."""
    broker.ensure_running()
    kafka = KafkaTool(broker.bootstrap_servers)
    try:
        topic, records = _long_tail(kafka)
        table = Table(
            topic,
            bootstrap_servers=broker.bootstrap_servers,
            kafka_config=SLOW_FETCH,
            timeout=30.0,
            background=False,
        )
        restore = RestoreHeldAtFirstProgress(table)
        try:
            restore.start()
            restore.kill_at_first_progress(broker)
            time.sleep(0.5)
            broker.restart()
            restore.join(60)
            assert not restore.is_alive(), "the restore did not finish within 60 s of the restart"
            assert restore.error is None, repr(restore.error)
            assert restore.report is not None
            assert restore.records_at_hold is not None
            assert restore.records_at_hold < len(records) // 2, "killed too late to prove anything"
            assert restore.report.replayed_records == len(records)
            assert table.offsets == _ends(records)
            assert dict(table.raw_items()) == kafka.truth(records)
        finally:
            restore.release.set()
            table.close(checkpoint=False)
    finally:
        broker.ensure_running()
        kafka.close()


def test_a_snapshot_across_a_broker_restart_completes_whole_and_verifies(
    broker: RestartableBroker, tmp_path: Path
) -> None:
    """Apache Kafka 4.1.1: two tasks (``StaticShare`` 0 and 1 of 2, tailing, commit points every
    second) and a snapshot created with :class:`SnapshotApi`; the broker is SIGKILLed right after
    the create, before either task has reported, and restarted 1 s later. The snapshot ends
    COMPLETED with every partition (never a partial generation: a FAILED one, within its timeout,
    is the only other outcome allowed), ``statesnap checkpoints verify`` on the store passes
    after the restart, and a restore of that generation plus the tail equals a plain replay."""
    broker.ensure_running()
    kafka = KafkaTool(broker.bootstrap_servers)
    topic = kafka.create_topic(f"snaprestart-{uuid.uuid4().hex[:10]}", 4)
    url = (tmp_path / "store").as_uri()
    every_second = CheckpointOptions(url, interval="1h", commit_interval="1s")
    tasks = [
        Table(
            topic,
            bootstrap_servers=broker.bootstrap_servers,
            checkpoints=every_second,
            partitions=StaticShare(i, 2),
            timeout=STALL,
        )
        for i in range(2)
    ]
    api: SnapshotApi | None = None
    try:
        kafka.produce(topic, [((i % 90) % 4, b"k%d" % (i % 90), b"v%d" % i) for i in range(400)])
        for t in tasks:
            t.start()
        api = SnapshotApi.open(url, topic)
        created = api.create(timeout="30s")
        broker.kill()
        time.sleep(1.0)
        broker.restart()  # from this thread: a dev service dies with the thread that started it
        done = api.wait(created.generation, "40s")
        assert done.state in (SnapshotState.COMPLETED, SnapshotState.FAILED), done.state
        if done.state is SnapshotState.FAILED:
            assert done.error is not None
            assert "\n" not in done.error
        assert done.state is SnapshotState.COMPLETED, f"failed: {done.error}"
        assert not done.missing_partitions
        assert done.reported_partitions == {0, 1, 2, 3}
        for snap in api.list():  # no generation is COMPLETED with a partition missing
            assert snap.state is not SnapshotState.COMPLETED or not snap.missing_partitions, snap

        kafka.produce(topic, [((i % 90) % 4, b"k%d" % (i % 90), b"w%d" % i) for i in range(100)])
        verified = subprocess.run(
            [sys.executable, "-m", "statesnap.cli", "checkpoints", "verify", url, "--table", topic],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert verified.returncode == 0, verified.stdout + verified.stderr
    finally:
        for t in tasks:
            t.close(checkpoint=False)
        if api is not None:
            api.close()
        broker.ensure_running()

    restored = Table(
        topic,
        bootstrap_servers=broker.bootstrap_servers,
        checkpoints=CheckpointOptions(url, generation=done.generation),
        background=False,
    )
    try:
        report = restored.start()
        assert report.checkpoint == done.generation
        assert dict(restored.raw_items()) == kafka.truth(kafka.read_all(topic, range(4)))
    finally:
        restored.close(checkpoint=False)
        kafka.close()


def _torn_tail(broker: RestartableBroker, topic: str, cut: int) -> None:
    """Cut the last *cut* bytes of partition 0's active segment while the broker is down: the
    tail a power loss takes from a file that was never fsynced (a SIGKILL takes none of it)."""
    assert broker._dir is not None  # the broker's own temp dir (devstack/apache.py)
    segment = sorted((broker._dir / "data" / f"{topic}-0").glob("*.log"))[-1]
    os.truncate(segment, segment.stat().st_size - cut)


@pytest.mark.long  # a restart; the epoch checks it proves on a truncated log are proven by default,
# on a checkpoint whose epoch the log never had, in tests/integration/apache/test_leader_epochs.py
def test_log_truncation_after_an_unclean_restart(broker: RestartableBroker, tmp_path: Path) -> None:
    """Apache Kafka 4.1.1, one node: what it takes to truncate a log, and what checkpoints beyond
    the truncation do.

    A SIGKILL right after acks=1 produces loses nothing (page cache survives a process kill;
    measured: 20 records acknowledged, killed, all 20 there after the restart), so the broker is
    made to truncate the way a power loss would: killed, the last bytes of the active segment
    cut, restarted. Its recovery truncates to the last whole batch and the log end goes back
    (1,500 bytes of one-record batches: measured 120 → 100); the restarted leader writes in a new
    leader epoch (measured 0 → 2). Generation 1 (offset 50) is below the cut, generation 2
    (offset 120, after a record of epoch 0) beyond it:

    - while the log end is below generation 2, a restore pinned to it fails in one typed line
      (past the partition's end); an unpinned one skips it as truncated (the topic ID is the
      checkpoint's, so not another incarnation) and continues from generation 1;
    - once new records carry the end past it, its offsets look valid again but name other
      records: the leader epoch it kept says so (the broker holds epoch 0 only up to offset 100,
      KIP-320): skipped, generation 1 used, ``restore + tail`` equals a plain replay; a reader
      assigned at generation 2's position (a truncation after the checkpoint was chosen) fails
      in one line naming the truncation instead of reading past it."""
    broker.ensure_running()
    kafka = KafkaTool(broker.bootstrap_servers)
    topic = kafka.create_topic(f"trunc-{uuid.uuid4().hex[:10]}", 1)
    url = (tmp_path / "cp").as_uri()

    def checkpoint() -> CheckpointManifest:
        table = Table(topic, bootstrap_servers=broker.bootstrap_servers, checkpoints=url, background=False)
        table.start()
        cp = table.checkpoint()
        table.close(checkpoint=False)
        assert cp is not None
        return cp

    def restore(generation: int | None = None) -> tuple[RestoreReport, dict[bytes, bytes]]:
        restored = Table(
            topic,
            bootstrap_servers=broker.bootstrap_servers,
            checkpoints=CheckpointOptions(url, generation=generation),
            background=False,
            timeout=STALL,
        )
        try:
            return restored.start(), dict(restored.raw_items())
        finally:
            restored.close(checkpoint=False)

    try:
        for i in range(120):  # one record per batch: the cut lands on batch boundaries' neighbours
            kafka.produce(topic, [(0, b"old%d" % i, b"v%d" % i)])
            if i == 49:
                below = checkpoint()
        cp = checkpoint()
        assert below.offsets == {0: 50}
        assert cp.offsets == {0: 120}
        assert cp.partitions[0].leader_epoch == 0

        broker.kill()
        _torn_tail(broker, topic, 1500)
        broker.restart()
        end = _ends(kafka.read_all(topic, [0]))[0]
        assert 50 < end < 120, f"the broker's recovery truncated to {end}"

        with pytest.raises(NoUsableCheckpointError, match="past the partition's end"):
            restore(cp.generation)
        report, got = restore()
        assert report.checkpoint == below.generation
        assert "truncated" in report.skipped[0].reason
        assert got == kafka.truth(kafka.read_all(topic, [0]))

        kafka.produce(topic, [(0, b"new%d" % i, b"n%d" % i) for i in range(60)])
        records = kafka.read_all(topic, [0])
        assert _ends(records)[0] > 120  # past the checkpoint again: its offsets look valid
        report, got = restore()
        assert report.checkpoint == below.generation, report.skipped
        assert [s.generation for s in report.skipped] == [cp.generation]
        assert f"leader epoch 0 only up to offset {end}" in report.skipped[0].reason
        assert got == kafka.truth(records)

        reader = ChangelogReader(
            KafkaSettings(broker.bootstrap_servers, {}, STALL), topic, resume_offsets(cp, (0,))
        )
        try:
            with pytest.raises(OffsetOutOfRangeError, match=f"leader epoch 0 ends at offset {end}") as cut:
                _poll_for(reader, 20)
            assert "\n" not in str(cut.value)
        finally:
            reader.close()
    finally:
        kafka.close()


def _poll_for(reader: ChangelogReader, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        reader.poll(0.1)


def test_a_restore_whose_broker_stays_down_fails_in_one_line_naming_it(broker: RestartableBroker) -> None:
    """Apache Kafka 4.1.1: the broker is SIGKILLed at the first progress report of a restore
    and stays down: ``start()`` fails with :class:`BrokerUnavailableError`, one line naming the
    broker, within the table's ``timeout`` plus the probe that confirms it. Last in the module: it
    leaves the broker down, saving a restart (a test after it starts it again)."""
    broker.ensure_running()
    kafka = KafkaTool(broker.bootstrap_servers)
    try:
        topic, _records = _long_tail(kafka)
        table = Table(
            topic,
            bootstrap_servers=broker.bootstrap_servers,
            kafka_config=SLOW_FETCH,
            timeout=STALL,
            background=False,
        )
        restore = RestoreHeldAtFirstProgress(table)
        try:
            restore.start()
            restore.kill_at_first_progress(broker)
            restore.join(STALL + 30)
            assert not restore.is_alive(), "the restore's wait has no deadline"
        finally:
            restore.release.set()
            table.close(checkpoint=False)
        lost = restore.error
        assert isinstance(lost, BrokerUnavailableError), repr(lost)
        waited = restore.finished_at - restore.killed_at
        assert waited < STALL + 10, f"{waited:.1f}s after the kill: the restore's wait has no deadline"
        assert broker.bootstrap_servers in str(lost)
        assert topic in str(lost)
        assert "\n" not in str(lost)
    finally:
        kafka.close()  # the broker stays down: the next test (or the module's teardown) sees to it
