"""The Table façade on the real broker: reads, background consumption, close, typed errors,
partitions added after a checkpoint."""

from __future__ import annotations

import json
import logging
import shutil
import time
import uuid
from pathlib import Path
from typing import Any, Literal

import pytest

from statesnap import CheckpointOptions, JsonSerde, Table
from statesnap.checkpoint import CheckpointRepository
from statesnap.errors import (
    BrokerUnavailableError,
    ConfigError,
    TableStateError,
    TopicNotFoundError,
)
from statesnap.kafka.admin import KafkaAdmin
from statesnap.kafka.config import KafkaSettings

pytestmark = pytest.mark.integration


def _json(obj: object) -> bytes:
    return JsonSerde().serialize(obj)


def test_reads_with_json_serde(kafka: Any) -> None:
    topic = kafka.create_topic(f"api-{uuid.uuid4().hex[:12]}", 2)
    kafka.produce(
        topic,
        [
            (0, b"alice", _json({"balance": 10})),
            (1, b"bob", _json({"balance": 5})),
            (0, b"alice", _json({"balance": 12, "tags": ["vip"]})),
            (1, b"carol", _json([1, 2])),
            (1, b"carol", None),
            (0, b"dave", _json(None)),  # JSON null is a value, not a tombstone
        ],
    )
    t = Table(
        topic, bootstrap_servers=kafka.bootstrap, key_serde="string", value_serde="json", background=False
    )
    with pytest.raises(TableStateError, match="cannot get: table is new"):
        t.get("alice")
    report = t.start()
    try:
        assert report.replayed_records == 6
        assert t.caught_up
        assert t.get("alice") == {"balance": 12, "tags": ["vip"]}
        assert t["bob"] == {"balance": 5}
        assert t.get("carol") is None
        assert t.get("carol", "gone") == "gone"
        assert t.get("dave", "absent") is None
        assert "alice" in t
        assert "carol" not in t
        assert "dave" in t
        with pytest.raises(KeyError):
            t["carol"]
        assert len(t) == 3
        assert dict(t.items()) == {
            "alice": {"balance": 12, "tags": ["vip"]},
            "bob": {"balance": 5},
            "dave": None,
        }
        assert dict(t.raw_items())[b"bob"] == b'{"balance":5}'
        assert t.offsets == {0: 3, 1: 3}
    finally:
        t.close()
    with pytest.raises(TableStateError):
        t.get("alice")
    t.close()  # idempotent


def test_background_mode_keeps_consuming(kafka: Any) -> None:
    topic = kafka.create_topic(f"bg-{uuid.uuid4().hex[:12]}", 2)
    kafka.produce(topic, [(0, b"a", b"1")])
    t = Table(topic, bootstrap_servers=kafka.bootstrap, key_serde="string", value_serde="string")
    t.start()
    try:
        assert t.get("a") == "1"
        with pytest.raises(TableStateError, match="background"):
            t.poll()
        kafka.produce(topic, [(1, b"b", b"2"), (0, b"a", b"3")])
        kafka.wait_for(lambda: t.get("b") == "2" and t.get("a") == "3", what="new records")
        kafka.produce(topic, [(0, b"a", None)])
        kafka.wait_for(lambda: "a" not in t, what="the tombstone")
        assert dict(t.items()) == {"b": "2"}
        assert t.offsets == {0: 3, 1: 1}
    finally:
        t.close()


@pytest.mark.parametrize("store", ["memory", "columnar"])
def test_a_table_without_checkpoints_keeps_no_change_set(
    kafka: Any, store: Literal["memory", "columnar"]
) -> None:
    """No checkpoint will ever take its changes: its commit points drop them (a tailing replica
    would otherwise hold a second copy of every key it saw change), and the table stays exact."""
    topic = kafka.create_topic(f"nock-{uuid.uuid4().hex[:12]}", 2)
    records = [(i % 2, b"k%d" % (i % 40), None if i % 7 == 0 else b"v%d" % i) for i in range(300)]
    kafka.produce(topic, records)
    t = Table(topic, bootstrap_servers=kafka.bootstrap, background=False, store=store)
    t.start()
    try:
        kafka.produce(topic, [(0, b"late", b"x")])
        kafka.wait_for(lambda: t.poll(0.1) >= 0 and t.get_raw(b"late") == b"x", what="the late record")
        t.commit()  # a commit point after the last batch
        assert t.store.changes() == {}
        truth = kafka.truth(kafka.read_all(topic, range(2)))
        assert dict(t.raw_items()) == truth
    finally:
        t.close()


