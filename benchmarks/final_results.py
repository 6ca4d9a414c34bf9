"""A windowed count with final emission: statesnap beside Kafka Streams, Quix Streams and a plain
loop, one run, one Apache Kafka broker (issue #33's last proof; prints a table, ``--json`` too).

Every contender reads the same input topic (JSON ``{"amount": n}`` records over ``--keys`` keys, a
key's partition fixed by the driver) and writes one final result per (key, tumbling window) to
its own output topic once stream time passes the window's end plus grace, value
``{"start": S, "end": E, "value": N}`` with the input key:

- plain loop: a bare confluent-kafka consume loop that keeps each partition's stream time and its
  open windows' counts and produces a window's results when stream time reaches end + grace (the
  limit). Its rule, run by the driver over the input topic, is the ground truth every contender's
  output is checked against (``ok`` / ``MISMATCH``);
- statesnap ``Processor.count(..., window=Windows.tumbling(size, grace=...), emit="final", to=out)``
  (the Python engine, file checkpoints, commit interval 5 s), at least once and exactly once;
- Kafka Streams 4.1.1 (``benchmarks/peers/kafka-streams``, ``FinalCountPeer``): ``groupByKey()
  .windowedBy(TimeWindows.ofSizeAndGrace).count().suppress(untilWindowCloses(unbounded()))``;
  once with commit.interval.ms 5000 (statesnap's and Quix's) and its default 10 MB record cache,
  whose updates reach ``suppress`` only when the cache flushes (at a commit), and once with the
  cache off (``statestore.cache.max.bytes=0``: every update reaches ``suppress`` at once);
- Quix Streams 3.28 (``benchmarks/peers/quix/final_app.py`` in the venv ``processors.py`` makes):
  ``tumbling_window(size, grace_ms).count().final(closing_strategy="partition")``, commit 5 s.

Two measures, each contender alone on the machine (one after the other):

- throughput: a backlog of ``--events`` records (60 ms apart, up to 5 s out of order, well
  inside the 10 s grace; 1-minute windows, so thousands close); records/s from the contender's
  process start (interpreter or JVM start and group join included) to the last final result a
  plain consumer reads from its output topic, and the records per CPU second of the contender's
  process (every thread; what the other engineers' load on this shared machine inflates far
  less than wall time);
- latency: live input at ``--rate`` records/s with event time = wall time, 1 s windows with
  200 ms grace. A final result's latency = when the driver's consumer receives it minus when the
  record that closed its window (the partition's first with timestamp >= end + grace) was
  produced. Windows closed in the first ``--warmup`` seconds are left out (start-up, group join).
  Stream time advances per partition only with records, so this is what Kafka Streams'
  ``suppress``, Quix's ``final()`` and statesnap's stream-time punctuator all need.

    .venv/bin/python benchmarks/final_results.py                       # 500 k events, ~10 min
    .venv/bin/python benchmarks/final_results.py --quick --skip-peers  # the smoke run (tests run it)

Exits 1 when statesnap's or the plain loop's final results differ from the ground truth (a
peer's difference is printed, not fatal: it is the peer's semantics). Not a test: it prints
figures for the record. Outputs are read with ``isolation.level=read_committed``.

One module on purpose (over the usual length): the driver and the two contender processes it
starts (``final_results.py contender plain|statesnap ...``) share :class:`WindowCounter`, so the
plain loop that competes and the ground truth that judges everyone are the same rule.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from rich.console import Console
from rich.table import Table as RichTable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import peer_java
from processors import (
    QUIX_CONSUMER_CONFIG,
    QUIX_DIR,
    BenchError,
    children_cpu,
    create_topic,
    given_or_apache,
    idempotent_producer,
    plain_consumer,
    produce_keyed,
    quix_python,
    read_loop,
)

from statesnap.kafka.admin import KafkaAdmin
from statesnap.kafka.config import KafkaSettings
from statesnap.kafka.reader import BATCH_SIZE

console = Console(stderr=True)

SCRIPT = Path(__file__).resolve()
QUIX_FINAL_APP = QUIX_DIR / "final_app.py"
T_BASE_MS = 1_700_000_000_000
BACKLOG_MS_PER_EVENT = 60
#: Backlog records arrive up to this much out of order: inside the grace, so none is late.
BACKLOG_JITTER_MS = 5_000
BACKLOG_WINDOW = (60_000, 10_000)  # size, grace
LIVE_WINDOW = (1_000, 200)
#: statesnap's and Quix's default commit interval; Kafka Streams is given the same.
COMMIT_INTERVAL_MS = 5_000
#: A contender that has not written every final result of the backlog by then failed.
BACKLOG_TIMEOUT_S = 900.0
#: After the live input stops: time for the last windows' results (a commit interval and more).
DRAIN_S = COMMIT_INTERVAL_MS / 1000 + 5.0
STOP_GRACE_S = 25.0
#: ``consume(BATCH_SIZE, timeout)`` returns when the batch is full or the timeout passed, so on live
#: input the timeout is added to every record's latency: the output watch (whose receipt time is
#: the measure) and the plain loop (the limit) wait 5 ms. statesnap's own loop waits 20 ms
#: (``statesnap.task.loop.TAIL_POLL``).
WATCH_POLL_S = 0.005

#: (key, window start) -> count: a contender's final results.
Finals = dict[tuple[bytes, int], int]


class WindowCounter:
    """The plain loop's rule, Kafka Streams' (``KStreamWindowAggregate`` + ``suppress``): per
    partition, stream time is the largest timestamp seen; a record counts in its tumbling window
    unless stream time (this record included) reached the window's end + grace (late: dropped);
    then every window whose end + grace <= stream time is closed, its counts final."""

    def __init__(self, size_ms: int, grace_ms: int) -> None:
        self.size, self.grace = size_ms, grace_ms
        self.stream_time: dict[int, int] = {}
        self.open: dict[int, dict[int, dict[bytes, int]]] = {}
        self.next_close: dict[int, int] = {}
        self.late = 0

    def add(self, partition: int, key: bytes | None, ts: int) -> list[tuple[bytes, int, int]]:
        """Count one record; the (key, start, count) results it closed (window by window)."""
        if key is None:  # belongs to no group and moves no stream time (statesnap, Kafka Streams)
            return []
        st = max(self.stream_time.get(partition, ts), ts)
        self.stream_time[partition] = st
        start = ts - ts % self.size
        windows = self.open.setdefault(partition, {})
        if start + self.size + self.grace > st:
            counts = windows.get(start)
            if counts is None:
                counts = windows[start] = {}
                self.next_close[partition] = min(self.next_close.get(partition, start), start)
            counts[key] = counts.get(key, 0) + 1
        else:
            self.late += 1
        if st < self.next_close.get(partition, st + 1) + self.size + self.grace:
            return []
        closed: list[tuple[bytes, int, int]] = []
        for s in sorted(windows):
            if s + self.size + self.grace > st:
                break
            closed.extend((k, s, c) for k, c in windows.pop(s).items())
        if windows:
            self.next_close[partition] = min(windows)
        else:
            self.next_close.pop(partition, None)
        return closed


def envelope(start: int, size_ms: int, count: int) -> bytes:
    return b'{"start": %d, "end": %d, "value": %d}' % (start, start + size_ms, count)


# ------------------------------------------------------------------------------ topics and data


def key_of(kid: int) -> bytes:
    return b"key-%d" % kid


def produce_backlog(bs: str, topic: str, partitions: int, events: int, keys: int) -> float:
    """*events* records, 60 ms apart with up to 5 s of disorder; seconds taken."""
    rng = np.random.default_rng(33)
    ids = rng.integers(0, keys, size=events)
    amounts = rng.integers(1, 1000, size=events)
    stamps = T_BASE_MS + np.arange(events) * BACKLOG_MS_PER_EVENT - rng.integers(0, BACKLOG_JITTER_MS, events)
    return produce_keyed(bs, topic, partitions, ids, amounts, stamps)


def output_consumer(bs: str) -> Any:
    return plain_consumer(bs, **{"isolation.level": "read_committed", "fetch.wait.max.ms": 10})


def read_to_eof(bs: str, topic: str, partitions: int, on_record: Any, timeout: float = 300.0) -> int:
    """Every record of *topic* through *on_record*, to each partition's EOF; records read."""
    c = output_consumer(bs)
    try:
        return read_loop(c, topic, partitions, on_record=on_record, timeout=timeout)
    finally:
        c.close()


