"""SIGKILL of a stateful processor at random points of processing and of checkpoint writes, with a
producer running (issue #18's kill tests), on Apache Kafka (the session's ``apache_kafka``).

The processor is the running tally of :mod:`faults.processor_child` (two key-value stores,
``balances`` and ``payments``; every record emits its account's balance), in its own process,
checkpointing at every commit point. It is killed several times: after a random delay (mostly mid
processing: records handled, outputs sent, no checkpoint yet) and the moment a checkpoint's data
files are in the store but its manifest is not (provably mid-write). Each restart restores what
the last crash left and must go on committing. Then, against a recomputation by a plain consumer
loop over the input (not statesnap):

- every retained checkpoint's files hold exactly the stores of the input below its offsets, byte
  for byte (read with pyarrow from the store, not through statesnap);
- every retained generation restored point-in-time, plus the re-processed tail, equals the
  recomputation over everything, store for store, byte for byte (``StoreReader.raw_items``);
- the outputs satisfy the output mode's contract (:data:`OUTPUT_MODES`): at least once, every
  record the recomputation emits, per account in order, replays allowed; exactly once
  (``Processor(exactly_once=True)``, read ``read_committed``), exactly those records.

On file:// and on S3 (the session moto server); the RocksDB and columnar local stores in long
variants. A second test runs two members of one consumer group and kills them in turn (a
survivor gains the dead member's partitions from their checkpoint); a third kills the windowed
processor (windows closing, late records, expiry at retention, a punctuator). The default run
kills twice per processor (once mid-processing, once between a checkpoint's files and its
manifest); long mode (``STATESNAP_FAULTS=long``) more.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from faults.harness import (
    KafkaTool,
    Location,
    Rec,
    check_secrets,
    checkpoint_contents,
    cli_env,
    kill_group,
    repo_of,
    run_cli,
    table_digest_of,
)
from faults.ledger import CaseLedger
from faults.processor_child import (
    EXACTLY_ONCE,
    FINAL,
    NAME,
    SNAPSHOT_TIMEOUT,
    STORES,
    TUMBLING,
    WINDOWED,
    Event,
    build,
    tally_options,
    window_model,
)
from statesnap.checkpoint import layout
from statesnap.devstack import ApacheKafkaBroker
from statesnap.snapshot.api import SnapshotApi

PARTITIONS = 3
ACCOUNTS = 400
CHILD = Path(__file__).with_name("processor_child.py")
#: The meta store statesnap keeps beside the user's (stream time per partition).
META_PREFIX = b"_statesnap\x00"


@pytest.fixture(scope="module")
def kafka(apache_kafka: ApacheKafkaBroker) -> Iterator[KafkaTool]:
    """This module's broker is Apache Kafka, not the suite's Tansu (``new_topic`` follows)."""
    tool = KafkaTool(apache_kafka.bootstrap_servers)
    yield tool
    tool.close()


# --- the input and its independent recomputation -----------------------------------------------


class Payments(threading.Thread):
    """Keeps producing payments (an amount as ASCII digits) and, now and then, an account's
    closing (a null value); an account always goes to one partition."""

    def __init__(self, kafka: KafkaTool, topic: str, seed: int, pause: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.kafka, self.topic, self.pause = kafka, topic, pause
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.produced = 0
        self.error: BaseException | None = None

    def batch(self, n: int) -> list[tuple[int, bytes | None, bytes | None]]:
        out: list[tuple[int, bytes | None, bytes | None]] = []
        for _ in range(n):
            account = self.rng.randrange(ACCOUNTS)
            value = None if self.rng.random() < 0.05 else b"%d" % self.rng.randrange(1, 1000)
            out.append((account % PARTITIONS, b"acct-%04d" % account, value))
        return out

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.produced += len(self.kafka.produce(self.topic, self.batch(50)))
                time.sleep(self.pause)
        except BaseException as e:  # surfaced by finish()
            self.error = e

    def finish(self) -> int:
        self.stop.set()
        self.join(60)
        assert not self.is_alive(), "producer did not stop"
        if self.error is not None:
            raise AssertionError(f"producer failed: {self.error!r}")
        return self.produced


@dataclass
class Tally:
    """What the tally processor must hold and emit, computed by the definition."""

    #: Per store: the stored key as the checkpoint files hold it -> value bytes.
    stored: dict[str, dict[bytes, bytes]] = field(default_factory=lambda: {s: {} for s in STORES})
    #: Per store: key -> value bytes, as ``StoreReader.raw_items`` yields them.
    stores: dict[str, dict[bytes, bytes]] = field(default_factory=lambda: {s: {} for s in STORES})
    #: Per account: the values emitted, in order (None: the account was closed).
    outputs: dict[bytes, list[bytes | None]] = field(default_factory=dict)


def stored_key(store: str, partition: int, key: bytes) -> bytes:
    """A processor store's key as stored (the layout documented in processor/keyspace.py)."""
    return store.encode() + b"\x00" + partition.to_bytes(4, "big") + key


