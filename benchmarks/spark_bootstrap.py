"""Spark bootstrap vs the single-process materializer, side by side in one run (prints a table).

Starts the embedded broker, produces N updates, then measures on the same topic:

- the ``statesnap-kafka`` source's raw read rate (all records into Spark, ``noop`` sink);
- Spark ``bootstrap()``: full history → one sorted base file per partition + manifest;
- the single-process rate: ``statesnap.Table`` full replay + checkpoint (what
  ``statesnap materialize`` does with the Python engine);
- scale-out: Spark ``bootstrap()`` on a Spark standalone cluster on 127.0.0.1 (master and workers
  as separate JVMs, started from the pyspark installation) with 1 and then 2 workers of one core
  each, on the same topic; printed as ratios to the single process and 2 workers vs 1.

    .venv/bin/python benchmarks/spark_bootstrap.py                                  # 10 M / 1 M keys
    .venv/bin/python benchmarks/spark_bootstrap.py --updates 1000000 --keys 100000  # quick
    .venv/bin/python benchmarks/spark_bootstrap.py --cluster-workers ""             # local only

Targets (2-core machine): Spark bootstrap >= 1.5x the single-process rate; source >= 300 k
records/s. Every checkpoint is compared with the single process's by table digest. On a 2-core
machine the broker, the driver and both workers share the same two cores: 2 workers cannot reach
2x of 1 there; the ratio says how much of the second core the job turns into throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table as RichTable

from statesnap import Table
from statesnap.blob import open_blob_store
from statesnap.checkpoint import CheckpointManifest, CheckpointRepository
from statesnap.devstack import EmbeddedBroker
from statesnap.digest import table_digest
from statesnap.kafka.config import KafkaSettings
from statesnap.sample import SampleSpec, produce_sample

console = Console(stderr=True)


def checkpoint_digest(url: str, manifest: CheckpointManifest) -> tuple[str, int]:
    """Digest of a checkpoint, loaded in this process (independent of the engine that wrote it)."""
    repo = CheckpointRepository.for_table(open_blob_store(url), manifest.cluster_id, manifest.table)
    pairs: list[tuple[bytes, bytes]] = []
    for _p, rows in repo.iter_partitions(manifest):
        pairs.extend(zip(rows.column("key").to_pylist(), rows.column("value").to_pylist(), strict=True))
    return table_digest(pairs)


#: librdkafka's default ``fetch.queue.backoff.ms`` (1 s) idles a fast consumer on the dev broker;
#: the Spark jobs and the core ChangelogReader both set 5 ms now, so ``--tuned`` (an extra
#: single-process run passing it explicitly) only re-checks that the shipped default matches.
TUNED = {"fetch.queue.backoff.ms": 5}


def single_process(
    bs: str, topic: str, url: str, kafka_config: dict[str, Any] | None = None, name: str = "python"
) -> tuple[float, CheckpointManifest, tuple[str, int]]:
    started = time.monotonic()
    table = Table(
        topic, bootstrap_servers=bs, name=name, checkpoints=url, background=False, kafka_config=kafka_config
    )
    table.start()
    manifest = table.checkpoint()
    elapsed = time.monotonic() - started
    digest = table_digest(table.raw_items())
    table.close(checkpoint=False)
    assert manifest is not None
    return elapsed, manifest, digest


def spark_session(cores: int, memory: str) -> Any:
    """statesnap's own local session (quiet, bound to loopback, workers checked)."""
    from statesnap.spark import spark_session as make

    return make(
        f"local[{cores}]",
        app_name="statesnap-bench",
        conf={"spark.driver.memory": memory, "spark.sql.shuffle.partitions": str(cores * 2)},
    )


