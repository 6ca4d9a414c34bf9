"""The ``statesnap-kafka`` source against a real broker, checked record by record.

Ground truth is the producer's delivery reports. The dev broker under-reports high watermarks
whenever the last record batch holds several records (the producer lingers to make sure it
does), so these tests also prove that the source finds the true end by partition EOF.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from integration.spark.spark_testkit import Delivered
from statesnap.spark import SPARK_SCHEMA

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def _records(rows: list[Any]) -> set[tuple[int, int, bytes | None, bytes | None]]:
    return {(r["partition"], r["offset"], r["key"], r["value"]) for r in rows}


def _truth(delivered: list[Delivered]) -> set[tuple[int, int, bytes | None, bytes | None]]:
    return {(d.partition, d.offset, d.key, d.value) for d in delivered}


def _kafka(spark: Any, bootstrap: str, topic: str, **options: str) -> Any:
    reader = spark.read.format("statesnap-kafka").option("kafka.bootstrap.servers", bootstrap)
    return reader.option("subscribe", topic).options(**options).load()


def test_batch_read_returns_exactly_the_offset_ranges(
    spark: Any, bootstrap: str, topic_name: str, produce: Any
) -> None:
    records: list[tuple[int, bytes | None, bytes | None]] = [
        (i % 3, b"k%d" % (i % 17), None if i % 11 == 0 else b"v%d" % i) for i in range(600)
    ]
    records += [(0, None, b"no-key"), (1, b"", b"empty-key"), (2, b"k-empty-value", b"")]
    delivered = produce(topic_name, records)

    df = _kafka(spark, bootstrap, topic_name)
    assert df.schema == SPARK_SCHEMA
    rows = df.collect()
    assert len(rows) == len(delivered)
    assert _records(rows) == _truth(delivered)
    assert {r["topic"] for r in rows} == {topic_name}
    assert {r["timestampType"] for r in rows} == {0}  # CreateTime, as Spark's Kafka source says
    assert all(r["timestamp"] is not None for r in rows)

    # Explicit ranges in Spark's JSON format (-2 earliest, -1 latest), split over many tasks.
    start = {"0": 5, "1": -2, "2": 100}
    end = {"0": 50, "1": -1, "2": 101}
    df = _kafka(
        spark,
        bootstrap,
        topic_name,
        minPartitions="7",
        startingOffsets=json.dumps({topic_name: start}),
        endingOffsets=json.dumps({topic_name: end}),
    )
    assert df.rdd.getNumPartitions() >= 7
    wanted = {
        d
        for d in _truth(delivered)
        if (d[0] == 0 and 5 <= d[1] < 50) or d[0] == 1 or (d[0] == 2 and d[1] == 100)
    }
    assert _records(df.collect()) == wanted


def test_stream_resumes_across_stop_restart_and_failed_batch(
    spark: Any, bootstrap: str, topic_name: str, produce: Any, tmp_path: Any
) -> None:
    """Spark re-runs a failed batch with the same id and the same offsets; a query stopped and
    restarted on the same checkpoint continues where it left off."""
    first = produce(topic_name, [(i % 2, b"k%d" % i, b"a%d" % i) for i in range(300)])
    batches: dict[int, list[Any]] = {}
    fail_on: set[int] = set()

    def sink(df: Any, batch_id: int) -> None:
        rows = df.collect()
        if batch_id in fail_on:
            fail_on.discard(batch_id)
            raise RuntimeError(f"injected failure in batch {batch_id}")
        batches[batch_id] = rows  # a re-run of the same batch id replaces, never appends

    def run(trigger: dict[str, Any] | None = None, **options: str) -> Any:
        stream = (
            spark.readStream.format("statesnap-kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic_name)
            .option("startingOffsets", "earliest")
            .options(**options)
            .load()
        )
        return (
            stream.writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / "chk"))
            .trigger(**(trigger or {"availableNow": True}))
            .start()
        )

    run(maxOffsetsPerTrigger="120").awaitTermination()
    assert len(batches) >= 3  # 300 records, at most 120 per batch
    got = [r for rows in batches.values() for r in rows]
    assert len(got) == len(first)
    assert _records(got) == _truth(first)

    second = produce(topic_name, [(i % 2, b"k%d" % i, b"b%d" % i) for i in range(200)])
    fail_on.add(max(batches) + 1)
    query = run()
    with pytest.raises(Exception, match="injected failure"):
        query.awaitTermination()
    run().awaitTermination()  # restart: the failed batch runs again
    got = [r for rows in batches.values() for r in rows]
    assert len(got) == len(first) + len(second)
    assert _records(got) == _truth(first) | _truth(second)

    # A continuously running query stopped in the middle of a stream of batches.
    third = produce(topic_name, [(i % 2, b"k%d" % i, b"c%d" % i) for i in range(400)])
    known = max(batches)
    query = run({"processingTime": "0.2 seconds"}, maxOffsetsPerTrigger="50")
    deadline = time.monotonic() + 60
    while max(batches) < known + 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    query.stop()
    fourth = produce(topic_name, [(i % 2, b"k%d" % i, b"d%d" % i) for i in range(100)])
    run().awaitTermination()
    got = [r for rows in batches.values() for r in rows]
    everything = _truth(first) | _truth(second) | _truth(third) | _truth(fourth)
    assert len(got) == len(everything)  # nothing read twice
    assert _records(got) == everything  # nothing missed


def test_bad_options_fail_in_spark_naming_the_option(
    spark: Any, bootstrap: str, topic_name: str, produce: Any
) -> None:
    """Through Spark the error type is wrapped, but its name and message survive."""
    produce(topic_name, [(0, b"k", b"v")])
    with pytest.raises(Exception, match=r"ConfigError.*startingOffsets"):
        _kafka(spark, bootstrap, topic_name, startingOffsets="{oops").collect()
    with pytest.raises(Exception, match=r"TopicNotFoundError.*subscribe"):
        _kafka(spark, bootstrap, "no-such-topic-" + topic_name).collect()
    with pytest.raises(Exception, match=r"BrokerUnavailableError.*kafka\.bootstrap\.servers"):
        _kafka(spark, "127.0.0.1:9", topic_name, metadataTimeoutMs="1500").collect()
    with pytest.raises(Exception, match=r"ConfigError.*endingOffsets.*beyond"):
        _kafka(spark, bootstrap, topic_name, endingOffsets=json.dumps({topic_name: {"0": 99}})).collect()
