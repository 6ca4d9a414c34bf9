"""Faults at the Kafka edge, on the real embedded broker (issue 11).

- A broker SIGKILLed during a restore hung ``ChangelogReader.poll`` forever, in silence: the
  all-brokers-down error goes to librdkafka's ``error_cb``, never to ``consume()``. Now a reader
  that is catching up and sees neither a record nor an EOF for ``timeout`` seconds raises
  :class:`BrokerUnavailableError` naming the address and the partitions it still waits for.
- A next offset beyond the log end (a checkpoint of a deleted-and-recreated topic) hung the same
  way: the dev broker answers such fetches with nothing, Apache Kafka resets to the beginning.
  Now it is an :class:`OffsetOutOfRangeError` naming topic, partition, offset and log end.
- librdkafka settings it refuses (``no.such.prop``, ``security.protocol=bogus``, SASL without
  credentials) escaped as 30-line ``cimpl.KafkaException`` tracebacks.

Kill tests start their own broker: the session broker is shared by every test.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]  # re-exported without __all__

from statesnap import Table
from statesnap.devstack import EmbeddedBroker
from statesnap.errors import (
    BrokerUnavailableError,
    KafkaConfigError,
    OffsetOutOfRangeError,
    StatesnapError,
)
from statesnap.kafka.config import KafkaSettings
from statesnap.kafka.reader import ChangelogReader

pytestmark = pytest.mark.integration

#: Seconds a stalled reader waits before it calls the cluster lost, in these tests.
STALL = 3.0
#: Records per partition: more than librdkafka prefetches (queued.min.messages = 100 k per
#: partition plus one 16 MB fetch), so a kill right after the first batch lands mid-restore.
RECORDS = 350_000
#: Anything slower than this after the kill is a hang (STALL + metadata probe + draining the
#: records already prefetched, on a machine shared with other test runs).
DEADLINE = STALL + 12.0


def _kill(broker: EmbeddedBroker) -> None:
    """SIGKILL, as in the issue: no goodbye to the clients."""
    proc = broker._proc
    assert proc is not None
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def _fill(bootstrap: str, topic: str, partitions: int, per_partition: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(15)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000, "acks": 1})
    value = b"v" * 90
    for i in range(per_partition * partitions):
        while True:
            try:
                producer.produce(topic, value, b"k%06d" % (i % 50_000), partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0


@pytest.fixture
def doomed_broker() -> Iterator[EmbeddedBroker]:
    """A broker of this test's own, filled with one large topic; the test kills it."""
    broker = EmbeddedBroker()
    broker.start()
    try:
        _fill(broker.bootstrap_servers, "big", 1, RECORDS)
        yield broker
    finally:
        broker.stop()


def _run_with_guard(fn: Any, limit: float) -> tuple[BaseException | None, float]:
    """Run *fn* on a thread; a hang fails the test after *limit* instead of hanging pytest."""
    outcome: list[BaseException | None] = []
    started = time.monotonic()

    def target() -> None:
        try:
            fn()
            outcome.append(None)
        except BaseException as e:
            outcome.append(e)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(limit)
    assert outcome, f"still blocked after {limit:.0f}s: the wait has no deadline"
    return outcome[0], time.monotonic() - started


def test_reader_gives_up_within_the_deadline_when_the_broker_dies(doomed_broker: EmbeddedBroker) -> None:
    address = doomed_broker.bootstrap_servers
    reader = ChangelogReader(KafkaSettings(address, {}, STALL), "big", {0: 0})
    killed_at: list[float] = []
    consumed = 0

    def restore() -> None:
        nonlocal consumed
        while not reader.caught_up:
            consumed += sum(len(m) for m in reader.poll(0.2).values())
            if consumed and not killed_at:
                _kill(doomed_broker)
                killed_at.append(time.monotonic())

    error, _ = _run_with_guard(restore, 60)
    assert killed_at
    elapsed = time.monotonic() - killed_at[0]
    assert isinstance(error, BrokerUnavailableError), error
    assert 0 < consumed < RECORDS, "the kill did not land mid-restore"
    message = str(error)
    assert address in message
    assert "[0]" in message  # the partitions still waited for
    assert "\n" not in message
    assert elapsed < DEADLINE, f"gave up {elapsed:.1f}s after the kill"
    started = time.monotonic()
    reader.close()
    assert time.monotonic() - started < 5  # closing never waits for the dead cluster


