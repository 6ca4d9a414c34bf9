"""Infrastructure faults: the S3 endpoint killed and restarted during writes, the broker killed
during a restore and during checkpoints. Every blocking wait must end in a typed one-line error
within a deadline (a hang is a finding); once the service is back, the table restored equals the
independent read.

These tests start brokers and S3 endpoints of their own and kill those, never the session's.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from faults.harness import (
    STATESNAP,
    CliResult,
    KafkaTool,
    Location,
    Producing,
    assert_one_line_error,
    check_secrets,
    checkpoint_contents,
    cli_env,
    dump_stacks,
    judge,
    kill_group,
    materialize_args,
    repo_of,
    restore,
    run_cli,
    s3_location,
    start_cli,
    table_digest_of,
    truth_at,
)
from faults.ledger import CaseLedger
from faults.proxy import TcpProxy
from faults.test_kills import _newest
from statesnap.checkpoint import layout
from statesnap.devstack import EmbeddedBroker, EmbeddedS3
from statesnap.devstack.process import LoopbackService, free_port

PARTITIONS = 2
#: statesnap's Kafka deadline in the CLI is 15 s; S3 calls retry a few times. Past this: a hang.
DEADLINE = 45.0


def _sigkill(service: LoopbackService) -> None:
    """SIGKILL, no goodbye to the clients; the object can be started again on the same port."""
    proc = service._proc
    assert proc is not None
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    service._proc = None


def _follow(bootstrap: str, topic: str, loc: Location, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    args = materialize_args(
        bootstrap, topic, loc, "--follow", "--checkpoint-interval", "0s", "--commit-interval", "50ms",
        "--min-count", "5", "--min-age", "0s", *extra,
    )  # fmt: skip
    return start_cli(args, loc, log)


def _ctrl_c(
    ledger: CaseLedger, proc: subprocess.Popen[bytes], log: Path, what: str, limit: float = DEADLINE
) -> int:
    """Stop a writer as an operator would; it must exit in time with 0 or a one-line error."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(limit)
        except subprocess.TimeoutExpired:
            dump_stacks(proc)
            kill_group(proc)
            proc.wait(10)
            ledger.fail(
                "hangs", f"{what} still running {limit:.0f}s after Ctrl-C:\n{log.read_text()[-1500:]}"
            )
    text = log.read_text(errors="replace")
    check_secrets(ledger, text, what)
    if proc.returncode not in (0, 130, -signal.SIGINT):
        errors = [line for line in text.splitlines() if line.startswith(("Error:", "Aborted!"))]
        assert errors, f"{what} exited {proc.returncode} without a one-line error:\n{text[-3000:]}"
        assert "Traceback" not in text, text[-3000:]
    return proc.returncode


def _wait_for_checkpoint(
    loc: Location,
    proc: subprocess.Popen[bytes],
    log: Path,
    ledger: CaseLedger,
    after: int = 0,
    limit: float = 40,
) -> int:
    deadline = time.monotonic() + limit
    while (newest := _newest(loc)) <= after:
        assert proc.poll() is None, log.read_text()[-3000:]
        if time.monotonic() > deadline:
            dump_stacks(proc)  # where it is stuck goes to its log
            ledger.fail(
                "hangs", f"no checkpoint after {after} within {limit:.0f}s:\n{log.read_text()[-6000:]}"
            )
        time.sleep(0.05)
    return newest


def _wait_until_following(proc: subprocess.Popen[bytes], log: Path, limit: float = 60) -> None:
    """Until the writer has caught up and follows (its Ctrl-C is then a clean stop: before, a
    Ctrl-C ends the command like any other)."""
    deadline = time.monotonic() + limit
    while " restored: checkpoint=" not in log.read_text(errors="replace"):  # Table._started's INFO
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"not following within {limit:.0f}s:\n{log.read_text()[-3000:]}"
        time.sleep(0.05)


@pytest.fixture
def own_s3() -> Iterator[EmbeddedS3]:
    s3 = EmbeddedS3(free_port())
    s3.start()
    yield s3
    s3.stop()


def _snapshot_in_progress(loc: Location) -> bool:
    """A generation has a snapshot record but no manifest yet: a checkpoint is being written."""
    records: set[int] = set()
    manifests: set[int] = set()
    for key in loc.list_keys():
        rest = key.partition("/")[2]
        if (gen := layout.record_generation(rest)) is not None:
            records.add(gen)
        if (gen := layout.manifest_generation(rest)) is not None:
            manifests.add(gen)
    return bool(records - manifests)


