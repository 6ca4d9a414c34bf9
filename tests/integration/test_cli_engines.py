"""One system, two engines: the CLI run as a user runs it, on the real broker, both blob stores
and both snapshot stores, with checkpoints written by the Python engine and by Spark.

Every checkpoint — whoever wrote it — must behave the same under ``snapshot`` and ``checkpoints``
commands, GC and restore; ``--json`` keys must not depend on the engine. The ground truth is an
independent consumer read of the topic to partition EOF (``kafka.read_all`` + ``kafka.truth``),
never a statesnap reader.
"""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from integration.cli_runner import STATESNAP, digest, ok, statesnap
from statesnap.materialize import spark_available

pytestmark = pytest.mark.integration

PARTITIONS = 4
ENGINES = ["python", pytest.param("spark", marks=pytest.mark.spark)]


def records(n: int, seed: int, keys: int = 300) -> list[tuple[int, bytes | None, bytes | None]]:
    out: list[tuple[int, bytes | None, bytes | None]] = []
    for i in range(n):
        k = (i * 7919 + seed) % keys
        key = b"k%04d" % k
        value = None if (i + seed) % 23 == 0 else b"v%d-%d" % (seed, i)
        out.append((k % PARTITIONS, key, value))
    return out


@dataclass
class Written:
    """A table whose checkpoints one engine wrote through the CLI."""

    engine: str
    store: str
    bootstrap: str
    topic: str
    url: str
    storage: list[str]
    snapshot_args: list[str]
    results: list[dict[str, Any]]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return statesnap(*args)

    def snap(self, command: str, *args: str) -> subprocess.CompletedProcess[str]:
        return statesnap(
            "snapshot", command, self.url, "--table", self.topic, *self.snapshot_args, *self.storage, *args
        )

    def ckpt(self, command: str, *args: str) -> subprocess.CompletedProcess[str]:
        return statesnap("checkpoints", command, self.url, "--table", self.topic, *self.storage, *args)


@pytest.fixture(
    scope="module",
    params=[
        ("python", "blob"),
        ("python", "topic"),
        # Spark with the topic store is covered by the following-writers test below (each Spark
        # CLI run starts a JVM: the suite keeps their number small)
        pytest.param(("spark", "blob"), marks=pytest.mark.spark),
    ],
    ids="-".join,
)
def written(request: pytest.FixtureRequest, kafka: Any, tmp_path_factory: pytest.TempPathFactory) -> Written:
    """Two generations written by ``statesnap materialize --engine E`` (the second incremental),
    on a file store for the topic snapshot store and on moto S3 for the blob one."""
    engine, store = request.param
    if engine == "spark" and not spark_available():
        pytest.skip("Spark needs pyspark and Java")
    topic = f"cli-{engine}-{store}-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, PARTITIONS)
    storage: list[str] = []
    if store == "blob":
        s3 = request.getfixturevalue("s3_server")
        bucket = s3.create_bucket(f"b-{uuid.uuid4().hex[:10]}")
        url = f"s3://{bucket}/ckpt"
        for k, v in s3.storage_options().items():
            storage += ["--storage-option", f"{k}={v}"]
        snapshot_args: list[str] = []
    else:
        url = str(tmp_path_factory.mktemp("ckpt"))
        snapshot_args = ["--snapshot-store", f"topic:_snapshots-{topic}", "-b", kafka.bootstrap]
    w = Written(engine, store, kafka.bootstrap, topic, url, storage, snapshot_args, [])
    for seed in (1, 2):
        kafka.produce(topic, records(2000, seed))
        args = ["materialize", "-b", kafka.bootstrap, "-t", topic, "--checkpoints", url, "--engine", engine]
        if store == "topic":
            args += ["--snapshot-store", f"topic:_snapshots-{topic}"]
        w.results.append(ok(statesnap(*args, *storage, "--json", "--quiet")))
    return w


