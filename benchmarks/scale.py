"""Restore at scale: each state store against the pyarrow read floor, from a file and from S3.

For each key count N: write a checkpoint of N keys (``key-<i>``, 100-byte values, P partitions)
with statesnap's own checkpoint writer, to a local directory and to the embedded moto S3 server.
Then, each in a fresh subprocess (so peak RSS is its own):

- the floors: ``pyarrow.parquet.read_table`` of the checkpoint's data files (local paths); lookups
  of the same random keys in a plain dict of the rows; the same tail applied by a plain loop
  (``d[msg.key()] = msg.value()``, every message field read once);
- per store and source: load every partition through ``CheckpointRepository.iter_partitions``
  (with the bases' persisted key indexes, for the columnar store) into the store and make it ready
  (the columnar store builds its index on the first lookup, unless it read a persisted one):
  seconds, the seconds until lookups probe one index (a restore from several partitions' persisted
  indexes builds one over them in the background; lookups are measured after it), peak RSS
  above the process's RSS before the restore, bytes per key above the raw key+value bytes, the
  RSS it holds 3 s after it settled (over the raw bytes), ``get``/s and ``get_many``/s (batches
  of 4,000) on random present keys and tail-replay records/s (200 k records over 2N keys,
  batches of 500).

Every cell runs ``--repeat`` times (3 by default), floors and stores interleaved so a busy
neighbour hits both alike; the table prints min and median of each, each figure next to its floor
of the same run, with the load average.

    .venv/bin/python benchmarks/scale.py --keys 1000000                 # ~3 min
    .venv/bin/python benchmarks/scale.py --keys 1000000,10000000 --stores columnar --sources file
    .venv/bin/python benchmarks/scale.py --keys 10000000 --stores columnar --sources file \
        --delta-share 0.05 --baseline /tmp/before/src      # an incremental checkpoint, A/B

Targets (issues 9 and 21, this 2-core machine): columnar ≤ 1.3x the floor at 10 M keys, memory
≤ 1.5x raw bytes, ≥ 500 k get/s at 10 M keys, ≥ 600 k records/s replay; RocksDB ≤ 2x the floor;
S3 ≤ 1.1x the local time.
Not a test: it prints a table (and ``--json`` rows) for the record.
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from fresh_process import parse_or_run_child, peak_rss, rss_now, run_child

VALUE_BYTES = 100
CLUSTER = "bench-cluster"
#: Seconds after the restore settled at which the RSS it holds is read.
HELD_AFTER_S = 3.0
TABLE = "scale"


@dataclass
class Result:
    """One cell: min and median over the repeats (rates: median and best), with the floors'."""

    keys: int
    what: str
    source: str
    seconds: float
    seconds_median: float
    indexed_median: float
    floor_seconds: float
    floor_seconds_median: float
    peak_rss_mb: float
    bytes_per_key_above_raw: float | None
    held_over_raw: float | None
    gets_per_s: float
    gets_best: float
    get_many_per_s: float | None
    floor_gets_per_s: float
    replay_per_s: float
    replay_best: float
    floor_replay_per_s: float
    load_average: float


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


def delta_table(base: pa.Table, share: float) -> pa.Table:
    """An incremental checkpoint's delta over *base*: new values for every 1/*share*-th key
    (updates only, so the key count stays N), at offsets after the base's."""
    rows = base.take(pa.array(np.arange(0, base.num_rows, max(1, round(1 / share)), dtype=np.int64)))
    values = pc.binary_join_element_wise(pa.scalar(b"new:"), rows.column("value"), pa.scalar(b""))
    offsets = pa.array(np.arange(base.num_rows, base.num_rows + rows.num_rows, dtype=np.int64))
    return rows.set_column(1, "value", values).set_column(2, "offset", offsets)


def write_checkpoint(
    url: str, options: dict[str, str], n: int, partitions: int, delta_share: float = 0.0
) -> tuple[int, list[str]]:
    """Write a checkpoint of *n* keys with statesnap's writer, then (with *delta_share*) one more
    whose partitions add a delta over those bases; raw bytes and the last one's data-file keys."""
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
    if delta_share:
        deltas = {}
        for p, u in updates.items():
            assert u.base is not None
            d = delta_table(u.base, delta_share)
            deltas[p] = PartitionUpdate(p, u.base.num_rows + d.num_rows, delta=d, keys=u.base.num_rows)
        manifest = commit(
            repo, table=TABLE, topic=TABLE, cluster_id=CLUSTER, updates=deltas, previous=manifest
        )
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


