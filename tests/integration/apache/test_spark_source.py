"""``format("statesnap-kafka")`` on Apache Kafka: timestamp options on real ``offsets_for_times``
answers, and the same rows as Spark's own ``format("kafka")``.

Tansu answers offset 0 to every ListOffsets-by-timestamp request, so the timestamp options were
proven only against a fake of Kafka's answers (tests/unit/test_spark_options.py). Apache Kafka
4.1.1 answers them for real: records produced with explicit CreateTime timestamps (one out of
order, as clients may write them) are read with each option and checked against what the
producer sent — Kafka's rule: a timestamp maps to the first offset whose timestamp is at or
after it. Then every such read, a whole-topic read with headers, and JSON offsets are run with
Spark's own source too, and the rows must be identical, column for column.

Spark's connector (``spark-sql-kafka-0-10``; Maven Central serves 4.2.0, not the installed 4.3.0)
comes from benchmarks/peers/spark-kafka/target/lib, where benchmarks/kafka_sources.py fetches
it; it is added to the one shared test SparkSession with ``ADD JAR``.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

# The Spark tests' session fixture; its conftest imports its testkit as a top-level module.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "spark"))
from confluent_kafka import Producer

from integration.conftest import KafkaTool
from integration.spark.conftest import spark

pytestmark = [pytest.mark.spark, pytest.mark.integration]

__all__ = ["spark"]

CONNECTOR = Path(__file__).resolve().parents[3] / "benchmarks" / "peers" / "spark-kafka" / "target" / "lib"
#: The connector and what it needs beyond PySpark's own jars (as benchmarks/kafka_sources.py).
NEEDED = (
    "spark-sql-kafka-0-10_2.13-",
    "spark-token-provider-kafka-0-10_2.13-",
    "kafka-clients-",
    "commons-pool2-",
)
PER_PARTITION = 10
#: CreateTime of the records: an hour ago on whole seconds (recent: retention keeps them).
BASE = (int(time.time()) - 3600) * 1000
#: Partition 0's offset 7 is written with this out-of-order timestamp.
OUT_OF_ORDER = BASE + 1500

Row = tuple[Any, ...]


@dataclass(frozen=True)
class Sent:
    """A record as the producer wrote it and the broker acknowledged it."""

    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, str | bytes | None], ...] | None


def _timestamp(partition: int, i: int) -> int:
    """p0 at BASE + i s (offset 7 out of order), p1 half a second later."""
    if partition == 0 and i == 7:
        return OUT_OF_ORDER
    return BASE + i * 1000 + partition * 500


@pytest.fixture(scope="module")
def timed(kafka: KafkaTool) -> tuple[str, list[Sent]]:
    """Two partitions of records with explicit timestamps, headers on some, a tombstone and a
    keyless record among them."""
    topic = kafka.create_topic(f"ts-{uuid.uuid4().hex[:10]}", 2, {"retention.ms": "-1"})
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5})
    sent: list[Sent] = []
    errors: list[str] = []
    for i in range(PER_PARTITION):
        for p in (0, 1):
            key = None if (p, i) == (1, 4) else b"k%d-%d" % (p, i)
            value = None if (p, i) == (0, 3) else b"v%d-%d" % (p, i)
            headers: list[tuple[str, str | bytes | None]] | None = (
                [("h", b"%d" % i), ("h", None)] if i % 3 == 0 else None
            )
            ts = _timestamp(p, i)

            def done(err: Any, msg: Any, ts: int = ts, headers: Any = headers) -> None:
                if err is not None:
                    errors.append(str(err))
                else:
                    hs = None if headers is None else tuple(headers)
                    sent.append(Sent(msg.partition(), msg.offset(), ts, msg.key(), msg.value(), hs))

            producer.produce(topic, value, key, partition=p, timestamp=ts, headers=headers, on_delivery=done)
    assert producer.flush(30) == 0
    assert not errors, errors
    return topic, sorted(sent, key=lambda s: (s.partition, s.offset))


def _first_at_or_after(sent: list[Sent], partition: int, ts: int) -> int | None:
    """Kafka's answer to ListOffsets by timestamp: the first offset whose timestamp is >= ts."""
    return next((s.offset for s in sent if s.partition == partition and s.timestamp >= ts), None)