def test_materialize_json_is_the_same_on_both_engines(written: Written, kafka: Any) -> None:
    first, second = written.results
    assert set(first) == {
        "table",
        "topic",
        "engine",
        "engine_reason",
        "checkpoint",
        "written",
        "keys",
        "offsets",
        "restore",
        "checkpoint_seconds",
        "seconds",
        "bytes",
        "url",
    }
    assert set(first["restore"]) == {"checkpoint", "replayed_records", "restore_seconds"}
    assert first["engine"] == second["engine"] == written.engine
    assert first["written"]
    assert second["written"]
    assert second["restore"]["checkpoint"] == first["checkpoint"]  # incremental
    assert second["restore"]["replayed_records"] == 2000
    truth = kafka.truth(kafka.read_all(written.topic, range(PARTITIONS)))
    assert second["keys"] == len(truth)  # the table's keys, not the files' rows
    assert second["offsets"] == {
        str(p): o
        for p, o in kafka.end_offsets(
            kafka.read_all(written.topic, range(PARTITIONS)), range(PARTITIONS)
        ).items()
    }


def test_every_checkpoint_is_a_snapshot(written: Written) -> None:
    snaps = ok(written.snap("list", "--json"))
    ckpts = ok(written.ckpt("list", "--json"))
    assert [s["generation"] for s in snaps] == [c["generation"] for c in ckpts]
    assert all(s["state"] == "COMPLETED" for s in snaps)
    assert all(c["state"] == "COMPLETED" for c in ckpts)
    task = "spark-bootstrap" if written.engine == "spark" else "main"
    assert all([t["task_id"] for t in s["tasks"]] == [task] for s in snaps)
    assert all(c["engine"] == written.engine for c in ckpts)
    newest = snaps[0]["generation"]
    shown = ok(written.snap("show", str(newest), "--json"))
    assert shown["generation"] == newest
    assert shown["missing_partitions"] == []
    assert ok(written.snap("current", "--json"))["generation"] == newest
    assert all(r["ok"] for r in ok(written.ckpt("verify", "--json", *written.snapshot_args)))


def test_restore_from_either_engine_equals_ground_truth(written: Written, kafka: Any) -> None:
    truth = kafka.truth(kafka.read_all(written.topic, range(PARTITIONS)))
    out = ok(
        statesnap(
            "dump",
            "-b",
            written.bootstrap,
            "-t",
            written.topic,
            "--checkpoints",
            written.url,
            *written.storage,
            "--digest",
            "--json",
        )
    )
    assert out["checkpoint"] == written.results[-1]["checkpoint"]
    assert out["replayed_records"] == 0
    assert (out["keys"], out["digest"]) == (len(truth), digest(truth))


def test_pinned_snapshot_survives_gc_and_dry_run_says_so(written: Written) -> None:
    gens = [s["generation"] for s in ok(written.snap("list", "--json"))]
    oldest, newest = gens[-1], gens[0]
    assert ok(written.snap("pin", str(oldest), "--json"))["pinned"] is True
    gc_args = [
        "--min-count",
        "1",
        "--min-age",
        "0s",
        "--orphan-grace",
        "0s",
        *written.snapshot_args,
        "--json",
    ]
    (dry,) = ok(written.ckpt("gc", "--dry-run", *gc_args))
    assert sorted(dry["retained"]) == sorted({oldest, newest})
    assert dry["deleted_generations"] == []
    assert dry["pinned"] == [oldest]
    (real,) = ok(written.ckpt("gc", *gc_args))
    assert sorted(real["retained"]) == sorted(dry["retained"])
    assert {c["generation"] for c in ok(written.ckpt("list", "--json"))} == {oldest, newest}
    assert all(r["ok"] for r in ok(written.ckpt("verify", "--json", *written.snapshot_args)))
    ok(written.snap("unpin", str(oldest)))
    (after,) = ok(written.ckpt("gc", *gc_args))
    assert after["deleted_generations"] == [oldest]
    assert oldest in after["snapshot_records_deleted"]
    assert [s["generation"] for s in ok(written.snap("list", "--json"))] == [newest]


