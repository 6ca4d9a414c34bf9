"""``Processor(exactly_once=True)`` on Apache Kafka: a processor SIGKILLed between a transaction's
commit and the checkpoint, or in the middle of a transaction, then restarted, leaves an output
topic whose ``read_committed`` view is exactly one record per input record (no duplicate, no
loss) and a state equal to a plain-consumer recomputation.

Every broker-dependent case here ran on Apache Kafka 4.1 (the session's ``apache_kafka``): Tansu
shows aborted records to ``read_committed`` readers, so it cannot prove this. The processor runs
in a child process (the test module's :func:`child`) that kills itself with SIGKILL at the exact
point under test, while the test keeps producing input; the restart runs in the test process.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka import KafkaError as RdKafkaError

from integration.conftest import KafkaTool, frames_of
from statesnap import CheckpointOptions, ProcessingOptions, Processor, ProcessorContext, Record
from statesnap.errors import HandlerError, OutputError
from statesnap.kafka.config import KafkaSettings
from statesnap.processor import transactions
from statesnap.processor.outputs import Outputs
from statesnap.processor.stores import StoreReader
from statesnap.processor.transactions import TransactionalOutputs, offsets_group_of
from statesnap.serde import resolve_serde
from statesnap.stores import open_state_store
from statesnap.task.engine import Task

pytestmark = pytest.mark.integration

PARTITIONS = 2
ACCOUNTS = 17
TESTS_DIR = Path(__file__).resolve().parents[2]

#: One output record as the test compares it: (input partition, input offset, running total).
Out = tuple[int, int, int]


# --- the processor, in the child and in the test ---------------------------------------------


def tally(cfg: dict[str, Any]) -> Processor:
    """The running tally of the issue, emitting (input partition, input offset, total) per record."""
    proc = Processor(
        cfg["name"],
        inputs=[cfg["topic"]],
        bootstrap_servers=cfg["bootstrap"],
        checkpoints=CheckpointOptions(
            cfg["url"],
            storage_options=cfg.get("storage_options"),
            interval=cfg.get("interval", "1h"),
            commit_interval=cfg["commit_interval"],
        ),
        stores=["balances"],
        value_serde="json",
        **({"group": cfg["group"]} if cfg.get("group") else {"partitions": range(PARTITIONS)}),
        kafka_config=cfg.get("kafka_config"),
        processing=ProcessingOptions(exactly_once=True, dead_letter_topic=cfg.get("dlq")),
    )
    fail_at = cfg.get("fail_at")
    refuses = cfg.get("dlq") is not None

    @proc.handler
    def on_payment(record: Record, ctx: ProcessorContext) -> None:
        if fail_at is not None and record.value["amount"] == fail_at:
            raise ValueError(f"cannot handle amount {fail_at}")
        if refuses and refused(record.value["amount"]):
            raise ValueError("refused")  # to the dead-letter topic, in the transaction
        balances = ctx.stores["balances"]
        total = balances.get(record.key, 0) + record.value["amount"]
        balances[record.key] = total
        ctx.emit(cfg["out"], record.key, {"p": record.partition, "o": record.offset, "total": total})

    return proc


def child(arg: str) -> None:
    """The processor as a service: start, checkpoint, say so, keep processing — and SIGKILL itself
    at ``cfg["kill"]``: ``after_commit`` (a transaction committed through ``at`` input records, no
    checkpoint yet claims them), ``mid`` (record ``at`` is being handled, the open transaction's
    earlier records flushed to the broker) or ``after_hand_over`` (a consumer group revoked its
    partitions and it handed them over: the next owner restores that checkpoint). ``txn_timeout``
    (ms) shortens the broker's wait before it aborts what the dead child left open."""
    cfg = json.loads(arg)
    if cfg.get("txn_timeout"):
        transactions.TRANSACTION_TIMEOUT_MS = cfg["txn_timeout"]
    proc = tally(cfg)
    kill, at = cfg["kill"], cfg["at"]
    checkpointed = False

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    hand_over = Task.hand_over

    def hand_over_then_die(self: Task, partitions: tuple[int, ...]) -> None:
        hand_over(self, partitions)
        if kill == "after_hand_over" and checkpointed:
            die()

    Task.hand_over = hand_over_then_die  # type: ignore[method-assign]

    original = TransactionalOutputs.commit

    def commit(self: TransactionalOutputs, positions: Any, timeout: float, others: Any = None) -> None:
        original(self, positions, timeout, others)
        if kill == "after_commit" and checkpointed and sum(self._committed.values()) >= at:
            die()

    TransactionalOutputs.commit = commit  # type: ignore[method-assign]
    seen = 0

    @proc.handler
    def watch(record: Record, ctx: ProcessorContext) -> None:
        nonlocal seen
        seen += 1
        outputs = proc._outputs
        if (
            kill == "mid"
            and checkpointed
            and seen >= at
            and isinstance(outputs, TransactionalOutputs)
            and outputs._in_transaction
            and outputs.producer.flush(10) == 0  # the open transaction's records are on the broker
        ):
            die()

    report = proc.start()
    proc.checkpoint()  # None when nothing changed since the newest one (restored, or taken at a
    checkpointed = True  # commit point meanwhile: interval="0s")
    newest = proc.last_checkpoint
    print("started", newest.generation if newest is not None else report.checkpoint, flush=True)
    while True:
        time.sleep(0.5)


