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
windows), its store read back after the clock stopped (the plain loop's result is its dict
already; a statesnap run is timed from its processor's creation to caught up). Printed:
seconds, records/s, CPU seconds, records per CPU second, and each contender's time over its
plain loop's (the issue's target for a declared aggregation: <= 1.3x).

Then the per-record handler path (the issue's second target: <= 1.8x), a pair over the same topic:
one Python function, ``count(key, value, d)`` (``d[key] = d.get(key, 0) + 1``), called per record
by a plain loop on a dict (``count(m.key(), m.value(), counts)``) and by a statesnap handler on its
store (``count(record.key, record.value, ctx.stores["s"])``: the processor's values are raw bytes
as the plain loop's, the store's JSON). The same function on both sides, so the difference is what
statesnap's handler path costs per record: the record, the context, the store's checks and the
buffered write, the value's encode and decode. ``--only handler`` runs the pair alone (printed and
in the JSON apart from the aggregations, as ``handler_rows``).

    .venv/bin/python benchmarks/aggregations.py                                 # 2 M events, 200 k keys
    .venv/bin/python benchmarks/aggregations.py --events 200000 --keys 20000   # a quick run
    .venv/bin/python benchmarks/aggregations.py --broker apache
    .venv/bin/python benchmarks/aggregations.py --only handler --events 500000 --keys 50000

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
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from processors import WINDOW_MS, BenchError, Events, broker_for, count_loop, produce, window_truth

from statesnap import Processor, Windows
from statesnap.kafka.config import KafkaSettings
from statesnap.processor import StoreSpec
from statesnap.processor.context import ProcessorContext, Record
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


def statesnap_run(bs: str, topic: str, what: str) -> Processor:
    """A processor over *topic* from scratch (no checkpoints), started: caught up."""
    name = f"{what}-{uuid.uuid4().hex[:6]}"
    proc = Processor(name, inputs=[topic], bootstrap_servers=bs, value_serde="json")
    if what == "count":
        proc.count("s")
    elif what == "sum":
        proc.sum("s", "amount")
    else:
        proc.count("s", window=Windows.tumbling(timedelta(milliseconds=WINDOW_MS)))
    proc.start()
    return proc


def read_back(proc: Processor, *, windowed: bool = False) -> dict[bytes, int]:
    """Store ``s`` of a caught-up processor as the plain loop's dict, then the processor closed:
    the check, after the clock stopped (the plain loop's result is its dict already)."""
    try:
        if windowed:
            return {bytes(k[0]) + b"@%d" % k[1]: int(v) for k, v in proc.store("s").items()}
        return {bytes(k): int(v) for k, v in proc.store("s").items()}
    finally:
        proc.close(checkpoint=False)


def count(key: bytes, value: bytes | None, d: MutableMapping[Any, Any]) -> None:
    """The per-record work of the handler pair: the same function on a dict and on a store."""
    del value
    d[key] = d.get(key, 0) + 1


def handler_run(bs: str, topic: str) -> Processor:
    """A processor whose one handler calls :func:`count` on its store per record, from scratch
    (no checkpoints), started: caught up. Raw bytes keys and values (the plain loop's), the
    store's values JSON."""
    proc = Processor(
        f"handler-{uuid.uuid4().hex[:6]}",
        inputs=[topic],
        bootstrap_servers=bs,
        stores=[StoreSpec("s", value_serde="json")],
    )

    @proc.handler
    def on_record(record: Record, ctx: ProcessorContext) -> None:
        count(record.key, record.value, ctx.stores["s"])

    proc.start()
    return proc


