"""Fatal client errors stop the task: a static group member fenced by another with its
``group.instance.id``.

Apache Kafka 4.1.1 (the suite's broker), classic protocol: when a second consumer joins a group
with a ``group.instance.id`` already in use, the coordinator hands the id to the newcomer and
answers the older member's next heartbeat with ``FENCED_INSTANCE_ID``; librdkafka 2.16 makes that
a fatal consumer error, delivered as an error event with code ``_FATAL`` whose ``fatal()`` is
False. That member never gets a partition again. Before the fix statesnap logged a warning and
kept running with no partitions (a Table ``running``, serving stale rows; ``raise_if_failed()``
silent; the CLI never exiting on its own). Proven here: the fenced member stops with
:class:`FatalClientError` naming the fencing — a Table in ``group=`` mode, a Processor, and
``statesnap materialize --follow --group`` as a fresh process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from integration.conftest import KafkaTool
from statesnap import Processor, Table
from statesnap.devstack.orphans import guarded
from statesnap.errors import FatalClientError, TableStateError
from statesnap.task.lifecycle import TaskPhase

pytestmark = pytest.mark.integration

PARTITIONS = 2
#: Sessions as the group tests use them: a member joins in a few seconds.
GROUP_CONFIG = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}


def _records(n: int) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(i % PARTITIONS, b"k%d" % i, b"v%d" % i) for i in range(n)]


def _instance() -> str:
    return f"member-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def closing() -> Iterator[list[Any]]:
    """Tables and processors to close at the end, whatever happened."""
    made: list[Any] = []
    yield made
    for t in reversed(made):
        t.close(checkpoint=False)


def test_a_fenced_static_member_table_fails_and_its_reads_raise(
    kafka: KafkaTool, topic_name: str, tmp_path: Path, closing: list[Any]
) -> None:
    """Apache Kafka: the older of two group members with one ``group.instance.id`` is fenced
    (``_FATAL`` / ``FENCED_INSTANCE_ID``); its Table fails: status ``failed``, reads raise naming
    the fencing, ``raise_if_failed()`` raises :class:`FatalClientError`. The newcomer serves."""
    kafka.create_topic(topic_name, PARTITIONS)
    kafka.produce(topic_name, _records(40))
    url, group, instance = str(tmp_path / "ckpt"), f"g-{uuid.uuid4().hex[:8]}", _instance()
    config = {**GROUP_CONFIG, "group.instance.id": instance}
    older = Table(
        topic_name, bootstrap_servers=kafka.bootstrap, checkpoints=url, group=group, kafka_config=config
    )
    closing.append(older)
    older.start()
    KafkaTool.wait_for(lambda: older.partitions == (0, 1), 30, "the first member's assignment")
    assert older.get(b"k1") == b"v1"

    newer = Table(
        topic_name, bootstrap_servers=kafka.bootstrap, checkpoints=url, group=group, kafka_config=config
    )
    closing.append(newer)
    newer.start()
    KafkaTool.wait_for(lambda: older.phase is TaskPhase.FAILED, 30, "the fenced member to fail")

    assert "state='failed'" in repr(older)
    with pytest.raises(FatalClientError) as failed:
        older.raise_if_failed()
    message = str(failed.value)
    assert "group.instance.id" in message, message
    assert instance in message, message
    assert "fenced" in message, message
    assert "\n" not in message
    with pytest.raises(TableStateError, match="fenced") as read:
        older.get(b"k1")
    assert read.value.__cause__ is failed.value
    KafkaTool.wait_for(lambda: newer.partitions == (0, 1), 30, "the newcomer's assignment")
    KafkaTool.wait_for(lambda: newer.get(b"k1") == b"v1", 30, "the newcomer to serve")


def test_a_fenced_static_member_processor_stops(
    kafka: KafkaTool, topic_name: str, tmp_path: Path, closing: list[Any]
) -> None:
    """Apache Kafka: a Processor in a group, fenced under its ``group.instance.id`` by a second
    instance, stops with :class:`FatalClientError` instead of idling with no partitions."""
    kafka.create_topic(topic_name, PARTITIONS)
    kafka.produce(topic_name, _records(40))
    url, group, instance = str(tmp_path / "ckpt"), f"g-{uuid.uuid4().hex[:8]}", _instance()

    def processor() -> Processor:
        proc = Processor(
            "counts",
            inputs=[topic_name],
            bootstrap_servers=kafka.bootstrap,
            checkpoints=url,
            stores=["seen"],
            group=group,
            kafka_config={**GROUP_CONFIG, "group.instance.id": instance},
        )

        @proc.handler
        def count(record: Any, ctx: Any) -> None:
            ctx.stores["seen"][record.key] = record.value

        return proc

    older = processor()
    closing.append(older)
    older.start()
    KafkaTool.wait_for(lambda: older.task.partitions == (0, 1), 30, "the first instance's assignment")
    newer = processor()
    closing.append(newer)
    newer.start()
    KafkaTool.wait_for(lambda: older.task.phase is TaskPhase.FAILED, 30, "the fenced instance to stop")
    with pytest.raises(FatalClientError, match=r"group\.instance\.id"):
        older.task.raise_if_failed()


def test_materialize_follow_group_exits_when_fenced(
    kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    """Apache Kafka: two ``statesnap materialize --follow --group`` processes with the same
    ``STATESNAP_KAFKA_GROUP_INSTANCE_ID``: the older one exits non-zero on its own, with one line
    on stderr naming the fencing (before the fix it ran on with no partitions until killed)."""
    kafka.create_topic(topic_name, PARTITIONS)
    kafka.produce(topic_name, _records(40))
    url, group = str(tmp_path / "ckpt"), f"g-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "STATESNAP_KAFKA_GROUP_INSTANCE_ID": _instance(),
        "STATESNAP_KAFKA_SESSION_TIMEOUT_MS": "6000",
        "STATESNAP_KAFKA_HEARTBEAT_INTERVAL_MS": "500",
    }
    command = [
        sys.executable,
        "-m",
        "statesnap.cli",
        *("materialize", "-b", kafka.bootstrap, "-t", topic_name, "--checkpoints", url, "--follow"),
        *("--group", group, "--engine", "python", "--commit-interval", "1s", "-q"),
    ]
    procs: list[subprocess.Popen[str]] = []

    def start() -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            guarded(command), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        procs.append(proc)
        return proc

    try:
        older = start()
        KafkaTool.wait_for(lambda: _members(kafka, group) == 1, 60, "the first process to join")
        newer = start()
        try:
            code = older.wait(60)
        except subprocess.TimeoutExpired:
            pytest.fail("the fenced process kept running")
        stderr = older.stderr.read() if older.stderr else ""
        assert code != 0, stderr
        naming = [line for line in stderr.splitlines() if "fenced" in line]
        assert len(naming) == 1, stderr
        assert "FatalClientError" in naming[0], stderr
        assert "group.instance.id" in naming[0], stderr
        assert newer.poll() is None, "the newcomer stopped too"
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


def _members(kafka: KafkaTool, group: str) -> int:
    """Members of *group* the coordinator reports as stable (0 before it has any)."""
    futures = kafka.admin.describe_consumer_groups([group], request_timeout=5)
    try:
        described = futures[group].result(timeout=10)
    except Exception:  # not known yet
        return 0
    if str(described.state).split(".")[-1] != "STABLE":
        return 0
    return len(described.members)