def start_child(cfg: dict[str, Any], log: Path) -> subprocess.Popen[str]:
    code = (
        f"import sys; sys.path.insert(0, {str(TESTS_DIR)!r}); "
        "from integration.apache.test_processor_exactly_once import child; child(sys.argv[1])"
    )
    with log.open("w") as err:
        return subprocess.Popen(
            [sys.executable, "-c", code, json.dumps(cfg)], stdout=subprocess.PIPE, stderr=err, text=True
        )


def wait_started(proc: subprocess.Popen[str], log: Path) -> int:
    """The generation of the checkpoint the child took (or restored) once caught up."""
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the child prints it within its start-up (or dies)
    assert line.startswith("started"), (line, log.read_text()[-4000:])
    return int(line.split()[1])


def wait_killed(proc: subprocess.Popen[str], log: Path, timeout: float = 60) -> None:
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        raise AssertionError(
            f"the child never reached its kill point; log:\n{log.read_text()[-4000:]}"
        ) from None
    finally:
        if proc.stdout is not None:
            proc.stdout.close()
    assert rc == -signal.SIGKILL, (rc, log.read_text()[-4000:])


# --- input, ground truth and the output topic ------------------------------------------------


def payments(kafka: KafkaTool, topic: str, start: int, n: int) -> None:
    """Amounts start..start+n-1; account i % 17, each account in one partition."""
    kafka.produce(
        topic,
        (
            (i % ACCOUNTS % PARTITIONS, f"acct-{i % ACCOUNTS}".encode(), json.dumps({"amount": i}).encode())
            for i in range(start, start + n)
        ),
    )


def produce_slowly(
    kafka: KafkaTool, topic: str, start: int, n: int, batch: int = 40, pause: float = 0.4
) -> None:
    """Input arriving while the processor runs: batches between its commit points."""
    for first in range(start, start + n, batch):
        payments(kafka, topic, first, min(batch, start + n - first))
        time.sleep(pause)


def refused(amount: int) -> bool:
    """The records a processor with a dead-letter topic refuses."""
    return amount % 50 == 7


def recompute(
    kafka: KafkaTool, topic: str, refusing: bool = False
) -> tuple[dict[bytes, int], list[Out], list[int]]:
    """Ground truth from a plain consumer loop, not statesnap: the balances, the one output record
    each input record must have produced and the amounts of the records refused (*refusing*)."""
    balances: dict[bytes, int] = {}
    outputs: list[Out] = []
    dead: list[int] = []
    for r in kafka.read_all(topic, range(PARTITIONS)):
        assert r.key is not None
        assert r.value is not None
        amount = json.loads(r.value)["amount"]
        if refusing and refused(amount):
            dead.append(amount)
            continue
        balances[r.key] = balances.get(r.key, 0) + amount
        outputs.append((r.partition, r.offset, balances[r.key]))
    return balances, outputs, dead


def read_outputs(bootstrap: str, topic: str, isolation: str, timeout: float = 30) -> list[Out]:
    """The output topic as a plain consumer with *isolation* sees it."""
    return [(v["p"], v["o"], v["total"]) for v in read_values(bootstrap, topic, isolation, timeout)]