def test_table_restore_fails_with_a_typed_error_when_the_broker_dies(
    doomed_broker: EmbeddedBroker,
) -> None:
    """The path of ``statesnap dump``: Table.start's catch-up loop over the reader."""
    address = doomed_broker.bootstrap_servers
    table = Table("big", bootstrap_servers=address, background=False, timeout=STALL)
    killed_at: list[float] = []

    def progress(records: int, _eof: int, _partitions: int) -> None:
        if records and not killed_at:
            _kill(doomed_broker)
            killed_at.append(time.monotonic())

    error, _ = _run_with_guard(lambda: table.start(progress=progress), 60)
    assert killed_at
    elapsed = time.monotonic() - killed_at[0]
    assert isinstance(error, BrokerUnavailableError), error
    assert address in str(error)
    assert elapsed < DEADLINE, f"gave up {elapsed:.1f}s after the kill"
    assert table.report.replayed_records < RECORDS
    close_error, took = _run_with_guard(table.close, 30)
    assert took < 10
    assert close_error is None or isinstance(close_error, StatesnapError)


def test_reader_waits_for_a_cluster_that_is_only_slow(kafka: Any) -> None:
    """The stall deadline must not fire for a live cluster: a caught-up reader with no new
    records for longer than the deadline stays quiet and keeps tailing."""
    topic = kafka.create_topic(f"f-{uuid.uuid4().hex[:12]}", 1)
    kafka.produce(topic, [(0, b"k", b"v")])
    reader = ChangelogReader(KafkaSettings(kafka.bootstrap, {}, 1.0), topic, {0: 0})
    try:
        deadline = time.monotonic() + 20
        while not reader.caught_up:
            assert time.monotonic() < deadline
            reader.poll(0.1)
        quiet_until = time.monotonic() + 2.5
        while time.monotonic() < quiet_until:
            reader.poll(0.1)  # no records, all at EOF: never an error
        kafka.produce(topic, [(0, b"k", b"v2")])
        got: list[Any] = []
        while not got:
            assert time.monotonic() < deadline
            got = reader.poll(0.1).get(0, [])
        assert got[-1].value() == b"v2"
    finally:
        reader.close()


# --- offsets beyond the log end ------------------------------------------------------------------


def test_offsets_beyond_the_log_end_are_a_typed_error(kafka: Any) -> None:
    topic = kafka.create_topic(f"f-{uuid.uuid4().hex[:12]}", 2)
    records = kafka.produce(topic, [(p, b"k%d" % i, b"v") for i in range(50) for p in (0, 1)])
    end = kafka.end_offsets(records, [0, 1])
    reader = ChangelogReader(KafkaSettings(kafka.bootstrap, {}, 10.0), topic, {0: end[0] + 1000, 1: 0})
    try:

        def restore() -> None:
            while not reader.caught_up:
                reader.poll(0.2)

        error, took = _run_with_guard(restore, 30)
        assert isinstance(error, OffsetOutOfRangeError), error
        assert (error.topic, error.partition, error.offset) == (topic, 0, end[0] + 1000)
        assert error.log_end == end[0]
        assert topic in str(error)
        assert kafka.bootstrap in str(error)
        assert took < 8  # well before the 10 s stall deadline: it is not mistaken for a dead broker
    finally:
        reader.close()


def test_offsets_at_the_log_end_are_fine(kafka: Any) -> None:
    """A checkpoint taken at the very end (next offset == log end) is the common case."""
    topic = kafka.create_topic(f"f-{uuid.uuid4().hex[:12]}", 1)
    records = kafka.produce(topic, [(0, b"k%d" % i, b"v") for i in range(20)])
    end = kafka.end_offsets(records, [0])
    reader = ChangelogReader(KafkaSettings(kafka.bootstrap, {}, 10.0), topic, {0: end[0]})
    try:
        deadline = time.monotonic() + 20
        while not reader.caught_up:
            assert time.monotonic() < deadline
            assert reader.poll(0.1) == {}
        time.sleep(1.5)  # longer than the out-of-range grace
        assert reader.poll(0.1) == {}
    finally:
        reader.close()


