"""SIGKILL of consumer-group members in turn, at random moments and in the middle of a rebalance,
for the two processors whose outputs depend on state handed from member to member: final window
results (a tumbling count, ``emit="final"``) and a windowed outer join, both exactly once
(issue #33). Apache Kafka 4.1 (the session's ``apache_kafka``): a classic group's eager
rebalances, static membership, transactions and ``read_committed``.

Two static members of one group (``rebalance_child.py``; a restart keeps the slot's
``group.instance.id`` and so its ``transactional.id``: it fences what the killed incarnation left
open at once — a dynamic member's would hold the partitions' next owner for
``transaction.timeout.ms``). Round by round one of them is SIGKILLed — at a random moment once
the group commits (the join: mid-catch-up), or inside its hand-over (the transaction commit and
checkpoint of the partitions leaving it, widened by the child) in the rebalance its peer's
restart set off — left dead until the group evicts it (the session timeout: the survivor gains
its partitions from their checkpoint plus the committed offsets, re-processing between them for
state only), then restarted (another rebalance). Then both run to the end — until the group's
committed offsets, read by a plain consumer, reach the end of every input partition — and close
cleanly. Judged against what never went through statesnap's group code:

- final results: every window the plain loop (:func:`faults.test_processor_kills.final_model`)
  closes by the end has exactly one result on the output topic (``read_committed``) with the
  loop's count, and no other window has one;
- the join: the output (``read_committed``) equals, record for record (key, value, timestamp),
  what one uninterrupted run of the same join sends.

The default variant kills the join's members twice (once at random, once inside a hand-over),
about 40 s; the ``long`` ones (``make test-long``, ``STATESNAP_LONG=1``) kill twice and six times
for final results, and six times for the join, over 100k records.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from faults.harness import KafkaTool, Location, cli_env, kill_group
from faults.join_child import build as build_join
from faults.processor_child import TUMBLING
from faults.rebalance_child import HAND_OVER_DELAY
from faults.test_join_kills import committed_records
from faults.test_join_kills import produce as produce_join_inputs
from faults.test_join_kills import results as join_results
from faults.test_processor_kills import PARTITIONS, TimedPayments, _read_events, final_model
from statesnap.devstack import ApacheKafkaBroker

CHILD = Path(__file__).with_name("rebalance_child.py")
TESTS = Path(__file__).parents[1]
#: Long enough after a SIGKILL for the group to evict the member (its 6 s session timeout) and
#: rebalance without it.
EVICTED = 7.5


@pytest.fixture(scope="module")
def kafka(apache_kafka: ApacheKafkaBroker) -> Iterator[KafkaTool]:
    """This module's broker is Apache Kafka (transactions, static membership)."""
    tool = KafkaTool(apache_kafka.bootstrap_servers)
    yield tool
    tool.close()