def recompute(records: Sequence[Rec], offsets: dict[int, int] | None = None) -> Tally:
    """The tally of the records below *offsets* (all without), by a plain loop."""
    out = Tally()
    balances, payments = out.stores["balances"], out.stores["payments"]
    where: dict[bytes, int] = {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        if offsets is not None and r.offset >= offsets.get(r.partition, 0):
            continue
        assert r.key is not None
        where[r.key] = r.partition
        emitted = out.outputs.setdefault(r.key, [])
        if r.value is None:
            balances.pop(r.key, None)
            payments.pop(r.key, None)
            emitted.append(None)
            continue
        balance = int(balances.get(r.key, b"0")) + int(r.value)
        balances[r.key] = b"%d" % balance
        payments[r.key] = (int.from_bytes(payments.get(r.key, bytes(8)), "big") + 1).to_bytes(8, "big")
        emitted.append(b"%d" % balance)
    for store, rows in out.stores.items():
        out.stored[store] = {stored_key(store, where[k], k): v for k, v in rows.items()}
    return out


def judge_stores(ledger: CaseLedger, what: str, got: dict[str, dict[bytes, bytes]], want: Tally) -> None:
    for store in STORES:
        g, w = got.get(store, {}), want.stores[store]
        if g == w:
            continue
        missing = [k for k in w if k not in g]
        wrong = [k for k in g if w.get(k) != g[k]]
        detail = f"{what}: store {store}: {len(missing)} keys missing, {len(wrong)} wrong/extra (of {len(w)})"
        ledger.fail("data_lost" if missing and not wrong else "wrong_tables", detail)


# --- output modes -------------------------------------------------------------------------------


def is_subsequence(want: Sequence[bytes | None], got: Sequence[bytes | None]) -> bool:
    it = iter(got)
    return all(any(g == w for g in it) for w in want)


def at_least_once(ledger: CaseLedger, outputs: Sequence[Rec], want: Tally) -> None:
    """Every record the recomputation emits appears, per account in order (a replayed stretch
    repeats, nothing is skipped), and nothing else appears."""
    got: dict[bytes, list[bytes | None]] = {}
    for r in sorted(outputs, key=lambda r: (r.partition, r.offset)):
        assert r.key is not None
        got.setdefault(r.key, []).append(r.value)
    lost = [k for k, values in want.outputs.items() if not is_subsequence(values, got.get(k, []))]
    ledger.check(
        not lost,
        "data_lost",
        f"at-least-once outputs: {len(lost)} accounts miss emitted records, e.g. {lost[:3]}",
    )
    allowed = {(k, v) for k, values in want.outputs.items() for v in values}
    foreign = [(k, v) for k, values in got.items() for v in values if (k, v) not in allowed]
    ledger.check(not foreign, "wrong_tables", f"outputs no record produced: {foreign[:3]}")
    emitted = sum(len(v) for v in want.outputs.values())
    ledger.check(len(outputs) >= emitted, "data_lost", f"{len(outputs)} outputs < {emitted} expected")


def exactly_once(ledger: CaseLedger, outputs: Sequence[Rec], want: Tally) -> None:
    """Read committed (``read_all``'s consumer is ``read_committed``, librdkafka's default):
    per account exactly the records the recomputation emits, in order — none lost, none twice."""
    got: dict[bytes, list[bytes | None]] = {}
    for r in sorted(outputs, key=lambda r: (r.partition, r.offset)):
        assert r.key is not None
        got.setdefault(r.key, []).append(r.value)
    wrong = [k for k in want.outputs.keys() | got.keys() if got.get(k, []) != want.outputs.get(k, [])]
    detail = ", ".join(
        f"{k!r}: {len(got.get(k, []))} emitted, {len(want.outputs.get(k, []))} expected" for k in wrong[:3]
    )
    ledger.check(
        not wrong, "wrong_tables", f"exactly-once outputs differ for {len(wrong)} accounts: {detail}"
    )


#: Output mode -> (extra child arguments, the judge of the output topic).
OUTPUT_MODES: dict[str, tuple[tuple[str, ...], Callable[[CaseLedger, Sequence[Rec], Tally], None]]] = {
    "at_least_once": ((), at_least_once),
    "exactly_once": ((EXACTLY_ONCE,), exactly_once),
}


# --- the processor in a child process -----------------------------------------------------------


def _generations(loc: Location) -> tuple[set[int], set[int]]:
    """(generations with a manifest, generations with a data file), from a plain listing."""
    manifests: set[int] = set()
    data: set[int] = set()
    for key in loc.list_keys():
        _table, _, rest = key.partition("/")
        gen = layout.manifest_generation(rest)
        if gen is not None:
            manifests.add(gen)
        gen = layout.data_generation(rest)
        if gen is not None and rest.endswith(".parquet"):
            data.add(gen)
    return manifests, data


def _newest(loc: Location) -> int:
    return max(_generations(loc)[0], default=0)


def _mid_write(loc: Location, baseline: int) -> bool:
    manifests, data = _generations(loc)
    return any(g > baseline and g not in manifests for g in data)


def _child(
    bootstrap: str,
    topic: str,
    output: str,
    loc: Location,
    how: str,
    store: str,
    log: Path,
    extra: Sequence[str],
) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, str(CHILD), bootstrap, topic, output, loc.cli_url, how, store, *extra],
            stdout=out, stderr=out, stdin=subprocess.DEVNULL, env=cli_env(loc.cli_env),
            start_new_session=True,
        )  # fmt: skip