def handler_pair(bs: str, topic: str, partitions: int) -> list[dict[str, Any]]:
    """The plain loop calling :func:`count` on a dict, then the statesnap handler calling it on
    its store, over the same topic; the handler's counts checked against the loop's."""

    def plain() -> dict[bytes, int]:
        counts: dict[bytes, int] = {}

        def on(m: Any) -> None:
            count(m.key(), m.value(), counts)

        count_loop(bs, topic, partitions, {}, on_record=on)
        return counts

    wall, cpu, truth = timed(plain)
    rows: list[dict[str, Any]] = [{"contender": "plain loop, count(k, v, dict)", "s": wall, "cpu_s": cpu}]
    wall, cpu, proc = timed(lambda: handler_run(bs, topic))
    got = read_back(proc)
    rows.append(
        {"contender": "statesnap handler, count(k, v, store)", "s": wall, "cpu_s": cpu, "equal": got == truth}
    )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--broker", choices=["tansu", "apache"], default="tansu")
    ap.add_argument(
        "--only",
        choices=["aggregations", "handler"],
        help="run only the declared aggregations, or only the handler pair (default both)",
    )
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    rows: list[dict[str, Any]] = []
    handler_rows: list[dict[str, Any]] = []
    try:
        with broker_for(args.broker) as bs, tempfile.TemporaryDirectory():
            topic = f"events-{uuid.uuid4().hex[:6]}"
            produce(KafkaSettings(bs), topic, args.partitions, Events(args.keys, 0, args.events, 1))
            p = args.partitions
            if args.only != "handler":
                aggregations(bs, topic, p, rows)
            if args.only != "aggregations":
                handler_rows = handler_pair(bs, topic, p)
    except BenchError as e:
        sys.exit(f"aggregations: {e}")
    plain: dict[str, float] = {row["of"]: row["s"] for row in rows if "equal" not in row}
    plain["window"] = plain.get("count", 0.0)
    for row in rows:
        row["vs_plain"] = row["s"] / plain[row["of"]]
    for row in handler_rows:
        row["vs_plain"] = row["s"] / handler_rows[0]["s"]
    for row in (*rows, *handler_rows):
        row["rps"] = args.events / row["s"]
        row["rec_per_cpu_s"] = args.events / max(row["cpu_s"], 1e-9)
    if args.json:
        out = {
            "events": args.events,
            "keys": args.keys,
            "load_start": load,
            "rows": rows,
            "handler_rows": handler_rows,
        }
        print(json.dumps(out, indent=2))
        return
    print(
        f"{args.events:,} events over {args.keys:,} keys, {args.partitions} partitions, {args.broker} broker "
        f"(load {load:.2f} -> {os.getloadavg()[0]:.2f}); x = wall time over the plain loop's"
    )
    if rows:
        print("declared aggregations (target <= 1.3x; the window count's x is over the count's loop):")
        print_rows(rows)
    if handler_rows:
        print("the per-record handler path (target <= 1.8x):")
        print_rows(handler_rows)


def print_rows(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        checked = "" if "equal" not in row else "  equal to the plain loop" if row["equal"] else "  DIFFERS"
        print(
            f"  {row['contender']:38s} {row['s']:6.2f} s {row['rps']:>9,.0f} rec/s  "
            f"CPU {row['cpu_s']:6.2f} s {row['rec_per_cpu_s']:>9,.0f} rec/CPU s  "
            f"{row['vs_plain']:5.2f}x{checked}"
        )


def aggregations(bs: str, topic: str, p: int, rows: list[dict[str, Any]]) -> None:
    """The declared aggregations against their plain loops (the rows appended to *rows*; a plain
    loop's row has no ``equal``, the statesnap rows name their loop in ``of``)."""

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
    for name, fn in (("count", plain_count), ("sum", plain_sum)):
        wall, cpu, truth[name] = timed(fn)
        rows.append({"contender": f"plain loop, {name}", "s": wall, "cpu_s": cpu, "of": name})
    truth["window"] = window_truth(bs, topic, p)
    for what in ("count", "sum", "window"):
        for mode in ("batch", "per record"):

            def run(what: str = what) -> Processor:
                return statesnap_run(bs, topic, what)

            if mode == "per record":
                with per_record():
                    wall, cpu, proc = timed(run)
            else:
                wall, cpu, proc = timed(run)
            got = read_back(proc, windowed=what == "window")
            rows.append(
                {
                    "contender": f"statesnap {what}, {mode}",
                    "s": wall,
                    "cpu_s": cpu,
                    "of": what,
                    "equal": got == truth[what],
                }
            )


if __name__ == "__main__":
    main()