def test_close_writes_a_final_checkpoint(kafka: Any, tmp_path: Path) -> None:
    topic = kafka.create_topic(f"close-{uuid.uuid4().hex[:12]}", 2)
    kafka.produce(topic, [(0, b"a", b"1"), (1, b"b", b"2")])
    url = (tmp_path / "cp").as_uri()
    t = Table(
        topic,
        bootstrap_servers=kafka.bootstrap,
        checkpoints=CheckpointOptions(url, interval="1h", commit_interval="1h"),
    )
    t.start()
    produced = kafka.produce(topic, [(0, b"a", b"3"), (1, b"c", b"4"), (1, b"b", None)])
    kafka.wait_for(lambda: t.offsets == {0: 2, 1: 3}, what="the tail")
    repo = t.repo
    assert isinstance(repo, CheckpointRepository)
    assert repo.generations() == []  # the interval never elapsed
    t.close()
    (gen,) = repo.generations()
    m = repo.read_manifest(gen)
    assert m.offsets == {0: 2, 1: 3}
    assert m.topic == topic
    assert m.table == topic
    assert {p.partition for p in produced} == {0, 1}

    again = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)
    report = again.start()
    try:
        assert report.checkpoint == gen
        assert report.replayed_records == 0
        assert report.restored_keys == 2
        assert dict(again.raw_items()) == {b"a": b"3", b"c": b"4"}
    finally:
        again.close(checkpoint=False)
    assert repo.generations() == [gen]  # close(checkpoint=False) wrote nothing


def test_context_manager_checkpoints_only_on_clean_exit(kafka: Any, tmp_path: Path) -> None:
    topic = kafka.create_topic(f"ctx-{uuid.uuid4().hex[:12]}", 1)
    kafka.produce(topic, [(0, b"a", b"1")])
    url = (tmp_path / "cp").as_uri()
    t = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)

    def fail_inside() -> None:
        with t:
            assert t.get(b"a") == b"1"
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fail_inside()
    assert t.repo is not None
    assert t.repo.generations() == []
    with Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False) as t:
        pass
    assert t.repo is not None
    assert len(t.repo.generations()) == 1


def test_missing_topic(kafka: Any) -> None:
    """A typo in the topic name must fail with TopicNotFoundError, and must not create the
    topic as a side effect of asking for its metadata (brokers with
    auto.create.topics.enable=true, Apache Kafka's default and Tansu's behaviour, create a
    topic on a metadata request unless the client says allow_auto_topic_creation=false)."""
    missing = f"missing-{uuid.uuid4().hex[:12]}"
    t = Table(missing, bootstrap_servers=kafka.bootstrap, background=False, timeout=5)
    with pytest.raises(TopicNotFoundError, match=missing):
        t.start()
    assert not kafka.topic_exists(missing)


def test_create_topic_creates_the_requested_partitions(kafka: Any) -> None:
    """KafkaAdmin.create_topic (used by produce-sample) must create the partition count it was
    asked for, not whatever the broker auto-creates while it checks for existence."""
    name = f"create-{uuid.uuid4().hex[:12]}"
    admin = KafkaAdmin(KafkaSettings(kafka.bootstrap))
    assert admin.create_topic(name, 3) is True
    assert admin.partitions(name) == (0, 1, 2)
    assert admin.create_topic(name, 3) is False


def test_unreachable_broker() -> None:
    t = Table(
        "whatever",
        bootstrap_servers="127.0.0.1:1",
        timeout=2,
        background=False,
        kafka_config={"sasl.password": "hunter2-S3CR3T"},
    )
    with pytest.raises(BrokerUnavailableError, match=r"127\.0\.0\.1:1") as info:
        t.start()
    assert "hunter2-S3CR3T" not in str(info.value)


def test_bad_configuration_fails_before_any_io() -> None:
    with pytest.raises(ConfigError, match="table name"):
        Table("t", bootstrap_servers="127.0.0.1:1", name="a/b")
    with pytest.raises(ConfigError, match="state store"):
        Table("t", bootstrap_servers="127.0.0.1:1", store="redis")  # type: ignore[arg-type]  # the bad input under test
    with pytest.raises(ConfigError, match="duration"):
        Table("t", bootstrap_servers="127.0.0.1:1", checkpoints=CheckpointOptions("/tmp/x", interval="often"))


def test_unknown_partition_is_a_config_error(kafka: Any) -> None:
    topic = kafka.create_topic(f"parts-{uuid.uuid4().hex[:12]}", 2)
    t = Table(topic, bootstrap_servers=kafka.bootstrap, partitions=[1, 5], background=False)
    with pytest.raises(ConfigError, match=r"\[5\]"):
        t.start()


