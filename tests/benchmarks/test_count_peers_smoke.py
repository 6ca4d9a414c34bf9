"""benchmarks/count_peers.py (issue #36's peers: Kafka Streams, Spark Structured Streaming) stays
runnable and right: its ``--quick --window`` run, peers included, on the suite's Apache Kafka broker.

The script checks every contender's final state (the count per key; the live 1-minute windows)
against its plain loop's and exits 1 on a difference; this test also reads every row of both printed
tables, so a contender that went missing, or whose state differs, fails it either way.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from statesnap.devstack.apache import ApacheKafkaBroker

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "count_peers.py"
SPARK_KAFKA = ROOT / "benchmarks" / "peers" / "spark-kafka" / "target" / "lib"

CONTENDERS = (
    "plain loop (dict)",
    "statesnap proc.count",
    "Kafka Streams 4.1.1 at-least-once, state dir wiped",
    "Kafka Streams 4.1.1 at-least-once, state dir kept",
    "Kafka Streams 4.1.1 exactly_once_v2, state dir wiped",
    "Kafka Streams 4.1.1 exactly_once_v2, state dir kept",
    "Spark Structured Streaming, RocksDB state",
)


def cells(line: str) -> list[str]:
    """The cells of one row of the rich table (header rows split on ┃, body rows on │)."""
    return [c.strip() for c in line.strip().strip("┃│").replace("┃", "│").split("│")]


@pytest.mark.integration
@pytest.mark.long  # a benchmark smoke run with two JVM peers (~3 min here, at load 2-4 on 2 cores)
def test_quick_run_with_peers_checks_every_state(apache_kafka: ApacheKafkaBroker) -> None:
    """On the suite's Apache Kafka 4.1.1 broker: the quick run (100 k events, the count and the
    window count) ends 0 and prints two tables, each with a row per contender; every contender's
    state equals the plain loop's from scratch and after the restart over the tail (``ok / ok``),
    and each has figures for both phases."""
    if shutil.which("mvn") is None or shutil.which("java") is None:
        pytest.skip("java and mvn are needed for the Kafka Streams peer (install Java 17+ and Maven)")
    if not SPARK_KAFKA.is_dir():
        pytest.skip(f"Spark's Kafka connector is missing from {SPARK_KAFKA}: run bash scripts/setup.sh")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--window", "--bootstrap", apache_kafka.bootstrap_servers],
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    lines = out.splitlines()
    header = next(cells(line) for line in lines if line.startswith("┃"))
    body = [dict(zip(header, cells(line), strict=True)) for line in lines if line.startswith("│")]
    body = [row for row in body if row["contender"]]  # a wrapped note's next line has no contender
    assert len(body) == 2 * len(CONTENDERS), out
    for table in (body[: len(CONTENDERS)], body[len(CONTENDERS) :]):
        assert [row["contender"] for row in table] == list(CONTENDERS), out
        for row in table:
            for column in ("scratch s", "restart->tail s", "scratch rec/s", "restart x plain"):
                assert float(row[column].replace(",", "")) > 0, (column, out)
        for row in table[1:]:
            assert row["state vs plain loop"] == "ok / ok", out
    assert "MISMATCH" not in out
    assert "count per key" in out
    assert "1-minute tumbling count" in out