def test_snapshot_create_delete_and_diff(written: Written, kafka: Any) -> None:
    """A snapshot created with no writer running fails by its deadline, naming the partitions;
    the next writer run starts a newer generation; `diff` compares checkpoints whoever wrote
    them; `delete` removes the newest too."""
    result = written.snap("create", "--wait", "--timeout", "1s", "--json")
    assert result.returncode == 1  # --wait exits 1 unless COMPLETED
    failed = json.loads(result.stdout)
    assert failed["state"] == "FAILED"
    assert failed["missing_partitions"] == list(range(PARTITIONS))
    # a writer run joins nothing stale: it starts the next generation and completes it
    kafka.produce(written.topic, records(200, 3))
    args = [
        "materialize",
        "-b",
        written.bootstrap,
        "-t",
        written.topic,
        "--checkpoints",
        written.url,
        "--engine",
        "python",
    ]
    done = ok(statesnap(*args, *written.storage, "--json", "--quiet"))
    assert done["checkpoint"] > failed["generation"]
    diff = ok(written.snap("diff", str(written.results[-1]["checkpoint"]), str(done["checkpoint"]), "--json"))
    assert diff["added"] + diff["removed"] + diff["changed"] > 0
    ok(written.snap("delete", str(done["checkpoint"])))
    gens = [s["generation"] for s in ok(written.snap("list", "--json"))]
    assert done["checkpoint"] not in gens


@pytest.mark.parametrize(
    ("engine", "store"),
    [
        # Python is the long variant: Python instances under `materialize --follow` completing
        # `snapshot create --wait` equal to a full replay are proven by default in
        # test_snapshot_tasks.py, their Ctrl-C checkpoint by test_default_follow_works_with_default_options,
        # followers with the topic snapshot store (idle or not) by the Spark variant.
        pytest.param("python", "topic", marks=pytest.mark.long),
        # Spark with the blob store: its snapshots and GC are covered by the `written` matrix;
        # each Spark CLI run starts a JVM, so the suite keeps their number small.
        pytest.param("spark", "topic", marks=pytest.mark.spark),
    ],
)
def test_snapshot_create_waits_for_following_writers(
    kafka: Any, tmp_path: Path, engine: str, store: str
) -> None:
    """`snapshot create --wait` completes against `materialize --follow` — two Python instances
    or one Spark streaming materializer — idle or not, within about two trigger intervals, with
    either snapshot store; Ctrl-C commits a final checkpoint; `checkpoints list` and `snapshot
    list` agree; the result equals an independent read."""
    if engine == "spark" and not spark_available():
        pytest.skip("Spark needs pyspark and Java")
    topic = f"follow-{engine}-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, PARTITIONS)
    kafka.produce(topic, records(1500, 1))
    url = str(tmp_path / "ckpt")
    where = ["--snapshot-store", f"topic:_snapshots-{topic}"] if store == "topic" else []
    snap_args = [*where, "-b", kafka.bootstrap] if store == "topic" else []
    base = [*STATESNAP, "materialize", "-b", kafka.bootstrap, "-t", topic, "--checkpoints", url, "--follow"]
    base += ["--commit-interval", "1s", "--checkpoint-interval", "1h", "--json", *where]
    if engine == "spark":
        commands = [
            [*base, "--engine", "spark", "--spark-checkpoint-location", str(tmp_path / "spark-state")]
        ]
        tasks = [["spark-stream"]]
    else:
        commands = [[*base, "--engine", "python", "--instance", str(i), "--instances", "2"] for i in range(2)]
        tasks = [["instance-0", "instance-1"]]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    procs = [  # each in its own process group, stopped below as a terminal's Ctrl-C stops it
        subprocess.Popen(
            c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
        )
        for c in commands
    ]
    outs: list[tuple[str, str]] = []
    try:
        deadline = time.monotonic() + 180
        while not list(tmp_path.glob("ckpt/*/table.json")):
            for proc in procs:
                assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the writers never registered the table"
            time.sleep(0.5)
        if engine == "spark":  # the first micro-batch journaled: the session runs
            while not list(tmp_path.glob("ckpt/*/_spark/*/*.json")):
                assert procs[0].poll() is None, procs[0].communicate()[1][-3000:]
                assert time.monotonic() < deadline, "the Spark materializer never journaled a batch"
                time.sleep(0.2)
        else:
            time.sleep(8)  # restores done, first commits made
        for _ in range(2):  # idle the second time: nothing new since the first snapshot
            started = time.monotonic()
            created = statesnap(
                "snapshot",
                "create",
                url,
                "--table",
                topic,
                *snap_args,
                "--wait",
                "--timeout",
                "60s",
                "--json",
            )
            snap = ok(created)
            assert snap["state"] == "COMPLETED", snap
            assert [sorted(t["task_id"] for t in snap["tasks"])] == tasks
            assert time.monotonic() - started < 30
        ckpts = ok(statesnap("checkpoints", "list", url, "--table", topic, "--json"))
        snaps = ok(statesnap("snapshot", "list", url, "--table", topic, *snap_args, "--json"))
        assert {c["generation"]: c["state"] for c in ckpts} == {
            s["generation"]: s["state"] for s in snaps if s["state"] == "COMPLETED"
        }
        kafka.produce(topic, records(500, 2))
        ends = {
            str(p): o
            for p, o in kafka.end_offsets(kafka.read_all(topic, range(PARTITIONS)), range(PARTITIONS)).items()
        }
        deadline = time.monotonic() + 150  # Spark's first batches are slow on a busy 2-core machine
        while True:  # snapshots until one holds everything: the writers caught up
            snap = json.loads(
                statesnap(
                    "snapshot",
                    "create",
                    url,
                    "--table",
                    topic,
                    *snap_args,
                    "--wait",
                    "--timeout",
                    "60s",
                    "--json",
                ).stdout
            )
            offsets = {str(o["partition"]): o["next_offset"] for t in snap["tasks"] for o in t["offsets"]}
            if snap["state"] == "COMPLETED" and offsets == ends:
                break
            assert time.monotonic() < deadline, f"writers never caught up: {snap}"
            time.sleep(2)
    finally:
        for proc in procs:  # the whole group: Spark's JVM and Python workers get it too
            os.killpg(proc.pid, signal.SIGINT)
        outs = [proc.communicate(timeout=120) for proc in procs]
    for proc, (_out, err) in zip(procs, outs, strict=True):
        assert proc.returncode == 0, err[-3000:]
        assert "Traceback" not in err, err[-3000:]
        assert not [line for line in err.splitlines() if " ERROR " in line], err[-3000:]
    truth = kafka.truth(kafka.read_all(topic, range(PARTITIONS)))
    if engine == "spark":
        final = json.loads(outs[0][0].strip().splitlines()[-1])
        assert final["engine"] == "spark"
        assert final["keys"] == len(truth), f"{outs[0][0]}\n{outs[0][1][-4000:]}"
    else:  # instances checkpoint their part at exit; a last snapshot makes the whole
        ok(
            statesnap(
                "materialize", "-b", kafka.bootstrap, "-t", topic, "--checkpoints", url, "--json", "--quiet"
            )
        )
    dumped = ok(
        statesnap("dump", "-b", kafka.bootstrap, "-t", topic, "--checkpoints", url, "--digest", "--json")
    )
    assert (dumped["keys"], dumped["digest"]) == (len(truth), digest(truth))
    assert dumped["replayed_records"] == 0


