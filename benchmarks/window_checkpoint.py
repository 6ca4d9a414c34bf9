"""The first checkpoint of a window store against a count store's, same records, one run (issue #36).

``--events`` JSON records over ``--keys`` keys (every key once first, then uniformly drawn),
event timestamps spread evenly up to just before now (``--per-minute`` per minute), on
``--partitions`` partitions. Two processors catch up over them from scratch, one after the other:
``proc.count("counts")`` (one row per key) and ``proc.count("windows",
window=Windows.tumbling("1m"))`` (about ``events / per-minute × keys-per-minute`` windows come and
go; only the newest minute's live at the end). After each catch-up, one checkpoint, timed; the
figures: its seconds (wall and CPU of this process), the bytes of the files it wrote, the rows the
store holds, and the processing rate (records per CPU second). Issue #36 measured 4.6 s for the
window store's first checkpoint (998 live windows) against 0.35 s for the 200 k-key count store:
the window store's cost followed the windows that came and went. The ratio printed, window
checkpoint / count checkpoint, is the figure to watch (target: <= 1).

    .venv/bin/python benchmarks/window_checkpoint.py                                  # 2 M events, 200 k keys
    .venv/bin/python benchmarks/window_checkpoint.py --events 200000 --keys 20000    # a quick run
    .venv/bin/python benchmarks/window_checkpoint.py --broker apache                 # Apache Kafka
    .venv/bin/python benchmarks/window_checkpoint.py --store rocksdb                 # each store

Not a test: it prints figures for the record (``--json`` the same as JSON).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from processors import BenchError, broker_for, files_of

from statesnap import Processor, StoreOptions, Windows
from statesnap.kafka.admin import KafkaAdmin
from statesnap.kafka.clients import new_producer
from statesnap.kafka.config import KafkaSettings

MINUTE_MS = 60_000


def produce(bs: str, topic: str, partitions: int, events: int, keys: int, per_minute: int) -> float:
    """*events* records ``{"amount": n}`` keyed ``key-<id>``, timestamps rising to just before now."""
    t0 = time.monotonic()
    KafkaAdmin(KafkaSettings(bs)).create_topic(topic, partitions, config={"retention.ms": "-1"})
    producer = new_producer(
        KafkaSettings(bs),
        **{
            "linger.ms": 20,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 500_000,
            "enable.idempotence": False,
        },
    )
    rng = np.random.default_rng(36)
    ids = rng.integers(0, keys, size=events)
    ids[: min(keys, events)] = rng.permutation(keys)[: min(keys, events)]
    step = MINUTE_MS / per_minute
    now = int(time.time() * 1000)
    first = now - int(events * step) - MINUTE_MS
    errors: list[str] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(str(err))

    for i, kid in enumerate(ids.tolist()):
        while True:
            try:
                stamp = first + int(i * step)
                key = b"key-%d" % kid
                producer.produce(topic, b'{"amount": 1}', key, timestamp=stamp, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(120) or errors:
        raise BenchError(f"producing to {topic!r}: records undelivered {errors[:1]}")
    return time.monotonic() - t0


def run_one(bs: str, topic: str, root: Path, *, window: bool, store: str) -> dict[str, Any]:
    """Catch up from scratch into *store*, then one checkpoint (timed): one processor's figures."""
    gc.collect()
    name = f"{'windows' if window else 'counts'}-{uuid.uuid4().hex[:6]}"
    proc = Processor(
        name,
        inputs=[topic],
        bootstrap_servers=bs,
        checkpoints=str(root),
        value_serde="json",
        store=StoreOptions(store, path=str(root.parent / f"{root.name}-state")),  # not in the files counted
    )
    if window:
        proc.count("windows", window=Windows.tumbling(timedelta(minutes=1)))
    else:
        proc.count("counts")
    t0, cpu0 = time.monotonic(), time.process_time()
    report = proc.start()
    out: dict[str, Any] = {
        "catch_up_s": time.monotonic() - t0,
        "catch_up_cpu_s": time.process_time() - cpu0,
        "records": report.replayed_records,
    }
    try:
        before = files_of(root)
        t1, cpu1 = time.monotonic(), time.process_time()
        proc.checkpoint()
        out["checkpoint_s"] = time.monotonic() - t1
        out["checkpoint_cpu_s"] = time.process_time() - cpu1
        out["checkpoint_bytes"] = sum(s for p, s in files_of(root).items() if before.get(p) != s)
        out["live_rows"] = sum(1 for _ in proc.store("windows" if window else "counts").items())
    finally:
        proc.close(checkpoint=False)
    out["records_per_cpu_s"] = out["records"] / max(out["catch_up_cpu_s"], 1e-9)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--per-minute", type=int, default=1_000, help="events per minute of event time")
    ap.add_argument("--broker", choices=["tansu", "apache"], default="tansu")
    ap.add_argument(
        "--store",
        choices=["auto", "memory", "columnar", "rocksdb"],
        default="auto",
        help="the processors' state store (default: auto, what a processor gets)",
    )
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    try:
        with broker_for(args.broker) as bs, tempfile.TemporaryDirectory() as work:
            topic = f"events-{uuid.uuid4().hex[:6]}"
            produced = produce(bs, topic, args.partitions, args.events, args.keys, args.per_minute)
            count = run_one(bs, topic, Path(work) / "count", window=False, store=args.store)
            windows = run_one(bs, topic, Path(work) / "window", window=True, store=args.store)
    except BenchError as e:
        sys.exit(f"window_checkpoint: {e}")
    r = {
        "events": args.events,
        "keys": args.keys,
        "partitions": args.partitions,
        "broker": args.broker,
        "store": args.store,
        "produce_s": produced,
        "load_start": load,
        "load_end": os.getloadavg()[0],
        "count": count,
        "window": windows,
        "window_vs_count_checkpoint": windows["checkpoint_s"] / max(count["checkpoint_s"], 1e-9),
    }
    if args.json:
        print(json.dumps(r, indent=2))
        return
    print(
        f"{args.events:,} events over {args.keys:,} keys, {args.partitions} partitions, "
        f"{args.broker} broker, {args.store} store (load {r['load_start']:.2f} -> {r['load_end']:.2f})"
    )
    for what, f in (("count store", count), ("window store (1-minute tumbling)", windows)):
        print(
            f"  {what:34s} records {f['records']:>10,}  live rows {f['live_rows']:>8,}  "
            f"catch-up {f['catch_up_s']:6.2f} s ({f['records_per_cpu_s']:>9,.0f} rec/CPU s)  "
            f"checkpoint {f['checkpoint_s']:6.3f} s (CPU {f['checkpoint_cpu_s']:.3f} s, "
            f"{f['checkpoint_bytes']:,} B)"
        )
    print(f"  window checkpoint / count checkpoint: {r['window_vs_count_checkpoint']:.2f}x (target <= 1)")


if __name__ == "__main__":
    main()