def test_s3_endpoint_down_and_back_during_writes(
    s3_server: EmbeddedS3, kafka: KafkaTool, ledger: CaseLedger, tmp_path: Path
) -> None:
    """The S3 endpoint dies in the middle of a checkpoint (connections reset, new ones refused)
    and comes back with its data a few seconds later. Commands during the outage fail in time
    with a typed one-line error; the writer resumes checkpointing on its own within 30 s of the
    endpoint's return (its log says it "will retry at the next commit point") and stops in time
    on Ctrl-C; nothing committed is damaged; the restored table equals the independent read."""
    topic = kafka.create_topic(f"s3down-{uuid.uuid4().hex[:10]}", PARTITIONS)
    proxy = TcpProxy(s3_server.port)
    proxy.up()
    bucket = s3_server.create_bucket(f"down-{uuid.uuid4().hex[:10]}")
    direct = s3_location(s3_server, bucket)
    endpoint = f"http://127.0.0.1:{proxy.port}"
    loc = replace(
        direct,
        options={**direct.options, "endpoint_url": endpoint},
        cli_url=f"s3://{bucket}/{direct.prefix}?endpoint_url={endpoint}",
    )
    producer = Producing(kafka, topic, PARTITIONS, pause=0.03)
    producer.start()
    log = tmp_path / "writer.log"
    writer = _follow(kafka.bootstrap, topic, loc, log)
    try:
        before = _wait_for_checkpoint(direct, writer, log, ledger)
        deadline = time.monotonic() + 10
        while not _snapshot_in_progress(direct) and time.monotonic() < deadline:
            time.sleep(0.002)
        proxy.down()  # mid-checkpoint: its snapshot record is written, its manifest not yet
        ledger.tried("infrastructure_faults")
        for args in (
            ["checkpoints", "verify", loc.cli_url],
            ["dump", "-b", kafka.bootstrap, "-t", topic, "--checkpoints", loc.cli_url, "--digest"],
        ):
            result = run_cli(ledger, args, timeout=DEADLINE, env=loc.cli_env)
            assert_one_line_error(ledger, result, "BlobStoreError")
        time.sleep(1.0)
        proxy.up()
        assert writer.poll() is None, f"the writer died with the endpoint:\n{log.read_text()[-2000:]}"
        _wait_for_checkpoint(direct, writer, log, ledger, after=max(before, _newest(direct)), limit=30)
    finally:
        producer.finish()
        _ctrl_c(ledger, writer, log, "writer")
        proxy.down()
    expected = truth_at(kafka.read_all(topic, range(PARTITIONS)))
    got = restore(kafka.bootstrap, topic, direct, read_only=True)
    assert got.checkpoint is not None
    judge(ledger, "restore after the S3 outage", got.table, expected)
    verify = run_cli(ledger, ["checkpoints", "verify", direct.cli_url], timeout=DEADLINE, env=direct.cli_env)
    assert verify.returncode == 0, verify.output[-2000:]


