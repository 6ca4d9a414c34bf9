"""SIGKILL of a writer at random points of a checkpoint write, with a producer running.

The writer is ``statesnap materialize --follow`` (python engine, a checkpoint at every commit
point) in its own process; it is killed several times, half of the time after a random delay and
half of the time the moment a checkpoint's data files are in the store but its manifest is not
(provably mid-write). Each restart restores whatever the last crash left and must go on
committing. Then: restore (CLI ``dump`` and in-process) == full replay == an independent
consumer read to partition EOF, and GC with zero grace leaves only files retained manifests
reference (no orphans, no temp files, no unfinished multipart uploads).

On file:// and on S3 (the session moto server). Long mode adds rounds and a Spark streaming
materializer killed the same way.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from faults.harness import (
    CliResult,
    KafkaTool,
    Location,
    Producing,
    check_secrets,
    debris,
    judge,
    kill_group,
    materialize_args,
    repo_of,
    restore,
    run_cli,
    start_cli,
    table_digest_of,
    truth_at,
)
from faults.ledger import CaseLedger
from statesnap.checkpoint import layout

PARTITIONS = 3
#: A killed writer's snapshot in progress is kept by GC until its deadline: keep that short.
SNAPSHOT_TIMEOUT = 3


def _generations(loc: Location) -> tuple[set[int], set[int]]:
    """(generations with a manifest, generations with a data file), from a plain listing."""
    manifests: set[int] = set()
    data: set[int] = set()
    for key in loc.list_keys():
        _table, _, rest = key.partition("/")
        gen = layout.manifest_generation(rest)
        if gen is not None:
            manifests.add(gen)
        gen = layout.data_generation(rest)
        if gen is not None and rest.endswith(".parquet"):
            data.add(gen)
    return manifests, data


def _newest(loc: Location) -> int:
    return max(_generations(loc)[0], default=0)


def _mid_write(loc: Location, baseline: int) -> bool:
    """A generation newer than *baseline* has data files in the store and no manifest yet."""
    manifests, data = _generations(loc)
    return any(g > baseline and g not in manifests for g in data)


def _writer(kafka: KafkaTool, topic: str, loc: Location, log: Path) -> subprocess.Popen[bytes]:
    args = materialize_args(
        kafka.bootstrap, topic, loc, "--follow", "--checkpoint-interval", "0s", "--commit-interval", "20ms",
        "--min-count", "3", "--min-age", "0s", "--snapshot-timeout", f"{SNAPSHOT_TIMEOUT}s",
    )  # fmt: skip
    return start_cli(args, loc, log)


def _stale_upload(loc: Location) -> None:
    """What a writer killed during a multipart upload leaves on S3."""
    repo = repo_of(loc)
    key = f"{loc.prefix}/{repo.directory}/data/{99:020d}/p00000-base-0.parquet"
    upload = loc.s3.create_multipart_upload(Bucket=loc.bucket, Key=key)
    loc.s3.upload_part(
        Bucket=loc.bucket, Key=key, UploadId=upload["UploadId"], PartNumber=1, Body=b"x" * 1024
    )


def _orphans(loc: Location) -> None:
    """Debris of writers killed before their manifest: an unreferenced data file and a temp file."""
    store = loc.store()
    directory = repo_of(loc).directory
    store.write(f"{directory}/data/{98:020d}/p00001-base-0.parquet", b"half a file")
    if loc.kind == "file":
        assert loc.root is not None
        (loc.root / directory / "snapshots" / ".tmp-killed-writer").write_bytes(b"{")


def _gc_everything(ledger: CaseLedger, loc: Location) -> CliResult:
    """``checkpoints gc`` keeping only the newest checkpoint, with zero grace: every byte of
    debris is due. Must exit 0; returns its result."""
    args = ["checkpoints", "gc", loc.cli_url, "--min-count", "1", "--min-age", "0s", "--orphan-grace", "0s"]
    gc = run_cli(ledger, [*args, "--json"], timeout=60, env=loc.cli_env)
    assert gc.returncode == 0, gc.stderr[-2000:]
    return gc


def _describe(loc: Location, keys: list[str]) -> list[str]:
    """Debris keys, snapshot records with their state and deadline."""
    import json

    repo = repo_of(loc)
    out = []
    for key in keys:
        if key.startswith("generations/"):
            rec = json.loads(repo.store.read(repo.key(key)))
            out.append(
                f"{key} ({rec.get('state')}, deadline {rec.get('deadline')}, updated {rec.get('updated_at')})"
            )
        else:
            out.append(key)
    return out


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_sigkill_python_writer_mid_checkpoint(
    kind: str,
    kafka: KafkaTool,
    new_topic: Any,
    new_location: Any,
    ledger: CaseLedger,
    long_mode: bool,
    tmp_path: Path,
) -> None:
    if kind == "s3" and not long_mode:  # S3 under kills by default: test_processor_kills[s3-…]
        pytest.skip("on S3 in long mode (STATESNAP_FAULTS=long)")
    rounds = 8 if long_mode else 3
    topic = new_topic(PARTITIONS, "kill")
    loc: Location = new_location(kind)
    rng = random.Random(int(uuid.uuid4().hex[:8], 16))
    producer = Producing(kafka, topic, PARTITIONS)
    producer.start()
    log = tmp_path / "writer.log"
    mid_write_kills = 0
    try:
        for round_no in range(rounds):
            committed_before = _newest(loc)
            proc = _writer(kafka, topic, loc, log)
            try:
                deadline = time.monotonic() + 45
                while _newest(loc) <= committed_before:  # a restarted writer goes on committing
                    assert proc.poll() is None, log.read_text()[-3000:]
                    if time.monotonic() > deadline:
                        ledger.fail("hangs", f"round {round_no}: restarted writer committed nothing in 45 s")
                    time.sleep(0.01)
                # Long mode alternates random kills and kills between data files and manifest;
                # the default mode has one random round, then aims every kill mid-write.
                if round_no % 2 == 0 if long_mode else round_no == 0:
                    time.sleep(rng.uniform(0, 1.0))
                else:
                    baseline = max(set().union(*_generations(loc)), default=0)
                    deadline = time.monotonic() + 30  # a small delta's write is a short window
                    while not _mid_write(loc, baseline) and time.monotonic() < deadline:
                        time.sleep(0.001)
                    mid_write_kills += _mid_write(loc, baseline)
                assert proc.poll() is None, log.read_text()[-3000:]
            finally:
                kill_group(proc)
                proc.wait(10)
            ledger.tried("kills")
            repo = repo_of(loc)
            newest = repo.generations()[0]
            assert repo.verify(newest).ok, "a SIGKILL left a visible, incomplete checkpoint"
    finally:
        produced = producer.finish()
    # The writer restarts once more after the last crash and exits: a checkpoint of everything.
    final = run_cli(
        ledger,
        materialize_args(kafka.bootstrap, topic, loc, "--min-count", "3", "--min-age", "0s"),
        timeout=60, env=loc.cli_env,
    )  # fmt: skip
    assert final.returncode == 0, final.stderr[-2000:]
    assert mid_write_kills > 0, "no kill landed between a checkpoint's data files and its manifest"
    check_secrets(ledger, log.read_text(errors="replace"), "writer log")

    records = kafka.read_all(topic, range(PARTITIONS))
    ledger.check(
        len(records) == len(produced), "data_lost", f"broker holds {len(records)} of {len(produced)}"
    )
    expected = truth_at(records)
    full = restore(kafka.bootstrap, topic, None)
    judge(ledger, "full replay", full.table, expected)
    got = restore(kafka.bootstrap, topic, loc, read_only=True)
    assert got.checkpoint is not None
    assert got.skipped == []
    assert got.offsets == kafka.end_offsets(records, range(PARTITIONS))  # the final run's checkpoint
    judge(ledger, f"restore after {rounds} kills on {kind}", got.table, expected)
    dumped = run_cli(
        ledger,
        ["dump", "-b", kafka.bootstrap, "-t", topic, "--checkpoints", loc.cli_url, "--digest", "--json"],
        timeout=60,
        env=loc.cli_env,
    ).json()
    ledger.check(dumped["digest"] == table_digest_of(expected), "wrong_tables", f"dump digest on {kind}")

    # Debris of crashes that died even earlier than ours, then GC with zero grace removes it all.
    _orphans(loc)
    if kind == "s3":
        _stale_upload(loc)
    assert debris(loc), "the crashes and the planted orphans left no debris to collect"
    gc = _gc_everything(ledger, loc)
    # Data files, temp files, uploads and the records of deleted or dead generations: all gone.
    left = debris(loc)
    assert left == [], f"GC with zero grace left debris: {_describe(loc, left)}\nGC said {gc.stdout}"
    assert loc.kind != "file" or not [p for p in loc.root.rglob("*") if ".tmp" in p.name]  # type: ignore[union-attr]
    verify = run_cli(ledger, ["checkpoints", "verify", loc.cli_url], timeout=60, env=loc.cli_env)
    assert verify.returncode == 0, verify.output[-2000:]
    after = restore(kafka.bootstrap, topic, loc, read_only=True)
    assert after.checkpoint is not None
    judge(ledger, f"restore after GC on {kind}", after.table, expected)


def test_sigkill_spark_streaming_materializer(
    kafka: KafkaTool, new_topic: Any, ledger: CaseLedger, long_mode: bool, tmp_path: Path
) -> None:
    """Long mode only (a Spark driver takes ~10 s to start here): the streaming materializer in its
    own driver process, SIGKILLed twice at random moments with a producer running."""
    if not long_mode:
        pytest.skip("Spark kill runs in long mode (STATESNAP_FAULTS=long)")
    if shutil.which("java") is None:
        pytest.skip("no Java")
    pytest.importorskip("pyspark")
    child = Path(__file__).parents[1] / "integration" / "spark" / "materialize_child.py"
    topic = new_topic(PARTITIONS, "spark-kill")
    url, chk = (tmp_path / "cp").as_uri(), str(tmp_path / "chk")
    loc = Location("file", url, {}, url, {}, root=tmp_path / "cp")
    producer = Producing(kafka, topic, PARTITIONS, pause=0.05)
    producer.start()
    rng = random.Random()
    try:
        for _round in range(2):
            before = _newest(loc)
            with (tmp_path / "spark.log").open("ab") as out:
                proc = subprocess.Popen(
                    [sys.executable, str(child), kafka.bootstrap, topic, url, chk],
                    stdout=out, stderr=out, env={**os.environ, "PYSPARK_PYTHON": sys.executable},
                    start_new_session=True,
                )  # fmt: skip
            try:
                deadline = time.monotonic() + 120
                while _newest(loc) <= before:
                    assert proc.poll() is None, (tmp_path / "spark.log").read_text()[-3000:]
                    if time.monotonic() > deadline:
                        ledger.fail("hangs", "Spark materializer committed nothing in 120 s")
                    time.sleep(0.1)
                time.sleep(rng.uniform(0.2, 3.0))
            finally:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
            ledger.tried("kills")
    finally:
        producer.finish()
    records = kafka.read_all(topic, range(PARTITIONS))
    repo = repo_of(loc)
    for gen in repo.generations():
        assert repo.verify(gen).ok, gen
        got = restore(kafka.bootstrap, topic, loc, name="mat", read_only=True, generation=gen)
        judge(ledger, f"Spark generation {gen} + tail", got.table, truth_at(records))


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_gc_collects_records_of_a_generation_whose_manifest_is_gone(
    kind: str, kafka: KafkaTool, new_topic: Any, new_location: Any, ledger: CaseLedger, long_mode: bool
) -> None:
    """GC (a writer's own, after a checkpoint) killed between deleting an old generation's manifest
    and files and deleting its snapshot records: the next GC must finish the job. Seen in the
    SIGKILL test above as COMPLETED records of a generation without a manifest, kept forever."""
    if kind == "s3" and not long_mode:
        pytest.skip("on S3 in long mode (STATESNAP_FAULTS=long)")
    topic = new_topic(1, "halfgc")
    loc: Location = new_location(kind)
    for n in range(3):
        kafka.produce(topic, [(0, b"k%d" % n, b"v%d" % n)])
        written = run_cli(ledger, materialize_args(kafka.bootstrap, topic, loc), timeout=60, env=loc.cli_env)
        assert written.returncode == 0
    repo = repo_of(loc)
    assert repo.generations() == [3, 2, 1]
    oldest = repo.read_manifest(1)
    only_1 = [repo.key(f.path) for f in oldest.files if f.path.startswith(f"data/{1:020d}/")]
    repo.store.delete([repo.key(layout.manifest_key(1)), *only_1])  # what the killed GC got to do
    ledger.tried("kills")
    gc = _gc_everything(ledger, loc)
    left = debris(loc)
    assert left == [], f"GC left a deleted generation's records: {_describe(loc, left)}\nGC said {gc.stdout}"


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_gc_collects_a_killed_writers_snapshot_past_its_deadline(
    kind: str, kafka: KafkaTool, new_topic: Any, new_location: Any, ledger: CaseLedger, long_mode: bool
) -> None:
    """A writer killed after it opened a snapshot (record ``CREATED``) and wrote data files, but
    before the manifest: once the snapshot's deadline has passed it reads as FAILED, and GC with
    zero grace must delete its record and files — nothing else will ever complete it."""
    if kind == "s3" and not long_mode:
        pytest.skip("on S3 in long mode (STATESNAP_FAULTS=long)")
    topic = new_topic(1, "stale")
    loc: Location = new_location(kind)
    kafka.produce(topic, [(0, b"k%d" % i, b"v") for i in range(50)])
    base = ["-b", kafka.bootstrap, "-t", topic, "--checkpoints", loc.cli_url]
    assert (
        run_cli(
            ledger, ["materialize", "--engine", "python", "-q", *base], timeout=60, env=loc.cli_env
        ).returncode
        == 0
    )
    created = run_cli(
        ledger, ["snapshot", "create", loc.cli_url, "--table", topic, "--timeout", "1s", "--json"],
        timeout=60, env=loc.cli_env,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    gen = created.json()["generation"]
    store = loc.store()
    store.write(f"{repo_of(loc).directory}/data/{gen:020d}/p00000-base-0.parquet", b"killed mid-write")
    ledger.tried("kills")
    time.sleep(1.5)
    show = ["snapshot", "show", loc.cli_url, "--table", topic, str(gen), "--json"]
    shown = run_cli(ledger, show, timeout=60, env=loc.cli_env)
    assert shown.json()["state"] == "FAILED"  # every reader sees the deadline
    gc = _gc_everything(ledger, loc)
    left = debris(loc)
    assert left == [], f"GC kept a dead snapshot: {_describe(loc, left)}\nGC said {gc.stdout}"
