"""statesnap on a real Spark standalone cluster (master + two workers as separate JVMs on loopback).

What runs where is what a user's deployment has: the driver is its own process, executors are
JVMs started by the workers, Python workers import statesnap from the interpreter the job names
(``PYSPARK_PYTHON`` / ``spark.pyspark.python``: the cluster-image recipe, docs/spark-cluster.md),
checkpoints go to S3 (moto) with the endpoint and credentials passed as storage options — the
workers' environment has no AWS settings, so nothing reaches an executor except with the job.

Ground truth is independent of statesnap: a replay of what the broker acknowledged.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from integration.spark_cluster.standalone import StandaloneCluster, executor_pids, spark_home
from statesnap import CheckpointOptions, Follower
from statesnap.blob import open_blob_store
from statesnap.checkpoint import locate_table
from statesnap.digest import table_digest

pytestmark = [pytest.mark.spark, pytest.mark.integration]

HERE = Path(__file__).resolve().parent
TESTS = HERE.parents[1]  # the driver imports integration.spark_cluster.standalone, as the tests do
PARTITIONS = 4


def changelog(n: int, *, keys: int, seed: int) -> list[tuple[int, bytes | None, bytes | None]]:
    """Deterministic updates and tombstones; a key always lives in one partition."""
    out: list[tuple[int, bytes | None, bytes | None]] = []
    for i in range(n):
        k = (i * 7919 + seed) % keys
        value = None if i % 9 == 4 else b"v-%d-%d" % (seed, i)
        out.append((k % PARTITIONS, b"key-%d" % k, value))
    return out


def truth_digest(records: Sequence[Any], below: dict[int, int] | None = None) -> tuple[str, int]:
    """Digest of a full replay of *records* (only offsets below *below*, when given): newest value
    per key in offset order, a tombstone deletes."""
    table: dict[bytes, bytes] = {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        if r.key is None or (below is not None and r.offset >= below.get(r.partition, 0)):
            continue
        if r.value is None:
            table.pop(r.key, None)
        else:
            table[r.key] = r.value
    return table_digest(table.items())


def _read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline() if ready else ""


def _failure(what: str, cluster: StandaloneCluster, log: Path) -> str:
    return (
        f"{what}\n--- driver ---\n{log.read_text(errors='replace')[-6000:]}\n"
        f"--- worker-0 ---\n{cluster.tail('worker-0', 15)}\n--- master ---\n{cluster.tail('master', 15)}"
    )


# ~60 s, the suite's slowest: long; the cluster path runs by default in the spark-submit test below
@pytest.mark.long
def test_bootstrap_stream_with_executor_killed_and_read_table_on_s3(
    spark_cluster: StandaloneCluster, kafka: Any, topic_name: str, s3_location: Any, tmp_path: Path
) -> None:
    """bootstrap → read_table → materialize_stream with one executor SIGKILLed mid-batch →
    read_table: each equals a full replay; so does every generation committed on the way."""
    kafka.create_topic(topic_name, PARTITIONS)
    first = kafka.produce(topic_name, changelog(6000, keys=400, seed=1))
    config = {
        "master": spark_cluster.master_url,
        "bootstrap": kafka.bootstrap,
        "topic": topic_name,
        "table": "clustered",
        "checkpoints": s3_location.url,
        "storage_options": s3_location.options,
        "spark_checkpoint_location": str(tmp_path / "spark-state"),
        "max_offsets_per_trigger": 2500,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    log = tmp_path / "driver.log"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "cluster_driver.py"),
                str(tmp_path / "config.json"),
                str(tmp_path / "out.json"),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            cwd=HERE,
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])),
            },
        )
    try:
        deadline = time.monotonic() + 120
        while (line := _read_line(proc, max(0.0, deadline - time.monotonic()))) != "BOOTSTRAPPED\n":
            if not line or time.monotonic() >= deadline:
                pytest.fail(_failure("driver did not bootstrap", spark_cluster, log))
        second = kafka.produce(topic_name, changelog(10000, keys=400, seed=2))
        everything = [*first, *second]
        ends = kafka.end_offsets(everything, range(PARTITIONS))
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(ends) + "\n")
        proc.stdin.flush()
        rc = proc.wait(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 0, _failure(f"driver exited {rc}", spark_cluster, log)
    result = json.loads((tmp_path / "out.json").read_text())

    # It ran on the cluster, on both workers' executors.
    assert result["master"] == spark_cluster.master_url
    assert result["executors"] == 2
    assert len(result["executor_pids"]) == 2
    assert int(result["shuffle_partitions"]) >= 2

    # Bootstrap and read_table: the history as of the first batch of records.
    boot = result["bootstrap"]
    assert {int(p): o for p, o in boot["offsets"].items()} == kafka.end_offsets(first, range(PARTITIONS))
    assert tuple(boot["read_table"]) == truth_digest(first)

    # An executor was killed while tasks of a batch ran on it: the stage lost a task and re-ran it.
    stream = result["stream"]
    assert stream["killer_error"] is None
    lost = [k for k in stream["kills"] if k["failed_tasks"] >= 1]
    assert lost, f"no kill landed mid-task: {stream['kills']}"
    assert lost[0]["pid"] not in executor_pids(result["app_id"])
    assert sum(1 for stage, _n, _t in stream["events"] if stage == "journaled") >= 3, stream["events"]

    # After the kill: the final checkpoint and read_table equal a full replay of everything.
    assert {int(p): o for p, o in stream["offsets"].items()} == ends
    expected = truth_digest(everything)
    assert tuple(stream["read_table"]) == expected

    # Every generation on S3 (bootstrap, periodic, compacted, final) restores to a replay of the
    # records below its offsets — read by a Python Table, not by Spark.
    store = open_blob_store(s3_location.url, **s3_location.options)
    repo = locate_table(store, "clustered")
    generations = repo.generations()
    assert len(generations) >= 3, generations  # bootstrap + at least one periodic + the final
    for gen in generations:
        assert repo.verify(gen).ok, gen
        manifest = repo.read_manifest(gen)
        got = _checkpoint_digest(kafka.bootstrap, topic_name, "clustered", s3_location, gen)
        assert got == truth_digest(everything, dict(manifest.offsets)), gen


def _checkpoint_digest(bootstrap: str, topic: str, table: str, loc: Any, generation: int) -> tuple[str, int]:
    """The digest of exactly what *generation* holds, read by a Python Table (not by Spark)."""
    exact = CheckpointOptions(loc.url, storage_options=loc.options, generation=generation)
    replica: Follower[bytes, bytes] = Follower(
        topic, bootstrap_servers=bootstrap, name=table, checkpoints=exact, tail=False
    )
    replica.start()
    try:
        return table_digest(replica.raw_items())
    finally:
        replica.close()


def _apps(cluster: StandaloneCluster) -> list[dict[str, Any]]:
    status = cluster.status()
    active, completed = status.get("activeapps", []), status.get("completedapps", [])
    assert isinstance(active, list), status
    assert isinstance(completed, list), status
    apps: list[dict[str, Any]] = [*active, *completed]
    return apps


# Long (suite budget: a master and two workers take ~35 s to start and run): by default Spark runs
# local[*], spark-submit is proven from a venv by test_first_job.py, executors' S3 options by
# tests/unit/test_s3_for_executors.py.
@pytest.mark.long
def test_spark_submit_runs_the_pipeline_on_the_cluster(
    spark_cluster: StandaloneCluster, kafka: Any, topic_name: str, s3_location: Any, tmp_path: Path
) -> None:
    """``spark-submit --master spark://… statesnap/spark/__main__.py <materialize options>``: the
    submitted master is used (not local[*]); S3 settings given only as the driver's environment
    (``AWS_*``, as a user's shell has them) reach the executors, whose own environment has none;
    the checkpoint a Python Table restores equals a full replay; ``--json`` has the CLI's keys."""
    kafka.create_topic(topic_name, PARTITIONS)
    records = kafka.produce(topic_name, changelog(4000, keys=300, seed=3))
    import statesnap.spark.__main__ as entry

    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "STATESNAP_", "PYSPARK_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["SPARK_HOME"] = str(spark_home())
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env.update(  # the driver's environment only: no --storage-option
        AWS_ENDPOINT_URL=s3_location.options["endpoint_url"],
        AWS_DEFAULT_REGION=s3_location.options["region"],
        AWS_ACCESS_KEY_ID=s3_location.options["aws_access_key_id"],
        AWS_SECRET_ACCESS_KEY=s3_location.options["aws_secret_access_key"],
    )
    assert not any(k.startswith("AWS_") for k in spark_cluster._env()), "the workers must not have them"
    confs = {
        "spark.pyspark.python": sys.executable,
        "spark.executor.memory": "512m",
        "spark.cores.max": "2",
        "spark.driver.memory": "768m",
        "spark.driver.host": "127.0.0.1",
    }
    command = [
        str(spark_home() / "bin" / "spark-submit"),
        "--master",
        spark_cluster.master_url,
        *(f"--conf={k}={v}" for k, v in confs.items()),
        entry.__file__,
        "-b",
        kafka.bootstrap,
        "-t",
        topic_name,
        "--table",
        "submitted",
        "--checkpoints",
        s3_location.url,
        "--json",
    ]
    before = {a["id"] for a in _apps(spark_cluster)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=150, check=False)
    (tmp_path / "submit.out").write_text(done.stdout)
    (tmp_path / "submit.err").write_text(done.stderr)
    assert done.returncode == 0, done.stderr[-6000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert s3_location.options["aws_secret_access_key"] not in done.stdout + done.stderr
    # It ran on the cluster: the driver's environment names no master (no STATESNAP_SPARK_MASTER),
    # so only spark-submit's --master can have put the application there.
    ran = [a for a in _apps(spark_cluster) if a["id"] not in before]
    assert len(ran) == 1, ran
    assert ran[0]["state"] == "FINISHED", ran

    ends = kafka.end_offsets(records, range(PARTITIONS))
    expected = truth_digest(records)
    assert result["engine"] == "spark"
    assert result["written"] is True
    assert result["keys"] == expected[1]
    assert {int(p): o for p, o in result["offsets"].items()} == ends
    got = _checkpoint_digest(kafka.bootstrap, topic_name, "submitted", s3_location, result["checkpoint"])
    assert got == expected


def test_pyspark_ships_spark_class_for_the_daemons() -> None:
    """The fixture's premise: pip-installed pyspark has bin/spark-class and the deploy jars."""
    home = spark_home()
    assert os.access(home / "bin" / "spark-class", os.X_OK)
    assert any(p.name.startswith("spark-core") for p in (home / "jars").iterdir())