def test_silent_s3_endpoint_does_not_block_ctrl_c(
    s3_server: EmbeddedS3, kafka: KafkaTool, ledger: CaseLedger, tmp_path: Path
) -> None:
    """The S3 endpoint goes silent under a writer (connections accepted, never answered: a
    blackholed network, a wedged load balancer). Ctrl-C must still stop the writer within
    --shutdown-timeout, with a one-line error: a blocked S3 call cannot be interrupted, so
    shutting down must stop waiting for it (the last committed checkpoint stands)."""
    topic = kafka.create_topic(f"s3mute-{uuid.uuid4().hex[:10]}", PARTITIONS)
    proxy = TcpProxy(s3_server.port)
    proxy.up()
    bucket = s3_server.create_bucket(f"mute-{uuid.uuid4().hex[:10]}")
    direct = s3_location(s3_server, bucket)
    endpoint = f"http://127.0.0.1:{proxy.port}"
    loc = replace(
        direct,
        cli_url=f"s3://{bucket}/{direct.prefix}?endpoint_url={endpoint}",
        cli_env={**direct.cli_env, "STATESNAP_LOG_LEVEL": "INFO"},  # says when it follows
    )
    producer = Producing(kafka, topic, PARTITIONS, pause=0.03)
    producer.start()
    log = tmp_path / "writer.log"
    writer = _follow(kafka.bootstrap, topic, loc, log, "--shutdown-timeout", "5s")
    try:
        _wait_for_checkpoint(direct, writer, log, ledger)
        _wait_until_following(writer, log)  # checkpoints start during the catch-up now
        proxy.down()
        proxy.up(silent=True)
        ledger.tried("infrastructure_faults")
        time.sleep(3)  # the writer's next calls are now stuck waiting for an answer
    finally:
        producer.finish()
        code = _ctrl_c(ledger, writer, log, "writer on a silent S3 endpoint", limit=15)
        proxy.down()
    assert code == 1, code
    errors = [line for line in log.read_text().splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, log.read_text()[-3000:]
    (error,) = errors
    assert "did not finish within 5s" in error, error
    assert "last committed checkpoint stands" in error, error


def test_s3_endpoint_killed_and_restarted_empty_during_writes(
    own_s3: EmbeddedS3, kafka: KafkaTool, ledger: CaseLedger, tmp_path: Path, long_mode: bool
) -> None:
    """moto SIGKILLed under a writer and restarted: it keeps objects in memory, so the store comes
    back empty (as if wiped). The writer must stop in time on Ctrl-C and never commit a checkpoint
    that references lost files; a writer run afterwards checkpoints and restores to the independent
    read. (That the writer resumes checkpointing by itself is the wiped-store test below.) Long
    mode: the outage itself is covered by the proxy test above."""
    if not long_mode:
        pytest.skip("long mode (STATESNAP_FAULTS=long)")
    topic = kafka.create_topic(f"s3kill-{uuid.uuid4().hex[:10]}", PARTITIONS)
    bucket = own_s3.create_bucket("faults")
    loc = s3_location(own_s3, bucket)
    producer = Producing(kafka, topic, PARTITIONS, pause=0.03)
    producer.start()
    log = tmp_path / "writer.log"
    writer = _follow(kafka.bootstrap, topic, loc, log)
    try:
        _wait_for_checkpoint(loc, writer, log, ledger)
        time.sleep(random.uniform(0, 0.3))
        _sigkill(own_s3)
        ledger.tried("infrastructure_faults")
        time.sleep(1.0)
        own_s3.start()
        own_s3.create_bucket(bucket)
        deadline = time.monotonic() + 10
        while writer.poll() is None and _newest(loc) == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        if _newest(loc):
            repo = repo_of(loc)
            assert repo.verify(repo.generations()[0]).ok, "checkpoint after the wipe references lost files"
    finally:
        producer.finish()
        _ctrl_c(ledger, writer, log, "writer")
    final = run_cli(
        ledger,
        materialize_args(kafka.bootstrap, topic, loc),
        timeout=DEADLINE,
        env=loc.cli_env,
    )
    assert final.returncode == 0, final.stderr[-2000:]
    got = restore(kafka.bootstrap, topic, loc, read_only=True)
    assert got.checkpoint is not None
    judge(
        ledger,
        "restore after S3 came back empty",
        got.table,
        truth_at(kafka.read_all(topic, range(PARTITIONS))),
    )


@pytest.fixture
def loaded_broker() -> Iterator[tuple[EmbeddedBroker, str]]:
    """A broker of this test's own with a topic large enough that a restore takes seconds."""
    broker = EmbeddedBroker()
    broker.start()
    try:
        tool = KafkaTool(broker.bootstrap_servers)
        topic = tool.create_topic("big", PARTITIONS)
        tool._producer = None
        producer = Producer(
            {"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 20, "batch.size": 1_000_000}
        )
        value = b"v" * 90
        for i in range(RECORDS):
            while True:
                try:
                    producer.produce(topic, value, b"k%06d" % (i % 50_000), partition=i % PARTITIONS)
                    break
                except BufferError:
                    producer.poll(0.05)
        assert producer.flush(60) == 0
        del producer
        yield broker, topic
    finally:
        broker.stop()


RECORDS = 300_000


def test_broker_killed_during_restore(
    loaded_broker: tuple[EmbeddedBroker, str], ledger: CaseLedger, tmp_path: Path
) -> None:
    """``dump`` of a 300 k-record topic; the broker is SIGKILLed while it replays. It must end
    within the deadline: with a one-line BrokerUnavailableError naming the address, or — if it
    had already fetched everything up to partition EOF — with exactly the independent read's table.
    Prefetching is capped so that the kill cuts the stream."""
    broker, topic = loaded_broker
    address = broker.bootstrap_servers
    expected = table_digest_of(truth_at(KafkaTool(address).read_all(topic, range(PARTITIONS), timeout=60)))
    args = [
        *[
            "dump",
            "-b",
            address,
            "-t",
            topic,
            "--checkpoints",
            (tmp_path / "ck").as_uri(),
            "--digest",
            "--json",
        ],
        *["--kafka-config", "queued.max.messages.kbytes=512"],
        *["--kafka-config", "max.partition.fetch.bytes=262144"],
    ]
    proc = subprocess.Popen(
        [*STATESNAP, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(),
        start_new_session=True,
    )  # fmt: skip
    time.sleep(random.uniform(1.4, 2.0))  # interpreter start ~1 s, the replay takes seconds
    landed = proc.poll() is None
    _sigkill(broker)
    ledger.tried("infrastructure_faults")
    killed = time.monotonic()
    try:
        out, err = proc.communicate(timeout=DEADLINE)
    except subprocess.TimeoutExpired:
        dump_stacks(proc)
        kill_group(proc)
        out, err = proc.communicate()
        ledger.fail("hangs", f"dump still running {DEADLINE:.0f}s after the broker died: {err[-3000:]!r}")
    check_secrets(ledger, out + err, "dump")
    assert not (tmp_path / "ck").exists(), "a read-only dump created the checkpoint store"
    result = CliResult(args, proc.returncode, out, err, time.monotonic() - killed)
    if result.returncode == 0:  # everything was fetched before the kill: then it must be right
        ledger.check(result.json()["digest"] == expected, "wrong_tables", "dump as the broker died")
        if landed:
            pytest.skip("the kill came after the last fetch; the table was right")
        return
    assert_one_line_error(ledger, result, "BrokerUnavailableError")
    assert address in result.error_lines()[0]


def test_broker_killed_during_checkpoints(ledger: CaseLedger, new_location: Any, tmp_path: Path) -> None:
    """A broker of our own dies (SIGKILL) right after the last acknowledged record, while the writer
    checkpoints it. The writer must stop on Ctrl-C within the deadline (or have exited with a
    typed error), and every checkpoint it committed must verify and hold exactly the records below
    its offsets — read from the Parquet files without statesnap, against what the broker acked."""
    broker = EmbeddedBroker()
    broker.start()
    try:
        tool = KafkaTool(broker.bootstrap_servers)
        topic = tool.create_topic(f"bkill-{uuid.uuid4().hex[:10]}", PARTITIONS)
        loc: Location = new_location("file")
        producer = Producing(tool, topic, PARTITIONS, pause=0.02)
        producer.start()
        log = tmp_path / "writer.log"
        writer = _follow(broker.bootstrap_servers, topic, loc, log)
        try:
            _wait_for_checkpoint(loc, writer, log, ledger)
            time.sleep(random.uniform(0.2, 1.0))
            acked = producer.finish()
            _sigkill(broker)  # the writer is now consuming and checkpointing the last batches
            ledger.tried("infrastructure_faults")
            time.sleep(2)
        finally:
            producer.stop.set()
            tool._producer = None
            _ctrl_c(ledger, writer, log, "writer")
        repo = repo_of(loc)
        generations = repo.generations()
        assert generations
        for gen in generations:
            assert repo.verify(gen).ok, f"generation {gen} was committed incomplete"
            offsets, table = checkpoint_contents(loc, gen)
            judge(ledger, f"checkpoint {gen} written as the broker died", table, truth_at(acked, offsets))
    finally:
        broker.stop()


def test_checkpoint_store_wiped_under_a_writer(
    kafka: KafkaTool, new_location: Any, ledger: CaseLedger, tmp_path: Path
) -> None:
    """What moto's restart does at random, made deterministic: every object of the store is
    deleted under a running writer (an operator wiping a bucket, a store restored empty). The writer
    must checkpoint again within a deadline (a complete checkpoint: the old files are gone) or
    exit with a typed error — not run on without checkpoints."""
    topic = kafka.create_topic(f"wipe-{uuid.uuid4().hex[:10]}", PARTITIONS)
    loc: Location = new_location("file")
    producer = Producing(kafka, topic, PARTITIONS, pause=0.03)
    producer.start()
    log = tmp_path / "writer.log"
    writer = _follow(kafka.bootstrap, topic, loc, log)
    try:
        _wait_for_checkpoint(loc, writer, log, ledger, after=2)
        assert loc.root is not None
        loc.root.rename(loc.root.with_name("wiped"))  # all at once: no half-deleted tree
        ledger.tried("infrastructure_faults")
        deadline = time.monotonic() + 15
        while writer.poll() is None and _newest(loc) == 0:
            if time.monotonic() > deadline:
                ledger.fail(
                    "hangs",
                    "15 s after the store was wiped the writer runs on without checkpoints:\n"
                    + "\n".join(log.read_text().splitlines()[-6:]),
                )
            time.sleep(0.1)
        if _newest(loc):
            repo = repo_of(loc)
            assert repo.verify(repo.generations()[0]).ok, "checkpoint after the wipe references lost files"
    finally:
        producer.finish()
        _ctrl_c(ledger, writer, log, "writer")
