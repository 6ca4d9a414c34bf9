"""Restore at scale: each state store against the pyarrow read floor, from a file and from S3.

For each key count N: write a checkpoint of N keys (``key-<i>``, 100-byte values, P partitions)
with statesnap's own checkpoint writer, to a local directory and to the embedded moto S3 server.
Then, each in a fresh subprocess (so peak RSS is its own):

- the floor: ``pyarrow.parquet.read_table`` of the checkpoint's data files (local paths);
- per store and source: load every partition through ``CheckpointRepository.iter_partitions``
  into the store and make it ready (the columnar store builds its index on the first lookup):
  seconds, peak RSS above the process's RSS before the restore, bytes per key above the raw
  key+value bytes, ``get``/s on random present keys and tail-replay records/s.

    .venv/bin/python benchmarks/scale.py --keys 1000000                 # ~2 min
    .venv/bin/python benchmarks/scale.py --keys 1000000,10000000 --repeat 3

Targets (issue 9, this 2-core machine): columnar ≤ 1.6x the floor, memory ≤ 1.5x raw bytes,
≥ 500 k get/s, ≥ 200 k records/s replay; RocksDB ≤ 2x the floor; S3 ≤ 1.5x the local time.
Not a test: it prints a table (and ``--json`` rows) for the record.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

VALUE_BYTES = 100
CLUSTER = "bench-cluster"
TABLE = "scale"


@dataclass
class Result:
    keys: int
    what: str
    source: str
    seconds: float
    peak_rss_mb: float
    bytes_per_key_above_raw: float | None
    held_over_raw: float | None = None
    ratio_to_floor: float | None = None
    gets_per_s: float | None = None
    replay_per_s: float | None = None


def partition_table(p: int, partitions: int, n: int) -> pa.Table:
    """Partition *p*'s rows, sorted by key, built column-wise (no Python object per row)."""
    ids = pa.array(np.arange(p, n, partitions, dtype=np.int64))
    keys = pc.binary_join_element_wise(pa.scalar("key-"), pc.cast(ids, pa.string()), "").cast(pa.binary())
    pad = "x" * VALUE_BYTES
    values = pc.utf8_slice_codeunits(
        pc.binary_join_element_wise(pc.cast(ids, pa.string()), pa.scalar(":" + pad), ""), 0, VALUE_BYTES
    ).cast(pa.binary())
    ts = pa.array(np.full(len(ids), 1_700_000_000_000, dtype=np.int64)).cast(pa.timestamp("ms", tz="UTC"))
    # Offsets within the partition (0..rows-1), below the next offset the checkpoint records.
    offsets = pa.array(np.arange(len(ids), dtype=np.int64))
    table = pa.table({"key": keys, "value": values, "offset": offsets, "timestamp": ts})
    return table.sort_by("key")


def write_checkpoint(url: str, options: dict[str, str], n: int, partitions: int) -> tuple[int, list[str]]:
    """Write one checkpoint of *n* keys with statesnap's writer; raw bytes and data-file keys."""
    from statesnap.blob import open_blob_store
    from statesnap.checkpoint.repository import CheckpointRepository
    from statesnap.checkpoint.writer import PartitionUpdate

    try:  # the commit path moved to the snapshot package (issue "one system, two engines")
        from statesnap.task.write import write_checkpoint as commit
    except ImportError:  # pragma: no cover - older layout
        from statesnap.checkpoint.writer import write_checkpoint as commit  # type: ignore[attr-defined,no-redef]

    repo = CheckpointRepository.for_table(open_blob_store(url, **options), CLUSTER, TABLE)
    raw = 0
    updates = {}
    for p in range(partitions):
        t = partition_table(p, partitions, n)
        raw += sum(pc.sum(pc.binary_length(t.column(c))).as_py() for c in ("key", "value"))
        updates[p] = PartitionUpdate(p, t.num_rows, base=t)
    manifest = commit(repo, table=TABLE, topic=TABLE, cluster_id=CLUSTER, updates=updates)
    return raw, [repo.key(f.path) for f in manifest.files]


