"""One ``local[2]`` SparkSession for every Spark test, plus an exact record-level ground truth.

The session is created in a fixture (never at import) and the source is registered once. Tests
compare against what the producer's delivery reports say was written (partition, offset, key,
value) — an independent truth that does not go through any statesnap reader.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

pytest.importorskip("pyspark")

from confluent_kafka import Producer

from integration.spark.spark_testkit import Delivered
from statesnap.kafka.admin import KafkaAdmin
from statesnap.kafka.config import KafkaSettings


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The shared session: 2 cores, few shuffle partitions, no UI."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs a Java runtime (java on PATH or JAVA_HOME)")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from statesnap.spark import register
    from statesnap.spark.class_archive import driver_options

    builder = SparkSession.builder
    archive = driver_options()
    if archive:  # as spark_session() launches a driver: from the class archive setup made
        builder = builder.config("spark.driver.extraJavaOptions", archive)
    session = (
        builder.master("local[2]")
        .appName("statesnap-tests")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


Produce = Callable[[str, Sequence[tuple[int, bytes | None, bytes | None]]], list[Delivered]]


@pytest.fixture
def produce(bootstrap: str) -> Produce:
    """``produce(topic, [(partition, key, value), ...])`` → what was delivered, in order.

    Records are sent with a linger so the broker stores multi-record batches: the case where the
    dev broker under-reports the high watermark.
    """

    def run(topic: str, records: Sequence[tuple[int, bytes | None, bytes | None]]) -> list[Delivered]:
        partitions = max((p for p, _k, _v in records), default=0) + 1
        KafkaAdmin(KafkaSettings(bootstrap)).create_topic(topic, max(partitions, 1))
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": False})
        out: list[Delivered] = []
        errors: list[str] = []

        def on_delivery(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                out.append(Delivered(msg.partition(), msg.offset(), msg.key(), msg.value()))

        for p, key, value in records:
            producer.produce(topic, value, key, partition=p, on_delivery=on_delivery)
        assert producer.flush(30) == 0
        assert not errors, errors
        return sorted(out, key=lambda d: (d.partition, d.offset))

    return run
