"""State larger than memory: ``proc.count`` into the RocksDB store against the default store, with
checkpoints during the catch-up, peak RSS sampled (issue #36, item 4).

``--events`` records over ``--keys`` keys (benchmarks/processors.py's data: every key once, then
uniform draws) go to one topic. Then, per store (``rocksdb`` and the default, ``auto``), each in a
fresh process so its peak RSS is its own:

1. **catch-up**: a processor counting per key, from scratch, checkpointing every
   ``--checkpoint-interval`` seconds to a local directory while it catches up; timed to caught up.
   An RSS sampler (every 0.2 s) gives the peak, the RSS at the end and the RSS at each tenth of the
   run, so memory that grows with the state shows as a slope. The checkpoints written during the
   catch-up are counted (the newest generation), and the final one (``close``) is timed.
2. **restore**: the same processor started again: restore from its newest checkpoint plus the
   (empty) tail; seconds and peak RSS.

The counts of ``--verify`` random keys, and the number of keys, are checked against an
independent ground truth: ``numpy.bincount`` over the generated key ids (no Kafka involved).

    .venv/bin/python benchmarks/rocksdb_state.py                                  # 24 M / 20 M keys
    .venv/bin/python benchmarks/rocksdb_state.py --events 2000000 --keys 1500000  # ~2 min

Targets (issue #36, item 4): processing into RocksDB within 1.5x the default store's time; its
peak RSS bounded by its caches and write buffers, not by the state (flat across the run, where the
default store's grows with the keys). Not a test: it prints a table (``--json`` the same as JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fresh_process import ChildFailedError, parse_or_run_child, rss_now, run_child
from processors import BenchError, Events, broker_for, produce

from statesnap import CheckpointOptions, Processor, StoreOptions
from statesnap.kafka.config import KafkaSettings

SAMPLE_S = 0.2


def rss_mb() -> float:
    return rss_now() / 2**20


class RssSampler:
    """The process's RSS every :data:`SAMPLE_S` seconds on a thread: peak and the samples."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.samples.append(rss_mb())

    def tenths(self) -> list[float]:
        """The RSS at each tenth of the run."""
        if not self.samples:
            return []
        n = len(self.samples)
        return [round(self.samples[min(n - 1, n * i // 10)]) for i in range(1, 11)]


def processor(a: dict[str, Any]) -> Processor:
    root = Path(a["root"])
    proc = Processor(
        a["name"],
        inputs=[a["topic"]],
        bootstrap_servers=a["bs"],
        checkpoints=CheckpointOptions(
            str(root / "checkpoints"),
            interval=timedelta(seconds=a["interval_s"]),
            commit_interval=timedelta(seconds=min(5.0, a["interval_s"])),
        ),
        store=StoreOptions(a["store"], path=str(root / "state")),
    )
    proc.count("s")
    return proc


def verify(proc: Processor, sample: dict[str, int], keys: int) -> str | None:
    """None when the sampled counts and the number of keys equal the ground truth."""
    reader = proc.store("s")
    held = len(reader)
    if held != keys:
        return f"{held:,} keys held, {keys:,} expected"
    for kid, want in sample.items():
        got = reader.get(b"key-%s" % kid.encode())
        if got != want:
            return f"key-{kid}: {got} counted, {want} expected"
    return None


def child(a: dict[str, Any]) -> dict[str, Any]:
    sample = json.loads(Path(a["sample"]).read_text())
    base = rss_mb()
    proc = processor(a)
    with RssSampler() as rss:
        t0, cpu0 = time.monotonic(), time.process_time()
        proc.start()
        seconds, cpu = time.monotonic() - t0, time.process_time() - cpu0
    last = proc.last_checkpoint
    manifests = 0 if last is None else last.generation  # generations count up from 1
    wrong = verify(proc, sample, a["keys"])
    t1 = time.monotonic()
    proc.close(checkpoint=a["phase"] == "catch-up")
    close_s = time.monotonic() - t1
    return {
        "phase": a["phase"],
        "store": a["store"],
        "s": seconds,
        "cpu_s": cpu,
        "close_s": close_s,
        "rss_base_mb": base,
        "rss_peak_mb": max(rss.samples, default=rss_mb()),
        "rss_end_mb": rss.samples[-1] if rss.samples else rss_mb(),
        "rss_tenths_mb": rss.tenths(),
        "manifests": manifests,
        "wrong": wrong,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=24_000_000)
    ap.add_argument("--keys", type=int, default=20_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--checkpoint-interval", type=float, default=30.0, help="seconds")
    ap.add_argument("--stores", default="rocksdb,auto", help="comma-separated store kinds")
    ap.add_argument("--verify", type=int, default=20_000, help="random keys checked")
    ap.add_argument("--broker", choices=["tansu", "apache"], default="apache")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parse_or_run_child(ap, child)
    if args is None:
        return
    if args.events < args.keys:
        sys.exit("rocksdb_state: --events must be at least --keys (every key is written once first)")
    load = os.getloadavg()[0]
    events = Events(args.keys, 0, args.events, 1)
    truth = np.zeros(args.keys, dtype=np.int64)
    for ids, _, _ in events.chunks():
        truth += np.bincount(ids, minlength=args.keys)
    picked = np.random.default_rng(3).choice(args.keys, size=min(args.verify, args.keys), replace=False)
    rows: list[dict[str, Any]] = []
    try:
        with broker_for(args.broker) as bs, tempfile.TemporaryDirectory() as tmp:
            sample = Path(tmp) / "sample.json"
            sample.write_text(json.dumps({str(int(k)): int(truth[k]) for k in picked}))
            del truth
            topic = f"counts-{uuid.uuid4().hex[:6]}"
            produce_s = produce(KafkaSettings(bs), topic, args.partitions, events)
            print(f"produced {args.events:,} events in {produce_s:.1f} s", file=sys.stderr)
            for store in args.stores.split(","):
                root = Path(tmp) / store
                common = {
                    "bs": bs,
                    "topic": topic,
                    "store": store,
                    "root": str(root),
                    "name": f"count-{store}",
                    "interval_s": args.checkpoint_interval,
                    "keys": args.keys,
                    "sample": str(sample),
                }
                for phase in ("catch-up", "restore"):
                    row = run_child(__file__, {**common, "phase": phase})
                    print(
                        f"{store} {phase}: {row['s']:.1f} s, peak {row['rss_peak_mb']:,.0f} MB",
                        file=sys.stderr,
                    )
                    if row["wrong"]:
                        raise BenchError(f"{store} {phase}: {row['wrong']}")
                    rows.append(row)
    except (BenchError, ChildFailedError) as e:
        sys.exit(f"rocksdb_state: {e}")
    report(args, load, rows)


def report(args: argparse.Namespace, load: float, rows: list[dict[str, Any]]) -> None:
    default = next((r for r in rows if r["store"] != "rocksdb" and r["phase"] == "catch-up"), None)
    for r in rows:
        r["rps"] = args.events / r["s"] if r["phase"] == "catch-up" else None
        r["vs_default"] = r["s"] / default["s"] if default is not None and r["phase"] == "catch-up" else None
    if args.json:
        print(
            json.dumps({"events": args.events, "keys": args.keys, "load_start": load, "rows": rows}, indent=2)
        )
        return
    print(
        f"{args.events:,} events over {args.keys:,} keys, {args.partitions} partitions, "
        f"{args.broker} broker, "
        f"checkpoint every {args.checkpoint_interval:g} s (load {load:.2f} -> {os.getloadavg()[0]:.2f}); "
        "counts checked against numpy.bincount"
    )
    print(
        "| store | phase | seconds | rec/s | × default | peak RSS | RSS at each tenth (MB) "
        "| checkpoints | close |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        rps = f"{r['rps']:,.0f}" if r["rps"] else ""
        vs = f"{r['vs_default']:.2f}×" if r["vs_default"] else ""
        tenths = " ".join(str(x) for x in r["rss_tenths_mb"])
        print(
            f"| {r['store']} | {r['phase']} | {r['s']:.1f} | {rps} | {vs} | {r['rss_peak_mb']:,.0f} MB | "
            f"{tenths} | {r['manifests']} | {r['close_s']:.1f} s |"
        )


if __name__ == "__main__":
    main()