def test_partitions_added_after_a_checkpoint_are_replayed_from_the_beginning(
    kafka: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kafka behaviour: CreatePartitions adds empty partitions to a live topic and producers
    start writing to them; a checkpoint taken before knows nothing about them. Restore must
    resume the old partitions from the checkpoint and read the new ones from offset 0.

    The dev broker (Tansu) rejects CreatePartitions (UNSUPPORTED_FEATURE, probed below), so the
    "before" topology is a precise fake: while the first table runs, the cluster's metadata
    answer (KafkaAdmin.partitions) reports only partitions 0 and 1 of a 3-partition topic, and
    nothing is produced to partition 2 until after that table's checkpoint; the restoring table
    sees the real metadata (all three partitions). The real growth is proven on Apache Kafka by
    tests/integration/apache/test_partition_growth.py.
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import NewPartitions  # type: ignore[attr-defined]  # re-exported without __all__

    topic = kafka.create_topic(f"grow-{uuid.uuid4().hex[:12]}", 3)
    try:
        kafka.admin.create_partitions([NewPartitions(topic, 4)])[topic].result(10)
        supported = True
    except KafkaException:
        supported = False  # Tansu: UNSUPPORTED_FEATURE
    if supported:  # pragma: no cover - only on brokers implementing KIP-195
        pytest.skip("this broker grows topics for real: tests/integration/apache/test_partition_growth.py")

    url = (tmp_path / "cp").as_uri()
    produced = kafka.produce(topic, [(0, b"a", b"1"), (1, b"b", b"1"), (0, b"c", b"1")])
    real_partitions = KafkaAdmin.partitions
    with monkeypatch.context() as m:
        m.setattr(KafkaAdmin, "partitions", lambda self, name: real_partitions(self, name)[:2])
        old = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)
        old.start()
        assert old.partitions == (0, 1)
        manifest = old.checkpoint()
        old.close(checkpoint=False)
    assert manifest is not None
    assert sorted(manifest.partitions) == [0, 1]

    # "After the partition was added": records arrive on the new partition and the old ones.
    produced += kafka.produce(
        topic, [(2, b"n1", b"new"), (2, b"n2", b"new"), (2, b"n1", None), (2, b"n3", b"x"), (1, b"b", b"2")]
    )
    t = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)
    report = t.start()
    try:
        assert report.checkpoint == manifest.generation
        assert t.partitions == (0, 1, 2)
        assert report.replayed_records == 5  # 4 on the new partition from offset 0, 1 on p1
        assert t.offsets == {0: 2, 1: 2, 2: 4}
        assert dict(t.raw_items()) == kafka.truth(produced)
        m2 = t.checkpoint()
        assert m2 is not None
        assert sorted(m2.partitions) == [0, 1, 2]
    finally:
        t.close(checkpoint=False)


def test_json_helper_matches_the_serde() -> None:
    assert json.loads(_json({"b": 1, "a": 2})) == {"a": 2, "b": 1}


def test_a_checkpoint_interval_below_the_commit_interval_raises_the_commit_cadence(
    kafka: Any, tmp_path: Path
) -> None:
    """``interval="1s"`` with the default 5 s commit interval: checkpoints are taken at commit
    points, so commit points come every second too (before, a following table's first
    checkpoint came only at the 5 s commit point). On the suite's broker."""
    topic = kafka.create_topic(f"t-{uuid.uuid4().hex[:8]}", 1)
    kafka.produce(topic, [(0, b"a", b"1")])
    url = str(tmp_path / "ckpt")
    options = CheckpointOptions(url, interval="1s")
    assert options.commit_every.total_seconds() == 1.0
    assert CheckpointOptions(url, interval="1h").commit_every.total_seconds() == 5.0
    with Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=options) as t:
        assert t.commit_interval.total_seconds() == 1.0
        kafka.produce(topic, [(0, b"b", b"2")])
        deadline = time.monotonic() + 4.0  # below the 5 s commit interval
        repos = []
        while time.monotonic() < deadline:
            repos = list(tmp_path.glob("ckpt/*/snapshots/*.json"))
            if repos:
                break
            time.sleep(0.1)
        assert repos, "no checkpoint within 4 s of a 1 s checkpoint interval"


def test_a_checkpoint_that_keeps_failing_is_said_once_then_once_when_it_works(
    kafka: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A store that cannot take the checkpoint (here the data directory is a file, as a full disk
    or a store out of reach fails every write) is retried at every commit point; that was one
    warning line each time (123 lines in 26 s for a full disk). Now: one line, then one when
    checkpoints work again. On the suite's broker; the failure is a real filesystem error."""
    topic = kafka.create_topic(f"t-{uuid.uuid4().hex[:8]}", 1)
    kafka.produce(topic, [(0, b"a", b"1")])
    url = tmp_path / "ckpt"
    options = CheckpointOptions(str(url), interval="0.1s")
    with (
        caplog.at_level(logging.WARNING, logger="statesnap.python.consuming"),
        Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=options) as t,
    ):
        (table_dir,) = url.iterdir()
        data = table_dir / "data"
        shutil.rmtree(data, ignore_errors=True)
        data.write_text("not a directory")
        for i in range(30):  # some 30 commit points that each try a checkpoint
            kafka.produce(topic, [(0, b"k%d" % i, b"v")])
            time.sleep(0.1)
        data.unlink()
        kafka.produce(topic, [(0, b"z", b"v")])
        deadline = time.monotonic() + 10
        while not any("work again" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "checkpoints did not work again"
            time.sleep(0.05)
        deadline = time.monotonic() + 10
        while t.get(b"z") != b"v":  # it consumed on through the failures
            assert time.monotonic() < deadline, "the table stopped consuming"
            time.sleep(0.05)
    said = [r.getMessage() for r in caplog.records if r.name == "statesnap.python.consuming"]
    assert len(said) == 2, said
    assert "checkpoint failed; it keeps consuming and retries at each commit point" in said[0]
    assert "commit points work again (after " in said[1]
