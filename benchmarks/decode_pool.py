"""Which memory pool a restore should decode checkpoint files into (``statesnap/decode_memory.py``).

Write a checkpoint of N keys (``key-<i>``, 100-byte values, 8 partitions, with their persisted key
indexes) with statesnap's writer to a local directory; then restore it into the columnar store,
each restore in a fresh process, alternating between jemalloc's pool (statesnap's choice) and
Arrow's default pool (mimalloc, chosen with ``ARROW_DEFAULT_MEMORY_POOL=mimalloc``). Per restore:
seconds until ready (the first lookup answers), peak RSS above the process's RSS before the restore
(after the background build of one key index over the partitions), random ``get``/s on present
keys afterwards (CPU time, best of 3 passes of 200 k) and how much of the process sits on
transparent huge pages. Prints best / median / max of the ready seconds and medians of the rest,
with the kernel's THP settings and the load average: the pool decides huge pages, and huge pages
decide both the lookups (fewer TLB misses) and the stalls (a kernel with THP ``defrag=madvise``
compacts memory while a fault on memory that asked for huge pages waits).

    .venv/bin/python benchmarks/decode_pool.py                   # 10 M keys, 8 restores each, ~4 min
    .venv/bin/python benchmarks/decode_pool.py --keys 1000000 --repeat 4

Not a test: it prints a table (and ``--json`` rows).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import scale  # the checkpoint writer of benchmarks/scale.py
from fresh_process import parse_or_run_child, peak_rss, rss_now, run_child

#: The pools compared, and the environment that chooses each.
POOLS = {"jemalloc (statesnap)": {}, "mimalloc (Arrow's default)": {"ARROW_DEFAULT_MEMORY_POOL": "mimalloc"}}


def child(args: dict[str, Any]) -> dict[str, Any]:
    from statesnap.blob import open_blob_store
    from statesnap.checkpoint.repository import CheckpointRepository
    from statesnap.decode_memory import decode_pool
    from statesnap.stores import open_state_store

    repo = CheckpointRepository.for_table(open_blob_store(args["url"]), scale.CLUSTER, scale.TABLE)
    manifest = repo.latest()
    assert manifest is not None
    before = rss_now()
    with tempfile.TemporaryDirectory() as tmp:
        store = open_state_store("columnar", path=tmp, name="bench")
        started = time.perf_counter()
        for p, part in repo.iter_decoded(manifest, indexes=True):
            store.load(p, part.rows, part.index)
        store.get(b"key-0")
        ready = time.perf_counter() - started
        store.wait_indexed(600)  # type: ignore[attr-defined]
        peak = peak_rss() - before
        rng = random.Random(1)
        probe = [b"key-%d" % rng.randrange(args["keys"]) for _ in range(200_000)]
        rates = []
        for _ in range(3):
            t = time.process_time()
            for k in probe:
                store.get(k)
            rates.append(len(probe) / (time.process_time() - t))
        huge = 0
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    huge = int(line.split()[1]) * 1024
        store.close()
    return {
        "pool": decode_pool().backend_name,
        "ready": ready,
        "peak": peak,
        "gets": max(rates),
        "huge": huge,
    }


def thp_setting(name: str) -> str:
    """The kernel's chosen transparent-huge-page setting (the bracketed word of the sysfs file)."""
    try:
        text = Path(f"/sys/kernel/mm/transparent_hugepage/{name}").read_text()
    except OSError:
        return "n/a"
    return next((w.strip("[]") for w in text.split() if w.startswith("[")), text.strip())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=10_000_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=8, help="restores per pool, alternating")
    ap.add_argument("--json", action="store_true", help="also print the rows as JSON lines")
    args = parse_or_run_child(ap, child)
    if args is None:
        return
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in POOLS}
    loads: list[float] = []
    with tempfile.TemporaryDirectory() as root:
        t = time.perf_counter()
        raw, _ = scale.write_checkpoint(f"file://{root}", {}, args.keys, args.partitions)
        print(f"# {args.keys:,} keys: checkpoint written in {time.perf_counter() - t:.1f}s", file=sys.stderr)
        cell = {"url": f"file://{root}", "keys": args.keys}
        labels = list(POOLS)
        for rep in range(args.repeat):
            for label in labels if rep % 2 == 0 else labels[::-1]:  # alternating: neighbours hit both
                # The pool is the label's alone: a user's ARROW_DEFAULT_MEMORY_POOL is unset.
                env = {"ARROW_DEFAULT_MEMORY_POOL": None, **POOLS[label]}
                runs[label].append(run_child(__file__, cell, env))
                loads.append(os.getloadavg()[0])
            print(f"# repeat {rep + 1}/{args.repeat} done", file=sys.stderr)
    print(
        f"{args.keys:,} keys ({raw / 2**20:,.0f} MiB of keys and values), {args.repeat} restores per pool, "
        f"THP enabled={thp_setting('enabled')} defrag={thp_setting('defrag')}, "
        f"load average {statistics.median(loads):.1f}"
    )
    print()
    print(
        "| decode pool | ready s: best / median / max | peak RSS MiB (median) | get/s (median) "
        "| huge pages MiB (median) |"
    )
    print("|---|---|---|---|---|")
    rows = []
    for label, rs in runs.items():
        ready = sorted(r["ready"] for r in rs)
        row = {
            "pool": label,
            "backend": rs[0]["pool"],
            "ready_best": ready[0],
            "ready_median": statistics.median(ready),
            "ready_max": ready[-1],
            "peak_mib": statistics.median(r["peak"] for r in rs) / 2**20,
            "gets_per_s": statistics.median(r["gets"] for r in rs),
            "huge_mib": statistics.median(r["huge"] for r in rs) / 2**20,
        }
        rows.append(row)
        print(
            f"| {label} | {row['ready_best']:.2f} / {row['ready_median']:.2f} / {row['ready_max']:.2f} "
            f"| {row['peak_mib']:,.0f} | {row['gets_per_s'] / 1e3:,.0f} k | {row['huge_mib']:,.0f} |"
        )
    if args.json:
        for row in rows:
            print(json.dumps(row))


if __name__ == "__main__":
    main()