def _restore(
    bootstrap: str, topic: str, scratch_output: str, loc: Location, generation: int | None, store: str
) -> tuple[dict[str, dict[bytes, bytes]], int | None, int]:
    """Point-in-time restore in-process (no periodic checkpoint, none at close, a GC that would
    keep everything): (stores as ``raw_items`` yields them, the generation restored, records
    re-processed). It is a task of its own in the snapshots: as the killed writer's task
    (``main``) it would complete that writer's snapshot still in progress with its own state (a
    valid checkpoint, but not a point-in-time check), which a loaded machine once let happen
    after the deadline's sleep below."""
    options = tally_options(
        loc.url, dict(loc.options), interval="1h", generation=generation, keep=10_000, task_id="pit-check"
    )
    proc = build(bootstrap, topic, scratch_output, options, store)
    report = proc.start()
    try:
        stores = {s: dict(proc.store(s).raw_items()) for s in STORES}
    finally:
        proc.close(checkpoint=False)
    return stores, report.checkpoint, report.replayed_records


def _checkpoint_stores(
    loc: Location, generation: int
) -> tuple[dict[int, int], dict[str, dict[bytes, bytes]]]:
    """(input offsets, stored keys per store) of one checkpoint, read from its files directly."""
    offsets, rows = checkpoint_contents(loc, generation)
    stored: dict[str, dict[bytes, bytes]] = {s: {} for s in STORES}
    for key, value in rows.items():
        if key.startswith(META_PREFIX):
            continue
        store = key.split(b"\x00", 1)[0].decode()
        assert store in stored, f"generation {generation}: a key of an undeclared store {key[:40]!r}"
        stored[store][key] = value
    return offsets, stored


