"""Where ``store="auto"`` should switch from the dict store to the columnar one.

For each row count N: write a checkpoint of N keys (``key-<i>``, 100-byte values, 8 partitions)
with statesnap's writer to a local directory; then, each in a fresh process, restore it into the
``memory`` and the ``columnar`` store, apply a tail of T records (random keys over 2N: half
updates, half new keys, batches of 500 as a consumer hands them over) and make the table ready
(one ``get``: the columnar store builds its key index on the first lookup). Wall seconds of
restore + tail + ready, min and median of the repeats, runs interleaved so a busy neighbour hits
both stores alike; then the smallest N where columnar wins, with the load average.

    .venv/bin/python benchmarks/auto_store.py                              # ~2 min
    .venv/bin/python benchmarks/auto_store.py --keys 30000,100000,300000,1000000 --tail 200000

The figures set ``statesnap.stores.AUTO_COLUMNAR_ROWS``. Not a test: it prints a table.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import scale  # the checkpoint writer and message stand-in of benchmarks/scale.py
from fresh_process import parse_or_run_child, run_child


def child(args: dict[str, Any]) -> dict[str, Any]:
    from statesnap.blob import open_blob_store
    from statesnap.checkpoint.repository import CheckpointRepository
    from statesnap.stores import open_state_store

    n, tail_n = args["keys"], args["tail"]
    repo = CheckpointRepository.for_table(open_blob_store(args["url"]), scale.CLUSTER, scale.TABLE)
    manifest = repo.latest()
    assert manifest is not None
    rng = random.Random(args["seed"])
    tail = [scale._Msg(b"key-%d" % rng.randrange(2 * n), b"y" * scale.VALUE_BYTES, i) for i in range(tail_n)]
    store = open_state_store(args["what"])
    started = time.perf_counter()
    for p, rows in repo.iter_partitions(manifest):
        store.load(p, rows)
    restored = time.perf_counter() - started
    for lo in range(0, len(tail), 500):
        store.apply_messages(lo // 500 % 8, tail[lo : lo + 500])
    store.get(b"key-0")  # ready: the first read
    seconds = time.perf_counter() - started
    store.close()
    return {"seconds": seconds, "restore": restored}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", default="100000,300000,1000000", help="comma-separated row counts")
    ap.add_argument("--tail", type=int, default=200_000, help="records applied after the restore")
    ap.add_argument("--repeat", type=int, default=3)
    args = parse_or_run_child(ap, child)
    if args is None:
        return
    print("| rows | tail | store | restore+tail+ready s min | median | restore s (median) | load avg |")
    print("|---|---|---|---|---|---|---|")
    crossover = None
    for n in [int(k) for k in args.keys.split(",")]:
        with tempfile.TemporaryDirectory() as root:
            url = f"file://{root}"
            scale.write_checkpoint(url, {}, n, 8)
            runs: dict[str, list[dict[str, Any]]] = {"memory": [], "columnar": []}
            for rep in range(args.repeat):
                for what, done in runs.items():
                    done.append(
                        run_child(
                            __file__, {"what": what, "keys": n, "tail": args.tail, "url": url, "seed": rep}
                        )
                    )
        load = os.getloadavg()[0]
        medians = {}
        for what, rs in runs.items():
            secs = [r["seconds"] for r in rs]
            medians[what] = statistics.median(secs)
            print(
                f"| {n:,} | {args.tail:,} | {what} | {min(secs):.3f} | {medians[what]:.3f} "
                f"| {statistics.median(r['restore'] for r in rs):.3f} | {load:.1f} |",
                flush=True,
            )
        if crossover is None and medians["columnar"] < medians["memory"]:
            crossover = n
    print(
        f"# columnar is faster (median) from {crossover:,} rows"
        if crossover
        else "# memory faster throughout"
    )


if __name__ == "__main__":
    main()
