"""How long a Spark session takes to start, as the CLI starts it (prints min / median / max).

Each run is a fresh interpreter (a cold JVM, as every ``statesnap materialize --engine spark``
pays): it times the imports, :func:`statesnap.spark.session.spark_session` (JVM launch, context,
source registration and the one-task worker check) and the session's stop, and prints one JSON
line; the parent prints each run and the summary the README quotes.

    .venv/bin/python benchmarks/spark_startup.py              # 5 runs, local[*]
    .venv/bin/python benchmarks/spark_startup.py --runs 3 --master 'local[2]'

The figures depend on the machine's load: the load average is printed with them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

#: What one run does, in its own interpreter (the clock starts before any import).
_CHILD = """
import json, sys, time
t0 = time.monotonic()
from statesnap.spark.session import spark_session
imported = time.monotonic()
spark = spark_session(sys.argv[1])
ready = time.monotonic()
spark.stop()
stopped = time.monotonic()
print(json.dumps({"imports": imported - t0, "session": ready - imported, "total": ready - t0,
                  "stop": stopped - ready}))
"""

#: A run that has not started its session in this long is reported as failed, not waited on.
RUN_TIMEOUT_SECONDS = 300


def run_once(master: str) -> dict[str, float]:
    """One cold start in a fresh interpreter; its timings in seconds."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, master],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_SECONDS,
        check=False,
        env=env,
    )
    if out.returncode != 0:
        raise SystemExit(f"run failed (exit {out.returncode}): {out.stderr.strip()[-2000:]}")
    figures: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    figures["process"] = time.monotonic() - started  # interpreter start to exit, JVM stop included
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--master", default="local[*]")
    args = parser.parse_args()
    runs = []
    for i in range(args.runs):
        figures = run_once(args.master)
        runs.append(figures)
        print(
            f"run {i + 1}: session ready {figures['total']:.1f}s after interpreter start "
            f"(imports {figures['imports']:.1f}s, spark_session() {figures['session']:.1f}s); "
            f"stop {figures['stop']:.1f}s",
            flush=True,
        )
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores, master {args.master}")
    for key, label in (("total", "session ready"), ("session", "spark_session()")):
        values = sorted(r[key] for r in runs)
        print(
            f"{label}: min {values[0]:.1f}s, median {statistics.median(values):.1f}s, "
            f"max {values[-1]:.1f}s over {len(values)} runs"
        )


if __name__ == "__main__":
    main()