def ground_truth(bs: str, topic: str, partitions: int, window: tuple[int, int]) -> tuple[Finals, int]:
    """The plain loop's rule over the whole input topic, in partition order; results, late records."""
    counter, truth = WindowCounter(*window), {}

    def on(m: Any) -> None:
        for k, s, c in counter.add(m.partition(), m.key(), m.timestamp()[1]):
            truth[(k, s)] = c

    read_to_eof(bs, topic, partitions, on)
    return truth, counter.late


@dataclass
class Output:
    """What a contender wrote: its results, how many records repeated a (key, window)."""

    finals: Finals = field(default_factory=dict)
    records: int = 0
    repeats: int = 0


def read_output(bs: str, topic: str, partitions: int) -> Output:
    out = Output()

    def on(m: Any) -> None:
        v = json.loads(m.value())
        k = (m.key(), int(v["start"]))
        out.repeats += k in out.finals
        out.finals[k] = int(v["value"])

    out.records = read_to_eof(bs, topic, partitions, on)
    return out


def compare(got: Output, truth: Finals) -> str:
    """``ok``, or ``MISMATCH`` with the counts of missing, extra and differing results."""
    if got.finals == truth:
        return "ok" if not got.repeats else f"ok ({got.repeats} repeated)"
    missing = len(truth.keys() - got.finals.keys())
    extra = len(got.finals.keys() - truth.keys())
    wrong = sum(1 for k, c in got.finals.items() if k in truth and truth[k] != c)
    return f"MISMATCH ({missing} missing, {extra} extra, {wrong} wrong of {len(truth):,})"