def _kill_rounds(
    ledger: CaseLedger,
    loc: Location,
    start: Callable[[], subprocess.Popen[bytes]],
    rounds: int,
    rng: random.Random,
    log: Path,
) -> int:
    """Start the processor, wait until it commits, SIGKILL it — after a random delay (mostly
    mid-processing) or the moment a checkpoint is half-written — and again, *rounds* times;
    returns the kills that landed mid-write (at least one, and restarts restored checkpoints)."""
    mid_write_kills = 0
    for round_no in range(rounds):
        committed_before = _newest(loc)
        proc = start()
        try:
            deadline = time.monotonic() + 45
            while _newest(loc) <= committed_before:  # a restarted processor goes on committing
                assert proc.poll() is None, log.read_text()[-3000:]
                if time.monotonic() > deadline:
                    ledger.fail("hangs", f"round {round_no}: restarted processor committed nothing in 45 s")
                time.sleep(0.01)
            if round_no % 2 == 0:
                time.sleep(rng.uniform(0, 1.0))
            else:
                baseline = max(set().union(*_generations(loc)), default=0)
                deadline = time.monotonic() + 30
                while not _mid_write(loc, baseline) and time.monotonic() < deadline:
                    time.sleep(0.001)
                mid_write_kills += _mid_write(loc, baseline)
            assert proc.poll() is None, log.read_text()[-3000:]
        finally:
            kill_group(proc)
            proc.wait(10)
        ledger.tried("kills")
        repo = repo_of(loc)
        assert repo.verify(repo.generations()[0]).ok, "a SIGKILL left a visible, incomplete checkpoint"
    assert mid_write_kills > 0, "no kill landed between a checkpoint's data files and its manifest"
    started = [line for line in log.read_text().splitlines() if line.startswith("started")]
    assert any(line != "started None" for line in started[1:]), f"restarts never restored: {started}"
    return mid_write_kills


@dataclass(frozen=True)
class Run:
    """What a kill test ran: its topics, its store, the child's options and log."""

    topic: str
    output: str
    scratch: str
    loc: Location
    store_kind: str
    extra: Sequence[str]
    log: Path


def _verify(ledger: CaseLedger, kafka: KafkaTool, run: Run, produced: int) -> list[Rec]:
    """After the kills: every retained checkpoint's files and its restore + tail against the
    recomputation, then one clean run to the end, its restore and ``dump --store``; returns the
    input records."""
    topic, loc, store_kind, kind = run.topic, run.loc, run.store_kind, run.loc.kind
    records = kafka.read_all(topic, range(PARTITIONS))
    ledger.check(len(records) == produced, "data_lost", f"input holds {len(records)} of {produced}")
    want = recompute(records)

    # What the crashes left, point in time: each retained checkpoint's files, then + the tail.
    # A restore is a writer: it would settle the killed writer's last snapshot (and GC after), so
    # that is settled first, as the next writer settles it — finished where every partition was
    # reported (the kill fell between the report and the commit: a valid checkpoint), else failed
    # once its deadline passed.
    time.sleep(SNAPSHOT_TIMEOUT + 0.5)
    repo = repo_of(loc)
    api = SnapshotApi.for_repo(repo, NAME)
    try:
        api.wait(api.current().generation, timeout=0)
    finally:
        api.close()
    generations = repo.generations()
    assert len(generations) >= 2, generations
    for gen in generations:
        offsets, stored = _checkpoint_stores(loc, gen)
        at = recompute(records, offsets)
        for store in STORES:
            ledger.check(
                stored[store] == at.stored[store],
                "wrong_tables",
                f"generation {gen}'s {store} files differ from the input below its offsets {offsets}",
            )
        got, restored, replayed = _restore(kafka.bootstrap, topic, run.scratch, loc, gen, store_kind)
        assert restored == gen, (restored, gen)
        assert replayed == len(records) - sum(offsets.values()), (replayed, offsets)
        judge_stores(ledger, f"generation {gen} + tail on {kind}", got, want)
    assert repo_of(loc).generations() == generations, "a point-in-time restore wrote a checkpoint"

    # The processor restarts once more after the last crash and exits: a checkpoint of everything.
    final = _child(kafka.bootstrap, topic, run.output, loc, "once", store_kind, run.log, run.extra)
    assert final.wait(90) == 0, run.log.read_text()[-3000:]
    check_secrets(ledger, run.log.read_text(errors="replace"), "processor log")
    got, restored, replayed = _restore(kafka.bootstrap, topic, run.scratch, loc, None, store_kind)
    newest = repo_of(loc).generations()[0]
    assert restored == newest
    assert replayed == 0
    judge_stores(ledger, f"restore after the kills on {kind}", got, want)
    for store in STORES:  # as an operator reads it: the CLI, over the stored bytes
        args = ["dump", "--table", NAME, "--store", store, "-c", loc.cli_url, "--digest", "--json"]
        dumped = run_cli(ledger, [*args, "-b", kafka.bootstrap], timeout=60, env=loc.cli_env)
        assert dumped.returncode == 0, dumped.output[-2000:]
        shown = dumped.json()
        ledger.check(
            (shown["checkpoint"], shown["keys"], shown["digest"])
            == (newest, len(want.stores[store]), table_digest_of(want.stores[store])),
            "wrong_tables",
            f"dump --store {store} on {kind}: {shown}",
        )
    return records