class Members:
    """Two static members (slots 0 and 1) of one group, each incarnation with a log of its own."""

    def __init__(
        self, kind: str, bootstrap: str, loc: Location, group: str, topics: Sequence[str], logs: Path
    ):
        self.args = [kind, bootstrap, loc.cli_url, group]
        self.topics = list(topics)
        self.env = cli_env(
            {
                **loc.cli_env,
                "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])),
            }
        )
        self.logs = logs
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.log_of: dict[int, Path] = {}
        self.incarnations = 0
        self.killed: set[int] = set()  # slots SIGKILLed and not restarted yet

    def spawn(self, slot: int) -> None:
        self.incarnations += 1
        self.killed.discard(slot)
        log = self.log_of[slot] = self.logs / f"member-{slot}-{self.incarnations}.log"
        with log.open("ab") as out:
            self.procs[slot] = subprocess.Popen(
                [sys.executable, str(CHILD), *self.args, f"member-{slot}", *self.topics],
                stdout=out, stderr=out, stdin=subprocess.DEVNULL, env=self.env, start_new_session=True,
            )  # fmt: skip

    def text(self, slot: int) -> str:
        return self.log_of[slot].read_text(errors="replace")

    def hand_overs(self, slot: int) -> int:
        """How many hand-overs this slot's current incarnation began (rebalances that took
        partitions from it)."""
        return len(re.findall(r"^handing over ", self.text(slot), re.MULTILINE))

    def hand_over_hit(self, slot: int) -> str:
        """Where in its last hand-over this slot's (killed) incarnation ended: before the
        transaction's commit, between the commit and the checkpoint, or after the hand-over (the
        revocation logged)."""
        text = self.text(slot)
        began = text.rfind("\nhanding over ")
        assert began >= 0, "no hand-over began"
        if re.search(r"group \S+: revoked", text[began:]):
            return "after a hand-over"
        if "\nhand-over committed" in text[began:]:
            return "inside a hand-over: committed, no checkpoint"
        return "inside a hand-over: before its commit"

    def check_alive(self) -> None:
        for slot, proc in self.procs.items():
            if slot in self.killed:
                continue
            assert proc.poll() is None, f"member {slot} exited {proc.returncode}: {self.text(slot)[-3000:]}"

    def wait_started(self, slot: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not re.search(r"^started ", self.text(slot), re.MULTILINE):
            self.check_alive()
            assert time.monotonic() < deadline, f"member {slot} did not start in {timeout:.0f} s"
            time.sleep(0.05)

    def kill(self, slot: int) -> None:
        proc = self.procs[slot]
        self.killed.add(slot)
        kill_group(proc)
        proc.wait(10)

    def close(self) -> None:
        """SIGTERM both (a clean close: a last commit point and checkpoint), then wait."""
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)
        for slot, proc in self.procs.items():
            assert proc.wait(60) == 0, self.text(slot)[-3000:]
            assert re.search(r"^closed$", self.text(slot), re.MULTILINE), self.text(slot)[-3000:]

    def kill_all(self) -> None:
        for proc in self.procs.values():
            kill_group(proc)
            proc.wait(10)

    def every_log(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.logs.glob("member-*.log")))


def committed_offsets(bootstrap: str, group: str, topics: Sequence[str]) -> dict[tuple[str, int], int] | None:
    """The group's committed offsets per (input, partition) (-1: none yet), read with
    ``read_committed`` (an open transaction's offsets are not committed); None while the
    coordinator calls them unstable."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        tps = consumer.committed(
            [TopicPartition(t, p) for t in topics for p in range(PARTITIONS)], timeout=10
        )
    except KafkaException:
        return None
    finally:
        consumer.close()
    return {(tp.topic, tp.partition): max(tp.offset, -1) for tp in tps}


def end_offsets(bootstrap: str, topics: Sequence[str]) -> dict[tuple[str, int], int]:
    """Per (input, partition), the offset after its last record: a plain consumer to EOF."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "test-truth",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    ends = {(t, p): 0 for t in topics for p in range(PARTITIONS)}
    try:
        consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t in topics for p in range(PARTITIONS)])
        at_eof: set[tuple[str, int]] = set()
        deadline = time.monotonic() + 60
        while at_eof != set(ends):
            assert time.monotonic() < deadline, "reading the inputs to their end timed out"
            for m in consumer.consume(1000, 0.1):
                topic, p, err = m.topic(), m.partition(), m.error()
                assert topic is not None
                assert p is not None
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        at_eof.add((topic, p))
                    continue
                offset = m.offset()
                assert offset is not None
                at_eof.discard((topic, p))
                ends[(topic, p)] = offset + 1
    finally:
        consumer.close()
    return ends


def kill_rounds(
    members: Members, rounds: int, rng: random.Random, progressed: Callable[[], bool]
) -> list[str]:
    """Start both members; *rounds* times one of them (in turn) is SIGKILLed, left dead until
    evicted, and restarted. Even rounds kill at a random moment once the group made progress
    (*progressed*); odd rounds kill the member that was the survivor within 40 ms of the start
    of its hand-over (its commit and checkpoint of the partitions leaving it) in the rebalance
    its peer's restart set off. Returns what each kill hit."""
    members.spawn(0)
    members.spawn(1)  # the first kill comes once the group commits: mid-catch-up, as a rule
    hits: list[str] = []
    baseline = 0  # the victim-to-be's hand-overs when its peer was restarted
    for round_no in range(rounds):
        victim = round_no % 2
        deadline = time.monotonic() + 60
        if round_no % 2 == 0:
            while not progressed():
                members.check_alive()
                assert time.monotonic() < deadline, f"round {round_no}: the group made no progress in 60 s"
                time.sleep(0.1)
            time.sleep(rng.uniform(0, 1.0))
            members.check_alive()
            members.kill(victim)
            hits.append("steady")
        else:
            while members.hand_overs(victim) <= baseline:
                members.check_alive()
                assert time.monotonic() < deadline, f"round {round_no}: member {victim} never handed over"
                time.sleep(0.002)
            time.sleep(rng.uniform(0, 1.5 * HAND_OVER_DELAY))  # inside the child's widened hand-over
            members.kill(victim)
            hits.append(members.hand_over_hit(victim))
            members.wait_started(1 - victim)  # its peer, alone once the group evicts it
        time.sleep(EVICTED)  # the group rebalances without it: its peer gains its partitions
        members.check_alive()
        baseline = members.hand_overs(1 - victim)
        members.spawn(victim)
        if round_no % 2 == 1 or round_no == rounds - 1:
            members.wait_started(victim)  # (else the next round kills its peer while it starts)
    return hits