# ---------------------------------------------------------------------------------- contenders


@dataclass(frozen=True)
class Contender:
    name: str
    guarantee: str
    commit: str
    #: How to start it: a function of (bootstrap, input, output, window, work dir) -> argv.
    kind: str
    extra: tuple[str, ...] = ()


def contenders(skip_peers: bool, exactly_once: bool) -> list[Contender]:
    out = [
        Contender("plain loop", "at least once", "none, linger 5 ms", "plain"),
        Contender("statesnap", "at least once", f"{COMMIT_INTERVAL_MS} ms", "statesnap"),
    ]
    if exactly_once:
        out.append(
            Contender(
                "statesnap exactly_once",
                "exactly once",
                f"{COMMIT_INTERVAL_MS} ms",
                "statesnap",
                ("--exactly-once",),
            )
        )
    if not skip_peers:
        out += [
            Contender(
                "Kafka Streams",
                "at least once",
                f"{COMMIT_INTERVAL_MS} ms, cache 10 MB",
                "kstreams",
                (str(COMMIT_INTERVAL_MS), str(10 * 1024 * 1024)),
            ),
            Contender(
                "Kafka Streams, cache off",
                "at least once",
                f"{COMMIT_INTERVAL_MS} ms, cache 0",
                "kstreams",
                (str(COMMIT_INTERVAL_MS), "0"),
            ),
            Contender("Quix Streams", "at least once", "5000 ms", "quix"),
        ]
    return out


def build_kafka_streams() -> list[str]:
    """The java command line that runs FinalCountPeer (built first when needed)."""
    return peer_java("FinalCountPeer", heap="512m", log_level="warn")


