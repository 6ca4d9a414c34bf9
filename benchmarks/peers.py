"""statesnap beside the peers a user would pick instead, one run, one Apache Kafka broker (prints a table).

For each history multiplier M (the topic holds M x keys updates, 1 % tombstones, 100-byte values):

- floor: a plain confluent-kafka loop reading the whole topic (nothing is kept);
- statesnap restore: a ``Table(..., checkpoints=...)`` that checkpointed the history restores from
  that checkpoint plus a small tail (``start()`` to ready, per state store);
- statesnap full replay: the same table without a checkpoint;
- Kafka Streams restore: ``benchmarks/peers/kafka-streams`` (a KTable via ``toTable`` and, with
  ``--count``, a ``groupByKey().count()``) built over the history, then restarted with its state
  directory wiped: start() to RUNNING with its stores restored from their changelogs, and to the
  same tail processed. Twice: from the changelog as Streams wrote it (uncompacted: the broker's
  1 GB segments), and from a changelog the log cleaner has compacted (Streams' best case).

Kafka Streams' close() commits its input offsets, so with --repeat > 1 only its first restore has
the tail to process: best-of then favours Kafka Streams, never statesnap.

    .venv/bin/python benchmarks/peers.py                                  # 200 k keys, 1x and 10x
    .venv/bin/python benchmarks/peers.py --keys 50000 --history-multiplier 1 --repeat 1   # quick

Needs Java 17, Maven and the Apache Kafka jars of ``bash scripts/setup.sh``; the Java peer is built
with ``mvn -q package`` on first use. Not a test: it prints figures for the record.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table as RichTable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from processors import BenchError, plain_consumer, read_loop

from statesnap import Table
from statesnap.devstack.apache import ApacheKafkaBroker, apache_kafka_missing
from statesnap.digest import table_digest
from statesnap.kafka.config import KafkaSettings
from statesnap.sample import SampleSpec, produce_sample

console = Console(stderr=True)

PEER_DIR = Path(__file__).resolve().parent / "peers" / "kafka-streams"
#: Generous: Kafka Streams builds 10 x 200 k updates in well under this on a loaded 2-core machine.
PEER_TIMEOUT_S = 900
MVN_TIMEOUT_S = 600
FLOOR_TIMEOUT_S = 600.0


@dataclass
class Row:
    multiplier: int
    history: int
    keys: int
    tail: int
    floor_s: float = 0.0
    ckpt_s: dict[str, float] = field(default_factory=dict)
    full_s: dict[str, float] = field(default_factory=dict)
    equal: dict[str, bool] = field(default_factory=dict)
    #: Per changelog variant ("written", "compacted"): the peer's JSON of its build and best restore.
    ks_build: dict[str, dict[str, Any]] = field(default_factory=dict)
    ks_restore: dict[str, dict[str, Any]] = field(default_factory=dict)


class PeerBuildError(BenchError):
    """The Kafka Streams peer could not be built (no Maven, or ``mvn package`` failed)."""


def peer_classpath() -> str:
    """The Kafka Streams peers' classpath, after ``mvn -q package`` when a peer's class is missing
    or older than its source (every benchmark that runs a peer of ``benchmarks/peers/kafka-streams``
    builds it here)."""
    java = PEER_DIR / "src" / "main" / "java"
    classes, lib = PEER_DIR / "target" / "classes", PEER_DIR / "target" / "lib"

    def stale(source: Path) -> bool:
        built = classes / source.relative_to(java).with_suffix(".class")
        return not built.exists() or built.stat().st_mtime < source.stat().st_mtime

    if not lib.is_dir() or any(stale(source) for source in java.rglob("*.java")):
        if shutil.which("mvn") is None:
            raise PeerBuildError("mvn not found: install Maven to build benchmarks/peers/kafka-streams")
        console.print("building the Kafka Streams peer (mvn -q package)")
        done = subprocess.run(
            ["mvn", "-q", "-B", "-Dstyle.color=never", "package"],
            cwd=PEER_DIR,
            capture_output=True,
            text=True,
            timeout=MVN_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            raise PeerBuildError(
                f"mvn package failed in {PEER_DIR}: {(done.stdout + done.stderr).strip()[-2000:]}"
            )
    return os.pathsep.join([str(classes), str(lib / "*")])


def peer_java(main_class: str, heap: str = "1g", log_level: str = "error") -> list[str]:
    """The java command line that runs ``dev.statesnap.peers.<main_class>`` (the peers built first
    when needed: :class:`PeerBuildError`)."""
    return [
        "java",
        f"-Xmx{heap}",
        f"-Dorg.slf4j.simpleLogger.defaultLogLevel={log_level}",
        "-cp",
        peer_classpath(),
        f"dev.statesnap.peers.{main_class}",
    ]


def run_json_peer(cmd: list[str], timeout: float, what: str) -> dict[str, Any]:
    """Run a peer that prints one JSON line on stdout (everything else on stderr): that JSON plus
    the process's wall time, ``process_wall_s`` (JVM start included). BenchError when it fails."""
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    wall = time.monotonic() - t0
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        raise BenchError(
            f"Kafka Streams {what} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}"
        )
    out: dict[str, Any] = json.loads(lines[-1])
    out["process_wall_s"] = wall
    return out