def run_to_the_end(members: Members, bootstrap: str, group: str, ends: dict[tuple[str, int], int]) -> None:
    """Until the group's committed offsets reach *ends* on every input partition, then close."""
    deadline = time.monotonic() + 90
    while committed_offsets(bootstrap, group, members.topics[:-1]) != ends:
        members.check_alive()
        assert time.monotonic() < deadline, (
            f"the group's committed offsets {committed_offsets(bootstrap, group, members.topics[:-1])} "
            f"did not reach the inputs' ends {ends} in 90 s"
        )
        time.sleep(0.2)
    members.close()


def restored_and_rebalanced(members: Members) -> tuple[int, int]:
    """(restarts that restored a checkpoint, assignments logged): the kills moved state."""
    text = members.every_log()
    restored = len(re.findall(r"^started \d+$", text, re.MULTILINE))
    assigned = len(re.findall(r"group \S+: assigned", text))
    assert restored > 0, "no restarted member restored a checkpoint"
    assert assigned >= 4, f"only {assigned} assignments: the kills set off too few rebalances"
    return restored, assigned


# Long only: final results under SIGKILL are proven by default by test_processor_kills.py's
# test_sigkill_never_loses_a_final_window_result (exactly once), and state handed from member to
# member under kills and rebalances (the hand-over's commit and checkpoint, the same group code) by
# test_join_results_survive_kills_across_rebalances below; this pair of them costs ~30 s.
@pytest.mark.long
@pytest.mark.parametrize("rounds", [2, 6])
def test_final_window_results_survive_kills_across_rebalances(
    rounds: int, kafka: KafkaTool, new_topic: Any, new_location: Any, tmp_path: Path
) -> None:
    """Apache Kafka. A tumbling count emitting final results, exactly once, in a group of two
    static members killed in turn (at random, and mid-hand-over) while out-of-order and late
    records keep arriving: every window closed by the end has exactly one final result with the
    plain loop's count, and no other window has one."""
    topic, output = new_topic(PARTITIONS, "rfinal"), new_topic(PARTITIONS, "rfinal-out")
    loc: Location = new_location("file")
    group = f"rfinal-{uuid.uuid4().hex[:8]}"
    seed = int(uuid.uuid4().hex[:8], 16)
    rng = random.Random(seed)
    producer = TimedPayments(kafka, topic, seed, by_key=True)
    producer.send(2000)
    producer.start()
    members = Members("final", kafka.bootstrap, loc, group, [topic, output], tmp_path)
    last = [0]

    def progressed() -> bool:
        offsets = committed_offsets(kafka.bootstrap, group, [topic])
        done = 0 if offsets is None else sum(max(o, 0) for o in offsets.values())
        moved, last[0] = done > last[0], max(last[0], done)
        return moved

    started = time.monotonic()
    try:
        try:
            hits = kill_rounds(members, rounds, rng, progressed)
        finally:
            produced = producer.finish()
        events = _read_events(kafka.bootstrap, topic)
        assert len(events) == produced, f"the input holds {len(events)} of {produced}"
        run_to_the_end(members, kafka.bootstrap, group, end_offsets(kafka.bootstrap, [topic]))
    finally:
        members.kill_all()
    restored, assigned = restored_and_rebalanced(members)
    assert any(hit.startswith("inside a hand-over") for hit in hits), hits
    want = final_model(events)
    assert want, "no window closed"
    got: dict[tuple[bytes, int], list[int]] = {}
    for key, value, _ts in committed_records(kafka.bootstrap, output):
        assert key is not None
        result = json.loads(value)
        assert result["end"] - result["start"] == TUMBLING.size_ms, result
        got.setdefault((key, result["start"]), []).append(result["value"])
    lost = [w for w in want if w not in got]
    assert not lost, f"{len(lost)} of {len(want)} final results lost (seed {seed}), e.g. {lost[:3]}"
    wrong = {w: values for w, values in got.items() if set(values) != {want.get(w)}}
    assert not wrong, (
        f"{len(wrong)} windows with a wrong or foreign result (seed {seed}): {list(wrong.items())[:3]}"
    )
    twice = {w: values for w, values in got.items() if len(values) > 1}
    assert not twice, (
        f"{len(twice)} final results emitted more than once (seed {seed}): {list(twice.items())[:3]}"
    )
    print(json.dumps({
        "kills": hits, "restored": restored, "assignments": assigned, "windows": len(want),
        "records": len(events), "seconds": round(time.monotonic() - started, 1), "seed": seed,
    }))  # fmt: skip