def command(
    c: Contender, bs: str, topics: tuple[str, str], window: tuple[int, int], work: Path, tools: dict[str, Any]
) -> list[str]:
    inp, out = topics
    size, grace = (str(x) for x in window)
    tag = uuid.uuid4().hex[:8]
    if c.kind in ("plain", "statesnap"):
        return [
            sys.executable,
            str(SCRIPT),
            "contender",
            c.kind,
            bs,
            inp,
            out,
            size,
            grace,
            str(work / f"ckpt-{tag}"),
            *c.extra,
        ]
    if c.kind == "kstreams":
        return [
            *tools["java"],
            bs,
            inp,
            out,
            f"final-ks-{tag}",
            str(work / f"ks-{tag}"),
            size,
            grace,
            *c.extra,
            str(int(BACKLOG_TIMEOUT_S) + 300),
        ]
    return [
        str(tools["quix"]),
        str(QUIX_FINAL_APP),
        "--bootstrap",
        bs,
        "--input",
        inp,
        "--output",
        out,
        "--group",
        f"final-quix-{tag}",
        "--state-dir",
        str(work / f"quix-{tag}"),
        "--size-ms",
        size,
        "--grace-ms",
        grace,
        "--consumer-config",
        json.dumps(QUIX_CONSUMER_CONFIG),
        "--timeout",
        str(BACKLOG_TIMEOUT_S + 300),
    ]


@contextmanager
def running(cmd: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The contender's process, in its own session; SIGTERM (a clean close), then SIGKILL."""
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)


class OutputWatch:
    """A read_committed consumer on a contender's output topic: when (wall clock) each (key,
    window start) first arrived."""

    def __init__(self, bs: str, topic: str, partitions: int) -> None:
        self.c = output_consumer(bs)
        self.c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        self.arrived: dict[tuple[bytes, int], float] = {}

    def poll(self, timeout: float = WATCH_POLL_S) -> None:
        for m in self.c.consume(BATCH_SIZE, timeout):
            key, value = m.key(), m.value()
            if m.error() is None and key is not None and value is not None:
                self.arrived.setdefault((key, int(json.loads(value)["start"])), time.time())

    def close(self) -> None:
        self.c.close()


def log_tail(log: Path) -> str:
    return log.read_text(errors="replace").strip()[-1500:]


def backlog_run(
    c: Contender,
    bs: str,
    args: argparse.Namespace,
    inp: str,
    truth: Finals,
    work: Path,
    tools: dict[str, Any],
) -> dict[str, Any]:
    """One contender over the backlog: start to its last final result, then its output checked."""
    out = f"final-out-{uuid.uuid4().hex[:8]}"
    create_topic(bs, out, args.partitions)
    log = work / f"{out}.log"
    watch = OutputWatch(bs, out, args.partitions)
    res: dict[str, Any] = {}
    try:
        t0, cpu0 = time.time(), children_cpu()
        with running(command(c, bs, (inp, out), BACKLOG_WINDOW, work, tools), log) as proc:
            deadline = time.monotonic() + BACKLOG_TIMEOUT_S
            while len(watch.arrived) < len(truth):
                if proc.poll() is not None:
                    raise BenchError(f"{c.name} exited ({proc.returncode}) early: {log_tail(log)}")
                if time.monotonic() > deadline:
                    console.print(
                        f"[red]{c.name}: {len(watch.arrived):,} of {len(truth):,} results "
                        f"in {BACKLOG_TIMEOUT_S:.0f}s[/]"
                    )
                    break
                watch.poll()
        # The contender's own CPU (every thread; start-up and clean close included): what the
        # others' load on this shared machine inflates far less than wall time.
        res["cpu_s"] = children_cpu() - cpu0
        res["records_per_cpu_s"] = args.events / max(res["cpu_s"], 1e-9)
        times = sorted(watch.arrived.values())
        if times:
            res.update(first_final_s=times[0] - t0, last_final_s=times[-1] - t0)
            res["records_per_s"] = args.events / (times[-1] - t0)
    finally:
        watch.close()
    got = read_output(bs, out, args.partitions)
    res.update(finals=len(got.finals), output_records=got.records, check=compare(got, truth))
    console.print(f"  {c.name}: {res.get('records_per_s', 0):,.0f} records/s, {res['check']}")
    return res