@pytest.mark.parametrize(
    ("kind", "store_kind", "output_mode"),
    [
        # default: both blob stores and both output modes once each (suite budget); the rest long
        pytest.param("file", "auto", "at_least_once", marks=pytest.mark.long),
        ("s3", "auto", "at_least_once"),
        ("file", "auto", "exactly_once"),
        pytest.param("s3", "auto", "exactly_once", marks=pytest.mark.long),
        # the other local store kinds (auto is memory at this size), in long mode
        pytest.param("file", "rocksdb", "at_least_once", marks=pytest.mark.long),
        pytest.param("file", "columnar", "at_least_once", marks=pytest.mark.long),
    ],
)
def test_sigkill_processor_restores_its_stores_and_outputs(
    kind: str,
    store_kind: str,
    output_mode: str,
    kafka: KafkaTool,
    new_topic: Any,
    new_location: Any,
    ledger: CaseLedger,
    long_mode: bool,
    tmp_path: Path,
) -> None:
    """Apache Kafka (the session's broker: transactions hidden from ``read_committed`` readers
    when aborted, which exactly-once needs), both blob stores; the output mode as parametrized."""
    extra, judge_outputs = OUTPUT_MODES[output_mode]
    rounds = 8 if long_mode else 2  # a kill mid-processing, then one between files and manifest
    topic = new_topic(PARTITIONS, "pay")
    output = new_topic(PARTITIONS, "balances-out")
    scratch = new_topic(PARTITIONS, "balances-replay")
    loc: Location = new_location(kind)
    seed = int(uuid.uuid4().hex[:8], 16)
    rng = random.Random(seed)
    producer = Payments(kafka, topic, seed)
    kafka.produce(topic, producer.batch(2000))  # something to restore from the first kill on
    producer.start()
    log = tmp_path / "processor.log"
    try:
        mid_write_kills = _kill_rounds(
            ledger,
            loc,
            lambda: _child(kafka.bootstrap, topic, output, loc, "follow", store_kind, log, extra),
            rounds,
            rng,
            log,
        )
    finally:
        produced = producer.finish()

    records = _verify(
        ledger, kafka, Run(topic, output, scratch, loc, store_kind, extra, log), produced + 2000
    )
    judge_outputs(ledger, kafka.read_all(output, range(PARTITIONS)), recompute(records))
    print(json.dumps({"kills": rounds, "mid_write": mid_write_kills, "records": len(records), "seed": seed}))