def test_engine_options_are_refused_where_they_cannot_be_honoured(kafka: Any, tmp_path: Path) -> None:
    topic = kafka.create_topic(f"opts-{uuid.uuid4().hex[:8]}", 2)
    base = ["materialize", "-b", kafka.bootstrap, "-t", topic, "--checkpoints", str(tmp_path / "c")]
    if spark_available():
        bad = statesnap(*base, "--engine", "spark", "--state-store", "rocksdb")
        assert bad.returncode == 1
        assert "--state-store (store=) cannot be used with --engine spark" in bad.stderr
        bad = statesnap(*base, "--engine", "spark", "--instance", "0", "--instances", "2")
        assert bad.returncode == 1
        assert "--engine spark" in bad.stderr
    bad = statesnap(*base, "--engine", "python", "--spark-conf", "spark.executor.memory=1g")
    assert bad.returncode == 1
    assert "--spark-conf cannot be used with --engine python" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    auto = ok(statesnap(*base, "--state-store", "rocksdb", "--json", "--quiet"))
    assert auto["engine"] == "python"
    assert "--state-store" in auto["engine_reason"]
    # --store, the older name here, still works and says once that it is deprecated.
    old = statesnap(*base, "--store", "rocksdb", "--json", "--quiet")
    assert ok(old)["engine"] == "python"
    assert old.stderr.splitlines() == ["--store is deprecated here: use --state-store"]
    started = time.monotonic()
    typo = statesnap(
        "materialize", "-b", kafka.bootstrap, "-t", "no-such-topic-xyz", "--checkpoints", str(tmp_path / "d")
    )
    assert typo.returncode == 1
    assert "TopicNotFoundError" in typo.stderr
    assert time.monotonic() - started < 15