def read_values(bootstrap: str, topic: str, isolation: str, timeout: float = 30) -> list[Any]:
    """A topic's JSON values as a plain consumer with *isolation* sees them, to each partition's end."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-eos-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 10,
            "isolation.level": isolation,
        }
    )
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        eof: set[int] = set()
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        while eof != set(range(PARTITIONS)):
            assert time.monotonic() < deadline, f"reading {topic} timed out"
            for m in c.consume(1000, 0.1):
                err, partition = m.error(), m.partition()
                if err is not None:
                    if err.code() == RdKafkaError._PARTITION_EOF and partition is not None:
                        eof.add(partition)
                    continue
                value = m.value()
                assert value is not None
                out.append(json.loads(value))
        return out
    finally:
        c.close()


def wait_processed(
    kafka: KafkaTool, cfg: dict[str, Any], proc: Processor, timeout: float = 20.0
) -> dict[int, int]:
    """Wait until *proc* has processed the input to its ends now; returns them."""
    ends = KafkaTool.end_offsets(kafka.read_all(cfg["topic"], range(PARTITIONS)), range(PARTITIONS))
    KafkaTool.wait_for(
        lambda: all(proc.task.offsets.get(p, 0) >= e for p, e in ends.items()),
        timeout=timeout,
        what=f"processor {cfg['name']} to process every record",
    )
    return ends


def setup(kafka: KafkaTool, tmp_path: Path, **extra: Any) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:10]
    return {
        "name": f"eos-{tag}",
        "topic": kafka.create_topic(f"eos-in-{tag}", PARTITIONS),
        "out": kafka.create_topic(f"eos-out-{tag}", PARTITIONS),
        "dlq": kafka.create_topic(f"eos-dlq-{tag}", PARTITIONS),
        "bootstrap": kafka.bootstrap,
        "url": (tmp_path / "cp").as_uri(),
        "commit_interval": "100ms",
        **extra,
    }


def restart_and_check(kafka: KafkaTool, cfg: dict[str, Any], checkpoint: int | None) -> int:
    """Restart in this process: restored from *checkpoint* (None: any); the state equals the recomputation and
    the committed outputs are exactly the expected records. Returns the records re-processed
    with emission suppressed."""
    proc = tally({**cfg, "fail_at": None})
    report = proc.start()
    try:
        assert report.checkpoint == checkpoint if checkpoint is not None else report.checkpoint is not None
        balances, expected, dead = recompute(kafka, cfg["topic"], refusing=cfg.get("dlq") is not None)
        assert dict(proc.store("balances").items()) == balances
        assert proc._outputs is not None
        suppressed = proc._outputs.state_only_records
    finally:
        proc.close()
    got = read_outputs(kafka.bootstrap, cfg["out"], "read_committed")
    duplicates = [o for o, n in Counter(got).items() if n > 1]
    missing = sorted(set(expected) - set(got))
    assert not duplicates, f"{len(duplicates)} outputs duplicated: {duplicates[:5]}"
    assert not missing, f"{len(missing)} outputs lost: {missing[:5]}"
    assert sorted(got) == sorted(expected)
    if cfg.get("dlq") is not None:  # the dead-letter copies were in the transactions too
        assert sorted(
            v["amount"] for v in read_values(kafka.bootstrap, cfg["dlq"], "read_committed")
        ) == sorted(dead)
    return int(suppressed)


# --- the kill tests ----------------------------------------------------------------------------


def share_of(share: str) -> dict[str, Any]:
    """How the test's processor gets its partitions: all of them, a consumer group's, or a static
    group member's (``group.instance.id``: the same member after a restart)."""
    tag = uuid.uuid4().hex[:6]
    if share == "group":
        return {"group": f"eos-group-{tag}"}
    if share == "static-group":
        return {"group": f"eos-group-{tag}", "kafka_config": {"group.instance.id": "member-1"}}
    return {}


