"""A count per key (and, with ``--window``, a 1-minute tumbling count): statesnap beside Kafka
Streams, Spark Structured Streaming and a plain loop, one run, one Apache Kafka broker (a table).

Issue #36, item 5. Same broker, same data for every contender: ``--events`` JSON records
``{"amount": n}`` over ``--keys`` keys (every key once first, then uniformly drawn), key ``key-i``
in partition ``i % partitions``, event timestamps evenly spaced and ending two minutes before the
run started (so the broker's retention keeps them: the topic and Kafka Streams' changelogs would
lose a 2023 history within seconds). Then 1 % more events (the tail) arrive after every contender
processed the history and saved its state. Each contender runs alone, one after the other:

- plain loop: a bare confluent-kafka loop counting into a dict (the limit); its counts are the
  ground truth every contender's state is checked against, and its "restart" is a recompute of
  history + tail;
- statesnap ``Processor(value_serde="json", checkpoints=<local dir>)`` with ``proc.count`` (with
  ``--window``: ``window=Windows.tumbling("1m")``): from scratch (``start()`` to caught up; its
  first checkpoint timed apart), then a new processor restoring that checkpoint + the tail;
- Kafka Streams 4.1.1 (``benchmarks/peers/kafka-streams``, ``CountPeer``: ``groupByKey().count()``
  or ``.windowedBy(TimeWindows.ofSizeWithNoGrace(1 min)).count()``, defaults otherwise),
  at-least-once and exactly_once_v2. A Streams app's committed offsets move when it processes the
  tail, so each guarantee builds two apps from scratch (each row shows its own build): one
  restarts with its state directory wiped (restore from the changelog), one with it kept.
  Seconds are ``start()`` to the last input record processed (JVM start excluded; CPU is the
  whole process's);
- Spark Structured Streaming (the installed PySpark, ``local[2]``, RocksDB state store provider,
  Spark's own ``format("kafka")`` source, ``spark.sql.shuffle.partitions`` = ``--partitions``
  rather than 200, which favours Spark here): ``groupBy(key).count()`` (window: a 10 s watermark
  and ``groupBy(window(timestamp, "1 minute"), key).count()``), ``outputMode("update")`` into a
  ``noop`` sink, ``trigger(availableNow=True)``, from scratch, then restarted from its
  ``checkpointLocation`` over the tail. Its state is read back with ``format("statestore")``.
  The session start and a warm-up (both queries over 1,000 events: class loading, code
  generation) are printed apart (paid once per application); CPU is the JVM's.

The window count is checked on the windows that live at the end (per partition the window
holding its stream time; retention = size, no grace, as both statesnap and Kafka Streams default
to): a contender's live windows must equal the plain loop's, key for key. Windows a contender
still holds past retention (Kafka Streams drops whole segments; Spark's watermark is global) are
not compared.

    .venv/bin/python benchmarks/count_peers.py                                   # 2 M / 200 k
    .venv/bin/python benchmarks/count_peers.py --events 500000 --keys 50000 --window
    .venv/bin/python benchmarks/count_peers.py --quick --window                  # the smoke run

Needs Java 17, Maven, the Apache Kafka jars and Spark's Kafka connector of ``bash
scripts/setup.sh``. Exits 1 when a contender's state differs from the plain loop's. Not a test: it
prints figures for the record (``--json`` too). The machine is shared: the load average is printed.
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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table as RichTable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kafka_sources import connector_jars
from peers import peer_java, run_json_peer
from processors import BenchError, children_cpu, given_or_apache, plain_consumer, produce_keyed, read_loop

console = Console(stderr=True)

WINDOW_MS = 60_000
#: The history + tail spans at most this much event time (Kafka Streams' window changelog keeps a
#: day beyond the window's retention; the broker deletes what is older).
SPAN_MS = 6 * 3600 * 1000
PEER_TIMEOUT_S = 1800
STORE = "counts"

#: A contender's state: key -> count, or (key, window start) -> count.
State = dict[Any, int]


# ---------------------------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Timeline:
    """Event ``i`` (of history and tail together) has timestamp ``first_ms + i * spacing_ms``."""

    first_ms: int
    spacing_ms: int

    @classmethod
    def ending_before_now(cls, total: int) -> Timeline:
        spacing = max(1, min(60, SPAN_MS // max(total, 1)))
        return cls(int(time.time() * 1000) - total * spacing - 120_000, spacing)


def produce(bs: str, topic: str, partitions: int, keys: int, lo: int, n: int, tl: Timeline) -> float:
    """Events ``lo .. lo+n`` of the stream into *topic* (created with retention.ms=-1 first)."""
    perm = np.random.default_rng([7, keys]).permutation(keys)
    rng = np.random.default_rng([1, lo])
    idx = np.arange(lo, lo + n)
    ids = rng.integers(0, keys, size=n)
    first = idx < keys
    ids[first] = perm[idx[first]]
    amounts = rng.integers(1, 1000, size=n)
    return produce_keyed(bs, topic, partitions, ids, amounts, tl.first_ms + idx * tl.spacing_ms)


def partition_of(key: bytes, partitions: int) -> int:
    return int(key[4:]) % partitions


# ------------------------------------------------------------------------------------ plain loop


def plain_loop(bs: str, topic: str, partitions: int, window: bool) -> tuple[float, float, int, State]:
    """The limit: consume every record, count into a dict. Window: per partition only the window
    holding its stream time lives (timestamps rise within a partition; retention = size), keys
    ``(key, start)``. Seconds, CPU seconds, records, the counts."""
    gc.collect()
    counts: dict[bytes, int] = {}
    live: dict[int, tuple[int, dict[bytes, int]]] = {}

    def on_window(m: Any) -> None:
        ts, p = m.timestamp()[1], m.partition()
        start = ts - ts % WINDOW_MS
        cur = live.get(p)
        if cur is None or cur[0] != start:
            cur = live[p] = (start, {})
        w, k = cur[1], m.key()
        w[k] = w.get(k, 0) + 1

    c = plain_consumer(bs)
    try:
        t0, cpu0 = time.monotonic(), time.process_time()
        n = read_loop(c, topic, partitions, counts, on_record=on_window if window else None)
        seconds, cpu = time.monotonic() - t0, time.process_time() - cpu0
    finally:
        c.close()
    if window:
        return seconds, cpu, n, {(k, s): v for s, w in live.values() for k, v in w.items()}
    return seconds, cpu, n, counts


def check(got: State, truth: State, window: bool, partitions: int) -> str:
    """``ok`` or ``MISMATCH (...)``. Window: only *got*'s windows that the truth says live (per
    partition, its live window's start) are compared; they must be all of the truth's."""
    if window:
        live = {partition_of(k, partitions): s for k, s in truth}
        got = {(k, s): v for (k, s), v in got.items() if live.get(partition_of(k, partitions)) == s}
    if got == truth:
        return "ok"
    missing = len(truth.keys() - got.keys())
    extra = len(got.keys() - truth.keys())
    wrong = sum(1 for k, v in got.items() if k in truth and truth[k] != v)
    return f"MISMATCH ({missing} missing, {extra} extra, {wrong} wrong of {len(truth):,})"


# ---------------------------------------------------------------------------------------- contenders


@dataclass
class Row:
    name: str
    scratch_s: float | None = None
    scratch_records: int = 0
    scratch_cpu_s: float | None = None
    restart_s: float | None = None
    restart_records: int = 0
    restart_cpu_s: float | None = None
    checks: list[str] = field(default_factory=list)
    note: str = ""


def statesnap_run(
    bs: str, topic: str, name: str, root: Path, window: bool
) -> tuple[float, float, Any, float, State]:
    """A processor from its checkpoint (or none) to caught up; then its checkpoint (timed); seconds,
    CPU, its restore report and the store read back."""
    from statesnap import Processor
    from statesnap.processor import Windows

    gc.collect()
    t0, cpu0 = time.monotonic(), time.process_time()
    proc = Processor(name, inputs=[topic], bootstrap_servers=bs, checkpoints=str(root), value_serde="json")
    proc.count(STORE, window=Windows.tumbling("1m") if window else None)
    report = proc.start()
    seconds, cpu = time.monotonic() - t0, time.process_time() - cpu0
    try:
        t1 = time.monotonic()
        proc.checkpoint()
        checkpoint_s = time.monotonic() - t1
        state: State = {
            ((bytes(k[0]), int(k[1])) if window else bytes(k)): int(v) for k, v in proc.store(STORE).items()
        }
    finally:
        proc.close(checkpoint=False)
    return seconds, cpu, report, checkpoint_s, state


@dataclass
class KsApp:
    guarantee: str  # "at-least-once" | "exactly_once_v2"
    restart: str  # "wiped" | "kept"
    app_id: str
    state_dir: Path
    scratch: dict[str, Any] = field(default_factory=dict)
    restart_run: dict[str, Any] = field(default_factory=dict)


def ks_java() -> list[str]:
    return peer_java("CountPeer")


def ks_run(
    java: list[str], bs: str, topic: str, app: KsApp, window: bool, wipe: bool
) -> tuple[dict[str, Any], State]:
    """One CountPeer run: its JSON line (+ process CPU, wall) and the store it dumped."""
    dump = app.state_dir.parent / f"{app.app_id}-{uuid.uuid4().hex[:6]}.tsv"
    cmd = [*java, bs, topic, app.app_id, str(app.state_dir), str(PEER_TIMEOUT_S), str(dump)]
    cmd += (["window"] if window else []) + (["eos"] if app.guarantee == "exactly_once_v2" else [])
    cmd += ["wipe"] if wipe else []
    cpu0 = children_cpu()
    out = run_json_peer(cmd, PEER_TIMEOUT_S + 120, app.app_id)
    out["cpu_s"] = children_cpu() - cpu0
    state: State = {}
    for line in dump.read_text().splitlines():
        parts = line.split("\t")
        key = parts[0].encode()
        state[(key, int(parts[1])) if window else key] = int(parts[-1])
    dump.unlink()
    return out, state


class SparkSide:
    """One local[2] session with Spark's Kafka source and RocksDB state; queries run one at a time."""

    def __init__(self, cores: int, shuffle_partitions: int) -> None:
        from statesnap.spark import spark_session

        jars = connector_jars()
        t0 = time.monotonic()
        self.spark = spark_session(
            f"local[{cores}]",
            app_name="statesnap-count-peers",
            conf={
                "spark.jars": ",".join(jars),
                "spark.driver.memory": "2g",
                "spark.sql.shuffle.partitions": str(shuffle_partitions),
                "spark.sql.streaming.stateStore.providerClass": (
                    "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
                ),
            },
        )
        self.spark.range(1).count()  # the first job: executors up
        self.session_s = time.monotonic() - t0
        self.pid = int(self.spark._jvm.java.lang.ProcessHandle.current().pid())
        self.warm_up_s: float | None = None

    def warm_up(self, bs: str, work: Path, partitions: int) -> None:
        """Once per session: both queries over 1,000 events, so the first measured query does not
        pay Spark's class loading and code generation (a cluster pays them once per application,
        like the session start; printed beside it)."""
        if self.warm_up_s is not None:
            return
        t0 = time.monotonic()
        topic = f"spark-warm-up-{uuid.uuid4().hex[:8]}"
        produce(bs, topic, partitions, 100, 0, 1_000, Timeline.ending_before_now(1_000))
        for window in (False, True):
            self.run(bs, topic, work / f"{topic}-{window}", window)
        self.warm_up_s = time.monotonic() - t0
        console.print(f"Spark warm-up (both queries over 1,000 events): {self.warm_up_s:.1f}s")

    def jvm_cpu(self) -> float:
        """User + system CPU seconds of the driver JVM (every thread) from /proc."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def run(self, bs: str, topic: str, checkpoint: Path, window: bool) -> tuple[float, float, int, State]:
        """One availableNow query (from scratch or from *checkpoint*); seconds, JVM CPU, input
        rows, the state read back from the checkpoint."""
        from pyspark.sql import functions as sf

        cpu0, t0 = self.jvm_cpu(), time.monotonic()
        df = (
            self.spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", bs)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .load()
            .select(sf.col("key").cast("string").alias("key"), "timestamp")
        )
        if window:
            agg = (
                df.withWatermark("timestamp", "10 seconds")
                .groupBy(sf.window("timestamp", "1 minute"), "key")
                .count()
            )
        else:
            agg = df.groupBy("key").count()
        q = (
            agg.writeStream.format("noop")
            .outputMode("update")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()
        seconds, cpu = time.monotonic() - t0, self.jvm_cpu() - cpu0
        rows = sum(int(p.get("numInputRows", 0)) for p in q.recentProgress)
        if q.exception() is not None:
            raise BenchError(f"Spark query failed: {q.exception()}")
        st = self.spark.read.format("statestore").load(str(checkpoint))
        state: State = {}
        if window:
            sel = st.select(
                sf.col("key.key").alias("k"),
                sf.expr("unix_millis(key.window.start)").alias("s"),
                sf.col("value.count").alias("c"),
            )
            for r in sel.collect():
                state[(r["k"].encode(), int(r["s"]))] = int(r["c"])
        else:
            for r in st.select(sf.col("key.key").alias("k"), sf.col("value.count").alias("c")).collect():
                state[r["k"].encode()] = int(r["c"])
        return seconds, cpu, rows, state

    def close(self) -> None:
        self.spark.stop()


# ------------------------------------------------------------------------------------------- the run


def measure(
    bs: str,
    args: argparse.Namespace,
    work: Path,
    java: list[str] | None,
    spark: SparkSide | None,
    window: bool,
) -> dict[str, Any]:
    """Every contender over one topic for the count (or the window count): history, then tail."""
    what = "window" if window else "count"
    topic = f"{what}-{uuid.uuid4().hex[:8]}"
    tail = max(args.events // 100, 1)
    tl = Timeline.ending_before_now(args.events + tail)
    r: dict[str, Any] = {"what": what, "events": args.events, "tail": tail, "spacing_ms": tl.spacing_ms}
    r["produce_s"] = produce(bs, topic, args.partitions, args.keys, 0, args.events, tl)
    console.print(f"[bold]{what}[/]: produced {args.events:,} events in {r['produce_s']:.1f}s")
    plain, ss = Row("plain loop (dict)"), Row("statesnap proc.count")
    rows = [plain, ss]
    truth_h: State
    plain.scratch_s, plain.scratch_cpu_s, plain.scratch_records, truth_h = plain_loop(
        bs, topic, args.partitions, window
    )
    console.print(f"  plain loop {plain.scratch_s:.2f}s")
    judge: Callable[[State, State], str] = lambda got, truth: check(got, truth, window, args.partitions)  # noqa: E731

    root = work / f"ckpt-{what}"
    ss.scratch_s, ss.scratch_cpu_s, rep, ck_s, state = statesnap_run(bs, topic, f"ss-{what}", root, window)
    ss.scratch_records = rep.replayed_records
    ss.checks.append(judge(state, truth_h))
    ss.note = f"first checkpoint {ck_s:.2f}s"
    console.print(f"  statesnap {ss.scratch_s:.2f}s, checkpoint {ck_s:.2f}s, {ss.checks[-1]}")

    apps: list[KsApp] = []
    if java is not None:
        for g in ("at-least-once", "exactly_once_v2"):
            for restart in ("wiped", "kept"):
                app_id = f"ks-{what}-{g[:3]}-{restart}-{uuid.uuid4().hex[:6]}"
                app = KsApp(g, restart, app_id, work / app_id)
                app.scratch, state = ks_run(java, bs, topic, app, window, wipe=True)
                app.scratch["check"] = judge(state, truth_h)
                apps.append(app)
                console.print(
                    f"  Kafka Streams {g} ({restart}) {app.scratch['seconds_to_caught_up']}s, "
                    f"{app.scratch['check']}"
                )
    ck = work / f"spark-{what}"
    spark_row = Row("Spark Structured Streaming, RocksDB state")
    if spark is not None:
        spark.warm_up(bs, work, args.partitions)
        spark_row.scratch_s, spark_row.scratch_cpu_s, spark_row.scratch_records, state = spark.run(
            bs, topic, ck, window
        )
        spark_row.checks.append(judge(state, truth_h))
        console.print(f"  Spark {spark_row.scratch_s:.2f}s, {spark_row.checks[-1]}")

    produce(bs, topic, args.partitions, args.keys, args.events, tail, tl)
    console.print(f"  tail of {tail:,} events produced; restarts")
    truth: State
    plain.restart_s, plain.restart_cpu_s, plain.restart_records, truth = plain_loop(
        bs, topic, args.partitions, window
    )
    plain.note = "restart = recompute of history + tail"
    ss.restart_s, ss.restart_cpu_s, rep, _ck, state = statesnap_run(bs, topic, f"ss-{what}", root, window)
    ss.restart_records = rep.replayed_records
    ss.checks.append(judge(state, truth))
    ss.note += f"; restore: load {rep.load_seconds:.2f}s + tail {rep.replay_seconds:.2f}s"
    for app in apps:
        app.restart_run, state = ks_run(java or [], bs, topic, app, window, wipe=app.restart == "wiped")
        app.restart_run["check"] = judge(state, truth)
    for g in ("at-least-once", "exactly_once_v2"):
        mine = [a for a in apps if a.guarantee == g]
        if not mine:
            continue
        for a in mine:
            row = Row(f"Kafka Streams 4.1.1 {g}, state dir {a.restart}")
            row.scratch_s = float(a.scratch["seconds_to_caught_up"])
            row.scratch_records = int(a.scratch["processed_records"])
            row.scratch_cpu_s = float(a.scratch["cpu_s"])
            row.restart_s = float(a.restart_run["seconds_to_caught_up"])
            row.restart_records = int(a.restart_run["processed_records"])
            row.restart_cpu_s = float(a.restart_run["cpu_s"])
            row.checks = [a.scratch["check"], a.restart_run["check"]]
            row.note = (
                f"restored {a.restart_run['records_restored']:,} changelog rec in "
                f"{a.restart_run['restore_seconds']}s; "
                f"JVM wall {a.restart_run['process_wall_s']:.1f}s"
            )
            rows.append(row)
    if spark is not None:
        spark_row.restart_s, spark_row.restart_cpu_s, spark_row.restart_records, state = spark.run(
            bs, topic, ck, window
        )
        spark_row.checks.append(judge(state, truth))
        spark_row.note = (
            f"+ {spark.session_s:.1f}s session start, {spark.warm_up_s or 0:.1f}s warm-up (once); "
            f"shuffle partitions {args.partitions}"
        )
        rows.append(spark_row)
    r["rows"] = [asdict(x) for x in rows]
    return r


# ------------------------------------------------------------------------------------------ report


def fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


COLUMNS = (
    "contender",
    "scratch s",
    "scratch rec/s",
    "scratch x plain",
    "scratch rec/CPU s",
    "restart->tail s",
    "restart rec/s",
    "restart x plain",
    "restart rec/CPU s",
    "state vs plain loop",
    "note",
)


def rate(n: int, seconds: float | None) -> str:
    return "-" if not seconds else f"{n / seconds:,.0f}"


def print_report(results: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    load = f"load average {meta['load_start']:.2f} -> {meta['load_end']:.2f} (2 cores, shared)"
    for r in results:
        plain = r["rows"][0]
        what = "1-minute tumbling count" if r["what"] == "window" else "count per key"
        t = RichTable(
            title=f"{what}: {r['events']:,} events, {meta['keys']:,} keys, {meta['partitions']} partitions, "
            f"tail {r['tail']:,} (1 %); one Apache Kafka 4.1.1 broker; {load}"
        )
        for c in COLUMNS:
            t.add_column(c, justify="left" if c in ("contender", "note", "state vs plain loop") else "right")
        for row in r["rows"]:
            s, rs = row["scratch_s"], row["restart_s"]
            t.add_row(
                row["name"],
                fmt(s, ".2f"),
                rate(row["scratch_records"], s),
                fmt(s / plain["scratch_s"] if s else None, ".2f"),
                rate(row["scratch_records"], row["scratch_cpu_s"]),
                fmt(rs, ".2f"),
                rate(row["restart_records"], rs),
                fmt(rs / plain["restart_s"] if rs else None, ".2f"),
                rate(row["restart_records"], row["restart_cpu_s"]),
                " / ".join(row["checks"]) or "(ground truth)",
                row["note"],
            )
        Console(width=280).print(t)
    print(
        "scratch: start to the last history record processed; restart->tail: start to the last tail "
        "record processed (statesnap: checkpoint restore + tail; Kafka Streams: changelog restore when "
        "wiped; Spark: from its checkpointLocation; plain loop: recompute). rec/s = records the "
        "contender processed / s; x plain = seconds / the plain loop's seconds; rec/CPU s = records / "
        "CPU seconds of the contender (its process, JVM start included for Kafka Streams; the driver "
        f"JVM for Spark). {load}."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="100 k events over 10 k keys (the smoke run)")
    ap.add_argument("--window", action="store_true", help="also the 1-minute tumbling count")
    ap.add_argument("--skip-kafka-streams", action="store_true")
    ap.add_argument("--skip-spark", action="store_true")
    ap.add_argument("--bootstrap", help="an Apache Kafka broker to use (default: start one)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.events, args.keys = 100_000, 10_000
    if args.events < 100 or not 1 <= args.keys <= args.events or args.partitions < 1:
        ap.error("--events >= 100, 1 <= --keys <= --events, --partitions >= 1")
    meta: dict[str, Any] = {
        "keys": args.keys,
        "partitions": args.partitions,
        "load_start": os.getloadavg()[0],
    }
    console.print(f"load average at start: {meta['load_start']:.2f} (2-core machine shared with others)")
    results: list[dict[str, Any]] = []
    spark: SparkSide | None = None
    try:
        java = None if args.skip_kafka_streams else ks_java()
        if not args.skip_spark:
            spark = SparkSide(2, args.partitions)
            console.print(f"Spark session started in {spark.session_s:.1f}s")
        with given_or_apache(args.bootstrap) as bs, tempfile.TemporaryDirectory() as tmp:
            for window in [False, True][: 1 + args.window]:
                results.append(measure(bs, args, Path(tmp), java, spark, window))
    except BenchError as e:
        sys.exit(f"count_peers: {e}")
    finally:
        if spark is not None:
            spark.close()
    meta["load_end"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps({"meta": meta, "results": results}, indent=2, default=str))
    else:
        print_report(results, meta)
    if any(not c.startswith("ok") for r in results for row in r["rows"] for c in row["checks"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