@pytest.mark.long  # groups under kills: test_group_tables and the fault suite prove rebalancing by default
@pytest.mark.parametrize("kind", ["file", "s3"])
def test_sigkill_group_members_one_at_a_time(
    kind: str,
    kafka: KafkaTool,
    new_topic: Any,
    new_location: Any,
    ledger: CaseLedger,
    long_mode: bool,
    tmp_path: Path,
) -> None:
    """Apache Kafka (a classic consumer group's rebalances). Two members of one group, killed in
    turn (randomly, or mid-checkpoint-write) and restarted while the other goes on: a survivor
    gains the dead member's partitions from their newest checkpoint (every store of each) plus
    the tail, and a restarted member takes some back. At-least-once outputs."""
    rounds = 6 if long_mode else 3
    topic = new_topic(PARTITIONS, "pay")
    output = new_topic(PARTITIONS, "balances-out")
    scratch = new_topic(PARTITIONS, "balances-replay")
    loc: Location = new_location(kind)
    group = f"tally-{uuid.uuid4().hex[:8]}"
    seed = int(uuid.uuid4().hex[:8], 16)
    rng = random.Random(seed)
    producer = Payments(kafka, topic, seed)
    kafka.produce(topic, producer.batch(2000))
    producer.start()
    log = tmp_path / "processor.log"
    run = Run(topic, output, scratch, loc, "auto", (), log)

    def member() -> subprocess.Popen[bytes]:
        return _child(kafka.bootstrap, topic, output, loc, "follow", "auto", log, (group,))

    members = [member(), member()]
    mid_write_kills = 0
    try:
        for round_no in range(rounds):
            committed_before = _newest(loc)
            deadline = time.monotonic() + 60
            while _newest(loc) <= committed_before:  # the group goes on committing
                for proc in members:
                    assert proc.poll() is None, log.read_text()[-3000:]
                if time.monotonic() > deadline:
                    ledger.fail("hangs", f"round {round_no}: the group committed nothing in 60 s")
                time.sleep(0.01)
            if round_no % 2 == 0:
                time.sleep(rng.uniform(0, 2.0))
            else:
                baseline = max(set().union(*_generations(loc)), default=0)
                deadline = time.monotonic() + 30
                while not _mid_write(loc, baseline) and time.monotonic() < deadline:
                    time.sleep(0.001)
                mid_write_kills += _mid_write(loc, baseline)
            victim = round_no % 2
            kill_group(members[victim])
            members[victim].wait(10)
            ledger.tried("kills")
            repo = repo_of(loc)
            assert repo.verify(repo.generations()[0]).ok, "a SIGKILL left a visible, incomplete checkpoint"
            members[victim] = member()
    finally:
        for proc in members:
            kill_group(proc)
            proc.wait(10)
        produced = producer.finish()
    started = [line for line in log.read_text().splitlines() if line.startswith("started")]
    assert any(line != "started None" for line in started), f"no member restored a checkpoint: {started}"
    records = _verify(ledger, kafka, run, produced + 2000)
    at_least_once(ledger, kafka.read_all(output, range(PARTITIONS)), recompute(records))
    print(json.dumps({"kills": rounds, "mid_write": mid_write_kills, "records": len(records), "seed": seed}))


# --- the windowed processor ----------------------------------------------------------------------


class TimedPayments(threading.Thread):
    """Keeps producing amounts with event times a little ahead of each other, about one in seven
    thrown back up to 1.5 s (within a window's grace, or late); partitions at random, or with
    *by_key* a key always to one partition (as a keyed producer sends)."""

    def __init__(
        self, kafka: KafkaTool, topic: str, seed: int, pause: float = 0.02, *, by_key: bool = False
    ) -> None:
        super().__init__(daemon=True)
        self.kafka, self.topic, self.pause, self.by_key = kafka, topic, pause, by_key
        self.rng = random.Random(seed)
        self.clock = int(time.time() * 1000) - 60_000  # brokers refuse times far ahead of theirs
        self.stop = threading.Event()
        self.produced = 0
        self.error: BaseException | None = None

    def send(self, n: int) -> None:
        producer = self.kafka.producer
        for _ in range(n):
            self.clock += self.rng.randrange(0, 10)
            ts = self.clock - self.rng.randrange(1, 1500) if self.rng.random() < 0.15 else self.clock
            value = json.dumps({"amount": self.rng.randrange(1, 10)}).encode()
            n_key = self.rng.randrange(20)
            partition = n_key % PARTITIONS if self.by_key else self.rng.randrange(PARTITIONS)
            producer.produce(self.topic, value, b"k%02d" % n_key, partition=partition, timestamp=ts)
        assert producer.flush(30) == 0
        self.produced += n

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.send(50)
                time.sleep(self.pause)
        except BaseException as e:  # surfaced by finish()
            self.error = e

    def finish(self) -> int:
        self.stop.set()
        self.join(60)
        assert not self.is_alive(), "producer did not stop"
        if self.error is not None:
            raise AssertionError(f"producer failed: {self.error!r}")
        return self.produced