@pytest.mark.parametrize("share", ["partitions", "group"])
def test_killed_between_a_transaction_commit_and_the_checkpoint(
    kafka: KafkaTool, tmp_path: Path, share: str
) -> None:
    """Apache Kafka proved it: the child commits transactions past its checkpoint C (up to K) and is
    SIGKILLed right after one commits; restarted, it restores C, re-processes [C, K) without
    emitting and emits from K: read_committed outputs are exactly one per input record. In a
    consumer group the restart is a new member that gains the partitions once the dead one's
    session expired, and reads K as it gains them (KIP-447: the member's own group)."""
    cfg = setup(kafka, tmp_path, kill="after_commit", at=300, **share_of(share))
    payments(kafka, cfg["topic"], 0, 200)
    log = tmp_path / "child.log"
    child_proc = start_child(cfg, log)
    checkpoint = wait_started(child_proc, log)
    produce_slowly(kafka, cfg["topic"], 200, 160)  # the child dies once 300 are committed
    wait_killed(child_proc, log)
    payments(kafka, cfg["topic"], 360, 60)
    suppressed = restart_and_check(kafka, cfg, checkpoint)
    assert suppressed >= 100, f"only {suppressed} records were re-processed silently (K - C >= 100)"


@pytest.mark.parametrize("share", ["partitions", "static-group"])
def test_killed_mid_transaction(kafka: KafkaTool, tmp_path: Path, share: str) -> None:
    """Apache Kafka proved it: the child is SIGKILLed with a transaction open whose records are on
    the broker (read_uncommitted sees them twice after the restart); the restart fences the dead
    producer (its transaction aborts) and read_committed outputs are exactly one per input record.
    A static group member (``group.instance.id``) keeps its transactional.id, so its restart
    fences the dead one at once too (a dynamic member's is per incarnation: the broker aborts
    the dead one's transaction after ``transaction.timeout.ms``)."""
    cfg = setup(kafka, tmp_path, kill="mid", at=330, commit_interval="300ms", **share_of(share))
    payments(kafka, cfg["topic"], 0, 200)
    log = tmp_path / "child.log"
    child_proc = start_child(cfg, log)
    checkpoint = wait_started(child_proc, log)
    produce_slowly(kafka, cfg["topic"], 200, 160)
    wait_killed(child_proc, log)
    payments(kafka, cfg["topic"], 360, 60)
    suppressed = restart_and_check(kafka, cfg, checkpoint)
    assert suppressed > 0, "the committed transactions past the checkpoint were not re-processed silently"
    uncommitted = read_outputs(kafka.bootstrap, cfg["out"], "read_uncommitted")
    assert len(uncommitted) > len(set(uncommitted)), "the killed transaction left no records on the broker"


def test_a_member_killed_right_after_handing_over_loses_no_output(kafka: KafkaTool, tmp_path: Path) -> None:
    """Apache Kafka proved it: a group member with outputs in its open transaction is revoked
    (another member joins), hands its partitions over and is SIGKILLed at once. The hand-over
    committed its transaction before its checkpoint (C <= K), so the next owner, which restores
    that checkpoint and emits from K, loses nothing and repeats nothing: read_committed outputs
    are exactly one per input record. (A hand-over that only checkpointed left K below C: the
    outputs between were in the transaction the kill aborted, and were lost.)"""
    cfg = setup(
        kafka,
        tmp_path,
        kill="after_hand_over",
        at=0,
        commit_interval="1h",
        txn_timeout=5000,
        **share_of("group"),
    )
    payments(kafka, cfg["topic"], 0, 200)
    log = tmp_path / "child.log"
    child_proc = start_child(cfg, log)
    wait_started(child_proc, log)
    payments(kafka, cfg["topic"], 200, 100)  # outputs in the child's open transaction
    time.sleep(1.5)
    successor = tally({**cfg, "commit_interval": "100ms"})
    successor.start()  # the child hands over, dies; its session expires; the successor owns all
    try:
        wait_killed(child_proc, log)
        KafkaTool.wait_for(
            lambda: len(successor.task.partitions) == PARTITIONS, timeout=60, what="the successor to own both"
        )
        payments(kafka, cfg["topic"], 300, 50)
        wait_processed(kafka, cfg, successor, timeout=60)
    finally:
        successor.close()
    restart_and_check(kafka, cfg, None)


