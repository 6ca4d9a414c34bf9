"""Spark's Kafka source options on ``statesnap-kafka``, through a real Spark session and broker.

Ground truth is what the producer's delivery reports say was written. Each test says which of
Spark's Kafka-source behaviours it proves; where the dev broker cannot show a behaviour
(timestamps: it answers offset 0 to every ListOffsets-by-timestamp request; retention: it never
deletes), the mapping is proven in tests/unit/test_spark_options.py against a precise fake and
here only the wiring through Spark and the broker's actual answer; the timestamp options against a
broker that answers them are proven on Apache Kafka in tests/integration/apache/test_spark_source.py.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from statesnap.devstack import EmbeddedBroker
from statesnap.kafka.admin import KafkaAdmin
from statesnap.kafka.config import KafkaSettings
from statesnap.spark.kafka_io import OffsetOracle
from statesnap.spark.option_parsing import parse_options
from statesnap.spark.source import SPARK_SCHEMA_WITH_HEADERS

pytestmark = [pytest.mark.spark, pytest.mark.integration]

Row = tuple[str, int, int, bytes | None, bytes | None]
Header = list[tuple[str, bytes | None]] | None


def produce(
    bootstrap: str,
    topic: str,
    records: Sequence[tuple[int, bytes | None, bytes | None]],
    *,
    partitions: int = 2,
    headers: Sequence[Header] | None = None,
) -> dict[Row, Header]:
    """Write *records* (partition, key, value); returns every delivered record → its headers."""
    KafkaAdmin(KafkaSettings(bootstrap)).create_topic(topic, partitions)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": False})
    out: dict[Row, Header] = {}
    errors: list[str] = []
    for i, (p, key, value) in enumerate(records):
        sent = headers[i] if headers else None

        def on_delivery(err: Any, msg: Any, sent: Header = sent) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                out[(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value())] = sent

        producer.produce(
            topic,
            value,
            key,
            partition=p,
            headers=None if sent is None else list(sent),
            on_delivery=on_delivery,
        )
    assert producer.flush(30) == 0
    assert not errors, errors
    assert len(out) == len(records)
    return out


def rows(df: Any) -> set[Row]:
    return {(r["topic"], r["partition"], r["offset"], r["key"], r["value"]) for r in df.collect()}


def read(spark: Any, bootstrap: str, **options: str) -> Any:
    return (
        spark.read.format("statesnap-kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .options(**options)
        .load()
    )


def test_several_topics_pattern_assign_json_offsets_and_headers(
    spark: Any, bootstrap: str, topic_name: str
) -> None:
    """``subscribe`` with a topic list, ``subscribePattern`` (whole-name Java regex match),
    ``assign``, ``startingOffsets``/``endingOffsets`` as JSON per topic and partition (-2
    earliest, -1 latest), ``minPartitions`` across topics, and ``includeHeaders`` with Spark's
    column type — record for record against the delivery reports."""
    a, b, other = f"{topic_name}-a", f"{topic_name}-b", f"{topic_name}-other"
    with_headers: list[Header] = [[("h", b"%d" % i), ("n", None)] if i % 3 else None for i in range(90)]
    written_a = produce(
        bootstrap, a, [(i % 2, b"k%d" % i, b"a%d" % i) for i in range(90)], headers=with_headers
    )
    written_b = produce(bootstrap, b, [(i % 3, b"k%d" % i, b"b%d" % i) for i in range(60)], partitions=3)
    produce(bootstrap, other, [(0, b"x", b"y")], partitions=1)

    both = set(written_a) | set(written_b)
    assert rows(read(spark, bootstrap, subscribe=f"{a},{b}")) == both
    df = read(spark, bootstrap, subscribePattern=f"{re.escape(topic_name)}-(a|b)", minPartitions="7")
    assert rows(df) == both
    assert df.rdd.getNumPartitions() >= 7
    assigned = read(spark, bootstrap, assign=json.dumps({a: [1], b: [0, 2]}))
    assert rows(assigned) == {r for r in both if (r[0], r[1]) in {(a, 1), (b, 0), (b, 2)}}

    bounded = read(
        spark,
        bootstrap,
        subscribe=f"{a},{b}",
        startingOffsets=json.dumps({a: {"0": 5, "1": -2}, b: {"0": -2, "1": 3, "2": 19}}),
        endingOffsets=json.dumps({a: {"0": 40, "1": -1}, b: {"0": 2, "1": -1, "2": -1}}),
    )
    bounds = {(a, 0): (5, 40), (a, 1): (0, 45), (b, 0): (0, 2), (b, 1): (3, 20), (b, 2): (19, 20)}
    assert rows(bounded) == {r for r in both if bounds[(r[0], r[1])][0] <= r[2] < bounds[(r[0], r[1])][1]}

    headed = read(spark, bootstrap, subscribe=a, includeHeaders="true")
    assert headed.schema == SPARK_SCHEMA_WITH_HEADERS
    ddl = "array<struct<key:string,value:binary>>"
    assert headed.schema["headers"].dataType.simpleString() == ddl
    got = {
        (r["topic"], r["partition"], r["offset"], r["key"], r["value"]): (
            None if r["headers"] is None else [(h["key"], h["value"]) for h in r["headers"]]
        )
        for r in headed.collect()
    }
    assert got == written_a
    assert sum(h is None for h in got.values()) == 30  # no headers → null, as Spark gives it


def test_timestamps_use_the_brokers_answer(spark: Any, broker: EmbeddedBroker, topic_name: str) -> None:
    """The timestamp options are resolved by a ListOffsets-by-timestamp request. A real Kafka
    answers "first offset at or after T" (proven on Apache Kafka by
    tests/integration/apache/test_spark_source.py); the dev broker answers 0 for every T, which
    makes the broker's answer visible. So here, on Tansu, ``endingTimestamp`` (any T) ends every
    partition at 0 — an empty read, proving the broker's answer (not ``latest``) bounds the read —
    and ``startingTimestamp`` starts at 0; partitions a ``*OffsetsByTimestamp`` map leaves out
    keep the default. The mapping of T to offsets is proven in tests/unit/test_spark_options.py."""
    bootstrap = broker.bootstrap_servers
    written = produce(bootstrap, topic_name, [(i % 2, b"k%d" % i, b"v%d" % i) for i in range(40)])
    now = str(int(time.time() * 1000))
    assert rows(read(spark, bootstrap, subscribe=topic_name, endingTimestamp=now)) == set()
    assert rows(read(spark, bootstrap, subscribe=topic_name, startingTimestamp=now)) == set(written)
    per = json.dumps({topic_name: {"1": int(now)}})
    only_0 = read(spark, bootstrap, subscribe=topic_name, endingOffsetsByTimestamp=per)
    assert rows(only_0) == {r for r in written if r[1] == 0}


def _stream(spark: Any, bootstrap: str, checkpoint: Path, sink: Any, **options: str) -> Any:
    df = spark.readStream.format("statesnap-kafka").option("kafka.bootstrap.servers", bootstrap)
    df = df.option("startingOffsets", "earliest").options(**options).load()
    writer = df.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
    return writer.trigger(availableNow=True).start()


def test_stream_over_a_pattern_picks_up_new_topics(
    spark: Any, bootstrap: str, topic_name: str, tmp_path: Path
) -> None:
    """A ``subscribePattern`` stream reads a topic created after it started from its earliest
    offset, as Spark's source does with newly discovered partitions; nothing is read twice."""
    seen: list[Row] = []

    def sink(df: Any, _batch: int) -> None:
        seen.extend(rows(df))

    first = produce(bootstrap, f"{topic_name}-1", [(i % 2, b"k%d" % i, b"1-%d" % i) for i in range(50)])
    pattern = f"{re.escape(topic_name)}-\\d+"
    _stream(spark, bootstrap, tmp_path / "chk", sink, subscribePattern=pattern).awaitTermination()
    later = produce(
        bootstrap, f"{topic_name}-2", [(i % 3, b"k%d" % i, b"2-%d" % i) for i in range(30)], partitions=3
    )
    _stream(spark, bootstrap, tmp_path / "chk", sink, subscribePattern=pattern).awaitTermination()
    assert sorted(seen) == sorted(set(first) | set(later))