@pytest.mark.parametrize(
    ("rounds", "records"), [(2, 30_000), pytest.param(6, 100_000, marks=pytest.mark.long)]
)
def test_join_results_survive_kills_across_rebalances(
    rounds: int, records: int, kafka: KafkaTool, new_topic: Any, new_location: Any, tmp_path: Path
) -> None:
    """Apache Kafka. The exactly-once outer join of ``join_child.py`` in a group of two static
    members killed in turn (at random, and mid-hand-over) while they work through their inputs:
    the output (``read_committed``) equals one uninterrupted run's, record for record."""
    left, right = new_topic(PARTITIONS, "rjl"), new_topic(PARTITIONS, "rjr")
    output, reference = new_topic(PARTITIONS, "rjout"), new_topic(PARTITIONS, "rjref")
    seed = int(uuid.uuid4().hex[:8], 16)
    produce_join_inputs(kafka, left, right, records, seed)
    build_join(kafka.bootstrap, left, right, reference, None, exactly_once=False).run(follow=False)
    want = join_results(kafka.bootstrap, reference)
    assert want, "the join sent nothing"

    loc: Location = new_location("file")
    group = f"rjoin-{uuid.uuid4().hex[:8]}"
    members = Members("join", kafka.bootstrap, loc, group, [left, right, output], tmp_path)
    ends = end_offsets(kafka.bootstrap, [left, right])
    last = [0]
    at_first_kill: list[int] = []

    def progressed() -> bool:
        offsets = committed_offsets(kafka.bootstrap, group, [left, right])
        if offsets == ends:
            return True  # caught up: a kill now tests a hand-over of finished partitions
        done = 0 if offsets is None else sum(max(o, 0) for o in offsets.values())
        moved, last[0] = done > last[0], max(last[0], done)
        if moved and not at_first_kill:
            at_first_kill.append(done)
        return moved

    started = time.monotonic()
    try:
        hits = kill_rounds(members, rounds, random.Random(seed), progressed)
        run_to_the_end(members, kafka.bootstrap, group, ends)
    finally:
        members.kill_all()
    restored, assigned = restored_and_rebalanced(members)
    assert any(hit.startswith("inside a hand-over") for hit in hits), hits
    got = join_results(kafka.bootstrap, output)
    lost, twice = want - got, got - want
    assert at_first_kill, "no progress was seen before the first kill"
    assert at_first_kill[0] < sum(ends.values()), "the first kill came after the catch-up"
    assert not lost, (
        f"{lost.total()} of {want.total()} join results lost (seed {seed}), e.g. {list(lost)[:3]}"
    )
    assert not twice, (
        f"{twice.total()} join results sent twice or foreign (seed {seed}), e.g. {list(twice)[:3]}"
    )
    print(json.dumps({
        "kills": hits, "restored": restored, "assignments": assigned, "results": want.total(),
        "committed_at_first_kill": at_first_kill[0], "inputs": sum(ends.values()),
        "seconds": round(time.monotonic() - started, 1), "seed": seed,
    }))  # fmt: skip