def flags(args: argparse.Namespace, variant: str) -> list[str]:
    """The Java peer's flags for one changelog variant."""
    return (["count"] if args.count else []) + (["compact"] if variant == "compacted" else [])


def run_peer(
    java: list[str], mode: str, bs: str, topic: str, app_id: str, state_dir: str, peer_flags: list[str]
) -> dict[str, Any]:
    """One run of the StreamsPeer: its JSON line plus the process's wall time."""
    cmd = [*java, mode, bs, topic, app_id, state_dir, str(PEER_TIMEOUT_S), *peer_flags]
    return run_json_peer(cmd, PEER_TIMEOUT_S + 60, mode)


def floor_read(bs: str, topic: str, partitions: int) -> tuple[float, int]:
    """Seconds for a bare confluent-kafka consumer to read every record of *topic* (the floor).

    It gets the fetch settings statesnap's reader uses: with librdkafka's defaults
    (``fetch.queue.backoff.ms`` 1 s after every partial fetch) a plain loop took 12.4 s for 2 M
    records here, three times statesnap's full replay, and would be no floor."""
    c = plain_consumer(bs)
    try:
        t0 = time.monotonic()
        n = read_loop(c, topic, partitions, timeout=FLOOR_TIMEOUT_S)  # nothing done per record
        return time.monotonic() - t0, n
    finally:
        c.close()


def timed_start(topic: str, bs: str, store: str, checkpoints: str | None) -> tuple[float, tuple[str, int]]:
    """Wall seconds from constructing the table to ``start()`` returning ready, and its digest."""
    gc.collect()
    t0 = time.monotonic()
    t = Table(topic, bootstrap_servers=bs, checkpoints=checkpoints, store=store, background=False)  # type: ignore[arg-type]
    t.start()
    seconds = time.monotonic() - t0
    digest = table_digest(t.raw_items())
    t.close(checkpoint=False)
    return seconds, digest


def run(bs: str, java: list[str], m: int, args: argparse.Namespace, root: str, work: str) -> Row:
    settings = KafkaSettings(bs)
    topic = f"peers-{m}x"
    history = args.keys * m
    row = Row(m, history, args.keys, args.tail)

    def produce(n: int, seed: int) -> None:
        produce_sample(settings, SampleSpec(topic, args.partitions, args.keys, n, 0.01, 100, seed))

    t0 = time.monotonic()
    produce(history, 1)
    console.print(
        f"[bold]{m}x[/]: produced {history:,} updates over {args.keys:,} keys in {time.monotonic() - t0:.1f}s"
    )

    # Both save their state over exactly the history, then the same tail arrives for both to apply.
    owner = Table(topic, bootstrap_servers=bs, checkpoints=root, background=False)
    owner.start()
    owner.checkpoint()
    owner.close(checkpoint=False)
    apps = {}
    for variant in args.changelogs:
        app_id = f"peers-ks-{m}x-{variant}-{uuid.uuid4().hex[:8]}"
        apps[variant] = (app_id, str(Path(work) / app_id), flags(args, variant))
        row.ks_build[variant] = run_peer(java, "build", bs, topic, *apps[variant])
        console.print(
            f"  Kafka Streams build ({variant} changelog): {row.ks_build[variant]['seconds_to_caught_up']}s"
        )
    produce(args.tail, 2)

    for _ in range(args.repeat):
        floor, n = floor_read(bs, topic, args.partitions)
        row.floor_s = min(row.floor_s or floor, floor)
        for store in args.stores:
            ck, d1 = timed_start(topic, bs, store, root)
            full, d2 = timed_start(topic, bs, store, None)
            row.ckpt_s[store] = min(row.ckpt_s.get(store, ck), ck)
            row.full_s[store] = min(row.full_s.get(store, full), full)
            row.equal[store] = d1 == d2 and row.equal.get(store, True)
        for variant, app in apps.items():
            ks = run_peer(java, "restore", bs, topic, *app)
            best = row.ks_restore.get(variant)
            if best is None or ks["seconds_to_caught_up"] < best["seconds_to_caught_up"]:
                row.ks_restore[variant] = ks
        console.print(
            f"  floor {floor:.2f}s ({n:,} rec); statesnap "
            + ", ".join(f"{s} ckpt {row.ckpt_s[s]:.2f}s full {row.full_s[s]:.2f}s" for s in args.stores)
            + "; Kafka Streams "
            + ", ".join(f"{v} ready {k['seconds_to_caught_up']}s" for v, k in row.ks_restore.items())
        )
    return row


def fmt(x: float) -> str:
    return f"{x:.2f}"