def test_default_follow_works_with_default_options(kafka: Any, tmp_path: Path) -> None:
    """`materialize --follow` with nothing but the required options starts, checkpoints on
    Ctrl-C and exits 0 (it used to exit 1 on checkpoint_interval vs orphan_grace)."""
    topic = kafka.create_topic(f"deflt-{uuid.uuid4().hex[:8]}", 2)
    kafka.produce(topic, [(i % 2, b"k%d" % i, b"v") for i in range(100)])
    proc = subprocess.Popen(
        [
            *STATESNAP,
            "materialize",
            "-b",
            kafka.bootstrap,
            "-t",
            topic,
            "--checkpoints",
            str(tmp_path / "c"),
            "--follow",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable, "HOME": str(tmp_path)},
    )
    time.sleep(6)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["keys"] == 100
    assert result["checkpoint"] == 1


@pytest.mark.spark
def test_ctrl_c_during_a_spark_batch_run_is_one_line(kafka: Any, tmp_path: Path) -> None:
    """A terminal's Ctrl-C (SIGINT to the whole process group: driver, JVM, Python workers)
    during `materialize --engine spark`: the job is cancelled and the command ends with one
    line and exit 130 — not pages of py4j tracebacks and crashed-worker errors — committing
    nothing."""
    if not spark_available():
        pytest.skip("Spark needs pyspark and Java")
    topic = kafka.create_topic(f"cc-{uuid.uuid4().hex[:8]}", 2)
    kafka.produce(topic, [(i % 2, b"k%d" % (i % 300), b"v%d" % i) for i in range(3000)])
    ckpt = tmp_path / "c"
    proc = subprocess.Popen(
        [*STATESNAP, "materialize", "--engine", "spark", "-b", kafka.bootstrap, "-t", topic,
         "--checkpoints", str(ckpt)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )  # fmt: skip
    assert proc.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + 120
    while not (lines and lines[-1].startswith("spark:")):  # the session is up: the run begins
        line = proc.stderr.readline()
        assert line or proc.poll() is None, "".join(lines)
        assert time.monotonic() < deadline, "".join(lines)
        lines.append(line)
    # Quiet by default: no log4j banner, no loopback or incubator-module warnings, one line
    # naming the master.
    assert [line.split(" ")[0] for line in lines if line.strip()] == ["engine:", "spark:"], lines
    assert "master local[" in lines[-1], lines
    os.killpg(proc.pid, signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    err = "".join(lines) + err
    assert proc.returncode == 130, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    cancelled = "Error: interrupted: the Spark job was cancelled before its checkpoint"
    assert errors == [f"{cancelled}; the last committed checkpoint stands"], err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert not [line for line in err.splitlines() if " ERROR " in line], err[-3000:]
    assert not list(ckpt.glob("*/snapshots/*.json")), "a cancelled run committed a checkpoint"


def _wait_for(predicate: Any, proc: subprocess.Popen[str], what: str, timeout: float = 240) -> None:
    """Poll *predicate* while *proc* runs (a Spark start-up on a busy 2-core machine is slow)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"exited {proc.returncode} before {what}\n{out}\n{err[-3000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


@pytest.mark.spark
# SIGINT is the long variant: the CLI handles both signals in one handler, and only SIGTERM also
# proves the JVM is out of the signalled process group (PySpark's JVM ignores SIGINT).
@pytest.mark.parametrize(
    "sig", [pytest.param(signal.SIGINT, marks=pytest.mark.long), signal.SIGTERM], ids=["SIGINT", "SIGTERM"]
)
def test_spark_follow_stopped_like_timeout_does_reports_its_own_run(
    kafka: Any, tmp_path: Path, sig: signal.Signals
) -> None:
    """`timeout -s INT` and process managers signal the command, then its process group (which
    holds it too): two signals. With SIGINT a Spark `--follow` used to end "Aborted: stopped
    again before the final checkpoint finished", exit 130, no JSON; with SIGTERM (systemd's
    default) the JVM shut down under it (exit 1, py4j tracebacks). Its `--json` copied another
    checkpoint's writer metadata into `restore` (restore_seconds == checkpoint_seconds) and its
    checkpoint skipped a generation. Now: the final checkpoint is the next generation, exit 0,
    and the figures are this run's. Broker: Apache Kafka (the suite's broker) and Tansu."""
    if not spark_available():
        pytest.skip("Spark needs pyspark and Java")
    topic = kafka.create_topic(f"stop-{uuid.uuid4().hex[:8]}", PARTITIONS)
    kafka.produce(topic, records(1500, 1))
    url = str(tmp_path / "ckpt")
    base = ["materialize", "-b", kafka.bootstrap, "-t", topic, "--checkpoints", url, "--json"]
    assert ok(statesnap(*base, "--engine", "python", "--quiet"))["checkpoint"] == 1
    kafka.produce(topic, records(700, 2))
    proc = subprocess.Popen(
        [*STATESNAP, *base, "--engine", "spark", "--follow", "--commit-interval", "1s",
         "--checkpoint-interval", "1h", "--spark-checkpoint-location", str(tmp_path / "spark-state")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable, "HOME": str(tmp_path)},
    )  # fmt: skip
    try:
        # A journaled batch: the 700 records are read (the checkpoint comes at the stop).
        _wait_for(lambda: list(tmp_path.glob("ckpt/*/_spark/*/*.json")), proc, "the first batch")
        os.kill(proc.pid, sig)  # as `timeout -s INT` does: the command...
        time.sleep(0.1)  # (a busy machine delivers the copy a little later)
        os.killpg(proc.pid, sig)  # ...then its process group
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    assert "Aborted" not in err, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert (result["engine"], result["checkpoint"], result["written"]) == ("spark", 2, True)
    restore = result["restore"]
    assert (restore["checkpoint"], restore["replayed_records"]) == (1, 700)
    assert 0 < restore["restore_seconds"] < result["seconds"]
    assert restore["restore_seconds"] != result["checkpoint_seconds"]
    # The same keys as the Python engine's --follow: nothing was produced after the restore.
    assert result["followed"]["records"] == 0
    assert 0 < result["followed"]["seconds"] < result["seconds"]
    assert result["keys"] == len(kafka.truth(kafka.read_all(topic, range(PARTITIONS))))
    listed = ok(statesnap("checkpoints", "list", url, "--table", topic, "--json"))
    assert [c["generation"] for c in listed] == [2, 1]


class Terminal:
    """A command whose stderr is a terminal (a pty), as a user at a shell sees it; stdout stays a
    pipe, as when it is redirected. The command runs in a process group of its own."""

    def __init__(self, args: list[str]) -> None:
        self._primary, secondary = pty.openpty()
        self.proc = subprocess.Popen(
            [*STATESNAP, *args], stdout=subprocess.PIPE, stderr=secondary, text=True,
            start_new_session=True,
            env={**os.environ, "PYSPARK_PYTHON": sys.executable, "COLUMNS": "160"},
        )  # fmt: skip
        os.close(secondary)
        self._seen = bytearray()
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self._primary, 65536)
            except OSError:  # the terminal's other end closed: the command exited
                return
            if not chunk:
                return
            self._seen.extend(chunk)

    @property
    def shown(self) -> str:
        return self._seen.decode(errors="replace")

    def wait_for(self, pattern: str, timeout: float = 240) -> re.Match[str]:
        """The first match of *pattern* in what the terminal showed, once it shows."""
        deadline = time.monotonic() + timeout
        while (found := re.search(pattern, self.shown)) is None:
            assert self.proc.poll() is None, f"exited {self.proc.returncode}: {self.shown[-3000:]}"
            assert time.monotonic() < deadline, f"never showed {pattern!r}: {self.shown[-3000:]}"
            time.sleep(0.2)
        return found

    def finish(self, timeout: float = 240) -> str:
        """The command's stdout once it exited (killed, with its group, past *timeout*)."""
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.communicate()
            self._reader.join(10)
            os.close(self._primary)
        return out


