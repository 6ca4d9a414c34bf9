"""The orphan grace a writer's GC applies: one rule, an hour or twice the checkpoint interval when
that is longer, for a library ``Table``, a ``Processor`` (what ``statesnap run`` runs) and
``statesnap materialize`` alike; a grace given is kept as given. Kafka behaviour: none beyond a
topic to open (Apache Kafka, the suite's broker)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from integration.conftest import KafkaTool
from statesnap import CheckpointOptions, Processor, RetentionPolicy, Table
from statesnap.checkpoint.retention import orphan_grace_for


def test_the_rule() -> None:
    assert orphan_grace_for(None) == timedelta(hours=1)
    assert orphan_grace_for(timedelta(minutes=5)) == timedelta(hours=1)
    assert orphan_grace_for(timedelta(hours=3)) == timedelta(hours=6)
    assert RetentionPolicy().grace == timedelta(hours=1)  # a GC of its own: no interval
    given = RetentionPolicy(orphan_grace=timedelta(0))
    assert given.for_interval(timedelta(hours=3)) is given


def test_a_writer_keeps_unreferenced_files_twice_its_checkpoint_interval(
    kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    """A library table checkpointing every 3 h keeps orphans 6 h (it kept them 1 h, the CLI's
    materialize 6 h); a processor every 2 h keeps them 4 h; an explicit grace stands."""
    topic = kafka.create_topic(topic_name, 1)
    table: Table[bytes, bytes] = Table(
        topic,
        bootstrap_servers=kafka.bootstrap,
        checkpoints=CheckpointOptions(str(tmp_path / "a"), interval="3h"),
        background=False,
    )
    table.start()
    try:
        assert table.snapshots is not None
        assert table.snapshots.retention is not None
        assert table.snapshots.retention.grace == timedelta(hours=6)
    finally:
        table.close(checkpoint=False)

    explicit = RetentionPolicy(orphan_grace=timedelta(minutes=10))
    table = Table(
        topic,
        bootstrap_servers=kafka.bootstrap,
        checkpoints=CheckpointOptions(str(tmp_path / "b"), interval="3h", retention=explicit),
        background=False,
    )
    table.start()
    try:
        assert table.snapshots is not None
        assert table.snapshots.retention == explicit
    finally:
        table.close(checkpoint=False)

    proc = Processor(
        "tally",
        inputs=[topic],
        bootstrap_servers=kafka.bootstrap,
        checkpoints=CheckpointOptions(str(tmp_path / "c"), interval="2h"),
        stores=["counts"],
    )

    @proc.handler
    def count(record: object, ctx: object) -> None:  # never called: the topic is empty
        raise AssertionError(record)

    proc.start()
    try:
        snapshots = proc.task.snapshots
        assert snapshots is not None
        assert snapshots.retention is not None
        assert snapshots.retention.grace == timedelta(hours=4)
    finally:
        proc.close(checkpoint=False)
