"""Races: two writers on one table, GC looping during restores and verifies, concurrent
``snapshot create``. Every committed checkpoint must verify, every restore must equal the
independent read at the offsets it reports, and no command may fail with anything but a typed
one-line error."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from faults.harness import (
    CliResult,
    KafkaTool,
    Location,
    Producing,
    check_secrets,
    dump_stacks,
    judge,
    judge_cli,
    kill_group,
    materialize_args,
    repo_of,
    restore,
    run_cli,
    run_cli_raw,
    start_cli,
    truth_at,
)
from faults.ledger import CaseLedger

PARTITIONS = 3


def _follow(kafka: KafkaTool, topic: str, loc: Location, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    args = materialize_args(
        kafka.bootstrap,
        topic,
        loc,
        "--follow",
        "--checkpoint-interval",
        "0s",
        "--commit-interval",
        "50ms",
        *extra,
    )
    return start_cli(args, loc, log)


def _stop(ledger: CaseLedger, proc: subprocess.Popen[bytes], log: Path, what: str) -> None:
    """Ctrl-C, as an operator would: the writer takes a final checkpoint and exits in time."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(45)
    except subprocess.TimeoutExpired:
        dump_stacks(proc)
        kill_group(proc)
        proc.wait(10)
        ledger.fail("hangs", f"{what} did not exit within 45 s of Ctrl-C:\n{log.read_text()[-3000:]}")
    text = log.read_text(errors="replace")
    check_secrets(ledger, text, what)
    assert "Traceback (most recent call last)" not in text, text[-3000:]
    assert proc.returncode in (0, 1, 130, -signal.SIGINT), (proc.returncode, text[-2000:])
    if proc.returncode == 1:  # a lost race must be a typed, one-line error
        assert any(line.startswith("Error:") for line in text.splitlines()), text[-2000:]


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_two_writers_on_one_table(
    kind: str,
    kafka: KafkaTool,
    new_topic: Any,
    new_location: Any,
    ledger: CaseLedger,
    tmp_path: Path,
    long_mode: bool,
) -> None:
    """Two ``materialize --follow`` of one table at once, both committing at every commit point.
    Manifests are write-once, so one writer loses each race for a generation; neither may
    corrupt a checkpoint the other committed (e.g. by rewriting its data files). S3: long mode."""
    if kind == "s3" and not long_mode:
        pytest.skip("on S3 in long mode (STATESNAP_FAULTS=long)")
    topic = new_topic(PARTITIONS, "two")
    loc: Location = new_location(kind)
    producer = Producing(kafka, topic, PARTITIONS, pause=0.03)
    producer.start()
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    writers = [_follow(kafka, topic, loc, log, "--min-count", "50", "--min-age", "1h") for log in logs]
    ledger.tried("races")
    try:
        time.sleep(6)
    finally:
        producer.finish()
        for proc, log in zip(writers, logs, strict=True):
            _stop(ledger, proc, log, f"writer {log.stem}")
    records = kafka.read_all(topic, range(PARTITIONS))
    repo = repo_of(loc)
    generations = repo.generations()
    assert len(generations) >= 3, generations
    bad = {g: repo.verify(g).problems for g in generations if not repo.verify(g).ok}
    ledger.check(not bad, "wrong_tables", f"two writers left corrupt committed checkpoints: {bad}")
    expected = truth_at(records)
    for gen in generations[:4]:  # the newest few, each restored and caught up
        got = restore(kafka.bootstrap, topic, loc, read_only=True, generation=gen)
        judge(ledger, f"generation {gen} + tail after two writers", got.table, expected)


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_gc_loops_during_restores(
    kind: str,
    kafka: KafkaTool,
    new_topic: Any,
    new_location: Any,
    ledger: CaseLedger,
    tmp_path: Path,
    long_mode: bool,
) -> None:
    """A writer commits continuously while GC (keep 1, no minimum age) loops; meanwhile restores
    and ``verify`` loop too. A generation deleted under a reader is skipped or retried, never a
    wrong table, and never reported as corruption. S3: long mode."""
    if kind == "s3" and not long_mode:
        pytest.skip("on S3 in long mode (STATESNAP_FAULTS=long)")
    topic = new_topic(PARTITIONS, "gcrace")
    loc: Location = new_location(kind)
    producer = Producing(kafka, topic, PARTITIONS, pause=0.03)
    producer.start()
    log = tmp_path / "writer.log"
    writer = _follow(kafka, topic, loc, log, "--min-count", "1", "--min-age", "0s")
    stop = threading.Event()
    gc_runs: list[CliResult] = []
    verifies: list[CliResult] = []
    restores: list[Any] = []
    errors: list[BaseException] = []
    seconds = 20 if long_mode else 6

    def loop(fn: Any) -> None:
        try:
            while not stop.is_set():
                fn()
        except BaseException as e:
            errors.append(e)

    gc_args = ["checkpoints", "gc", loc.cli_url, "--min-count", "1", "--min-age", "0s"]

    def restore_once() -> None:
        restores.append(restore(kafka.bootstrap, topic, loc, read_only=True))

    threads = [
        threading.Thread(
            target=loop, args=(lambda: gc_runs.append(run_cli_raw(gc_args, timeout=60, env=loc.cli_env)),)
        ),
        threading.Thread(target=loop, args=(lambda: verifies.append(
            run_cli_raw(["checkpoints", "verify", loc.cli_url, "--json"], timeout=60, env=loc.cli_env)),)),
        threading.Thread(target=loop, args=(restore_once,)),
    ]  # fmt: skip
    deadline = time.monotonic() + 30
    while not loc.list_keys() or not repo_of(loc).generations():
        assert time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.05)
    for t in threads:
        t.start()
    try:
        time.sleep(seconds)
    finally:
        stop.set()
        for t in threads:
            t.join(90)
        producer.finish()
        _stop(ledger, writer, log, "writer")
    ledger.tried("races")
    assert not any(t.is_alive() for t in threads), "a loop is stuck"
    assert not errors, errors
    assert gc_runs, "GC never ran"
    assert verifies, "verify never ran"
    assert restores, "no restore finished"
    for r in gc_runs:
        judge_cli(ledger, r)
        assert r.returncode == 0, r.stderr[-2000:]
    for r in verifies:
        judge_cli(ledger, r)
        assert r.returncode == 0, (
            f"verify reported corruption under GC:\n{r.stdout[-2000:]}{r.stderr[-2000:]}"
        )
    records = kafka.read_all(topic, range(PARTITIONS))
    for n, got in enumerate(restores):
        judge(
            ledger,
            f"restore {n} (from {got.checkpoint}) during GC",
            got.table,
            truth_at(records, got.offsets),
        )
    assert any(got.checkpoint is not None for got in restores), "no restore used a checkpoint"


