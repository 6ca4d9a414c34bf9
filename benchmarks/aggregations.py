"""Declared aggregations against a plain confluent-kafka loop computing the same into a dict, one
run, one broker (issue #36, item 1).

``--events`` records ``{"amount": n}`` over ``--keys`` keys (benchmarks/processors.py's data,
event timestamps 60 ms apart), then, each from scratch over the same topic, timed start to caught
up (wall and CPU of this process):

- plain loop, count: ``counts[k] = counts.get(k, 0) + 1`` per record;
- plain loop, sum: the same adding ``json.loads(value)["amount"]``;
- ``proc.count("counts")`` and ``proc.sum("sums", "amount")``, folded per polled batch (a
  declared aggregation that is the processor's only step), and the same forced down the
  per-record path (the fold as a handler per record, what ran before the batch path): the
  "before" of the same run;
- ``proc.count("windows", window=Windows.tumbling("1m"))``, batch and per record.

Every statesnap result is checked against the plain loop's (the window count against its live
windows). Printed: seconds, records/s, CPU seconds, records per CPU second, and each contender's
time over its plain loop's (the issue's target for a declared aggregation: <= 1.3x).

    .venv/bin/python benchmarks/aggregations.py                                 # 2 M events, 200 k keys
    .venv/bin/python benchmarks/aggregations.py --events 200000 --keys 20000   # a quick run
    .venv/bin/python benchmarks/aggregations.py --broker apache

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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from processors import WINDOW_MS, BenchError, Events, broker_for, count_loop, produce, window_truth

from statesnap import Processor, Windows
from statesnap.kafka.config import KafkaSettings
from statesnap.processor.handler import ProcessorHandler


@contextmanager
def per_record() -> Iterator[None]:
    """Processors built meanwhile run their declared aggregation per record (the batch fold off)."""
    original = Processor.handler_for

    def handler_for(self: Processor, store: Any, outputs: Any) -> ProcessorHandler:
        handler = original(self, store, outputs)
        handler._batched = None
        return handler

    Processor.handler_for = handler_for  # type: ignore[method-assign]
    try:
        yield
    finally:
        Processor.handler_for = original  # type: ignore[method-assign]


def timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    gc.collect()
    t0, cpu0 = time.monotonic(), time.process_time()
    out = fn()
    return time.monotonic() - t0, time.process_time() - cpu0, out


def statesnap_run(bs: str, topic: str, what: str) -> dict[bytes, int]:
    """A processor over *topic* from scratch (no checkpoints), caught up, its store read back."""
    name = f"{what}-{uuid.uuid4().hex[:6]}"
    proc = Processor(name, inputs=[topic], bootstrap_servers=bs, value_serde="json")
    if what == "count":
        proc.count("s")
    elif what == "sum":
        proc.sum("s", "amount")
    else:
        proc.count("s", window=Windows.tumbling(timedelta(milliseconds=WINDOW_MS)))
    proc.start()
    try:
        if what == "window":
            return {bytes(k[0]) + b"@%d" % k[1]: int(v) for k, v in proc.store("s").items()}
        return {bytes(k): int(v) for k, v in proc.store("s").items()}
    finally:
        proc.close(checkpoint=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--broker", choices=["tansu", "apache"], default="tansu")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    rows: list[dict[str, Any]] = []
    try:
        with broker_for(args.broker) as bs, tempfile.TemporaryDirectory():
            topic = f"events-{uuid.uuid4().hex[:6]}"
            produce(KafkaSettings(bs), topic, args.partitions, Events(args.keys, 0, args.events, 1))
            p = args.partitions

            def plain_count() -> dict[bytes, int]:
                counts: dict[bytes, int] = {}
                count_loop(bs, topic, p, counts)
                return counts

            def plain_sum() -> dict[bytes, int]:
                sums: dict[bytes, int] = {}
                get, loads = sums.get, json.loads

                def on(m: Any) -> None:
                    k = m.key()
                    sums[k] = get(k, 0) + loads(m.value())["amount"]

                count_loop(bs, topic, p, {}, on_record=on)
                return sums

            truth: dict[str, dict[bytes, int]] = {}
            plain: dict[str, float] = {}
            for name, fn in (("count", plain_count), ("sum", plain_sum)):
                wall, cpu, truth[name] = timed(fn)
                plain[name] = wall
                rows.append({"contender": f"plain loop, {name}", "s": wall, "cpu_s": cpu, "of": name})
            truth["window"] = window_truth(bs, topic, p)
            plain["window"] = plain["count"]
            for what in ("count", "sum", "window"):
                for mode in ("batch", "per record"):

                    def run(what: str = what) -> dict[bytes, int]:
                        return statesnap_run(bs, topic, what)

                    if mode == "per record":
                        with per_record():
                            wall, cpu, got = timed(run)
                    else:
                        wall, cpu, got = timed(run)
                    rows.append(
                        {
                            "contender": f"statesnap {what}, {mode}",
                            "s": wall,
                            "cpu_s": cpu,
                            "of": what,
                            "equal": got == truth[what],
                        }
                    )
    except BenchError as e:
        sys.exit(f"aggregations: {e}")
    for row in rows:
        row["rps"] = args.events / row["s"]
        row["rec_per_cpu_s"] = args.events / max(row["cpu_s"], 1e-9)
        row["vs_plain"] = row["s"] / plain[row["of"]]
    if args.json:
        out = {"events": args.events, "keys": args.keys, "load_start": load, "rows": rows}
        print(json.dumps(out, indent=2))
        return
    print(
        f"{args.events:,} events over {args.keys:,} keys, {args.partitions} partitions, {args.broker} broker "
        f"(load {load:.2f} -> {os.getloadavg()[0]:.2f}); x = wall time over the plain loop's "
        "(the count's for the window)"
    )
    for row in rows:
        checked = "" if "equal" not in row else "  equal to the plain loop" if row["equal"] else "  DIFFERS"
        print(
            f"  {row['contender']:30s} {row['s']:6.2f} s {row['rps']:>9,.0f} rec/s  "
            f"CPU {row['cpu_s']:6.2f} s {row['rec_per_cpu_s']:>9,.0f} rec/CPU s  "
            f"{row['vs_plain']:5.2f}x{checked}"
        )


if __name__ == "__main__":
    main()
