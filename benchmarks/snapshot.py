"""Snapshot latency across three instances, and the per-commit cost of ``target_generation``.

    .venv/bin/python benchmarks/snapshot.py [--snapshots 10] [--commit-interval 1]

Targets: ``create`` → ``COMPLETED`` under two commit intervals with 3 instances; checking the
target generation after each commit costs no broker or store round trip.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table as RichTable

from statesnap.devstack import EmbeddedBroker
from statesnap.kafka.config import KafkaSettings
from statesnap.sample import SampleSpec, produce_sample
from statesnap.snapshot.api import SnapshotApi
from statesnap.snapshot.model import SnapshotState


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--snapshots", type=int, default=10)
    ap.add_argument("--commit-interval", type=float, default=1.0)
    ap.add_argument("--instances", type=int, default=3)
    args = ap.parse_args()
    console = Console(stderr=True)
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as root:
        bs = broker.bootstrap_servers
        produce_sample(KafkaSettings(bs), SampleSpec("bench-snap", 8, 10_000, 100_000, 0.01, 100, 1))
        url = str(Path(root) / "ckpt")
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "statesnap.cli",
                    "materialize",
                    "-b",
                    bs,
                    "-t",
                    "bench-snap",
                    "--checkpoints",
                    url,
                    "--follow",
                    "--instance",
                    str(i),
                    "--instances",
                    str(args.instances),
                    "--commit-interval",
                    f"{args.commit_interval}s",
                    "--checkpoint-interval",
                    "1h",
                    "-q",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for i in range(args.instances)
        ]
        try:
            while not list(Path(url).glob("*/table.json")):
                time.sleep(0.2)
            time.sleep(5)
            api = SnapshotApi.open(url, "bench-snap")
            latencies = []
            for n in range(args.snapshots):
                started = time.monotonic()
                snap = api.create(label=f"bench-{n}")
                done = api.wait(snap.generation, "60s", poll=0.02)
                elapsed = time.monotonic() - started
                if done.state is not SnapshotState.COMPLETED:
                    raise SystemExit(f"snapshot {snap.generation} ended {done.state}: {done.error}")
                latencies.append(elapsed)
                console.print(f"  snapshot {snap.generation}: {elapsed:.2f}s")
            # Per-commit check: cached (block=False) vs a store read (block=True).
            orch = api.orchestrator
            orch.target_generation(block=True)
            n_cached = 100_000
            t0 = time.perf_counter()
            for _ in range(n_cached):
                orch.target_generation(block=False)
            cached_us = (time.perf_counter() - t0) / n_cached * 1e6
            n_block = 50
            t0 = time.perf_counter()
            for _ in range(n_block):
                orch.target_generation(block=True)
            block_us = (time.perf_counter() - t0) / n_block * 1e6
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(30)

    ci = args.commit_interval
    out = RichTable(title=f"snapshots across {args.instances} instances, commit interval {ci:g}s")
    for col in ("metric", "value", "target"):
        out.add_column(col)
    p50 = statistics.median(latencies)
    p_max = max(latencies)
    out.add_row("create → COMPLETED p50", f"{p50:.2f}s ({p50 / ci:.2f} commit intervals)", f"< {2 * ci:g}s")
    out.add_row(
        "create → COMPLETED max", f"{p_max:.2f}s ({p_max / ci:.2f} commit intervals)", f"< {2 * ci:g}s"
    )
    out.add_row("target_generation(block=False)", f"{cached_us:.2f} µs/call (no I/O)", "no round trip")
    out.add_row("target_generation(block=True)", f"{block_us:.0f} µs/call (store listing)", "-")
    Console(width=140).print(out)


if __name__ == "__main__":
    main()