def _read_events(bootstrap: str, topic: str) -> list[tuple[int, Event]]:
    """(offset, event) of every record, by partition and offset: a plain consumer to EOF."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "test-truth",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 10,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        eof: set[int] = set()
        out: list[tuple[int, int, Event]] = []
        deadline = time.monotonic() + 60
        while len(eof) < PARTITIONS:
            assert time.monotonic() < deadline, f"reading {topic} timed out"
            for m in consumer.consume(1000, 0.1):
                partition, offset, err = m.partition(), m.offset(), m.error()
                assert partition is not None
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        eof.add(partition)
                    continue
                assert offset is not None
                eof.discard(partition)
                key, value = m.key(), m.value()
                assert key is not None
                assert value is not None
                event = Event(partition, key, m.timestamp()[1], json.loads(value)["amount"])
                out.append((partition, offset, event))
        return [(offset, event) for _, offset, event in sorted(out, key=lambda t: (t[0], t[1]))]
    finally:
        consumer.close()


@pytest.mark.long  # windows across crashes: test_window_crash_equivalence proves it by default
@pytest.mark.parametrize("kind", ["file", "s3"])
def test_sigkill_windowed_processor_checkpoints_what_the_window_rules_say(
    kind: str,
    kafka: KafkaTool,
    new_topic: Any,
    new_location: Any,
    ledger: CaseLedger,
    long_mode: bool,
    tmp_path: Path,
) -> None:
    """Apache Kafka (record timestamps as produced, CreateTime). The windowed processor of
    :mod:`faults.processor_child`, killed like the tally with out-of-order records arriving:
    every retained checkpoint's files hold exactly the model of the input below its offsets
    (windows closed and expired by the stream time of that prefix, the punctuator's calls), and
    a last clean run's checkpoint the model of everything."""
    rounds = 6 if long_mode else 3
    topic = new_topic(PARTITIONS, "timed")
    loc: Location = new_location(kind)
    seed = int(uuid.uuid4().hex[:8], 16)
    producer = TimedPayments(kafka, topic, seed)
    producer.send(2000)
    producer.start()
    log = tmp_path / "processor.log"

    def windowed(how: str) -> subprocess.Popen[bytes]:
        return _child(kafka.bootstrap, topic, "-", loc, how, "auto", log, (WINDOWED,))

    try:
        mid_write_kills = _kill_rounds(
            ledger, loc, lambda: windowed("follow"), rounds, random.Random(seed), log
        )
    finally:
        produced = producer.finish()
    events = _read_events(kafka.bootstrap, topic)
    ledger.check(len(events) == produced, "data_lost", f"input holds {len(events)} of {produced}")

    generations = repo_of(loc).generations()
    assert len(generations) >= 2, generations
    for gen in generations:
        offsets, rows = checkpoint_contents(loc, gen)
        want = window_model([e for offset, e in events if offset < offsets.get(e.partition, 0)])
        ledger.check(
            rows == want, "wrong_tables", f"generation {gen} on {kind} differs from the window model"
        )

    assert windowed("once").wait(90) == 0, log.read_text()[-3000:]
    check_secrets(ledger, log.read_text(errors="replace"), "processor log")
    offsets, rows = checkpoint_contents(loc, repo_of(loc).generations()[0])
    assert sum(offsets.values()) == len(events)
    ledger.check(
        rows == window_model([e for _, e in events]), "wrong_tables", f"after {rounds} kills on {kind}"
    )
    print(json.dumps({"kills": rounds, "mid_write": mid_write_kills, "records": len(events), "seed": seed}))


def final_model(events: Sequence[tuple[int, Event]]) -> dict[tuple[bytes, int], int]:
    """The final result of every tumbling window closed by the end of the input, by the window
    rules (a plain loop, not statesnap): per partition, stream time is the largest timestamp so
    far; a record counts in its window unless stream time has passed the window's end + grace; a
    window is final once stream time reaches its end + grace."""
    counts: dict[int, dict[tuple[bytes, int], int]] = {}
    clock: dict[int, int] = {}
    size, closes_after = TUMBLING.size_ms, TUMBLING.size_ms + TUMBLING.grace_ms
    for _offset, e in events:
        now = clock[e.partition] = max(clock.get(e.partition, -1), e.timestamp)
        start = e.timestamp // size * size
        if now < start + closes_after:
            mine = counts.setdefault(e.partition, {})
            mine[(e.key, start)] = mine.get((e.key, start), 0) + 1
    return {
        window: n
        for p, mine in counts.items()
        for window, n in mine.items()
        if clock[p] >= window[1] + closes_after
    }


@pytest.mark.parametrize(
    "output_mode", ["exactly_once", pytest.param("at_least_once", marks=pytest.mark.long)]
)
def test_sigkill_never_loses_a_final_window_result(
    output_mode: str,
    kafka: KafkaTool,
    new_topic: Any,
    new_location: Any,
    ledger: CaseLedger,
    long_mode: bool,
    tmp_path: Path,
) -> None:
    """Apache Kafka (CreateTime timestamps, transactions, ``read_committed``). A tumbling count
    with ``emit="final"`` in a child process, killed mid-processing and between a checkpoint's
    files and its manifest while out-of-order and late records arrive, then run to the end: every
    window closed by the end has its final result on the output topic with the plain loop's count
    — exactly once with ``exactly_once=True``; at least once (repeats carry the same count)
    otherwise — and no window has a result it should not."""
    rounds = 4 if long_mode else 2
    topic, output = new_topic(PARTITIONS, "final"), new_topic(PARTITIONS, "final-out")
    loc: Location = new_location("file")
    seed = int(uuid.uuid4().hex[:8], 16)
    producer = TimedPayments(kafka, topic, seed, by_key=True)
    producer.send(2000)
    producer.start()
    log = tmp_path / "processor.log"
    extra = (FINAL, EXACTLY_ONCE) if output_mode == "exactly_once" else (FINAL,)

    def final(how: str) -> subprocess.Popen[bytes]:
        return _child(kafka.bootstrap, topic, output, loc, how, "auto", log, extra)

    try:
        _kill_rounds(ledger, loc, lambda: final("follow"), rounds, random.Random(seed), log)
    finally:
        produced = producer.finish()
    assert final("once").wait(90) == 0, log.read_text()[-3000:]
    events = _read_events(kafka.bootstrap, topic)
    ledger.check(len(events) == produced, "data_lost", f"input holds {len(events)} of {produced}")
    want = final_model(events)
    assert want, "no window closed"

    got: dict[tuple[bytes, int], list[int]] = {}
    for r in kafka.read_all(output, range(PARTITIONS)):  # read_committed
        assert r.key is not None
        assert r.value is not None
        result = json.loads(r.value)
        assert result["end"] - result["start"] == TUMBLING.size_ms, result
        got.setdefault((r.key, result["start"]), []).append(result["value"])
    lost = [w for w in want if w not in got]
    ledger.check(not lost, "data_lost", f"{len(lost)} of {len(want)} final results lost, e.g. {lost[:3]}")
    wrong = [w for w, values in got.items() if set(values) != {want.get(w)}]
    ledger.check(
        not wrong, "wrong_tables", f"{len(wrong)} windows with a wrong or foreign result: {wrong[:3]}"
    )
    if output_mode == "exactly_once":
        twice = [w for w, values in got.items() if len(values) > 1]
        ledger.check(not twice, "wrong_tables", f"{len(twice)} final results emitted twice: {twice[:3]}")
    print(json.dumps({"kills": rounds, "windows": len(want), "records": len(events), "seed": seed}))
