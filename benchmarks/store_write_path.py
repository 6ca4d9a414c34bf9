"""Where a count's time goes in each state store: the batch fold's two store calls, timed apart.

``proc.count``'s batch fold asks the store for the batch's distinct keys once (``get_many``) and
writes their new counts once (``apply``). This script makes those two calls the way the fold does,
with no broker, no decoding and no processor around them: N records over K random keys (``numpy``,
seeded), batches of B records, a key's count kept as its decimal text. Each store runs in a fresh
process. It prints, per store, the microseconds per record spent in ``get_many``, in ``apply`` and
in the benchmark's own Python between them (building keys and counts), and the ratio of each store's
total to the ``memory`` store's; then the final counts of 2,000 sampled keys are checked against
``numpy.bincount`` of the generated ids, so a store that lost or repeated a write fails the run.

    .venv/bin/python benchmarks/store_write_path.py                       # 3 M records, ~40 s
    .venv/bin/python benchmarks/store_write_path.py --records 300000 --stores rocksdb,memory

It answers what ``benchmarks/rocksdb_state.py`` cannot: how much of the RocksDB store's catch-up
time is RocksDB's own (the ``MultiGet`` and the ``WriteBatch`` through rocksdict) rather than the
processor's, which every store pays alike. Not a test: it prints a markdown table (``--json``:
one JSON document, a row per store); a count that differs from ``numpy.bincount`` fails it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from typing import Any

import numpy as np
from fresh_process import parse_or_run_child, run_child

from statesnap.stores import open_state_store

PARTITION = 1
TIMESTAMP = 1_700_000_000_000
PREFIX = PARTITION.to_bytes(4, "big")  # what the processor's store keys start with
SAMPLED = 2_000


def key_ids(records: int, keys: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, keys, records)


def child(a: dict[str, Any]) -> dict[str, Any]:
    ids = key_ids(a["records"], a["keys"], a["seed"])
    store = open_state_store(a["store"])
    batch = a["batch"]
    spent = {"get_many": 0.0, "apply": 0.0, "python": 0.0}
    clock = time.perf_counter
    started = clock()
    offset = 0
    try:
        for lo in range(0, len(ids), batch):
            t0 = clock()
            keys = [PREFIX + b"k%09d" % i for i in ids[lo : lo + batch].tolist()]
            tally = Counter(keys)  # a key may come more than once in a batch
            distinct = list(tally)
            t1 = clock()
            held = store.get_many(distinct)
            t2 = clock()
            rows = [
                (k, b"%d" % (tally[k] + (0 if h is None else int(h))), offset + j, TIMESTAMP)
                for j, (k, h) in enumerate(zip(distinct, held, strict=True))
            ]
            offset += len(keys)
            t3 = clock()
            store.apply(PARTITION, rows)
            t4 = clock()
            spent["python"] += (t1 - t0) + (t3 - t2)
            spent["get_many"] += t2 - t1
            spent["apply"] += t4 - t3
        wall = clock() - started
        sample = np.random.default_rng(a["seed"] + 1).choice(a["keys"], SAMPLED, replace=False)
        got = store.get_many([PREFIX + b"k%09d" % i for i in sample.tolist()])
        counts = [0 if g is None else int(g) for g in got]
    finally:
        store.close()
    return {
        "store": a["store"],
        "wall_s": wall,
        "spent_s": spent,
        "counts": counts,
        "sample": sample.tolist(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=3_000_000)
    ap.add_argument("--keys", type=int, default=2_500_000, help="key space the records draw from")
    ap.add_argument("--batch", type=int, default=2_000, help="records per get_many + apply")
    ap.add_argument("--stores", default="memory,columnar,rocksdb", help="comma-separated store kinds")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", action="store_true", help="one JSON document, not the table")
    args = parse_or_run_child(ap, child)
    if args is None:
        return
    if args.keys < SAMPLED:
        sys.exit(f"store_write_path: --keys must be at least {SAMPLED} (the sampled keys)")
    truth = np.bincount(key_ids(args.records, args.keys, args.seed), minlength=args.keys)
    load = os.getloadavg()[0]
    results = []
    for kind in args.stores.split(","):
        shape = {"records": args.records, "keys": args.keys, "batch": args.batch, "seed": args.seed}
        r = run_child(__file__, {"store": kind, **shape})
        wrong = sum(1 for i, c in zip(r["sample"], r["counts"], strict=True) if truth[i] != c)
        r["counts_checked"], r["counts_wrong"] = len(r["counts"]), wrong
        del r["counts"], r["sample"]
        results.append(r)
    if args.json:
        print(json.dumps({"records": args.records, "keys": args.keys, "load_start": load, "rows": results}))
    else:
        print_table(args, load, results)
    if any(r["counts_wrong"] for r in results):
        sys.exit("store_write_path: a store's counts differ from numpy.bincount")


def print_table(args: argparse.Namespace, load: float, results: list[dict[str, Any]]) -> None:
    memory = next((r["wall_s"] for r in results if r["store"] == "memory"), None)
    per = 1e6 / args.records
    print(
        f"{args.records:,} records over {args.keys:,} keys, batches of {args.batch:,}; "
        f"load {load:.1f} at the start\n"
    )
    columns = ["store", "total", "rec/s", "get_many µs/rec", "apply µs/rec", "other Python µs/rec"]
    print("| " + " | ".join([*columns, "÷ memory", "counts"]) + " |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        s = r["spent_s"]
        ratio = f"{r['wall_s'] / memory:.2f}×" if memory else "–"
        verdict = "equal" if not r["counts_wrong"] else f"{r['counts_wrong']} of {r['counts_checked']} WRONG"
        print(
            f"| {r['store']} | {r['wall_s']:.1f} s | {args.records / r['wall_s'] / 1e3:.0f} k "
            f"| {s['get_many'] * per:.2f} | {s['apply'] * per:.2f} | {s['python'] * per:.2f} "
            f"| {ratio} | {verdict} |"
        )


if __name__ == "__main__":
    main()