def workload(n: int) -> tuple[list[bytes], list[_Msg]]:
    """The lookups (200 k random present keys) and the tail (200 k records over 2N keys, half of
    them new) every store and the floors run: the same for all."""
    rng = random.Random(1)
    probe = [b"key-%d" % rng.randrange(n) for _ in range(200_000)]
    tail = [_Msg(b"key-%d" % rng.randrange(2 * n), b"y" * VALUE_BYTES, i) for i in range(200_000)]
    return probe, tail


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
        peak = peak_rss() - rss_before
        plain: dict[bytes, bytes] = {}
        for table in tables:
            plain.update(zip(table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True))
        del tables
        probe, tail = workload(n)
        get = plain.get
        t = time.process_time()
        for k in probe:
            get(k)
        gets = len(probe) / (time.process_time() - t)
        t = time.process_time()
        for lo in range(0, len(tail), 500):  # a plain consume loop: latest value per key
            for msg in tail[lo : lo + 500]:
                key = msg.key()
                if key is not None:
                    msg.offset()
                    msg.timestamp()
                    plain[key] = msg.value()
        replay = len(tail) / (time.process_time() - t)
        return {"seconds": seconds, "peak": peak, "gets": gets, "replay": replay}

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
        iter_decoded = getattr(repo, "iter_decoded", None)  # None in a baseline from before it
        if iter_decoded is not None:  # bases' persisted key indexes too (issue 21), where read
            for p, part in iter_decoded(manifest, indexes=args["what"] == "columnar"):
                if part.changes is None:
                    store.load(p, part.rows, part.index)
                else:  # as the task restore does for the columnar store (its key_indexes)
                    store.load_split(p, part.rows, part.index, part.changes)  # type: ignore[attr-defined]
        else:
            for p, rows in repo.iter_partitions(manifest):
                store.load(p, rows)
        store.get(b"key-0")  # ready: the columnar index is built on the first lookup
        seconds = time.perf_counter() - started
        # Restored from several partitions' persisted key indexes, the columnar store is ready at
        # once and builds one index over them in the background: lookups are measured after it.
        wait_indexed = getattr(store, "wait_indexed", None)
        if wait_indexed is not None:
            wait_indexed(600)
        indexed = time.perf_counter() - started
        peak = peak_rss() - rss_before
        pa.default_memory_pool().release_unused()  # decode buffers the allocator still holds
        # Held: what the store keeps once it settled. jemalloc (the decode pool) hands the
        # decoder's freed pages back by a decay of a second or two, not on release_unused().
        time.sleep(HELD_AFTER_S)
        held = rss_now() - rss_before
        assert len(store) == n, (len(store), n)
        probe, tail = workload(n)
        t = time.process_time()
        for k in probe:
            store.get(k)
        gets = len(probe) / (time.process_time() - t)
        get_many = getattr(store, "get_many", None)  # None in a baseline from before get_many
        many = None
        if get_many is not None:
            t = time.process_time()
            for lo in range(0, len(probe), 4000):
                get_many(probe[lo : lo + 4000])
            many = len(probe) / (time.process_time() - t)
        t = time.process_time()
        for lo in range(0, len(tail), 500):
            store.apply_messages(lo // 500 % 8, tail[lo : lo + 500])
        replay = len(tail) / (time.process_time() - t)
        store.close()
    return {
        "seconds": seconds,
        "indexed": indexed,
        "peak": peak,
        "held": held,
        "gets": gets,
        "many": many,
        "replay": replay,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", default="1000000", help="comma-separated key counts, e.g. 1000000,10000000")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--stores", default="memory,columnar,rocksdb")
    ap.add_argument("--sources", default="file,s3")
    ap.add_argument("--repeat", type=int, default=3, help="runs per cell: min and median are printed")
    ap.add_argument(
        "--baseline",
        metavar="PYTHONPATH",
        help="also measure each store from this source tree (e.g. a copy of src/ before a change), "
        "in the same run, labelled <store>@baseline",
    )
    ap.add_argument(
        "--delta-share",
        type=float,
        default=0.0,
        help="restore an incremental checkpoint: each base plus a delta updating this share of its "
        "keys (e.g. 0.05); the floor reads those files too",
    )
    ap.add_argument("--json", action="store_true", help="also print the rows as JSON lines")
    args = parse_or_run_child(ap, child)
    if args is None:
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
                for source in dict.fromkeys(["file", *sources]):  # the floor reads the local files
                    url, options = locations[source]
                    t = time.perf_counter()
                    raw, keys = write_checkpoint(url, options, n, args.partitions, args.delta_share)
                    print(
                        f"# {n:,} keys: checkpoint written to {source} in {time.perf_counter() - t:.1f}s",
                        file=sys.stderr,
                    )
                    if source == "file":
                        paths = [os.path.join(root, k) for k in keys]
                cells: list[tuple[str, str, dict[str, Any]]] = [
                    ("floor", "file", {"what": "floor", "paths": paths})
                ]
                for source in sources:
                    url, options = locations[source]
                    cells += [
                        (st, source, {"what": st, "url": url, "options": options, "env": {}}) for st in stores
                    ]
                    if args.baseline:
                        env = {"PYTHONPATH": args.baseline}
                        cells += [
                            (
                                f"{st}@baseline",
                                source,
                                {"what": st, "url": url, "options": options, "env": env},
                            )
                            for st in stores
                        ]
                runs: dict[tuple[str, str], list[dict[str, Any]]] = {
                    (label, src): [] for label, src, _ in cells
                }
                loads: list[float] = []
                for rep in range(args.repeat):  # interleaved: a busy neighbour hits every cell alike
                    # Each repeat starts at another cell, and dirty pages (RocksDB's files) are
                    # flushed first: no cell always runs in the previous one's writeback.
                    turn = rep % len(cells)
                    for label, source, cell in cells[turn:] + cells[:turn]:
                        os.sync()
                        measured = run_child(__file__, {**cell, "keys": n}, cell.get("env"))
                        runs[(label, source)].append(measured)
                        loads.append(os.getloadavg()[0])
                    print(f"# {n:,} keys: repeat {rep + 1}/{args.repeat} done", file=sys.stderr)
                floor = runs[("floor", "file")]
                for (label, source), rs in runs.items():
                    results.append(summarize(n, label, source, rs, floor, raw, statistics.median(loads)))
                print(f"# {n:,} keys: raw key+value bytes {raw / 2**20:.0f} MiB", file=sys.stderr)
    finally:
        if s3 is not None:
            s3.stop()
    print_table(results)
    if args.json:
        for r in results:
            print(json.dumps(asdict(r)))


def summarize(
    n: int,
    label: str,
    source: str,
    rs: list[dict[str, Any]],
    floor: list[dict[str, Any]],
    raw: int,
    load: float,
) -> Result:
    secs = [float(r["seconds"]) for r in rs]
    fsecs = [float(r["seconds"]) for r in floor]
    is_floor = label == "floor"
    held = None if is_floor else statistics.median(float(r["held"]) for r in rs) / raw
    peak = statistics.median(float(r["peak"]) for r in rs)
    many = [float(r["many"]) for r in rs if r.get("many") is not None]
    return Result(
        keys=n,
        what="pyarrow read / dict / plain loop (floor)" if is_floor else label,
        source=source,
        seconds=min(secs),
        seconds_median=statistics.median(secs),
        indexed_median=statistics.median(float(r.get("indexed", r["seconds"])) for r in rs),
        floor_seconds=min(fsecs),
        floor_seconds_median=statistics.median(fsecs),
        peak_rss_mb=peak / 2**20,
        bytes_per_key_above_raw=None if is_floor else (peak - raw) / n,
        held_over_raw=held,
        gets_per_s=statistics.median(float(r["gets"]) for r in rs),
        gets_best=max(float(r["gets"]) for r in rs),
        get_many_per_s=statistics.median(many) if many else None,
        floor_gets_per_s=statistics.median(float(r["gets"]) for r in floor),
        replay_per_s=statistics.median(float(r["replay"]) for r in rs),
        replay_best=max(float(r["replay"]) for r in rs),
        floor_replay_per_s=statistics.median(float(r["replay"]) for r in floor),
        load_average=load,
    )


def print_table(results: list[Result]) -> None:
    """Times as min / median of the repeats, rates as median / best; each next to its floor
    from the same run. Restore ratios compare mins and medians, rate ratios medians."""
    header = (
        "| keys | store | source | restore s (min / med) | floor s (min / med) | x floor (min / med) | "
        "one index s (med) | "
        "get/s (med / best) | x dict | get_many/s | replay rec/s (med / best) | x plain loop | "
        "peak RSS MiB | B/key above raw | held RSS / raw | load avg |"
    )
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    local = {(r.keys, r.what): r.seconds_median for r in results if r.source == "file"}
    for r in results:
        ratio = f"{r.seconds / r.floor_seconds:.2f} / {r.seconds_median / r.floor_seconds_median:.2f}"
        if r.source == "s3" and (r.keys, r.what) in local:
            ratio += f" ({r.seconds_median / local[(r.keys, r.what)]:.2f}x local)"
        many = "" if r.get_many_per_s is None else f"{r.get_many_per_s / 1000:,.0f} k"
        print(
            f"| {r.keys:,} | {r.what} | {r.source} | {r.seconds:.2f} / {r.seconds_median:.2f} "
            f"| {r.floor_seconds:.2f} / {r.floor_seconds_median:.2f} | {ratio} | {r.indexed_median:.2f} "
            f"| {r.gets_per_s / 1000:,.0f} k / {r.gets_best / 1000:,.0f} k "
            f"| {r.gets_per_s / r.floor_gets_per_s:.2f} | {many} "
            f"| {r.replay_per_s / 1000:,.0f} k / {r.replay_best / 1000:,.0f} k "
            f"| {r.replay_per_s / r.floor_replay_per_s:.2f} | {r.peak_rss_mb:,.0f} | "
            + ("" if r.bytes_per_key_above_raw is None else f"{r.bytes_per_key_above_raw:.0f}")
            + " | "
            + ("" if r.held_over_raw is None else f"{r.held_over_raw:.2f}")
            + f" | {r.load_average:.1f} |"
        )


if __name__ == "__main__":
    main()