def _read(spark: Any, fmt: str, bootstrap: str, topic: str, **options: str) -> Any:
    reader = spark.read.format(fmt).option("kafka.bootstrap.servers", bootstrap)
    if "assign" not in options and "subscribePattern" not in options:
        reader = reader.option("subscribe", topic)
    return reader.options(**options).load()


def _rows(df: Any) -> list[Row]:
    """Every column, the timestamp as epoch milliseconds (no session time zone in between)."""
    cols = [c for c in df.columns if c != "timestamp"]
    out = df.selectExpr(*cols, "unix_millis(timestamp) AS ts").collect()
    p = cols.index("partition")
    tagged = cols[0] == "read"
    return sorted((tuple(r) for r in out), key=lambda r: (r[0] if tagged else 0, r[p], r[p + 1]))


def _expected(sent: list[Sent], start: dict[int, int], end: dict[int, int]) -> list[tuple[int, int, int]]:
    """(partition, offset, timestamp) of the records in [start, end) per partition."""
    return sorted(
        (s.partition, s.offset, s.timestamp)
        for s in sent
        if start[s.partition] <= s.offset < end[s.partition]
    )


def _cases(topic: str, sent: list[Sent]) -> dict[str, tuple[dict[str, str], list[tuple[int, int, int]]]]:
    """Options → the (partition, offset, timestamp) rows Kafka's timestamp rule gives. Starting
    and ending options share reads (each Spark read costs a second or more)."""

    def first(p: int, ts: int, otherwise: int) -> int:
        found = _first_at_or_after(sent, p, ts)
        return otherwise if found is None else found

    ends = dict.fromkeys((0, 1), PER_PARTITION)
    far = BASE + 3_600_000  # after every record
    by_ts = json.dumps({topic: {"0": BASE + 4200, "1": BASE + 500}})
    return {
        "startingTimestamp, endingTimestamp": (
            {"startingTimestamp": str(BASE + 3200), "endingTimestamp": str(BASE + 7200)},
            _expected(
                sent,
                {p: first(p, BASE + 3200, 0) for p in (0, 1)},
                {p: first(p, BASE + 7200, PER_PARTITION) for p in (0, 1)},
            ),
        ),
        "startingOffsetsByTimestamp, endingOffsetsByTimestamp (no record that recent: latest)": (
            {
                "startingOffsetsByTimestamp": by_ts,
                "endingOffsetsByTimestamp": json.dumps({topic: {"0": far, "1": BASE + 6500}}),
            },
            _expected(
                sent,
                {0: first(0, BASE + 4200, 0), 1: first(1, BASE + 500, 0)},
                {0: PER_PARTITION, 1: first(1, BASE + 6500, PER_PARTITION)},
            ),
        ),
        "startingTimestamp wins over the others": (
            {
                "startingTimestamp": str(BASE + 8000),
                "startingOffsetsByTimestamp": by_ts,
                "startingOffsets": "earliest",
            },
            _expected(sent, {p: first(p, BASE + 8000, 0) for p in (0, 1)}, ends),
        ),
        "strategy latest: a partition with no record that recent is read from its end": (
            {
                "startingOffsetsByTimestamp": json.dumps({topic: {"0": BASE + 2000, "1": far}}),
                "startingOffsetsByTimestampStrategy": "latest",
            },
            _expected(sent, {0: first(0, BASE + 2000, 0), 1: PER_PARTITION}, ends),
        ),
    }


CASES = [
    "startingTimestamp, endingTimestamp",
    "startingOffsetsByTimestamp, endingOffsetsByTimestamp (no record that recent: latest)",
    "startingTimestamp wins over the others",
    "strategy latest: a partition with no record that recent is read from its end",
]