# Long: Spark progress on a terminal is proven by default by
# test_spark_follow_shows_batches_and_a_stop_during_start_up_is_one_line (each run starts a JVM).
@pytest.mark.long
@pytest.mark.spark
def test_spark_shows_its_start_and_progress_on_a_terminal(kafka: Any, tmp_path: Path) -> None:
    """`materialize --engine spark` printed nothing while its session started (15-45 s on a
    busy machine): on a terminal it now shows the seconds spent starting, then the tasks done and records
    read; stdout keeps the one result line. Broker: Apache Kafka (the suite's broker) and Tansu."""
    if not spark_available():
        pytest.skip("Spark needs pyspark and Java")
    topic = kafka.create_topic(f"prog-{uuid.uuid4().hex[:8]}", PARTITIONS)
    kafka.produce(topic, records(3000, 3))
    term = Terminal(
        [
            "materialize",
            "--engine",
            "spark",
            "-b",
            kafka.bootstrap,
            "-t",
            topic,
            "--checkpoints",
            str(tmp_path / "c"),
        ]
    )
    out = term.finish()
    shown = term.shown
    assert term.proc.returncode == 0, shown[-3000:]
    assert re.search(r"starting a Spark session \(local\[\*\]\).*\d:\d\d", shown), shown[-3000:]
    assert "started in" in shown, shown[-3000:]
    assert "bootstrapping" in shown, shown[-3000:]
    assert f"{PARTITIONS}/{PARTITIONS} tasks · 3,000 records read" in shown, shown[-3000:]
    assert out.startswith("checkpoint 1 of "), out
    assert "read 3,000 records" in out, out