# --- measured in a child process ---------------------------------------------------------------


class _Msg:
    __slots__ = ("_k", "_o", "_v")

    def __init__(self, k: bytes, v: bytes, o: int) -> None:
        self._k, self._v, self._o = k, v, o

    def key(self) -> bytes:
        return self._k

    def value(self) -> bytes:
        return self._v

    def offset(self) -> int:
        return self._o

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_001)


def rss_now() -> int:
    """Current resident set size (bytes): the baseline the restore's peak is measured from."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss() -> int:
    """This process's RSS high-water mark. Not ``ru_maxrss``: Linux carries that over from the
    parent across fork + exec, so a child would report the parent's peak."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def child(args: dict[str, Any]) -> dict[str, Any]:
    """One measurement in a fresh process. Lookup and replay rates are per CPU second: the
    machine is shared, and wall time would measure the neighbours."""
    rss_before = rss_now()
    n = args["keys"]
    if args["what"] == "floor":
        import pyarrow.parquet as pq

        started = time.perf_counter()
        # As many files in flight as a restore has (repository.IO_THREADS): the same parallelism.
        with ThreadPoolExecutor(8) as pool:
            tables = list(pool.map(pq.read_table, args["paths"]))
        seconds = time.perf_counter() - started
        del tables
        return {
            "seconds": seconds,
            "peak": peak_rss() - rss_before,
        }

    from statesnap.blob import open_blob_store
    from statesnap.checkpoint.repository import CheckpointRepository
    from statesnap.stores import open_state_store

    repo = CheckpointRepository.for_table(open_blob_store(args["url"], **args["options"]), CLUSTER, TABLE)
    manifest = repo.latest()
    assert manifest is not None
    rss_before = rss_now()
    with tempfile.TemporaryDirectory() as tmp:
        store = open_state_store(args["what"], path=tmp, name="bench")
        started = time.perf_counter()
        for p, rows in repo.iter_partitions(manifest):
            store.load(p, rows)
        store.get(b"key-0")  # ready: the columnar index is built on the first lookup
        seconds = time.perf_counter() - started
        peak = peak_rss() - rss_before
        pa.default_memory_pool().release_unused()  # decode buffers the allocator still holds
        held = rss_now() - rss_before
        assert len(store) == n, (len(store), n)
        rng = random.Random(1)
        probe = [b"key-%d" % rng.randrange(n) for _ in range(200_000)]
        t = time.process_time()
        for k in probe:
            store.get(k)
        gets = len(probe) / (time.process_time() - t)
        tail = [_Msg(b"key-%d" % rng.randrange(2 * n), b"y" * VALUE_BYTES, i) for i in range(200_000)]
        t = time.process_time()
        for lo in range(0, len(tail), 500):
            store.apply_messages(lo // 500 % 8, tail[lo : lo + 500])
        replay = len(tail) / (time.process_time() - t)
        store.close()
    return {"seconds": seconds, "peak": peak, "held": held, "gets": gets, "replay": replay}


def run_child(args: dict[str, Any]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(args)],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **args.get("env", {})},
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def best(args: dict[str, Any], repeat: int) -> dict[str, Any]:
    runs = [run_child(args) for _ in range(repeat)]
    return min(runs, key=lambda r: float(r["seconds"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", default="1000000", help="comma-separated key counts, e.g. 1000000,10000000")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--stores", default="memory,columnar,rocksdb")
    ap.add_argument("--sources", default="file,s3")
    ap.add_argument("--repeat", type=int, default=1, help="best of this many runs per cell")
    ap.add_argument(
        "--baseline",
        metavar="PYTHONPATH",
        help="also measure each store from this source tree (e.g. a copy of src/ before a change), "
        "in the same run, labelled <store>@baseline",
    )
    ap.add_argument("--json", action="store_true", help="also print the rows as JSON lines")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return

    from statesnap.devstack import EmbeddedS3

    stores = args.stores.split(",")
    sources = args.sources.split(",")
    results: list[Result] = []
    s3 = EmbeddedS3() if "s3" in sources else None
    if s3 is not None:
        s3.start()
    try:
        for n in [int(k) for k in args.keys.split(",")]:
            with tempfile.TemporaryDirectory() as root:
                locations: dict[str, tuple[str, dict[str, str]]] = {"file": (f"file://{root}", {})}
                if s3 is not None:
                    bucket = s3.create_bucket(f"scale-{n}-{int(time.time())}")
                    locations["s3"] = (f"s3://{bucket}/ckpt", s3.storage_options())
                raw = 0
                paths: list[str] = []
                for source in sources:
                    url, options = locations[source]
                    t = time.perf_counter()
                    raw, keys = write_checkpoint(url, options, n, args.partitions)
                    print(
                        f"# {n:,} keys: checkpoint written to {source} in {time.perf_counter() - t:.1f}s",
                        file=sys.stderr,
                    )
                    if source == "file":
                        paths = [os.path.join(root, k) for k in keys]
                floor = best({"what": "floor", "keys": n, "paths": paths}, args.repeat)
                results.append(
                    Result(n, "pyarrow read (floor)", "file", floor["seconds"], floor["peak"] / 2**20, None)
                )
                for source in sources:
                    url, options = locations[source]
                    runs = [(store, store, {}) for store in stores]
                    if args.baseline:
                        runs += [(f"{st}@baseline", st, {"PYTHONPATH": args.baseline}) for st in stores]
                    for label, store, env in runs:
                        cell = {"what": store, "keys": n, "url": url, "options": options, "env": env}
                        r = best(cell, args.repeat)
                        results.append(
                            Result(
                                n,
                                label,
                                source,
                                r["seconds"],
                                r["peak"] / 2**20,
                                (r["peak"] - raw) / n,
                                r["held"] / raw,
                                r["seconds"] / floor["seconds"],
                                r["gets"],
                                r["replay"],
                            )
                        )
                        print(f"# {label}/{source}: {r['seconds']:.2f}s", file=sys.stderr)
                print(f"# {n:,} keys: raw key+value bytes {raw / 2**20:.0f} MiB", file=sys.stderr)
    finally:
        if s3 is not None:
            s3.stop()
    print_table(results)
    if args.json:
        for r in results:
            print(json.dumps(asdict(r)))


def print_table(results: list[Result]) -> None:
    header = (
        "| keys | store | source | restore s | x floor | peak RSS MiB (growth) | B/key above raw "
        "| held RSS / raw | get/s (CPU) | replay rec/s (CPU) |"
    )
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    local = {(r.keys, r.what): r.seconds for r in results if r.source == "file"}
    for r in results:
        ratio = "" if r.ratio_to_floor is None else f"{r.ratio_to_floor:.2f}"
        if r.source == "s3" and (r.keys, r.what) in local:
            ratio += f" ({r.seconds / local[(r.keys, r.what)]:.2f}x local)"
        print(
            f"| {r.keys:,} | {r.what} | {r.source} | {r.seconds:.2f} | {ratio} | {r.peak_rss_mb:,.0f} | "
            + ("" if r.bytes_per_key_above_raw is None else f"{r.bytes_per_key_above_raw:.0f}")
            + " | "
            + ("" if r.held_over_raw is None else f"{r.held_over_raw:.2f}")
            + " | "
            + ("" if r.gets_per_s is None else f"{r.gets_per_s / 1000:,.0f} k")
            + " | "
            + ("" if r.replay_per_s is None else f"{r.replay_per_s / 1000:,.0f} k")
            + " |"
        )


if __name__ == "__main__":
    main()