def test_a_checkpoint_of_a_recreated_topic_never_hangs_a_restore(kafka: Any, tmp_path: Path) -> None:
    """Delete the topic, recreate it with fewer records, restore from the old checkpoint: the
    restore must end, either refusing with a typed error or without that checkpoint."""
    topic = kafka.create_topic(f"f-{uuid.uuid4().hex[:12]}", 1)
    kafka.produce(topic, [(0, b"old-%d" % i, b"v") for i in range(300)])
    ckpt = (tmp_path / "ckpt").as_uri()
    writer = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=ckpt, background=False)
    writer.start()
    writer.checkpoint()
    writer.close()
    kafka.admin.delete_topics([topic])[topic].result(15)
    deadline = time.monotonic() + 20
    while kafka.topic_exists(topic):
        assert time.monotonic() < deadline, "the broker did not delete the topic"
        time.sleep(0.1)
    kafka.create_topic(topic, 1)
    fresh = kafka.produce(topic, [(0, b"new-%d" % i, b"v") for i in range(10)])
    table = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=ckpt, background=False, timeout=10)
    error, _ = _run_with_guard(table.start, 45)
    try:
        if error is not None:
            assert isinstance(error, OffsetOutOfRangeError), error
        else:  # the checkpoint was refused: the table is the new incarnation's, nothing else
            assert dict(table.items()) == kafka.truth(fresh)
    finally:
        table.close()


# --- librdkafka settings it refuses --------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"no.such.prop": "1"}, "no.such.prop"),
        ({"security.protocol": "bogus"}, "security.protocol"),
        ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"}, "sasl.password"),
    ],
)
def test_table_refuses_bad_client_settings_with_a_config_error(
    kafka: Any, config: dict[str, str], named: str
) -> None:
    table = Table("any-topic", bootstrap_servers=kafka.bootstrap, kafka_config=config, background=False)
    with pytest.raises(KafkaConfigError, match=named.replace(".", r"\.")):
        table.start()


SECRET = "pw-" + uuid.uuid4().hex


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (["--kafka-config", "no.such.prop=1"], {}, "KafkaConfigError: unknown Kafka client property"),
        ([], {"STATESNAP_KAFKA_SECURITY_PROTOCOL": "bogus"}, "'security.protocol'"),
        (
            ["--kafka-config", "security.protocol=SASL_SSL", "--kafka-config", "sasl.mechanism=PLAIN"],
            {},
            "sasl.username and sasl.password must be set",
        ),
        # refused before click parses, as a usage error (exit 2): the entry may be the secret itself
        (["--kafka-config", f"sasl.password {SECRET}"], {}, "--kafka-config takes KEY=VALUE: entry 1"),
        (["--checkpoints", "://nothing"], {}, "UnknownSchemeError"),
        (["--checkpoints", "file:///tmp/ckpt%00x"], {}, "InvalidStoreUrlError"),
        (
            ["--checkpoints", f"gs://b/p?aws_secret_access_key={SECRET}"],
            {},
            "UnknownSchemeError: unknown checkpoint URL scheme 'gs'",
        ),
        (["--checkpoints", f"file://host/p?aws_secret_access_key={SECRET}"], {}, "UnknownSchemeError"),
    ],
)
def test_cli_bad_inputs_are_one_line_typed_errors_without_secrets(
    kafka: Any, args: list[str], env: dict[str, str], expected: str, tmp_path: Path
) -> None:
    from statesnap.cli import cli

    topic = kafka.create_topic(f"f-{uuid.uuid4().hex[:12]}", 1)
    runner = CliRunner()
    result = runner.invoke(
        cli,
        ["materialize", "--engine", "python", "-b", kafka.bootstrap, "-t", topic, *args],
        env={"STATESNAP_CHECKPOINTS": str(tmp_path / "ok"), **env},
        catch_exceptions=False,
    )
    output = result.output
    assert result.exit_code == (2 if "takes KEY=VALUE" in expected else 1), output
    errors = [line for line in output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, output
    assert expected in errors[0], output
    assert "Traceback" not in output
    assert SECRET not in output


def test_cli_unusable_checkpoint_root_is_a_typed_error(kafka: Any) -> None:
    """``--checkpoints /proc/ckpt`` escaped as a 54-line FileNotFoundError."""
    from statesnap.cli import cli

    topic = kafka.create_topic(f"f-{uuid.uuid4().hex[:12]}", 1)
    kafka.produce(topic, [(0, b"k", b"v")])
    result = CliRunner().invoke(
        cli,
        [
            "materialize",
            "--engine",
            "python",
            "-b",
            kafka.bootstrap,
            "-t",
            topic,
            "--checkpoints",
            "/proc/ckpt",
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 1, result.output
    assert "Error: StoreNotWritableError" in result.output
    assert "/proc/ckpt" in result.output
    assert "Traceback" not in result.output
