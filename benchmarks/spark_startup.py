"""How long a Spark session takes to start, as the CLI starts it, with and without the driver's
class archive (prints min / median / max of each, and their ratio).

Each run is a fresh interpreter (a cold JVM, as every ``statesnap materialize --engine spark``
pays): it times the imports, :func:`statesnap.spark.session.spark_session` (JVM launch, context,
source registration and the one-task worker check), a first job (a shuffle) and the session's
stop, and prints one JSON line. Runs alternate between the class archive
(:mod:`statesnap.spark.class_archive`, made first if missing) and none
(``STATESNAP_SPARK_CLASS_ARCHIVE=off``), so both see the same machine; the parent prints each run
and the summary the README quotes.

    .venv/bin/python benchmarks/spark_startup.py              # 5 runs of each, local[*]
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

from statesnap.spark.class_archive import ARCHIVE_ENV, archive_path, create

#: What one run does, in its own interpreter (the clock starts before any import).
_CHILD = """
import json, sys, time
t0 = time.monotonic()
from statesnap.spark.session import spark_session
imported = time.monotonic()
spark = spark_session(sys.argv[1])
ready = time.monotonic()
spark.range(10000).selectExpr("id % 7 AS k").groupBy("k").count().collect()
worked = time.monotonic()
spark.stop()
stopped = time.monotonic()
print(json.dumps({"imports": imported - t0, "session": ready - imported, "total": ready - t0,
                  "job": worked - ready, "stop": stopped - worked}))
"""

#: A run that has not started its session in this long is reported as failed, not waited on.
RUN_TIMEOUT_SECONDS = 300


def run_once(master: str, archive: str) -> dict[str, float]:
    """One cold start in a fresh interpreter (*archive*: the class archive's path, or ``off``);
    its timings in seconds."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, ARCHIVE_ENV: archive}
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
    parser.add_argument("--runs", type=int, default=5, help="runs of each (with and without the archive)")
    parser.add_argument("--master", default="local[*]")
    args = parser.parse_args()
    path = archive_path()
    if path is None:
        raise SystemExit(f"no class archive: {ARCHIVE_ENV}=off, or no java")
    if not path.is_file():
        started = time.monotonic()
        create(path)
        print(f"class archive made in {time.monotonic() - started:.1f}s: {path}", flush=True)
    runs: dict[str, list[dict[str, float]]] = {"archive": [], "none": []}
    for i in range(args.runs):
        for kind, setting in (("archive", str(path)), ("none", "off")):
            figures = run_once(args.master, setting)
            runs[kind].append(figures)
            print(
                f"run {i + 1} ({kind}): session ready {figures['total']:.1f}s after interpreter start "
                f"(imports {figures['imports']:.1f}s, spark_session() {figures['session']:.1f}s); "
                f"first job {figures['job']:.1f}s, stop {figures['stop']:.1f}s",
                flush=True,
            )
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores, master {args.master}")
    medians: dict[str, float] = {}
    for kind, figures_of in runs.items():
        for key, label in (("total", "session ready"), ("job", "first job")):
            values = sorted(r[key] for r in figures_of)
            print(
                f"{kind:>7} {label}: min {values[0]:.1f}s, median {statistics.median(values):.1f}s, "
                f"max {values[-1]:.1f}s over {len(values)} runs"
            )
        medians[kind] = statistics.median(r["total"] + r["job"] for r in figures_of)
    print(
        f"ready and first job done, median: {medians['archive']:.1f}s with the class archive, "
        f"{medians['none']:.1f}s without ({medians['archive'] / medians['none']:.2f}x)"
    )


if __name__ == "__main__":
    main()