class LiveInput:
    """Produces the live input from a thread: *rate* records/s in 5 ms ticks, event time = wall
    time, round-robin over the keys (so every partition's stream time moves every tick); keeps
    each partition's (timestamp, produce wall time) in produce order."""

    def __init__(self, bs: str, topic: str, partitions: int, keys: int, rate: int, seconds: float) -> None:
        self.topic, self.partitions, self.keys, self.rate, self.seconds = (
            topic,
            partitions,
            keys,
            rate,
            seconds,
        )
        self.producer = idempotent_producer(bs, **{"linger.ms": 1})
        self.sent: dict[int, list[tuple[int, float, bytes]]] = {p: [] for p in range(partitions)}
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, name="live-input", daemon=True)

    def _run(self) -> None:
        try:
            tick, n, t0 = 0.005, 0, time.time()
            per_tick = max(1, round(self.rate * tick))
            while time.time() < t0 + self.seconds:
                for _ in range(per_tick):
                    kid = n % self.keys
                    p, key, wall = kid % self.partitions, key_of(kid), time.time()
                    ts = int(wall * 1000)
                    self.producer.produce(
                        self.topic, b'{"amount": %d}' % (n % 1000), key, partition=p, timestamp=ts
                    )
                    self.sent[p].append((ts, wall, key))
                    n += 1
                self.producer.poll(0)
                time.sleep(max(0.0, t0 + (n / per_tick) * tick - time.time()))
            if self.producer.flush(60):
                self.error = "live input: records undelivered after 60 s"
        except Exception as e:
            self.error = repr(e)

    def truth_and_closers(self, window: tuple[int, int]) -> tuple[Finals, dict[tuple[bytes, int], float]]:
        """The plain loop's results over what was sent, and per result the produce wall time of
        the record that closed its window (the partition's first with timestamp >= end + grace)."""
        size, grace = window
        counter, truth, closer = WindowCounter(size, grace), {}, {}
        for p, records in self.sent.items():
            running_max: list[int] = []
            walls: list[float] = []
            mine: Finals = {}
            m = -1
            for ts, wall, key in records:
                m = max(m, ts)
                running_max.append(m)
                walls.append(wall)
                for k, s, c in counter.add(p, key, ts):
                    mine[(k, s)] = c
            for k, s in mine:
                i = bisect.bisect_left(running_max, s + size + grace)
                if i < len(walls):
                    closer[(k, s)] = walls[i]
            truth.update(mine)
        return truth, closer


def live_run(
    c: Contender, bs: str, args: argparse.Namespace, work: Path, tools: dict[str, Any]
) -> dict[str, Any]:
    """One contender on live input: latency of each final result from its window's closing record."""
    tag = uuid.uuid4().hex[:8]
    inp, out = f"final-live-{tag}", f"final-live-out-{tag}"
    create_topic(bs, inp, args.partitions)
    create_topic(bs, out, args.partitions)
    log = work / f"{out}.log"
    seconds = args.warmup + args.live_seconds
    live = LiveInput(bs, inp, args.partitions, args.live_keys, args.rate, seconds)
    watch = OutputWatch(bs, out, args.partitions)
    try:
        with running(command(c, bs, (inp, out), LIVE_WINDOW, work, tools), log) as proc:
            t0 = time.time()
            live.thread.start()
            expected: set[tuple[bytes, int]] | None = None
            while live.thread.is_alive() or time.time() < t0 + seconds + DRAIN_S:
                if proc.poll() is not None:
                    raise BenchError(f"{c.name} exited ({proc.returncode}) early: {log_tail(log)}")
                watch.poll()
                if not live.thread.is_alive():
                    if expected is None:
                        expected = set(live.truth_and_closers(LIVE_WINDOW)[0])
                    if expected <= watch.arrived.keys():
                        break
            live.thread.join(60)
    finally:
        watch.close()
    if live.error:
        raise BenchError(live.error)
    truth, closer = live.truth_and_closers(LIVE_WINDOW)
    measured = [
        (watch.arrived[k] - closer[k]) * 1000
        for k in truth
        if k in watch.arrived and k in closer and closer[k] >= t0 + args.warmup
    ]
    counted = sum(1 for k in truth if k in closer and closer[k] >= t0 + args.warmup)
    got = read_output(bs, out, args.partitions)
    res: dict[str, Any] = {
        "live_results": counted,
        "live_received": len(measured),
        "live_check": compare(got, truth),
    }
    if measured:
        q = statistics.quantiles(measured, n=100, method="inclusive") if len(measured) > 1 else measured * 99
        res.update(p50_ms=statistics.median(measured), p99_ms=q[98], max_ms=max(measured))
    console.print(
        f"  {c.name}: p50 {res.get('p50_ms', 0):.0f} ms, p99 {res.get('p99_ms', 0):.0f} ms "
        f"({len(measured)} of {counted} results), {res['live_check']}"
    )
    return res