def test_recreated_topic_fails_the_stream_unless_fail_on_data_loss_is_false(
    spark: Any, bootstrap: str, topic_name: str, tmp_path: Path
) -> None:
    """Spark's ``failOnDataLoss``: a stream restarted after its topic was deleted fails ("are
    gone"); after it was recreated with fewer records than the checkpoint's offsets it fails
    ("recreated") instead of stalling and then skipping the new topic's first offsets. With
    ``failOnDataLoss=false`` it warns and reads the new topic from its earliest offset."""
    seen: list[Row] = []

    def sink(df: Any, _batch: int) -> None:
        seen.extend(rows(df))

    chk = tmp_path / "chk"
    old = produce(bootstrap, topic_name, [(i % 2, b"k%d" % i, b"old%d" % i) for i in range(300)])
    _stream(spark, bootstrap, chk, sink, subscribe=topic_name).awaitTermination()
    assert sorted(seen) == sorted(old)

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic_name], operation_timeout=15)[topic_name].result(15)
    with pytest.raises(Exception, match=r"DataLossError.*are gone"):
        _stream(spark, bootstrap, chk, sink, subscribe=topic_name).awaitTermination()

    new = produce(bootstrap, topic_name, [(i % 2, b"k%d" % i, b"new%d" % i) for i in range(20)])
    with pytest.raises(
        Exception, match=r"DataLossError.*at offset 150 but the partition ends at 10.*recreated"
    ):
        _stream(spark, bootstrap, chk, sink, subscribe=topic_name).awaitTermination()
    assert sorted(seen) == sorted(old)  # nothing read from the new topic

    _stream(spark, bootstrap, chk, sink, subscribe=topic_name, failOnDataLoss="false").awaitTermination()
    assert sorted(seen) == sorted(set(old) | set(new))  # all of the new topic, from offset 0


