"""Where the Spark engine starts to pay off: ``statesnap materialize`` on each engine, side by side.

For each backlog size, a fresh topic gets that many updates (8 partitions, 100-byte values), then
``statesnap materialize --engine python`` and ``--engine spark`` each build a first checkpoint of
it into their own store, as a user runs them (a new process each: Spark's start-up is part of the
cost). ``--engine auto`` is run too, to show what it picks and why. The script prints the table,
the fitted model (Python rate, Spark start-up and per-core rate) and the crossover it implies, and
the environment variables that would tune ``auto`` to this machine.

    .venv/bin/python benchmarks/engine_crossover.py --sizes 100000,1000000,4000000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from statesnap.devstack import EmbeddedBroker
from statesnap.kafka.config import KafkaSettings
from statesnap.sample import SampleSpec, produce_sample

STATESNAP = [sys.executable, "-m", "statesnap.cli"]
PARTITIONS = 8


def run(engine: str, bootstrap: str, topic: str, store: Path) -> tuple[float, dict[str, object]]:
    started = time.monotonic()
    out = subprocess.run(
        [
            *STATESNAP,
            "materialize",
            "-b",
            bootstrap,
            "-t",
            topic,
            "--checkpoints",
            str(store),
            "--engine",
            engine,
            "--json",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    return time.monotonic() - started, json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="100000,1000000,4000000", help="backlog sizes (records)")
    parser.add_argument("--keys", type=int, default=200_000)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    cores = os.cpu_count() or 1
    rows = []
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            topic = f"crossover-{n}"
            spec = SampleSpec(
                topic=topic, partitions=PARTITIONS, keys=min(args.keys, n), updates=n, value_bytes=100, seed=1
            )
            produce_sample(KafkaSettings(broker.bootstrap_servers), spec)
            py_s, py = run("python", broker.bootstrap_servers, topic, Path(tmp) / f"py-{n}")
            sp_s, sp = run("spark", broker.bootstrap_servers, topic, Path(tmp) / f"sp-{n}")
            _auto_s, auto = run("auto", broker.bootstrap_servers, topic, Path(tmp) / f"auto-{n}")
            assert py["keys"] == sp["keys"], (py["keys"], sp["keys"])
            rows.append((n, py_s, sp_s, str(auto["engine"]), str(auto["engine_reason"])))
    print(f"\nstatesnap materialize, first checkpoint, {PARTITIONS} partitions, {cores} cores")
    print("(wall seconds of a new process each, Spark's start-up included)")
    print("| backlog | python s | spark s | spark/python | auto picks | auto's reason |")
    print("|---|---|---|---|---|---|")
    for n, py_s, sp_s, engine, reason in rows:
        print(f"| {n:,} | {py_s:.1f} | {sp_s:.1f} | {sp_s / py_s:.2f}× | {engine} | {reason} |")
    small, big = rows[0], rows[-1]
    python_rate = big[0] / big[1]
    spark_per_record = (big[2] - small[2]) / max(1, big[0] - small[0])
    startup = max(0.0, small[2] - small[0] * spark_per_record)
    per_core = 1 / (spark_per_record * cores) if spark_per_record > 0 else float("inf")
    gain = 1 / python_rate - spark_per_record
    crossover = startup / gain if gain > 0 else float("inf")
    print(f"\nfitted: python {python_rate:,.0f} rec/s; spark start-up {startup:.1f}s")
    print(f"        + {per_core:,.0f} rec/s per core")
    print(f"crossover on this machine: {crossover:,.0f} records (inf = Spark never wins here)")
    print(
        f"tune auto: STATESNAP_PYTHON_RATE={python_rate:.0f} STATESNAP_SPARK_STARTUP_SECONDS={startup:.1f} "
        f"STATESNAP_SPARK_RATE_PER_CORE={per_core:.0f}"
    )


if __name__ == "__main__":
    main()
