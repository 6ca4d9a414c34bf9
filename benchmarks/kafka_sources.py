"""Spark's own ``format("kafka")`` beside ``format("statesnap-kafka")``: batch read rates, same topic.

Starts the Apache Kafka dev broker, produces N records (100-byte values), then, in one local
SparkSession whose ``spark.jars`` holds Spark's Kafka connector, reads the whole topic with each
source into a ``noop`` sink (after one warm-up read each), best of ``--repeat``, and checks both
counted every record.

    .venv/bin/python benchmarks/kafka_sources.py                      # 2 M records
    .venv/bin/python benchmarks/kafka_sources.py --records 200000     # quick

The connector comes from ``benchmarks/peers/spark-kafka/pom.xml`` (fetched with Maven on first use).
Maven Central does not serve ``spark-sql-kafka-0-10_2.13`` 4.3.0 (the installed PySpark); 4.2.0,
the nearest served version, is used. Not a test: it prints figures for the record.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table as RichTable

from statesnap.devstack.apache import ApacheKafkaBroker, apache_kafka_missing
from statesnap.kafka.config import KafkaSettings
from statesnap.sample import SampleSpec, produce_sample

console = Console(stderr=True)

POM_DIR = Path(__file__).resolve().parent / "peers" / "spark-kafka"
#: The connector and what it needs beyond PySpark's own jars (PySpark ships Hadoop, Scala, lz4...).
NEEDED = (
    "spark-sql-kafka-0-10_2.13-",
    "spark-token-provider-kafka-0-10_2.13-",
    "kafka-clients-",
    "commons-pool2-",
)
MVN_TIMEOUT_S = 600


def connector_jars() -> list[str]:
    """Fetch Spark's Kafka connector with Maven once; the jars ``spark.jars`` needs."""
    lib = POM_DIR / "target" / "lib"
    if not lib.is_dir():
        if shutil.which("mvn") is None:
            sys.exit("kafka_sources: mvn not found: install Maven to fetch Spark's Kafka connector")
        console.print("fetching Spark's Kafka connector (mvn dependency:copy-dependencies)")
        done = subprocess.run(
            [
                "mvn",
                "-q",
                "-B",
                "-Dstyle.color=never",
                "dependency:copy-dependencies",
                "-DincludeScope=runtime",
                f"-DoutputDirectory={lib}",
            ],
            cwd=POM_DIR,
            capture_output=True,
            text=True,
            timeout=MVN_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            sys.exit(
                f"kafka_sources: Maven could not fetch the connector: {(done.stdout + done.stderr)[-1500:]}"
            )
    jars = sorted(str(p) for p in lib.glob("*.jar") if p.name.startswith(NEEDED))
    if not any(Path(j).name.startswith(NEEDED[0]) for j in jars):
        sys.exit(f"kafka_sources: no spark-sql-kafka jar in {lib}: remove it and rerun")
    return jars


def frame(spark: Any, fmt: str, bs: str, topic: str) -> Any:
    """The whole of *topic* as a batch DataFrame from source *fmt*."""
    return (
        spark.read.format(fmt)
        .option("kafka.bootstrap.servers", bs)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
    )


def read(spark: Any, fmt: str, bs: str, topic: str) -> float:
    """Seconds to read every record of *topic* with source *fmt* into a noop sink."""
    t0 = time.monotonic()
    frame(spark, fmt, bs, topic).write.format("noop").mode("overwrite").save()
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--cores", type=int, default=2, help="local[N] Spark")
    ap.add_argument("--repeat", type=int, default=2, help="timed reads per source; the best is reported")
    args = ap.parse_args()
    if args.records < 1 or args.partitions < 1 or args.cores < 1 or args.repeat < 1:
        ap.error("--records, --partitions, --cores and --repeat must be positive")
    missing = apache_kafka_missing()
    if missing is not None:
        sys.exit(f"kafka_sources: {missing}")
    jars = connector_jars()

    from statesnap.spark import spark_session

    console.print(f"load average at start: {os.getloadavg()[0]:.2f} (2-core machine shared with others)")
    results: dict[str, tuple[float, int]] = {}
    with ApacheKafkaBroker(heap="1g") as broker, tempfile.TemporaryDirectory():
        bs, topic = broker.bootstrap_servers, "sources"
        t0 = time.monotonic()
        produce_sample(
            KafkaSettings(bs), SampleSpec(topic, args.partitions, args.records, args.records, 0.0, 100, 1)
        )
        console.print(f"produced {args.records:,} records in {time.monotonic() - t0:.1f}s")
        spark = spark_session(
            f"local[{args.cores}]",
            app_name="statesnap-kafka-sources",
            conf={"spark.jars": ",".join(jars), "spark.driver.memory": "2g"},
        )
        try:
            for fmt in ("kafka", "statesnap-kafka"):
                read(spark, fmt, bs, topic)  # warm-up: JVM classes, Python workers, connections
                best = min(read(spark, fmt, bs, topic) for _ in range(args.repeat))
                rows = int(frame(spark, fmt, bs, topic).count())
                results[fmt] = (best, rows)
                console.print(f"  {fmt}: best {best:.2f}s, {rows:,} rows")
        finally:
            spark.stop()
    console.print(f"load average at end: {os.getloadavg()[0]:.2f}")

    out = RichTable(title=f"Spark batch read of {args.records:,} records, local[{args.cores}], Apache Kafka")
    for col in ("source", "rows", "best s", "rows/s"):
        out.add_column(col, justify="right")
    for fmt, (seconds, rows) in results.items():
        out.add_row(f'format("{fmt}")', f"{rows:,}", f"{seconds:.2f}", f"{rows / seconds:,.0f}")
    Console(width=120).print(out)
    spark_s, ours_s = results["kafka"][0], results["statesnap-kafka"][0]
    print(
        f"statesnap-kafka read rate / Spark kafka read rate = {spark_s / ours_s:.2f}x; rows equal: "
        f"{'yes' if results['kafka'][1] == results['statesnap-kafka'][1] == args.records else 'NO'}"
    )


if __name__ == "__main__":
    main()