def test_min_offsets_per_trigger_waits_until_max_trigger_delay(
    spark: Any, bootstrap: str, topic_name: str, tmp_path: Path
) -> None:
    """``minOffsetsPerTrigger``: triggers with fewer new offsets are skipped until
    ``maxTriggerDelay`` has passed since the last batch; then the batch runs with what is there."""
    batches: list[tuple[float, int]] = []
    started = time.monotonic()

    def sink(df: Any, _batch: int) -> None:
        count = df.count()
        if count:  # Spark runs a query's first batch even when it is empty
            batches.append((time.monotonic() - started, count))

    produce(bootstrap, topic_name, [(i % 2, b"k%d" % i, b"v%d" % i) for i in range(10)])
    df = spark.readStream.format("statesnap-kafka").options(
        **{
            "kafka.bootstrap.servers": bootstrap,
            "subscribe": topic_name,
            "startingOffsets": "earliest",
            "minOffsetsPerTrigger": "50",
            "maxTriggerDelay": "8s",
        }
    )
    query = (
        df.load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 90
        while not batches:
            assert time.monotonic() < deadline, "no batch within 90 s"
            time.sleep(0.1)
        assert batches[0][0] >= 8.0  # held back for maxTriggerDelay, though 10 records were there
        assert batches[0][1] == 10
        produce(bootstrap, topic_name, [(i % 2, b"k%d" % i, b"w%d" % i) for i in range(120)])
        while sum(n for _t, n in batches) < 130:
            assert time.monotonic() < deadline, f"not all records read: {batches}"
            time.sleep(0.1)
        assert all(n >= 50 for _t, n in batches[1:-1])  # only the last may be a delayed remainder
    finally:
        query.stop()


def test_java_client_settings_are_translated_or_refused_at_load(
    spark: Any, bootstrap: str, topic_name: str, tmp_path: Path
) -> None:
    """Java-client settings fail at ``load()`` — not at the first action inside a task — with one
    line that names the option and says what to write (Spark's own words where Spark refuses the
    setting too), never showing a secret. A PLAIN JAAS config becomes librdkafka credentials."""
    produce(bootstrap, topic_name, [(0, b"k", b"v")], partitions=1)
    base = {"kafka.bootstrap.servers": bootstrap, "subscribe": topic_name}
    jks = tmp_path / "trust.jks"
    jks.write_bytes(b"\xfe\xed\xfe\xed" + b"\x00" * 60)
    cases = [
        (
            {"kafka.key.deserializer": "org.apache.kafka.common.serialization.StringDeserializer"},
            r"option kafka\.key\.deserializer: Kafka option 'key\.deserializer' is not supported as keys",
        ),
        (
            {"kafka.ssl.truststore.location": str(jks), "kafka.ssl.truststore.password": "s3cret-pw"},
            r"option kafka\.ssl\.truststore\.location: .* JKS truststore.*keytool -list -rfc",
        ),
        (
            {"kafka.sasl.jaas.config": 'x.OAuthBearerLoginModule required clientSecret="s3cret-pw";'},
            r"option kafka\.sasl\.jaas\.config: OAuthBearerLoginModule.*oauthbearer\.method=oidc",
        ),
        (
            {"kafka.max.poll.interval.ms": "1"},
            r"option kafka\.max\.poll\.interval\.ms: librdkafka refuses it",
        ),
        (
            {"kafka.sasl.login.refresh.buffer.seconds": "300"},
            r"kafka\.sasl\.login\.refresh\.buffer\.seconds is not a setting",
        ),
    ]
    for extra, message in cases:
        loader = spark.read.format("statesnap-kafka").options(**base, **extra)
        with pytest.raises(Exception, match=message) as info:
            loader.load()  # load(), not an action
        assert "s3cret-pw" not in str(info.value)
        assert "KafkaError{" not in str(info.value)  # no raw librdkafka error

    jaas = (
        'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="s3cret-pw";'
    )
    opts = parse_options({**base, "kafka.sasl.jaas.config": jaas}, streaming=False)
    assert (opts.kafka_config["sasl.username"], opts.kafka_config["sasl.mechanism"]) == ("u", "PLAIN")
    # Accepted without effect (no consumer group is joined), as documented.
    accepted = {
        "groupIdPrefix": "etl",
        "kafka.group.id": f"g-{uuid.uuid4().hex[:6]}",
        "kafka.max.poll.records": "10",
    }
    assert len(read(spark, bootstrap, subscribe=topic_name, **accepted).collect()) == 1


def test_a_typo_at_load_suggests_the_documented_option_name(spark: Any, topic_name: str) -> None:
    """Through a real Spark ``load()``: Spark lower-cases option names on their way to a Python
    data source, so the one-line answer to ``startingOffset`` names ``startingOffsets`` as the
    docs spell it. No broker is contacted (the options fail first)."""
    loader = (
        spark.read.format("statesnap-kafka")
        .option("kafka.bootstrap.servers", "127.0.0.1:9")
        .option("subscribe", topic_name)
        .option("startingOffset", "earliest")
    )
    with pytest.raises(Exception, match=r"startingoffset \(Spark passes option names lower-cased\)") as info:
        loader.load()
    assert "did you mean startingOffsets?" in str(info.value)


def test_oracle_end_goes_back_when_a_topic_is_recreated(bootstrap: str, topic_name: str) -> None:
    """A running query's end probe starts where it saw the end last; on the dev broker a probe
    past the end of a recreated (shorter) partition gets no answer at all. The oracle probes again
    from the reported end and returns the new, smaller end instead of hanging."""
    produce(bootstrap, topic_name, [(0, b"k%d" % i, b"v") for i in range(30)], partitions=1)
    opts = parse_options(
        {"kafka.bootstrap.servers": bootstrap, "subscribe": topic_name, "metadataTimeoutMs": "8000"},
        streaming=True,
    )
    oracle = OffsetOracle(opts)
    try:
        assert oracle.latest([0]) == {0: 30}
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.delete_topics([topic_name], operation_timeout=15)[topic_name].result(15)
        produce(bootstrap, topic_name, [(0, b"k%d" % i, b"v") for i in range(5)], partitions=1)
        began = time.monotonic()
        assert oracle.latest_of([(topic_name, 0)]) == {(topic_name, 0): 5}
        assert time.monotonic() - began < 8
    finally:
        oracle.close()
