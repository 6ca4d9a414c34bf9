"""Follower benchmark: boot time, end-to-end freshness, HTTP lookup throughput (prints a table).

1. Boot: an owner materializes a checkpoint of K keys after H = K x --history-factor updates, then
   a small tail arrives; a Follower boots from the checkpoint, a Table replays everything. Both
   digests must match.
2. Freshness: while a producer writes --rate updates/s, a probe writes a record, takes the offset
   from its delivery report, and times produce() → follower.wait_for({p: offset}) → get() returns
   it. Reported: p50 / p99 / max over all probes (target p99 < 500 ms on loopback).
3. Lookups: ``statesnap serve`` in its own process (booted from the same checkpoint); a load
   generator here (threads, one keep-alive httpx client each) requests random existing keys for
   --lookup-seconds (at most --lookup-max requests). Reported: requests/s, p50 / p99 latency.

    .venv/bin/python benchmarks/follower.py                                      # 100 k keys, 1 M history
    .venv/bin/python benchmarks/follower.py --keys 20000 --freshness-seconds 5 --lookup-seconds 5  # quick
    .venv/bin/python benchmarks/follower.py --s3                                 # checkpoints on moto S3

Everything runs on loopback: the embedded broker (Tansu), optionally the moto S3 server, the serve
process and the load generator share this machine's cores, so the numbers are a floor.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from confluent_kafka import Producer
from rich.console import Console
from rich.table import Table as RichTable

from statesnap import CheckpointOptions, Table
from statesnap.devstack import EmbeddedBroker, EmbeddedS3
from statesnap.devstack.process import free_port
from statesnap.digest import table_digest
from statesnap.kafka.config import KafkaSettings
from statesnap.python.follower import Follower
from statesnap.sample import SampleSpec, produce_sample

console = Console(stderr=True)

SERVE_MAIN = (
    "import sys; from statesnap.cli.serve import serve; serve(sys.argv[1:], prog_name='statesnap serve')"
)


@dataclass
class Results:
    rows: list[tuple[str, str, str]] = field(default_factory=list)

    def add(self, section: str, metric: str, value: str) -> None:
        self.rows.append((section, metric, value))
        console.print(f"  {section}: {metric} = {value}")


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- 1. boot -------------------------------------------------------------------------------------------


def bench_boot(
    bs: str, topic: str, url: str, options: dict[str, str], args: argparse.Namespace, out: Results
) -> Follower:
    settings = KafkaSettings(bs)
    history = args.keys * args.history_factor
    t0 = time.monotonic()
    produce_sample(
        settings, SampleSpec(topic, args.partitions, args.keys, history, 0.01, args.value_bytes, 1)
    )
    console.print(f"produced {history:,} updates over {args.keys:,} keys in {time.monotonic() - t0:.1f}s")
    owner = Table(
        topic,
        bootstrap_servers=bs,
        checkpoints=CheckpointOptions(url, storage_options=options),
        background=False,
    )
    owner.start()
    manifest = owner.checkpoint()
    owner.close(checkpoint=False)
    assert manifest is not None
    tail = max(1, history // 100)
    produce_sample(settings, SampleSpec(topic, args.partitions, args.keys, tail, 0.01, args.value_bytes, 2))

    follower = Follower(
        topic, bootstrap_servers=bs, checkpoints=CheckpointOptions(url, storage_options=options)
    )
    rep = follower.start()
    boot = follower.status().restore_seconds or 0.0
    d_follower = table_digest(follower.raw_items())

    full = Table(topic, bootstrap_servers=bs, background=False)
    t0 = time.monotonic()
    full_rep = full.start()
    full_s = time.monotonic() - t0
    d_full = table_digest(full.raw_items())
    full.close(checkpoint=False)

    out.add("boot", "history (updates) / keys", f"{history + tail:,} / {d_follower[1]:,}")
    out.add(
        "boot",
        "follower boot from checkpoint (s)",
        f"{boot:.2f} (load {rep.load_seconds:.2f}, tail of {rep.replayed_records:,} records "
        f"{rep.replay_seconds:.2f})",
    )
    out.add("boot", "full replay (s)", f"{full_s:.2f} ({full_rep.replayed_records:,} records)")
    out.add("boot", "speed-up", f"{full_s / max(boot, 1e-9):.1f}x")
    out.add("boot", "follower == full replay", "yes" if d_follower == d_full else "NO")
    return follower


# --- 2. freshness ------------------------------------------------------------------------------------


class PacedLoad:
    """Writes ``rate`` updates/s in 10 ms ticks on its own producer until stopped."""

    def __init__(self, bs: str, topic: str, keys: int, rate: int, value_bytes: int) -> None:
        self.producer = Producer(
            {
                "bootstrap.servers": bs,
                "linger.ms": 5,
                "enable.idempotence": False,
                "queue.buffering.max.messages": 1_000_000,
            }
        )
        self.topic, self.keys, self.rate = topic, keys, rate
        self.value = b"x" * value_bytes
        self.sent = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name="paced-load", daemon=True)

    def run(self) -> None:
        rng = random.Random(5)
        started = time.monotonic()
        while not self.stop.is_set():
            due = int((time.monotonic() - started) * self.rate)
            while self.sent < due:
                key = b"key-%d" % rng.randrange(self.keys)
                try:
                    self.producer.produce(self.topic, self.value, key)
                except BufferError:
                    self.producer.poll(0.01)
                    continue
                self.sent += 1
            self.producer.poll(0)
            time.sleep(0.01)
        self.producer.flush(30)

    def __enter__(self) -> PacedLoad:
        self.started = time.monotonic()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.elapsed = time.monotonic() - self.started
        self.stop.set()
        self.thread.join(60)


def bench_freshness(bs: str, topic: str, follower: Follower, args: argparse.Namespace, out: Results) -> None:
    probe = Producer({"bootstrap.servers": bs, "linger.ms": 0})
    latencies: list[float] = []
    after_delivery: list[float] = []
    failures = 0
    with PacedLoad(bs, topic, args.keys, args.rate, args.value_bytes) as load:
        time.sleep(0.5)  # let the load reach its rate
        deadline = time.monotonic() + args.freshness_seconds
        i = 0
        while time.monotonic() < deadline:
            key, value = b"probe-%d" % (i % 50), b"probe-value-%d" % i
            box: dict[str, int] = {}

            def delivered(err: Any, msg: Any, box: dict[str, int] = box) -> None:
                if err is None:
                    box.update(p=msg.partition(), o=msg.offset())

            t0 = time.monotonic()
            probe.produce(topic, value, key, on_delivery=delivered)
            while not box:
                probe.poll(0.001)
            t1 = time.monotonic()
            if follower.wait_for({box["p"]: box["o"]}, timeout=5) and follower.get_raw(key) == value:
                now = time.monotonic()
                latencies.append(now - t0)
                after_delivery.append(now - t1)
            else:
                failures += 1
            i += 1
            time.sleep(0.02)
    achieved = load.sent / load.elapsed
    out.add("freshness", "write load (updates/s achieved)", f"{achieved:,.0f} (target {args.rate:,})")
    out.add("freshness", "probes (visible / failed)", f"{len(latencies)} / {failures}")
    out.add(
        "freshness",
        "produce → visible p50 / p99 / max (ms)",
        f"{percentile(latencies, 0.5) * 1000:.1f} / {percentile(latencies, 0.99) * 1000:.1f} / "
        f"{max(latencies, default=float('nan')) * 1000:.1f}",
    )
    out.add(
        "freshness",
        "delivery report → visible p50 / p99 (ms)",
        f"{percentile(after_delivery, 0.5) * 1000:.1f} / {percentile(after_delivery, 0.99) * 1000:.1f}",
    )
    verdict = "yes" if percentile(latencies, 0.99) < 0.5 else "NO"
    out.add("freshness", "p99 < 500 ms", verdict)


# --- 3. lookups ------------------------------------------------------------------------------------------


@contextmanager
def serve_process(bs: str, topic: str, url: str, options: dict[str, str]) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-c", SERVE_MAIN, "-b", bs, "-t", topic, "-c", url, "--port", str(port)]
    for k, v in options.items():
        cmd += ["--storage-option", f"{k}={v}"]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
        try:
            yield wait_healthy(proc, f"http://127.0.0.1:{port}", log)
        finally:
            proc.terminate()
            proc.wait(30)


def wait_healthy(proc: subprocess.Popen[bytes], base: str, log: Any) -> str:
    deadline = time.monotonic() + 300
    with httpx.Client(base_url=base, timeout=5) as http:
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"serve exited: {log.read().decode(errors='replace')}")
            try:
                if http.get("/health").status_code == 200:
                    return base
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("serve never became healthy")
            time.sleep(0.1)


def bench_lookups(base: str, topic: str, args: argparse.Namespace, out: Results) -> None:
    latencies: list[list[float]] = [[] for _ in range(args.lookup_threads)]
    errors = [0] * args.lookup_threads
    per_thread = max(1, args.lookup_max // args.lookup_threads)
    start = threading.Barrier(args.lookup_threads + 1)
    deadline = [0.0]

    def worker(n: int) -> None:
        rng = random.Random(n)
        with httpx.Client(base_url=base, timeout=10) as http:
            http.get("/health")  # open the keep-alive connection before timing
            start.wait()
            mine = latencies[n]
            for _ in range(per_thread):
                if time.monotonic() > deadline[0]:
                    break
                t0 = time.monotonic()
                r = http.get(f"/tables/{topic}/keys/key-{rng.randrange(args.keys)}")
                mine.append(time.monotonic() - t0)
                if r.status_code not in (200, 404):
                    errors[n] += 1

    threads = [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(args.lookup_threads)]
    for t in threads:
        t.start()
    deadline[0] = time.monotonic() + args.lookup_seconds
    start.wait()
    t0 = time.monotonic()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    every = [x for lat in latencies for x in lat]
    out.add("lookups", "requests (threads)", f"{len(every):,} ({args.lookup_threads})")
    out.add("lookups", "throughput (requests/s)", f"{len(every) / elapsed:,.0f}")
    out.add(
        "lookups",
        "latency p50 / p99 (ms)",
        f"{percentile(every, 0.5) * 1000:.2f} / {percentile(every, 0.99) * 1000:.2f}",
    )
    out.add("lookups", "errors (not 200/404)", str(sum(errors)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--history-factor", type=int, default=10, help="history = keys x this many updates")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument(
        "--rate", type=int, default=10_000, help="write load during the freshness run (updates/s)"
    )
    ap.add_argument("--freshness-seconds", type=float, default=10.0)
    ap.add_argument("--lookup-seconds", type=float, default=10.0)
    ap.add_argument("--lookup-threads", type=int, default=8)
    ap.add_argument("--lookup-max", type=int, default=200_000, help="upper bound on lookup requests")
    ap.add_argument("--s3", action="store_true", help="checkpoints on an embedded moto S3 server")
    args = ap.parse_args()
    out = Results()
    topic = f"bench-follower-{uuid.uuid4().hex[:8]}"
    with ExitStack() as stack:
        broker = stack.enter_context(EmbeddedBroker())
        bs = broker.bootstrap_servers
        if args.s3:
            s3 = stack.enter_context(EmbeddedS3())
            bucket = s3.create_bucket(f"bench-{uuid.uuid4().hex[:8]}")
            url, options = f"s3://{bucket}/ckpt", s3.storage_options()
        else:
            url, options = stack.enter_context(tempfile.TemporaryDirectory()), {}
        console.print(
            f"[bold]follower benchmark[/] keys={args.keys:,} history x{args.history_factor} "
            f"partitions={args.partitions} store={'s3' if args.s3 else 'file'} cores={os.cpu_count()}"
        )
        follower = bench_boot(bs, topic, url, options, args, out)
        try:
            bench_freshness(bs, topic, follower, args, out)
        finally:
            follower.close()
        with serve_process(bs, topic, url, options) as base:
            bench_lookups(base, topic, args, out)

    table = RichTable(title="statesnap follower benchmark")
    for col in ("section", "metric", "value"):
        table.add_column(col)
    for row in out.rows:
        table.add_row(*row)
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
