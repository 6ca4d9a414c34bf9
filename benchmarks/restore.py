"""Restore from checkpoint vs full replay, side by side in one run (prints a table).

Scenario per history size H (same key space): produce H updates, materialize a checkpoint, append a
tail, then restore (a) from the checkpoint + tail and (b) by full replay, for each state store.

    .venv/bin/python benchmarks/restore.py                       # 1 M keys, 1 M and 10 M updates
    .venv/bin/python benchmarks/restore.py --keys 100000 --histories 100000,1000000   # quick

Targets (2-core machine): checkpoint restore grows <= 1.3x when history grows 10x; at 10x history
checkpoint restore >= 10x faster than full replay; loading 1 M keys < 1 s (memory) / < 2 s
(RocksDB); table memory <= 3x raw key+value bytes; tail replay >= 200 k records/s.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table as RichTable

from statesnap import Table
from statesnap.devstack import EmbeddedBroker
from statesnap.digest import table_digest
from statesnap.kafka.config import KafkaSettings
from statesnap.sample import SampleSpec, produce_sample
from statesnap.stores.memory import MemoryStore

console = Console(stderr=True)


@dataclass
class Row:
    history: int
    store: str
    keys: int
    load_s: float
    tail_records: int
    tail_s: float
    checkpoint_restore_s: float
    full_replay_s: float
    full_records: int
    equal: bool
    mem_ratio: float | None


def memory_ratio(table: Table) -> float | None:
    """Python heap bytes held by the memory store per raw key+value byte."""
    store = table.store
    if not isinstance(store, MemoryStore):
        return None
    rows = store._rows
    held = sys.getsizeof(rows) + sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in rows.items())
    raw = sum(len(k) + len(v) - 20 for k, v in rows.items())
    return held / max(raw, 1)


def run(
    bs: str, history: int, keys: int, tail: int, partitions: int, stores: list[str], root: str
) -> list[Row]:
    settings = KafkaSettings(bs)
    topic = f"bench-{history}"
    t0 = time.monotonic()
    produce_sample(settings, SampleSpec(topic, partitions, keys, history, 0.01, 100, 1))
    console.print(f"  produced {history:,} in {time.monotonic() - t0:.1f}s")
    owner = Table(topic, bootstrap_servers=bs, checkpoints=root, background=False)
    owner.start()
    owner.checkpoint()
    owner.close(checkpoint=False)
    produce_sample(settings, SampleSpec(topic, partitions, keys, tail, 0.01, 100, 2))
    rows = []
    for store in stores:
        gc.collect()
        t = Table(topic, bootstrap_servers=bs, checkpoints=root, store=store, background=False)
        rep = t.start()
        d1 = table_digest(t.raw_items())
        ratio = memory_ratio(t)
        t.close(checkpoint=False)
        gc.collect()
        f = Table(topic, bootstrap_servers=bs, store=store, background=False)
        full = f.start()
        d2 = table_digest(f.raw_items())
        f.close(checkpoint=False)
        rows.append(
            Row(
                history,
                store,
                d1[1],
                rep.load_seconds,
                rep.replayed_records,
                rep.replay_seconds,
                rep.restore_seconds,
                full.restore_seconds,
                full.replayed_records,
                d1 == d2,
                ratio,
            )
        )
        console.print(f"  {store}: checkpoint {rep.restore_seconds:.2f}s vs full {full.restore_seconds:.2f}s")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--histories", default="1000000,10000000", help="comma-separated history sizes")
    ap.add_argument("--tail", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--stores", default="memory,rocksdb")
    args = ap.parse_args()
    histories = [int(h) for h in args.histories.split(",")]
    stores = args.stores.split(",")
    rows: list[Row] = []
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as root:
        for h in histories:
            console.print(f"[bold]history {h:,} updates over {args.keys:,} keys[/]")
            rows += run(broker.bootstrap_servers, h, args.keys, args.tail, args.partitions, stores, root)

    out = RichTable(title="statesnap restore benchmark")
    for col in (
        "history",
        "store",
        "keys",
        "load ckpt s",
        "tail rec",
        "tail rec/s",
        "ckpt restore s",
        "full replay s",
        "full rec/s",
        "speed-up",
        "equal",
        "mem/raw",
    ):
        out.add_column(col, justify="right")
    for r in rows:
        out.add_row(
            f"{r.history:,}",
            r.store,
            f"{r.keys:,}",
            f"{r.load_s:.2f}",
            f"{r.tail_records:,}",
            f"{r.tail_records / max(r.tail_s, 1e-9):,.0f}",
            f"{r.checkpoint_restore_s:.2f}",
            f"{r.full_replay_s:.2f}",
            f"{r.full_records / max(r.full_replay_s, 1e-9):,.0f}",
            f"{r.full_replay_s / max(r.checkpoint_restore_s, 1e-9):.1f}x",
            "yes" if r.equal else "NO",
            f"{r.mem_ratio:.2f}" if r.mem_ratio else "-",
        )
    Console(width=180).print(out)
    if len(histories) >= 2:
        for store in stores:
            small = next(r for r in rows if r.store == store and r.history == histories[0])
            big = next(r for r in rows if r.store == store and r.history == histories[-1])
            growth = big.checkpoint_restore_s / max(small.checkpoint_restore_s, 1e-9)
            speedup = big.full_replay_s / max(big.checkpoint_restore_s, 1e-9)
            print(
                f"{store}: checkpoint restore grows {growth:.2f}x for "
                f"{histories[-1] // histories[0]}x history (target <= 1.3x); "
                f"speed-up at largest history {speedup:.1f}x (target >= 10x)"
            )


if __name__ == "__main__":
    main()
