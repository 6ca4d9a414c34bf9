"""The Spark driver of the cluster test, in its own process (its own JVM), as spark-submit runs one.

    python cluster_driver.py CONFIG.json RESULT.json

1. A session on the standalone master; Python workers run this interpreter (the "cluster image"
   recipe: the same interpreter path on every node), checked by ``spark_session``.
2. ``bootstrap`` of the topic into checkpoints on S3 (storage options travel with the job), then
   ``read_table`` of it collected here; prints ``BOOTSTRAPPED`` and waits for one line on stdin:
   the end offsets of the records the test produced next.
3. ``materialize_stream`` until those offsets are materialized. After the first journaled batch
   a watcher SIGKILLs one executor JVM while a stage of a batch has tasks running on both
   executors (mid-batch), and checks that the stage lost a task to it (else it tries again on a
   later batch, at most three times).
4. ``stop`` (final checkpoint), ``read_table`` of it; everything is written to RESULT.json. The
   test compares the digests with its own replay of what the broker acknowledged.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from integration.spark_cluster.standalone import executor_pids
from statesnap.digest import table_digest


def log(msg: str) -> None:
    print(f"[driver {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def executors(sc: Any) -> int:
    return int(sc._jsc.sc().getExecutorIds().size())


def wait_executors(sc: Any, n: int, timeout: float) -> float:
    started = time.monotonic()
    while executors(sc) < n:
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{executors(sc)} of {n} executors registered after {timeout}s")
        time.sleep(0.2)
    return time.monotonic() - started


def table_of(spark: Any, df: Any) -> tuple[str, int]:
    rows = df.select("key", "value").collect()
    return table_digest((bytes(r["key"]), bytes(r["value"])) for r in rows)


class ExecutorKiller(threading.Thread):
    """Kills one executor JVM while a stage runs tasks on both executors, once armed."""

    def __init__(self, sc: Any, app_id: str, max_kills: int = 3) -> None:
        super().__init__(name="executor-killer", daemon=True)
        self.sc, self.app_id, self.max_kills = sc, app_id, max_kills
        self.armed = threading.Event()
        self.done = threading.Event()
        self.kills: list[dict[str, Any]] = []
        self.error: str | None = None

    def run(self) -> None:
        try:
            while not self.done.is_set() and len(self.kills) < self.max_kills:
                if not self.armed.wait(0.1):
                    continue
                kill = self._kill_when_busy()
                if kill is None:
                    continue
                self.kills.append(kill)
                self.armed.clear()
                if kill["failed_tasks"] > 0:
                    self.done.set()
        except Exception as e:  # reported in the result, never silently
            self.error = repr(e)

    def _kill_when_busy(self) -> dict[str, Any] | None:
        tracker = self.sc.statusTracker()
        while not self.done.is_set():
            for stage in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage)
                if info is None or info.numActiveTasks < 2:
                    continue
                pids = executor_pids(self.app_id)
                if not pids:
                    continue
                pid = pids[0]
                os.kill(pid, signal.SIGKILL)
                killed_at = time.monotonic()
                log(f"killed executor {pid} in stage {stage} ({info.numActiveTasks} tasks running)")
                while stage in tracker.getActiveStageIds():
                    time.sleep(0.05)
                after = tracker.getStageInfo(stage)
                return {
                    "pid": pid,
                    "at": killed_at,
                    "stage": stage,
                    "stage_name": info.name,
                    "active_tasks": info.numActiveTasks,
                    "failed_tasks": after.numFailedTasks if after is not None else -1,
                    "completed_tasks": after.numCompletedTasks if after is not None else -1,
                    "stage_seconds_after_kill": round(time.monotonic() - killed_at, 3),
                }
            time.sleep(0.005)
        return None


def main() -> None:
    cfg = json.loads(Path(sys.argv[1]).read_text())
    out_path = Path(sys.argv[2])
    # The cluster-image recipe: executors start the interpreter at this path (it exists on every
    # node). PySpark takes it from PYSPARK_PYTHON of the driver process, not from the session conf.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from statesnap import CheckpointOptions
    from statesnap.spark import bootstrap, materialize_stream, read_table, spark_session

    result: dict[str, Any] = {}
    t0 = time.monotonic()
    spark = spark_session(
        cfg["master"],
        app_name="statesnap-cluster-test",
        conf={
            "spark.executor.memory": "512m",
            "spark.executor.cores": "1",
            "spark.cores.max": "2",
            "spark.driver.memory": "768m",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
        },
    )
    sc = spark.sparkContext
    app_id = str(sc.applicationId)
    result["session_seconds"] = round(time.monotonic() - t0, 2)
    result["executors_wait_seconds"] = round(wait_executors(sc, 2, 60), 2)
    result.update(
        app_id=app_id,
        master=sc.master,
        executors=executors(sc),
        executor_pids=executor_pids(app_id),
        default_parallelism=sc.defaultParallelism,
        shuffle_partitions=spark.conf.get("spark.sql.shuffle.partitions"),
    )
    log(f"session on {sc.master} ({app_id}) in {result['session_seconds']}s")
    common: dict[str, Any] = {
        "bootstrap_servers": cfg["bootstrap"],
        "topic": cfg["topic"],
        "table": cfg["table"],
        "checkpoints": CheckpointOptions(cfg["checkpoints"], storage_options=cfg["storage_options"]),
    }
    try:
        t1 = time.monotonic()
        boot = bootstrap(spark, **common)
        result["bootstrap"] = {
            "generation": boot.generation,
            "offsets": {str(p): o for p, o in boot.offsets.items()},
            "tasks": boot.writer.get("spark_tasks"),
            "seconds": round(time.monotonic() - t1, 2),
        }
        df = read_table(spark, cfg["checkpoints"], cfg["table"], storage_options=cfg["storage_options"])
        result["bootstrap"]["read_table"] = table_of(spark, df)
        log(f"bootstrapped generation {boot.generation}: {result['bootstrap']}")
        print("BOOTSTRAPPED", flush=True)
        ends = {int(p): int(o) for p, o in json.loads(sys.stdin.readline()).items()}

        killer = ExecutorKiller(sc, app_id)
        killer.start()
        batches: list[tuple[str, int, float]] = []
        t2 = time.monotonic()

        def observer(stage: str, number: int) -> None:
            batches.append((stage, number, round(time.monotonic() - t2, 2)))
            if stage == "journaled" and not killer.done.is_set():
                killer.armed.set()

        stream_checkpoints = replace(
            common["checkpoints"], interval=timedelta(seconds=2), commit_interval=timedelta(seconds=0.3)
        )
        m = materialize_stream(
            spark,
            checkpoint_location=cfg["spark_checkpoint_location"],
            max_offsets_per_trigger=cfg["max_offsets_per_trigger"],
            compact_after=2,
            observer=observer,
            **{**common, "checkpoints": stream_checkpoints},
        )
        deadline = time.monotonic() + cfg.get("stream_timeout", 120)
        while any(m.offsets.get(p, 0) < end for p, end in ends.items()):
            if not m.query.isActive:
                raise RuntimeError(f"streaming query stopped: {m.query.exception()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"materializer at {m.offsets}, want {ends}")
            time.sleep(0.2)
        killer.done.set()
        killer.join(10)
        result["executors_after_kill"] = executors(sc)
        final = m.stop(checkpoint=True)
        if final is None:
            final = m.last_checkpoint
        assert final is not None
        result["stream"] = {
            "generation": final.generation,
            "offsets": {str(p): o for p, o in final.offsets.items()},
            "events": batches,
            "kills": [{**k, "at": round(k["at"] - t2, 2)} for k in killer.kills],
            "killer_error": killer.error,
            "seconds": round(time.monotonic() - t2, 2),
        }
        df = read_table(spark, cfg["checkpoints"], cfg["table"], storage_options=cfg["storage_options"])
        result["stream"]["read_table"] = table_of(spark, df)
        log(f"streamed to generation {final.generation}; kills {killer.kills}")
    finally:
        result["total_seconds"] = round(time.monotonic() - t0, 2)
        out_path.write_text(json.dumps(result))
        spark.stop()


if __name__ == "__main__":
    main()