def _reads(topic: str, sent: list[Sent]) -> dict[str, dict[str, str]]:
    """The whole topic, every timestamp case, JSON offsets with ``assign`` and a
    ``subscribePattern``, all with headers: the reads both sources make."""
    reads: dict[str, dict[str, str]] = {"whole topic": {}}
    reads |= {case: options for case, (options, _rows) in _cases(topic, sent).items()}
    reads["JSON offsets, assign"] = {
        "assign": json.dumps({topic: [0, 1]}),
        "startingOffsets": json.dumps({topic: {"0": 2, "1": -2}}),
        "endingOffsets": json.dumps({topic: {"0": -1, "1": 6}}),
    }
    reads["subscribePattern"] = {"subscribePattern": f"{topic[:3]}.*{topic[-4:]}"}
    return {name: {"includeHeaders": "true", **options} for name, options in reads.items()}


def _every_read(
    spark: Any, fmt: str, bootstrap: str, topic: str, reads: dict[str, dict[str, str]]
) -> dict[str, list[Row]]:
    """The rows of each read with source *fmt*, all read in one Spark job (a union of the scans,
    each row tagged with its read): one job instead of one per read keeps the module quick."""
    frames = [
        _read(spark, fmt, bootstrap, topic, **options).selectExpr(f"{i} AS read", "*")
        for i, options in enumerate(reads.values())
    ]
    union = frames[0]
    for f in frames[1:]:
        union = union.unionByName(f)
    rows = _rows(union)
    return {name: [r[1:] for r in rows if r[0] == i] for i, name in enumerate(reads)}


@pytest.fixture(scope="module")
def ours(spark: Any, kafka: KafkaTool, timed: tuple[str, list[Sent]]) -> dict[str, list[Row]]:
    """What ``statesnap-kafka`` reads for each of :func:`_reads`."""
    topic, sent = timed
    return _every_read(spark, "statesnap-kafka", kafka.bootstrap, topic, _reads(topic, sent))


@pytest.mark.parametrize("case", CASES)
def test_timestamp_options_follow_kafkas_offsets_for_times(
    ours: dict[str, list[Row]], timed: tuple[str, list[Sent]], case: str
) -> None:
    """Apache Kafka 4.1.1 proved it: each timestamp option reads exactly the records Kafka's
    ListOffsets-by-timestamp answers select (the first offset at or after the timestamp; the
    out-of-order record does not move it), with the producer's timestamps."""
    topic, sent = timed
    _options, expected = _cases(topic, sent)[case]
    got = sorted((r[3], r[4], r[-1]) for r in ours[case])  # partition, offset, timestamp (ms)
    assert got == expected
    assert got, "a case that reads nothing proves nothing"


def test_no_record_that_recent_fails_the_read_by_default(
    spark: Any, kafka: KafkaTool, timed: tuple[str, list[Sent]]
) -> None:
    """Apache Kafka 4.1.1 proved it: with the default strategy (``error``), a starting
    timestamp after every record of a partition fails the read, naming the option."""
    topic, _sent = timed
    with pytest.raises(Exception, match=r"(?i)timestamp") as failed:
        _read(
            spark, "statesnap-kafka", kafka.bootstrap, topic, startingTimestamp=str(BASE + 3_600_000)
        ).collect()
    assert "startingTimestamp" in str(failed.value)


@pytest.fixture(scope="module")
def spark_kafka(spark: Any, kafka: KafkaTool, timed: tuple[str, list[Sent]]) -> Any:
    """The shared session with Spark's own Kafka source loaded (skipped, saying why, where its
    jars are missing or do not load)."""
    jars = sorted(str(j) for j in CONNECTOR.glob("*.jar") if j.name.startswith(NEEDED))
    if not any(Path(j).name.startswith(NEEDED[0]) for j in jars):
        pytest.skip(
            f"Spark's Kafka connector jars are not in {CONNECTOR}: run .venv/bin/python "
            "benchmarks/kafka_sources.py --records 1000 (fetches them with Maven)"
        )
    try:
        for jar in jars:
            spark.sql(f"ADD JAR '{jar}'")
        _read(spark, "kafka", kafka.bootstrap, timed[0]).limit(1).collect()
    except Exception as e:  # Py4J and Spark errors alike: the reason is their first line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        pytest.skip(f"Spark's Kafka connector does not load into the shared SparkSession: {first[:200]}")
    return spark


