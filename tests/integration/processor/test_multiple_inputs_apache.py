"""Two co-partitioned inputs where broker behaviour matters, on Apache Kafka (4.x, the session's
``apache_kafka``): Tansu shows aborted records to ``read_committed`` readers and crashes on
``delete_records``, so neither exactly-once outputs nor a moved log start can be proven there.

- exactly-once: every input's offsets go in each transaction (also in a consumer group, where a
  survivor takes over a member stopped without a commit); after a stop between a transaction
  commit and the checkpoint, each input's records below its own committed offset are re-processed
  for state only: ``read_committed`` outputs are exactly one per input record.
- a log start that moved past the second input's checkpointed offset: ``require`` fails naming
  that input, partition and offsets; without it the restore replays what the log holds (never a
  silent skip).
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka import KafkaError as RdKafkaError
from confluent_kafka.admin import AdminClient

from integration.conftest import KafkaTool
from statesnap import CheckpointOptions, ProcessingOptions, Processor, ProcessorContext, Record
from statesnap.devstack import ApacheKafkaBroker
from statesnap.errors import RecordsDeletedError

pytestmark = pytest.mark.integration  # ~10 s in all: the only proof of these two, so default

PARTITIONS = 2


@pytest.fixture(scope="module")
def apache(apache_kafka: ApacheKafkaBroker) -> Iterator[KafkaTool]:
    tool = KafkaTool(apache_kafka.bootstrap_servers)
    yield tool
    tool.close()


def echo(
    name: str, inputs: list[str], out: str | None, bootstrap: str, url: str, **options: Any
) -> Processor:
    """Counts records per key and input; with *out*, emits one record per input record."""
    proc = Processor(
        name,
        inputs=inputs,
        bootstrap_servers=bootstrap,
        checkpoints=CheckpointOptions(url, interval="1h", commit_interval="50ms", **options.pop("ckpt", {})),
        stores=["seen"],
        **options,
    )

    @proc.handler
    def on_record(record: Record, ctx: ProcessorContext) -> None:
        seen = ctx.stores["seen"]
        key = record.topic.encode() + b"/" + (record.key or b"")
        seen[key] = str(int(seen.get(key, b"0")) + 1).encode()
        if out is not None:
            ctx.emit(out, record.key, json.dumps([record.topic, record.partition, record.offset]).encode())

    return proc


def produce(kafka: KafkaTool, topic: str, start: int, n: int) -> None:
    kafka.produce(topic, ((i % PARTITIONS, f"k{i % 5}".encode(), b"x") for i in range(start, start + n)))


def committed_outputs(bootstrap: str, topic: str, timeout: float = 30) -> list[tuple[str, int, int]]:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 10,
            "isolation.level": "read_committed",
        }
    )
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        eof: set[int] = set()
        out: list[tuple[str, int, int]] = []
        deadline = time.monotonic() + timeout
        while eof != set(range(PARTITIONS)):
            assert time.monotonic() < deadline, f"reading {topic} timed out"
            for m in c.consume(1000, 0.1):
                err, partition, value = m.error(), m.partition(), m.value()
                if err is not None:
                    if err.code() == RdKafkaError._PARTITION_EOF and partition is not None:
                        eof.add(partition)
                    continue
                assert value is not None
                t, p, o = json.loads(value)
                out.append((t, p, o))
        return out
    finally:
        c.close()


def two_inputs(apache: KafkaTool, prefix: str, tag: str) -> list[str]:
    """Two co-partitioned input topics, ``PREFIX-a-TAG`` and ``PREFIX-b-TAG``."""
    return [apache.create_topic(f"{prefix}-{side}-{tag}", PARTITIONS) for side in "ab"]


def every_record(kafka: KafkaTool, topics: list[str]) -> Counter[tuple[str, int, int]]:
    return Counter((t, r.partition, r.offset) for t in topics for r in kafka.read_all(t, range(PARTITIONS)))


def test_exactly_once_outputs_over_two_inputs(apache: KafkaTool, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    topics = two_inputs(apache, "eos2", tag)
    out = apache.create_topic(f"eos2-out-{tag}", PARTITIONS)
    url, name = str(tmp_path / "ckpt"), f"eos2-{tag}"
    for t in topics:
        produce(apache, t, 0, 40)
    echo(name, topics, out, apache.bootstrap, url, processing=ProcessingOptions(exactly_once=True)).run(
        follow=False
    )
    for t in topics:
        produce(apache, t, 40, 30)
    # A run that commits its outputs (and every input's offsets) but stops before a checkpoint.
    stopped = echo(name, topics, out, apache.bootstrap, url, processing=ProcessingOptions(exactly_once=True))
    stopped.start()
    deadline = time.monotonic() + 60
    while len(committed_outputs(apache.bootstrap, out)) < 140:
        assert time.monotonic() < deadline, "outputs were not committed"
        time.sleep(0.2)
    stopped.close(checkpoint=False)
    for t in topics:
        produce(apache, t, 70, 10)
    resumed = echo(name, topics, out, apache.bootstrap, url, processing=ProcessingOptions(exactly_once=True))
    report = resumed.run(follow=False)
    assert report.replayed_records == 80  # both inputs' records after the checkpoint, re-processed
    got = Counter(committed_outputs(apache.bootstrap, out))
    assert got == every_record(apache, topics)
    assert set(got.values()) == {1}


def test_exactly_once_outputs_over_two_inputs_in_a_consumer_group(apache: KafkaTool, tmp_path: Path) -> None:
    """Two group members over two inputs, exactly-once: the second joins (the first commits, then
    checkpoints, what it hands over), then the first stops without a checkpoint or a commit (its
    open transaction aborted). The survivor gains its partitions, reads each input's committed
    offsets and re-processes below them for state only: ``read_committed`` outputs are exactly one
    per input record, and the counts per input and key equal a plain count."""
    tag = uuid.uuid4().hex[:8]
    topics = two_inputs(apache, "eos2g", tag)
    out = apache.create_topic(f"eos2g-out-{tag}", PARTITIONS)
    url, name = str(tmp_path / "ckpt"), f"eos2g-{tag}"
    options: dict[str, Any] = {
        "processing": ProcessingOptions(exactly_once=True, max_idle="50ms"),
        "group": f"eos2g-group-{tag}",
    }

    def produced(start: int, n: int) -> None:
        for t in topics:
            produce(apache, t, start, n)

    def outputs_reach(n: int) -> None:
        KafkaTool.wait_for(
            lambda: len(committed_outputs(apache.bootstrap, out)) >= n, timeout=60, what=f"{n} outputs"
        )

    produced(0, 40)
    first = echo(name, topics, out, apache.bootstrap, url, **options)
    second = echo(name, topics, out, apache.bootstrap, url, **options)
    first.start()
    try:
        produced(40, 30)
        second.start()
        KafkaTool.wait_for(
            lambda: len(first.task.partitions) == len(second.task.partitions) == 1,
            timeout=60,
            what="the members to share the partitions",
        )
        produced(70, 30)
        outputs_reach(200)
        first.close(checkpoint=False)
        produced(100, 20)
        KafkaTool.wait_for(
            lambda: len(second.task.partitions) == PARTITIONS, timeout=60, what="the survivor to own both"
        )
        outputs_reach(240)
        assert second._outputs is not None
        assert second._outputs.state_only_records > 0  # the first's committed tail, for state only
        seen: Counter[bytes] = Counter()
        for k, v in second.store("seen").items():  # a key is in both partitions: one row in each
            seen[k] += int(v)
    finally:
        first.close(checkpoint=False)
        second.close()
    got = Counter(committed_outputs(apache.bootstrap, out))
    assert got == every_record(apache, topics)
    assert set(got.values()) == {1}
    truth = Counter(
        t.encode() + b"/" + (r.key or b"") for t in topics for r in apache.read_all(t, range(PARTITIONS))
    )
    assert seen == truth


def test_a_log_start_past_the_second_inputs_offset_is_never_skipped(
    apache: KafkaTool, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    topics = two_inputs(apache, "del2", tag)
    url, name = str(tmp_path / "ckpt"), f"del2-{tag}"
    for t in topics:
        produce(apache, t, 0, 20)
    echo(name, topics, None, apache.bootstrap, url).run(follow=False)
    produce(apache, topics[1], 20, 20)  # partition 1 of the second input: offsets 10..19
    admin = AdminClient({"bootstrap.servers": apache.bootstrap})
    for f in admin.delete_records([TopicPartition(topics[1], 1, 15)]).values():
        f.result(15)

    strict = echo(name, topics, None, apache.bootstrap, url, ckpt={"require": True})
    with pytest.raises(RecordsDeletedError, match=rf"topic '{topics[1]}' partition 1 .* offsets 10\.\.14"):
        strict.run(follow=False)

    lenient = echo(name, topics, None, apache.bootstrap, url)
    report = lenient.run(follow=False)
    assert [s.generation for s in report.skipped] == [1]
    assert report.checkpoint is None
    assert report.replayed_records == 20 + 25  # all of the first input, what the log holds of the second


def test_the_second_inputs_end_is_kept_without_records(apache: KafkaTool, tmp_path: Path) -> None:
    """A partition of the second input whose records retention deleted before any was read: the
    checkpoint keeps where its log continues, so a restore resumes (no needless replay); records
    produced after the checkpoint on a partition that was empty and deleted before the restore
    read them are never skipped silently."""
    tag = uuid.uuid4().hex[:8]
    topics = two_inputs(apache, "end2", tag)
    url, name = str(tmp_path / "ckpt"), f"end2-{tag}"
    produce(apache, topics[0], 0, 20)
    produce(apache, topics[1], 0, 20)
    admin = AdminClient({"bootstrap.servers": apache.bootstrap})
    for f in admin.delete_records([TopicPartition(topics[1], 0, 10)]).values():  # all of partition 0
        f.result(15)
    first = echo(name, topics, None, apache.bootstrap, url)
    assert first.run(follow=False).replayed_records == 30
    produce(apache, topics[0], 20, 4)
    again = echo(name, topics, None, apache.bootstrap, url)
    report = again.run(follow=False)
    assert report.checkpoint is not None
    assert not report.skipped
    assert report.replayed_records == 4


def test_a_group_member_replays_a_partition_whose_second_input_lost_records(
    apache: KafkaTool, tmp_path: Path
) -> None:
    """In a consumer group (Apache Kafka: the only broker here that moves a log start): a member
    gains a partition whose checkpointed offset of the second input lies below that input's log
    start. Without ``require`` it replays that partition from what the log holds (its other
    partition still restores from the checkpoint); with ``require`` it fails naming the input,
    partition and offsets, and the failed start leaves the group. Never a silent skip, never a
    crash of an unrequired restore."""
    tag = uuid.uuid4().hex[:8]
    topics = two_inputs(apache, "del2g", tag)
    url, name = str(tmp_path / "ckpt"), f"del2g-{tag}"
    for t in topics:
        produce(apache, t, 0, 20)
    echo(name, topics, None, apache.bootstrap, url).run(follow=False)  # checkpoint: 10 per partition
    produce(apache, topics[1], 20, 20)  # partition 1 of the second input: offsets 10..19
    admin = AdminClient({"bootstrap.servers": apache.bootstrap})
    for f in admin.delete_records([TopicPartition(topics[1], 1, 15)]).values():
        f.result(15)

    def member(group: str, **ckpt: Any) -> Processor:
        return echo(
            name,
            topics,
            None,
            apache.bootstrap,
            url,
            ckpt=ckpt,
            group=group,
            processing=ProcessingOptions(max_idle="50ms"),
        )

    strict_group = f"del2g-strict-{tag}"
    strict = member(strict_group, require=True)
    with pytest.raises(RecordsDeletedError, match=rf"topic '{topics[1]}' partition 1 .* offsets 10\.\.14"):
        strict.start()
    # The failed start closed what it opened: its consumer left the group at once.
    (described,) = admin.describe_consumer_groups([strict_group]).values()
    assert described.result(15).members == []

    lenient = member(f"del2g-lenient-{tag}")
    report = lenient.start()
    try:
        assert report.checkpoint == 1  # partition 0 restored from it
        assert [s.generation for s in report.skipped] == [1]
        assert f"'{topics[1]}' partition 1" in report.skipped[0].reason
        # Partition 0's tail (the second input's 10 new records), then partition 1 from the start:
        # the first input's 10 and the 5 the second input's log still holds.
        assert report.replayed_records == 10 + 10 + 5
        truth: Counter[bytes] = Counter(  # an independent count of what the log holds
            t.encode() + b"/" + (r.key or b"") for t in topics for r in apache.read_all(t, range(PARTITIONS))
        )
        seen: Counter[bytes] = Counter()
        for k, v in lenient.store("seen").items():  # a key is in both partitions: one row in each
            seen[k] += int(v)
        assert seen == truth
    finally:
        lenient.close()