def test_concurrent_snapshot_create(
    kafka: KafkaTool, new_topic: Any, new_location: Any, ledger: CaseLedger
) -> None:
    """Several ``snapshot create`` at once join one generation (one of them pins it: the pin is
    kept); a writer run then completes it, and it restores to the independent read."""
    topic = new_topic(PARTITIONS, "snaprace")
    loc: Location = new_location("file")
    kafka.produce(topic, [(i % PARTITIONS, b"k%d" % (i % 90), b"v%d" % i) for i in range(900)])
    base = materialize_args(kafka.bootstrap, topic, loc)
    assert run_cli(ledger, base, timeout=60).returncode == 0
    kafka.produce(topic, [(i % PARTITIONS, b"k%d" % (i % 50), b"w%d" % i) for i in range(300)])
    create = ["snapshot", "create", loc.cli_url, "--table", topic, "--timeout", "60s", "--json"]
    commands = [create, create, create, [*create, "--pin"], [*create, "--label", "race"]]
    with ThreadPoolExecutor(len(commands)) as pool:
        results = list(pool.map(lambda args: run_cli_raw(args, timeout=60), commands))
    ledger.tried("races")
    for r in results:
        judge_cli(ledger, r)
        assert r.returncode == 0, r.stderr[-2000:]
    generations = {r.json()["generation"] for r in results}
    assert len(generations) == 1, f"concurrent creates started several snapshots: {generations}"
    (gen,) = generations
    assert run_cli(ledger, base, timeout=60).returncode == 0
    shown = run_cli(
        ledger, ["snapshot", "show", loc.cli_url, "--table", topic, str(gen), "--json"], timeout=60
    )
    snap = json.loads(shown.stdout)
    assert snap["state"] == "COMPLETED", snap
    assert snap["pinned"], "a pin given while joining the snapshot was dropped"
    assert snap["label"] == "race", "a label given while joining the snapshot was dropped"
    got = restore(kafka.bootstrap, topic, loc, read_only=True, generation=gen, tail=False)
    judge(ledger, f"snapshot {gen}", got.table, truth_at(kafka.read_all(topic, range(PARTITIONS))))
    verify = run_cli(ledger, ["checkpoints", "verify", loc.cli_url], timeout=60)
    assert verify.returncode == 0, verify.output[-2000:]


class _GcBetweenListAndRead:
    """A real file store in which GC deletes one generation's snapshot records right after a
    reader listed them and before it reads them: the interleaving the GC race above hits at
    random, made deterministic."""

    def __init__(self, inner: Any, doomed_prefix: str) -> None:
        self.inner = inner
        self.doomed_prefix = doomed_prefix
        self.fired = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def read(self, key: str) -> bytes:
        if key.startswith(self.doomed_prefix) and not self.fired:
            self.fired = True
            self.inner.delete([b.key for b in self.inner.list(self.doomed_prefix)])
        return bytes(self.inner.read(key))


def test_snapshot_records_deleted_by_gc_under_a_reader(
    kafka: KafkaTool, new_topic: Any, new_location: Any, ledger: CaseLedger
) -> None:
    """Listing snapshots while GC deletes an old generation must list the others, not fail:
    a writer's background refresh logged an ERROR traceback for it, and ``snapshot list``
    can fail the same way."""
    from statesnap.snapshot.store import BlobSnapshotStore

    topic = new_topic(1, "gcread")
    loc: Location = new_location("file")
    base = materialize_args(kafka.bootstrap, topic, loc)
    for n in range(3):
        kafka.produce(topic, [(0, b"k%d" % n, b"v")])
        assert run_cli(ledger, base, timeout=60).returncode == 0
    repo = repo_of(loc)
    assert repo.generations() == [3, 2, 1]
    ledger.tried("races")
    racy = _GcBetweenListAndRead(repo.store, repo.key(f"generations/{1:020d}/"))
    listed = BlobSnapshotStore(racy, repo.directory).list()
    assert racy.fired
    assert [s.generation for s in listed] == [3, 2]