@pytest.mark.long
def test_killed_at_random_moments_with_a_producer_running(
    kafka: KafkaTool, tmp_path: Path, checkpoint_location: Any
) -> None:
    """Apache Kafka proved it, on file:// and on S3 (moto): five SIGKILLs at random moments — a
    checkpoint at every commit point, so kills land mid-transaction, between a transaction's commit
    and its checkpoint and during checkpoint writes — while input keeps arriving; after the last
    restart the committed outputs are exactly one per input record and the state equals the
    recomputation."""
    cfg = setup(kafka, tmp_path, kill="none", at=0, interval="0s")
    cfg.update(url=checkpoint_location.url, storage_options=checkpoint_location.options)
    rng = random.Random(18)
    produced = 0
    for round_no in range(5):
        log = tmp_path / f"child-{round_no}.log"
        child_proc = start_child(cfg, log)
        wait_started(child_proc, log)
        kill_at = time.monotonic() + rng.uniform(0.3, 2.0)
        while time.monotonic() < kill_at:
            payments(kafka, cfg["topic"], produced, 25)
            produced += 25
            time.sleep(0.05)
        child_proc.send_signal(signal.SIGKILL)
        wait_killed(child_proc, log)
    restart_and_check(kafka, cfg, None)


@pytest.mark.long  # suite budget; the kill tests prove aborted transactions stay invisible
def test_a_failing_handler_aborts_the_open_transaction(kafka: KafkaTool, tmp_path: Path) -> None:
    """Apache Kafka proved it: a handler raising mid-transaction stops the processor
    (HandlerError) and aborts what it had emitted since the last commit; the restart with a
    fixed handler ends with exactly one committed output per input record."""
    cfg = setup(kafka, tmp_path, commit_interval="1h", dlq=None)  # the failure stops it
    payments(kafka, cfg["topic"], 0, 100)
    first = tally(cfg)
    first.run(follow=False)  # a checkpoint at 100, its outputs committed
    assert first.last_checkpoint is not None
    payments(kafka, cfg["topic"], 100, 50)
    failing = tally({**cfg, "fail_at": 140})
    with pytest.raises(HandlerError, match="cannot handle amount 140"):
        failing.run(follow=False)
    assert len(read_outputs(kafka.bootstrap, cfg["out"], "read_committed")) == 100
    restart_and_check(kafka, cfg, first.last_checkpoint.generation)


def test_a_restarted_instance_fences_its_zombie(kafka: KafkaTool, tmp_path: Path) -> None:
    """Apache Kafka proved it: a second instance of the same task (same transactional.id) started
    while the first still runs fences it — the first stops with OutputError at its next commit (or
    a produce before it), its open transaction aborted — and the committed outputs are exactly one
    per input record."""
    cfg = setup(kafka, tmp_path)
    payments(kafka, cfg["topic"], 0, 50)
    zombie = tally(cfg)
    zombie.start()
    successor = tally(cfg)
    successor.start()
    try:
        payments(kafka, cfg["topic"], 50, 50)
        KafkaTool.wait_for(lambda: zombie.task.failure is not None, what="the zombie to stop")
        error = zombie.task.failure
        assert isinstance(error, OutputError), error
        assert "fenced" in str(error), error
        zombie.close()
        # The failure outlives close() (held here, and as the task's error): its frames no longer
        # hold the fenced producer, which otherwise kept reconnecting once its broker was gone.
        # The traceback still prints.
        held = [v for frame in frames_of(error) for v in frame.f_locals.values() if isinstance(v, Producer)]
        assert held == []
        # Where the fence surfaces is librdkafka's timing: the next commit, or a produce before it.
        assert "".join(traceback.format_exception(error)).count('File "') >= 2
        wait_processed(kafka, cfg, successor)
    finally:
        zombie.close()
        successor.close()
    assert successor.last_checkpoint is not None
    restart_and_check(kafka, cfg, successor.last_checkpoint.generation)


def test_consumer_group_members_hand_partitions_over_exactly_once(kafka: KafkaTool, tmp_path: Path) -> None:
    """Apache Kafka proved it (classic protocol, eager round-robin; KIP-447 offsets with the
    member's group metadata): while input keeps arriving, a second member joins (the first
    commits its transaction, then checkpoints, for the partition it hands over) and then the first
    leaves. Every running total emitted is right (the state moved whole with its partition) and
    the committed outputs are exactly one per input record; the group's committed offsets are
    the transactions' (no informational commit moved them past committed outputs)."""
    cfg = setup(kafka, tmp_path, **share_of("group"))
    payments(kafka, cfg["topic"], 0, 60)
    first, second = tally(cfg), tally(cfg)
    first.start()
    producer = threading.Thread(target=produce_slowly, args=(kafka, cfg["topic"], 60, 240, 30, 0.2))
    producer.start()
    try:
        second.start()
        KafkaTool.wait_for(
            lambda: len(first.task.partitions) == len(second.task.partitions) == 1,
            timeout=60,
            what="the members to share the partitions",
        )
        time.sleep(1.0)  # both process input for a while
        first.close()
        KafkaTool.wait_for(
            lambda: len(second.task.partitions) == PARTITIONS, timeout=60, what="the survivor to own both"
        )
        producer.join(60)
        ends = wait_processed(kafka, cfg, second, timeout=60)
    finally:
        producer.join(60)
        first.close()
        second.close()
    group = cfg["group"]
    committed = kafka.admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result()
    assert {tp.partition: tp.offset for tp in committed.topic_partitions} == ends
    restart_and_check(kafka, cfg, None)


