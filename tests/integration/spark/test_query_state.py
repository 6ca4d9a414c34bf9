"""statesnap's offsets rule Spark's streaming state (issue: one system, two engines, item 7).

Proven on the embedded broker (which supports deleting and recreating a topic) with the shared
local Spark session: after the topic *and* the checkpoint store are recreated under the same
names, a materializer restarted on the old Spark streaming state writes a checkpoint within two
intervals without any new record, equal to an independent replay of the new topic.
"""

from __future__ import annotations

import shutil
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from integration.spark.spark_testkit import changelog, digest, replay
from statesnap import CheckpointOptions, Table
from statesnap.blob import open_blob_store
from statesnap.checkpoint import locate_table
from statesnap.durations import parse_duration
from statesnap.errors import TableNotFoundError
from statesnap.spark import materialize_stream


def _newest(url: str, table: str) -> Any:
    try:
        return locate_table(open_blob_store(url), table).latest()
    except TableNotFoundError:
        return None


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _recreate(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result(15)
    _wait(lambda: topic not in admin.list_topics(timeout=5).topics, 15, f"{topic} to go")


def test_stale_spark_state_after_topic_and_store_are_recreated(
    spark: Any, bootstrap: str, produce: Any, tmp_path: Path
) -> None:
    topic = f"recreated-{uuid.uuid4().hex[:8]}"
    url, chk = f"file://{tmp_path}/cp", str(tmp_path / "chk")
    old = produce(topic, changelog(900, partitions=3, keys=100))
    common: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "topic": topic,
        "table": "rt",
        "checkpoint_location": chk,
    }

    def every(interval: str) -> CheckpointOptions:  # a batch every second
        return CheckpointOptions(url, interval=parse_duration(interval), commit_interval=timedelta(seconds=1))

    m = materialize_stream(spark, checkpoints=every("1s"), **common)
    ends = {p: max(d.offset for d in old if d.partition == p) + 1 for p in range(3)}
    _wait(lambda: (n := _newest(url, "rt")) is not None and n.offsets == ends, 90, "the first checkpoint")
    m.stop()

    _recreate(bootstrap, topic)
    shutil.rmtree(tmp_path / "cp")
    new = produce(topic, changelog(150, partitions=3, keys=40, seed=9))  # fewer records than before
    expected = digest(replay(new))

    interval = 3.0
    m = materialize_stream(spark, checkpoints=every(f"{interval}s"), **common)
    try:
        # two intervals once batches run; a busy 2-core machine makes Spark's first batch slow
        def checkpointed() -> bool:
            assert m.query.exception() is None, m.query.exception()  # a failed query fails here
            return _newest(url, "rt") is not None

        _wait(checkpointed, 2 * interval + 180, "a checkpoint of the new topic")
    finally:
        m.stop(checkpoint=False)
    assert list(tmp_path.glob("chk.stale-*")), "the stale Spark state was moved aside, not deleted"
    t = Table(
        topic,
        bootstrap_servers=bootstrap,
        name="rt",
        checkpoints=CheckpointOptions(url, require=True),
        background=False,
    )
    report = t.start()
    try:
        assert report.replayed_records == 0
        assert digest(dict(t.raw_items())) == expected
    finally:
        t.close(checkpoint=False)
