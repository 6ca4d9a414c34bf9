"""A static group member (``group.instance.id``) fenced on the three-node Apache Kafka cluster must
stop, not idle (issue 34: the fenced member kept running with no partitions, served stale rows and
``raise_if_failed()`` raised nothing).

Fixed by the ``fatal`` branch in ``kafka/group_reader.py`` (librdkafka reports the fencing with code
``_FATAL``, whose ``fatal()`` is False). Without it the test fails by its bounded wait, naming the
hang, instead of waiting forever.
"""

from __future__ import annotations

import time
import uuid

import pytest

from faults.ledger import CaseLedger
from integration.cluster.conftest import ClusterTool
from statesnap import Table
from statesnap.devstack.cluster import ApacheKafkaCluster
from statesnap.errors import StatesnapError

pytestmark = pytest.mark.integration

PARTITIONS = 2
#: How long a fenced member may take to stop (the broker fences it at its next heartbeat, ~1 s).
STOP_WITHIN = 20.0


def _member(ctool: ClusterTool, topic: str, group: str, instance: str) -> Table:
    return Table(
        topic,
        bootstrap_servers=ctool.bootstrap,
        group=group,
        kafka_config={
            "group.instance.id": instance,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        },
        background=True,
    )


def _wait_stopped(table: Table, within: float) -> BaseException | None:
    """The error a fenced table fails with, or None if it still runs after *within* seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            table.raise_if_failed()
        except StatesnapError as e:
            return e
        time.sleep(0.2)
    return None


@pytest.mark.timeout(120)
def test_a_fenced_static_member_stops_with_a_typed_error(
    cluster: ApacheKafkaCluster, ctool: ClusterTool, ledger: CaseLedger
) -> None:
    """Apache Kafka 4.1.1, three nodes, proved it: a second member joining with the same
    group.instance.id replaces the first; the group coordinator answers the first member's next
    heartbeat with FENCED_INSTANCE_ID, which librdkafka reports as a fatal consumer error. The
    first Table must stop: ``raise_if_failed()`` raises a typed error naming the fencing, and its
    reads raise too; the second member owns the partitions and serves the rows."""
    topic = ctool.create_topic("static", PARTITIONS)
    records = ctool.tool.produce(topic, [(i % PARTITIONS, b"k%d" % i, b"v%d" % i) for i in range(40)])
    group, instance = f"g-{uuid.uuid4().hex[:8]}", f"member-{uuid.uuid4().hex[:6]}"
    first = _member(ctool, topic, group, instance)
    first.start()
    second: Table | None = None
    try:
        assert dict(first.raw_items()) == ctool.tool.truth(records)
        coordinator = cluster.coordinator_of(group)
        assert coordinator in {0, 1, 2}
        second = _member(ctool, topic, group, instance)
        second.start()
        ledger.tried("cluster_faults")
        error = _wait_stopped(first, STOP_WITHIN)
        if error is None:
            ledger.fail(
                "hangs",
                f"a static member fenced by another with group.instance.id={instance} still runs "
                f"{STOP_WITHIN:.0f} s later: raise_if_failed() raised nothing (issue 34)",
            )
        assert "fenced" in str(error).lower() or "group.instance.id" in str(error), error
        with pytest.raises(StatesnapError):
            first.get(b"k0")
        assert dict(second.raw_items()) == ctool.tool.truth(records)
    finally:
        first.close(checkpoint=False)
        if second is not None:
            second.close(checkpoint=False)