@pytest.mark.long  # suite budget: a log message
def test_committed_offsets_behind_the_checkpoint_are_reported(
    kafka: KafkaTool, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Apache Kafka proved it: with the processor's group deleted (offsets expired or reset), the
    restore cannot know which outputs committed past its checkpoint and says so (at INFO: a
    checkpoint an at-least-once run or Spark wrote looks the same)."""
    cfg = setup(kafka, tmp_path)
    payments(kafka, cfg["topic"], 0, 40)
    first = tally(cfg)
    first.run(follow=False)
    kafka.admin.delete_consumer_groups([offsets_group_of(cfg["name"])])[offsets_group_of(cfg["name"])].result(
        15
    )
    again = tally(cfg)
    with caplog.at_level(logging.INFO, logger="statesnap.processor.task"):
        again.run(follow=False)
    assert "committed output offsets are behind checkpoint" in caplog.text


# --- the suppression window, unit level ----------------------------------------------------------


class _Message:
    """What the handler reads of a Kafka message."""

    def __init__(self, partition: int, offset: int, key: bytes, value: bytes) -> None:
        self._p, self._o, self._k, self._v = partition, offset, key, value

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def key(self) -> bytes:
        return self._k

    def value(self) -> bytes:
        return self._v

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_000 + self._o)

    def headers(self) -> None:
        return None


class _Producer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None]] = []

    def produce(self, topic: str, value: bytes | None, key: bytes | None, **_: Any) -> None:
        self.sent.append((topic, value))

    def flush(self, timeout: float) -> int:
        return 0

    def list_topics(self, topic: str, timeout: float) -> Any:
        """A cluster that has every topic asked for (outputs refuse one it does not)."""
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None)})


def test_records_below_the_committed_offsets_change_state_and_emit_nothing() -> None:
    """No broker: the handler re-processes a partition's records below its committed offset K
    (``replay_until``) for their state only — no output, no dead-letter copy — and emits from K
    on; another partition's window is its own. (The kill tests prove it end to end on Apache Kafka.)"""
    proc = Processor(
        "unit",
        inputs=["in"],
        bootstrap_servers="127.0.0.1:1",
        stores=["balances"],
        value_serde="json",
        processing=ProcessingOptions(dead_letter_topic="dlq"),
    )

    @proc.handler
    def on_payment(record: Record, ctx: ProcessorContext) -> None:
        if record.value["amount"] < 0:
            raise ValueError("negative")
        balances = ctx.stores["balances"]
        balances[record.key] = balances.get(record.key, 0) + record.value["amount"]
        ctx.emit("out", record.key, record.offset)

    json_serde = resolve_serde("json")
    outputs = Outputs(KafkaSettings("127.0.0.1:1"), resolve_serde(None), json_serde)
    producer = _Producer()
    outputs._producer = producer
    outputs.replay_until = {0: 3}
    store = open_state_store("memory")
    handler = proc.handler_for(store, outputs)
    amounts = [5, -1, 7, 11, -2, 13]
    handler.apply(
        0, [_Message(0, o, b"a", json.dumps({"amount": a}).encode()) for o, a in enumerate(amounts)], None
    )
    handler.apply(1, [_Message(1, o, b"b", json.dumps({"amount": 1}).encode()) for o in range(2)], None)
    assert [
        (t, json_serde.deserialize(v) if t == "out" and v is not None else None) for t, v in producer.sent
    ] == [
        ("out", 3),
        ("dlq", None),
        ("out", 5),
        ("out", 0),
        ("out", 1),
    ]
    assert outputs.state_only_records == 3
    balances = StoreReader(proc.stores["balances"], resolve_serde(None), json_serde, store, (0, 1))
    assert dict(balances.items()) == {b"a": 36, b"b": 2}