@pytest.mark.spark
def test_spark_follow_shows_batches_and_a_stop_during_start_up_is_one_line(
    kafka: Any, tmp_path: Path
) -> None:
    """On a terminal, `--follow` on Spark shows batches and records read while it runs, and a
    Ctrl-C (SIGINT to its process group) then ends it with its final checkpoint, exit 0. A
    Ctrl-C while the session still starts used to raise KeyboardInterrupt ("Aborted!", exit 1,
    or py4j tracebacks); it now ends with one line, exit 130, once the session can be stopped.
    Broker: Apache Kafka (the suite's broker) and Tansu."""
    if not spark_available():
        pytest.skip("Spark needs pyspark and Java")
    topic = kafka.create_topic(f"fprog-{uuid.uuid4().hex[:8]}", PARTITIONS)
    kafka.produce(topic, records(1000, 4))
    args = ["materialize", "--engine", "spark", "-b", kafka.bootstrap, "-t", topic, "--checkpoints"]
    args += [str(tmp_path / "c"), "--follow", "--commit-interval", "1s", "--checkpoint-interval", "1h"]
    args += ["--spark-checkpoint-location", str(tmp_path / "spark-state")]

    early = Terminal(args)
    early.wait_for(r"starting a Spark session")
    os.killpg(early.proc.pid, signal.SIGINT)
    assert early.finish() == ""
    assert early.proc.returncode == 130, early.shown[-3000:]
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", early.shown)  # the display's cursor moves
    errors = [line for line in plain.splitlines() if "Error" in line or "Traceback" in line]
    expected = (
        "Error: interrupted: stopped while the Spark session was starting; "
        "the last committed checkpoint stands"
    )
    assert [e.strip() for e in errors] == [expected], early.shown[-3000:]
    assert not list(tmp_path.glob("c/*/snapshots/*.json"))

    term = Terminal(args)
    term.wait_for(r"1 batches · 1,000 records read · caught up")
    os.killpg(term.proc.pid, signal.SIGINT)
    out = term.finish()
    assert term.proc.returncode == 0, term.shown[-3000:]
    assert out.startswith("checkpoint 1 of "), out
    assert "read 1,000 records" in out, out