def test_the_same_rows_as_sparks_own_source(
    spark_kafka: Any, kafka: KafkaTool, timed: tuple[str, list[Sent]], ours: dict[str, list[Row]]
) -> None:
    """Apache Kafka 4.1.1 proved it: for the whole topic with headers, JSON offsets with
    ``assign``, a ``subscribePattern``, and every timestamp case above (and a starting timestamp
    after every record, which both refuse), ``format("kafka")`` (connector 4.2.0) and
    ``format("statesnap-kafka")`` give identical rows: key, value, topic, partition, offset,
    timestamp, timestampType, headers (a tombstone, a keyless record, repeated and null header
    values included)."""
    topic, sent = timed
    bs = kafka.bootstrap
    theirs = _every_read(spark_kafka, "kafka", bs, topic, _reads(topic, sent))
    for name, rows in theirs.items():
        assert ours[name] == rows, name
        assert rows, f"{name}: a read of nothing proves nothing"
    with pytest.raises(Exception, match=r"(?i)timestamp"):  # as statesnap-kafka (the test above)
        _read(spark_kafka, "kafka", bs, topic, startingTimestamp=str(BASE + 3_600_000)).collect()

    whole = theirs["whole topic"]
    assert len(whole) == len(sent)  # and their source agrees with what the producer sent
    by_offset = {(r[3], r[4]): r for r in whole}  # partition, offset
    for s in sent:
        key, value, t, p, offset, ts_type, headers, ts = by_offset[(s.partition, s.offset)]
        assert (key, value, t, p, offset, ts_type, ts) == (
            s.key,
            s.value,
            topic,
            s.partition,
            s.offset,
            0,
            s.timestamp,
        )
        assert (None if headers is None else tuple((h[0], h[1]) for h in headers)) == s.headers


def _stream_rows(spark: Any, fmt: str, bootstrap: str, topic: str, checkpoint: Path) -> tuple[list[Row], int]:
    """Every row a streaming query with source *fmt* writes to a memory sink, reading the whole
    topic with headers in micro-batches of at most 10 offsets (trigger ``availableNow``), and the
    number of batches it ran."""
    name = f"stream_{fmt.replace('-', '_')}_{uuid.uuid4().hex[:8]}"
    df = (
        spark.readStream.format(fmt)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")  # Spark's streaming default is latest
        .option("maxOffsetsPerTrigger", "10")
        .option("includeHeaders", "true")
        .load()
    )
    query = (
        df.writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(checkpoint / name))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120), f"the {fmt} stream did not finish within 120 s"
        batches = sum(1 for p in query.recentProgress if p["numInputRows"])
    finally:
        query.stop()
    return _rows(spark.table(name)), batches


def test_a_stream_gives_the_same_rows_as_sparks_own_source(
    spark_kafka: Any, kafka: KafkaTool, timed: tuple[str, list[Sent]], tmp_path: Path
) -> None:
    """Apache Kafka 4.1.1 proved it: the same topic read by a streaming query (trigger
    ``availableNow``, ``maxOffsetsPerTrigger`` 10 so it takes two or more micro-batches, memory sink)
    with ``format("kafka")`` (connector 4.2.0) and with ``format("statesnap-kafka")`` gives
    identical rows, every column, headers, the tombstone and the keyless record included."""
    topic, sent = timed
    theirs, their_batches = _stream_rows(spark_kafka, "kafka", kafka.bootstrap, topic, tmp_path)
    ours, our_batches = _stream_rows(spark_kafka, "statesnap-kafka", kafka.bootstrap, topic, tmp_path)
    assert len(theirs) == len(sent), "Spark's source did not read the whole topic"
    assert ours == theirs
    assert our_batches > 1, our_batches
    assert their_batches > 1, their_batches