def cluster_bootstrap(
    workers: int, bs: str, topic: str, url: str, root: Path, repeat: int
) -> tuple[float, float, Any]:
    """(session + warm-up seconds, best bootstrap seconds of *repeat*, manifest) on a fresh
    standalone cluster of *workers* workers with one core each; stopped after."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration" / "spark_cluster"))
    from standalone import StandaloneCluster

    from statesnap.spark import bootstrap, spark_session

    os.environ["PYSPARK_PYTHON"] = sys.executable  # the executors' interpreter: same path here
    with StandaloneCluster(root / f"cluster-{workers}", workers=workers, cores=1, memory="2g") as cluster:
        t0 = time.monotonic()
        spark = spark_session(
            cluster.master_url,
            app_name=f"statesnap-bench-{workers}w",
            conf={
                "spark.executor.memory": "1g",
                "spark.cores.max": str(workers),
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
            },
        )
        try:
            sc = spark.sparkContext
            while sc._jsc.sc().getExecutorIds().size() < workers:
                if time.monotonic() - t0 > 120:
                    raise TimeoutError(f"{workers} executors did not register")
                time.sleep(0.2)
            # Warm every executor's Python workers, as the local run's warm-up does.
            sc.parallelize(range(workers * 4), workers * 4).map(lambda x: x).count()
            source_read(spark, bs, topic, endingOffsets=json.dumps({topic: {"0": 1}}))
            warm = time.monotonic() - t0
            best, manifest = float("inf"), None
            for i in range(repeat):  # a fresh table each time: a second run would be incremental
                t1 = time.monotonic()
                manifest = bootstrap(spark, bootstrap_servers=bs, topic=topic, table=f"c{i}", checkpoints=url)
                best = min(best, time.monotonic() - t1)
            return warm, best, manifest
        finally:
            spark.stop()


def source_read(spark: Any, bs: str, topic: str, **options: str) -> float:
    started = time.monotonic()
    (
        spark.read.format("statesnap-kafka")
        .option("kafka.bootstrap.servers", bs)
        .option("subscribe", topic)
        .options(**options)
        .load()
        .write.format("noop")
        .mode("overwrite")
        .save()
    )
    return time.monotonic() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--updates", type=int, default=10_000_000)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--tombstone-ratio", type=float, default=0.01)
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 2, help="Spark local[N]")
    ap.add_argument("--driver-memory", default="4g")
    ap.add_argument(
        "--cluster-workers",
        default="1,2",
        help="standalone-cluster runs: comma-separated worker counts (one core each); '' to skip",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run every measurement N times and keep the fastest (the machine is shared: noise)",
    )
    ap.add_argument("--json", action="store_true", help="also print the results as JSON")
    ap.add_argument(
        "--tuned",
        action="store_true",
        help="also run the single process with fetch.queue.backoff.ms passed explicitly",
    )
    args = ap.parse_args()

    from statesnap.spark import bootstrap, register

    topic = f"bench-{uuid.uuid4().hex[:8]}"
    spec = SampleSpec(
        topic, args.partitions, args.keys, args.updates, args.tombstone_ratio, args.value_bytes, seed=1
    )
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as root:
        bs = broker.bootstrap_servers
        console.print(
            f"[bold]producing {args.updates:,} updates over {args.keys:,} keys, "
            f"{args.partitions} partitions, {args.value_bytes}-byte values[/]"
        )
        t0 = time.monotonic()
        produce_sample(KafkaSettings(bs), spec)
        console.print(f"  produced in {time.monotonic() - t0:.1f}s")

        console.print("[bold]single process: Table full replay + checkpoint[/]")
        runs = [single_process(bs, topic, f"{root}/python", name=f"python{i}") for i in range(args.repeat)]
        py_s, py_manifest, py_digest = min(runs, key=lambda r: r[0])
        console.print(f"  {', '.join(f'{r[0]:.2f}s' for r in runs)}")
        tuned_s = None
        if args.tuned:
            console.print(f"[bold]single process, consumer tuned with {TUNED}[/]")
            tuned_s, _m, tuned_digest = single_process(bs, topic, f"{root}/python", TUNED, "tuned")
            assert tuned_digest == py_digest
            console.print(f"  {tuned_s:.2f}s")

        console.print(f"[bold]Spark local[{args.cores}][/]")
        t0 = time.monotonic()
        spark = spark_session(args.cores, args.driver_memory)
        register(spark)
        source_read(spark, bs, topic, endingOffsets=json.dumps({topic: {"0": 1}}))  # warm workers
        console.print(f"  session + warm-up {time.monotonic() - t0:.1f}s")
        src_s = min(source_read(spark, bs, topic) for _ in range(args.repeat))
        console.print(f"  source read {src_s:.2f}s")
        boot_s = float("inf")
        for i in range(args.repeat):
            t0 = time.monotonic()
            manifest = bootstrap(
                spark, bootstrap_servers=bs, topic=topic, table=f"spark{i}", checkpoints=f"{root}/spark"
            )
            boot_s = min(boot_s, time.monotonic() - t0)
            console.print(f"  bootstrap {time.monotonic() - t0:.2f}s")
        spark.stop()
        spark_digest = checkpoint_digest(f"{root}/spark", manifest)

        clusters: dict[int, tuple[float, float, bool]] = {}
        for workers in [int(w) for w in args.cluster_workers.split(",") if w.strip()]:
            console.print(f"[bold]Spark standalone cluster: {workers} worker(s) x 1 core[/]")
            warm_s, c_s, c_manifest = cluster_bootstrap(
                workers, bs, topic, f"{root}/cluster{workers}", Path(root), args.repeat
            )
            same = checkpoint_digest(f"{root}/cluster{workers}", c_manifest) == py_digest
            clusters[workers] = (warm_s, c_s, same)
            console.print(f"  cluster + session + warm-up {warm_s:.1f}s, bootstrap {c_s:.2f}s")

    n = args.updates
    py_rate, src_rate, boot_rate = n / py_s, n / src_s, n / boot_s
    out = RichTable(
        title=f"Spark bootstrap benchmark: {n:,} updates, {args.keys:,} keys, "
        f"{args.partitions} partitions, local[{args.cores}]"
    )
    for col in ("run", "seconds", "records/s", "vs single process", "target"):
        out.add_column(col, justify="right")
    out.add_row("single process (Table replay + checkpoint)", f"{py_s:.2f}", f"{py_rate:,.0f}", "1.00x", "")
    if tuned_s is not None:
        out.add_row(
            f"single process, tuned consumer {TUNED}",
            f"{tuned_s:.2f}",
            f"{n / tuned_s:,.0f}",
            f"{py_s / tuned_s:.2f}x",
            "(proposed core change)",
        )
    out.add_row(
        "statesnap-kafka source, raw read",
        f"{src_s:.2f}",
        f"{src_rate:,.0f}",
        f"{src_rate / py_rate:.2f}x",
        f">= 300,000/s {'ok' if src_rate >= 300_000 else 'MISSED'}",
    )
    out.add_row(
        "Spark bootstrap (read + fold + write + commit)",
        f"{boot_s:.2f}",
        f"{boot_rate:,.0f}",
        f"{boot_rate / py_rate:.2f}x",
        f">= 1.5x {'ok' if boot_rate >= 1.5 * py_rate else 'MISSED'}",
    )
    for workers, (_warm, c_s, same) in clusters.items():
        ratio = f"{py_s / c_s:.2f}x"
        if workers != 1 and 1 in clusters:
            ratio += f" ({clusters[1][1] / c_s:.2f}x of 1 worker)"
        out.add_row(
            f"Spark standalone, {workers} worker(s) x 1 core",
            f"{c_s:.2f}",
            f"{n / c_s:,.0f}",
            ratio,
            "digest equal" if same else "DIGEST DIFFERS",
        )
    Console(width=160).print(out)
    writer = dict(manifest.writer)
    print(
        f"keys: spark {spark_digest[1]:,} / python {py_digest[1]:,}; digests "
        f"{'equal' if spark_digest == py_digest else 'DIFFER'}; python checkpoint "
        f"{py_manifest.total_bytes:,} bytes, spark {manifest.total_bytes:,} bytes"
    )
    if tuned_s is not None:
        print(f"Spark bootstrap vs the tuned single process: {tuned_s / boot_s:.2f}x")
    print(
        f"spark bootstrap: plan {writer.get('plan_seconds')}s, job {writer.get('job_seconds')}s, "
        f"tasks {writer.get('tasks')}, task seconds {writer.get('task_seconds')}"
    )
    if args.json:
        print(
            json.dumps(
                {
                    "updates": n,
                    "keys": args.keys,
                    "single_process_s": py_s,
                    "tuned_single_process_s": tuned_s,
                    "source_s": src_s,
                    "bootstrap_s": boot_s,
                    "cluster_bootstrap_s": {str(w): c[1] for w, c in clusters.items()},
                    "cluster_digests_equal": all(c[2] for c in clusters.values()),
                    "writer": writer,
                }
            )
        )


if __name__ == "__main__":
    main()