def print_report(rows: list[Row], args: argparse.Namespace) -> None:
    out = RichTable(title="statesnap vs Kafka Streams vs a plain consumer (Apache Kafka, same run)")
    cols = ["history", "floor s"]
    for v in args.changelogs:
        cols += [f"KS {v}: build s", "changelog rec restored", "changelog MB", "restored s", "ready s"]
    for s in args.stores:
        cols += [f"ss {s} ckpt s", f"ss {s} full s"]
    for c in cols:
        out.add_column(c, justify="right")
    for r in rows:
        cells = [f"{r.history:,} ({r.multiplier}x)", fmt(r.floor_s)]
        for v in args.changelogs:
            ks = r.ks_restore[v]
            cells += [
                str(r.ks_build[v]["seconds_to_caught_up"]),
                f"{ks['records_restored']:,}",
                f"{r.ks_build[v]['changelog_bytes'] / 1e6:.1f}",
                str(ks["seconds_to_restored"]),
                str(ks["seconds_to_caught_up"]),
            ]
        for s in args.stores:
            cells += [fmt(r.ckpt_s[s]), fmt(r.full_s[s])]
        out.add_row(*cells)
    Console(width=240).print(out)
    for r in rows:
        for s in args.stores:
            ck = r.ckpt_s[s]
            vs_ks = ", ".join(
                f"{v} {float(r.ks_restore[v]['seconds_to_caught_up']) / ck:.1f}x" for v in args.changelogs
            )
            print(
                f"{r.multiplier}x history, {s} store: Kafka Streams restore / statesnap restore = {vs_ks}; "
                f"statesnap full replay / statesnap restore = {r.full_s[s] / ck:.1f}x; "
                f"statesnap restore / floor read = {ck / r.floor_s:.2f}x; restore equals replay: "
                f"{'yes' if r.equal[s] else 'NO'}"
            )
    if len(rows) >= 2:
        a, b = rows[0], rows[-1]
        k = b.multiplier // a.multiplier
        ready = {
            r.multiplier: {v: float(r.ks_restore[v]["seconds_to_caught_up"]) for v in args.changelogs}
            for r in rows
        }
        parts = [
            f"Kafka Streams ({v}) restore {ready[b.multiplier][v] / ready[a.multiplier][v]:.2f}x"
            for v in args.changelogs
        ]
        parts += [f"statesnap {s} restore {b.ckpt_s[s] / a.ckpt_s[s]:.2f}x" for s in args.stores]
        print(f"growth for {k}x history: " + ", ".join(parts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument(
        "--history-multiplier",
        default="1,10",
        help="comma-separated multiples of --keys: the history lengths to measure (default 1,10)",
    )
    ap.add_argument("--tail", type=int, default=None, help="records after the checkpoint (default keys/100)")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--stores", default="memory,rocksdb", help="statesnap stores to measure")
    ap.add_argument("--repeat", type=int, default=1, help="restores per size; the best is reported")
    ap.add_argument("--count", action="store_true", help="Kafka Streams also keeps groupByKey().count()")
    ap.add_argument(
        "--changelogs",
        default="written,compacted",
        help="Kafka Streams changelog variants: 'written' (as Streams wrote it, the broker's default "
        "1 GB segments keep it uncompacted) and/or 'compacted' (1 MB segments, restored after the "
        "cleaner caught up: Kafka Streams' best case)",
    )
    args = ap.parse_args()
    try:
        args.multipliers = [int(x) for x in args.history_multiplier.split(",")]
    except ValueError:
        ap.error(f"--history-multiplier: expected comma-separated integers, got {args.history_multiplier!r}")
    args.stores = args.stores.split(",")
    args.changelogs = args.changelogs.split(",")
    if not args.changelogs or set(args.changelogs) - {"written", "compacted"}:
        ap.error(f"--changelogs: expected written and/or compacted, got {','.join(args.changelogs)!r}")
    args.tail = args.tail if args.tail is not None else max(args.keys // 100, 1)
    if min(args.multipliers) < 1 or args.keys < 1 or args.repeat < 1:
        ap.error("--keys, --history-multiplier and --repeat must be positive")
    missing = apache_kafka_missing()
    if missing is not None:
        sys.exit(f"peers: {missing}")
    if shutil.which("mvn") is None and not (PEER_DIR / "target" / "lib").is_dir():
        sys.exit("peers: mvn not found: install Maven to build benchmarks/peers/kafka-streams")
    try:
        java = peer_java("StreamsPeer")
    except BenchError as e:
        sys.exit(f"peers: {e}")
    console.print(f"load average at start: {os.getloadavg()[0]:.2f} (2-core machine shared with others)")
    rows: list[Row] = []
    with (
        ApacheKafkaBroker(heap="1g") as broker,
        tempfile.TemporaryDirectory() as root,
        tempfile.TemporaryDirectory() as work,
    ):
        try:
            for m in args.multipliers:
                rows.append(run(broker.bootstrap_servers, java, m, args, root, work))
        except BenchError as e:
            sys.exit(f"peers: {e}")
    console.print(f"load average at end: {os.getloadavg()[0]:.2f}")
    print_report(rows, args)


if __name__ == "__main__":
    main()
