"""``read_table(..., as_of="now")``: the checkpoint plus the topic's tail, as of the call.

Proven on the embedded broker (Tansu, which under-reports high watermarks and reports topic IDs)
with the shared ``local[2]`` session. The ground truth is the producer's delivery reports
replayed in plain Python (``spark_testkit.replay``), never a statesnap reader.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from integration.spark.spark_testkit import Delivered, changelog, digest, replay
from statesnap import Table
from statesnap.errors import ConfigError, TableNotFoundError
from statesnap.spark import read_table

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def _table(df: Any) -> dict[bytes, bytes]:
    rows = df.select("key", "value").collect()
    out = {bytes(r["key"]): bytes(r["value"]) for r in rows}
    assert len(out) == len(rows)  # one row per key
    return out


def _checkpoint(bootstrap: str, topic: str, url: str) -> Any:
    t = Table(topic, bootstrap_servers=bootstrap, checkpoints=url, background=False)
    t.start()
    manifest = t.checkpoint()
    t.close(checkpoint=False)
    assert manifest is not None
    return manifest


def test_as_of_now_is_the_checkpoint_plus_the_tail(
    spark: Any, bootstrap: str, topic_name: str, produce: Any, tmp_path: Any
) -> None:
    url = f"file://{tmp_path}/cp"
    history: list[Delivered] = produce(topic_name, changelog(1500, partitions=3, keys=120, tombstone_every=5))
    manifest = _checkpoint(bootstrap, topic_name, url)
    at_checkpoint = replay(history)
    assert manifest.offsets == {p: 1 + max(d.offset for d in history if d.partition == p) for p in range(3)}

    # Updates and deletes of checkpointed keys, keys the checkpoint never saw (some deleted again
    # in the tail), a keyless record (skipped by tables), all in multi-record batches.
    tail: list[Delivered] = produce(
        topic_name,
        [*changelog(700, partitions=3, keys=200, seed=5, tombstone_every=4), (1, None, b"keyless")],
    )
    expected = replay(history + tail)
    tail_keys = {d.key for d in tail if d.key is not None}
    assert {k for k in at_checkpoint if k not in expected}, "the tail must delete checkpointed keys"
    assert {k for k in expected if k not in at_checkpoint}, "the tail must add new keys"
    assert {k for k in tail_keys if k not in at_checkpoint and k not in expected}, "new keys deleted again"
    assert any(expected.get(k) not in (None, v) for k, v in at_checkpoint.items()), "updates"

    now = read_table(spark, url, topic_name, as_of="now", bootstrap_servers=bootstrap)
    assert now.columns == ["key", "value", "offset", "timestamp", "partition"]
    assert digest(_table(now)) == digest(expected)
    newest = {d.key: d for d in history + tail if d.key is not None}
    for r in now.select("key", "offset", "partition").collect():
        d = newest[bytes(r["key"])]
        assert (r["offset"], r["partition"]) == (d.offset, d.partition)

    # The default is still the checkpoint, read without Kafka.
    assert digest(_table(read_table(spark, url, topic_name))) == digest(at_checkpoint)

    # The ends were fixed when read_table was called: later records do not move the DataFrame;
    # a new call sees them.
    later = produce(topic_name, [(0, b"key-0", b"later"), (2, b"late-key", b"x")])
    assert digest(_table(now)) == digest(expected)
    again = read_table(spark, url, topic_name, as_of="now", bootstrap_servers=bootstrap)
    assert digest(_table(again)) == digest(replay(history + tail + later))

    with pytest.raises(ConfigError, match=r"as_of='now'.*drop generation"):
        read_table(
            spark, url, topic_name, generation=manifest.generation, as_of="now", bootstrap_servers=bootstrap
        )
    with pytest.raises(ConfigError, match="bootstrap_servers is required"):
        read_table(spark, url, topic_name, as_of="now")
    with pytest.raises(ConfigError, match="as_of='now' only"):
        read_table(spark, url, topic_name, bootstrap_servers=bootstrap)
    with pytest.raises(ConfigError, match="as_of='yesterday'"):
        read_table(spark, url, topic_name, as_of="yesterday")


def test_as_of_now_without_a_checkpoint_replays_the_whole_topic(
    spark: Any, bootstrap: str, topic_name: str, produce: Any, tmp_path: Any
) -> None:
    """No checkpoint at all is not an error for ``as_of="now"``: like a ``Table`` restore, the
    topic is replayed from the beginning (the default ``as_of`` has nothing to read and says so)."""
    url = f"file://{tmp_path}/empty"
    records = produce(topic_name, changelog(900, partitions=2, keys=70, tombstone_every=3))
    with pytest.raises(TableNotFoundError):
        read_table(spark, url, "orders")
    df = read_table(spark, url, "orders", as_of="now", bootstrap_servers=bootstrap, topic=topic_name)
    assert digest(_table(df)) == digest(replay(records))


def test_as_of_now_never_merges_a_checkpoint_of_a_deleted_topic(
    spark: Any, bootstrap: str, topic_name: str, produce: Any, tmp_path: Any
) -> None:
    """A checkpoint of the topic's previous incarnation is skipped, as a restore skips it (the
    topic ID changed), even though the new topic has grown past the old offsets: the result is a
    replay of the new topic alone, never a mix."""
    url = f"file://{tmp_path}/cp"
    old = produce(topic_name, [(i % 2, b"old-%d" % (i % 50), b"v%d" % i) for i in range(200)])
    manifest = _checkpoint(bootstrap, topic_name, url)
    assert manifest.topic_id

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic_name])[topic_name].result(15)
    deadline = time.monotonic() + 15
    while topic_name in admin.list_topics(timeout=5).topics:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    new = produce(topic_name, [(i % 2, b"new-%d" % (i % 40), b"w%d" % i) for i in range(400)])

    df = read_table(spark, url, topic_name, as_of="now", bootstrap_servers=bootstrap)
    assert digest(_table(df)) == digest(replay(new))
    # as_of="checkpoint" reads the files as they are: the old incarnation's table.
    assert digest(_table(read_table(spark, url, topic_name))) == digest(replay(old))