# --------------------------------------------------------------------------- contender processes


def contender_main(argv: list[str]) -> None:
    """``final_results.py contender plain|statesnap BS INPUT OUTPUT SIZE_MS GRACE_MS WORK [--exactly-once]``:
    one contender, run until SIGTERM."""
    kind, bs, inp, out, size, grace, work = argv[:7]
    window = (int(size), int(grace))
    if kind == "statesnap":
        from statesnap import ProcessingOptions, Processor
        from statesnap.processor import Windows

        proc = Processor(
            f"final-{uuid.uuid4().hex[:8]}",
            inputs=[inp],
            bootstrap_servers=bs,
            checkpoints=work,
            value_serde="json",
            processing=ProcessingOptions(exactly_once="--exactly-once" in argv),
        )
        proc.count(
            "final",
            window=Windows.tumbling(
                timedelta(milliseconds=window[0]), grace=timedelta(milliseconds=window[1])
            ),
            emit="final",
            to=out,
        )
        signal.signal(signal.SIGTERM, lambda *_: proc.stop())
        proc.run()
        return
    plain_loop(bs, inp, out, window)


def plain_loop(bs: str, inp: str, out: str, window: tuple[int, int]) -> None:
    """The plain loop: consume, count, produce each window's results when it closes."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    partitions = len(KafkaAdmin(KafkaSettings(bs)).partitions(inp))
    c = plain_consumer(bs, **{"enable.partition.eof": False})
    producer = idempotent_producer(bs, **{"linger.ms": 5})
    counter = WindowCounter(*window)
    size = window[0]
    c.assign([TopicPartition(inp, p, OFFSET_BEGINNING) for p in range(partitions)])
    try:
        while not stop.is_set():
            for m in c.consume(BATCH_SIZE, WATCH_POLL_S):
                partition = m.partition()
                if m.error() is not None or partition is None:
                    continue
                for k, s, n in counter.add(partition, m.key(), m.timestamp()[1]):
                    while True:
                        try:
                            producer.produce(out, envelope(s, size, n), k, timestamp=s + size - 1)
                            break
                        except BufferError:
                            producer.poll(0.05)
            producer.poll(0)
    finally:
        producer.flush(30)
        c.close()


# ------------------------------------------------------------------------------------------ report


def fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_report(r: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(r, indent=2, default=str))
        return
    t = RichTable(
        title=(
            f"Windowed count, final emission (one run, Apache Kafka {r['broker']}): backlog "
            f"{r['events']:,} records, 1-min windows + 10 s grace; live {r['rate']:,} rec/s, 1 s windows "
            f"+ 200 ms grace"
        )
    )
    cols = [
        "contender",
        "commit interval",
        "records/s",
        "vs plain loop",
        "first final s",
        "last final s",
        "CPU s",
        "records/CPU s",
        "vs plain loop (CPU)",
        "finals",
        "backlog vs truth",
        "live p50 ms",
        "p99 ms",
        "max ms",
        "live results",
        "live vs truth",
    ]
    for col in cols:
        t.add_column(col, justify="left" if col in ("contender", "commit interval") else "right")
    for row in r["rows"]:
        rps = row.get("records_per_s")
        t.add_row(
            row["name"],
            row["commit"],
            fmt(rps, ",.0f"),
            fmt(row.get("vs_plain_loop"), ".2f") + ("x" if "vs_plain_loop" in row else ""),
            fmt(row.get("first_final_s"), ".2f"),
            fmt(row.get("last_final_s"), ".2f"),
            fmt(row.get("cpu_s"), ".1f"),
            fmt(row.get("records_per_cpu_s"), ",.0f"),
            fmt(row.get("vs_plain_loop_cpu"), ".2f") + ("x" if "vs_plain_loop_cpu" in row else ""),
            fmt(row.get("finals"), ","),
            row.get("check", "-"),
            fmt(row.get("p50_ms"), ".0f"),
            fmt(row.get("p99_ms"), ".0f"),
            fmt(row.get("max_ms"), ".0f"),
            f"{row.get('live_received', 0)}/{row.get('live_results', 0)}",
            row.get("live_check", "-"),
        )
    Console(width=250).print(t)
    print(
        f"ground truth: {r['truth_finals']:,} final results over the backlog ({r['late']} late records); "
        f"produce {r['produce_s']:.1f}s; load average {r['load_start']:.2f} -> {r['load_end']:.2f} (2 cores, "
        "shared). records/s: backlog records / (process start -> last final result read from the output "
        "topic), start-up and group join included. Latency: output receipt - produce time of the record "
        "that closed the window."
    )


def main() -> None:
    if sys.argv[1:2] == ["contender"]:
        contender_main(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=500_000)
    ap.add_argument("--keys", type=int, default=100, help="backlog keys")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--rate", type=int, default=2_000, help="live records/s")
    ap.add_argument("--live-keys", type=int, default=100)
    ap.add_argument("--warmup", type=float, default=10.0, help="live seconds left out (start-up, join)")
    ap.add_argument("--live-seconds", type=float, default=20.0, help="live seconds measured")
    ap.add_argument("--quick", action="store_true", help="20 k events, a 5 s live phase (the smoke run)")
    ap.add_argument("--skip-peers", action="store_true", help="only the plain loop and statesnap")
    ap.add_argument("--no-exactly-once", action="store_true", help="no statesnap exactly_once row")
    ap.add_argument("--bootstrap", help="an Apache Kafka broker to use (default: start one)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.events, args.warmup, args.live_seconds = 20_000, 2.0, 3.0
    load_start = os.getloadavg()[0]
    try:
        tools: dict[str, Any] = {}
        if not args.skip_peers:
            tools["java"] = build_kafka_streams()
            tools["quix"] = quix_python()
        with given_or_apache(args.bootstrap) as bs, tempfile.TemporaryDirectory() as tmp:
            r = run(bs, args, Path(tmp), tools)
    except BenchError as e:
        sys.exit(f"final_results: {e}")
    r.update(load_start=load_start, load_end=os.getloadavg()[0], broker="4.1.1", rate=args.rate)
    print_report(r, args.json)
    ours = [row for row in r["rows"] if row["kind"] in ("plain", "statesnap")]
    if any(
        not row.get("check", "").startswith("ok") or not row.get("live_check", "").startswith("ok")
        for row in ours
    ):
        sys.exit(1)


def run(bs: str, args: argparse.Namespace, work: Path, tools: dict[str, Any]) -> dict[str, Any]:
    inp = f"final-in-{uuid.uuid4().hex[:8]}"
    r: dict[str, Any] = {"events": args.events}
    r["produce_s"] = produce_backlog(bs, inp, args.partitions, args.events, args.keys)
    truth, r["late"] = ground_truth(bs, inp, args.partitions, BACKLOG_WINDOW)
    r["truth_finals"] = len(truth)
    console.print(f"backlog: {args.events:,} records in {r['produce_s']:.1f}s; {len(truth):,} final results")
    rows = []
    for c in contenders(args.skip_peers, not args.no_exactly_once):
        row: dict[str, Any] = {"name": c.name, "guarantee": c.guarantee, "commit": c.commit, "kind": c.kind}
        console.print(f"[bold]{c.name}[/]: backlog, then live")
        row.update(backlog_run(c, bs, args, inp, truth, work, tools))
        row.update(live_run(c, bs, args, work, tools))
        rows.append(row)
    plain, plain_cpu = rows[0].get("records_per_s"), rows[0].get("records_per_cpu_s")
    for row in rows:  # the ratios the table prints, in the JSON too
        if plain and row.get("records_per_s"):
            row["vs_plain_loop"] = row["records_per_s"] / plain
        if plain_cpu and row.get("records_per_cpu_s"):
            row["vs_plain_loop_cpu"] = row["records_per_cpu_s"] / plain_cpu
    r["rows"] = rows
    return r


if __name__ == "__main__":
    main()
