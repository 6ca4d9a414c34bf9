"""Crash safety: a writer killed with SIGKILL at any moment, mostly in the middle of writing a
checkpoint, never leaves a checkpoint that restores wrongly; GC then removes every piece of debris.

The writer is a real separate process (a small script using ``statesnap.Table`` with a file://
checkpoint directory, a checkpoint ``interval=0`` and a tiny ``commit_interval``, consuming in the
background) while the test keeps producing to the topic. It is killed several times, half of the
time at a random moment and half of the time as soon as a checkpoint's data files are seen on disk
before its manifest, i.e. provably mid-write. Each restart restores from whatever the previous
crash left behind, and must go on committing checkpoints.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from statesnap import RetentionPolicy, Table
from statesnap.blob import FileBlobStore
from statesnap.checkpoint import CheckpointRepository, collect_garbage, layout
from statesnap.digest import table_digest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 4
KEYS = 3000
ROUNDS = 6

WRITER = textwrap.dedent(
    """
    import sys, time
    from statesnap import CheckpointOptions, RetentionPolicy, Table

    topic, bootstrap, checkpoints = sys.argv[1:4]
    table = Table(
        topic,
        bootstrap_servers=bootstrap,
        checkpoints=CheckpointOptions(
            checkpoints,
            interval=0,
            commit_interval=0.001,
            retention=RetentionPolicy(min_count=3, min_age=0),  # orphan_grace stays 1h
        ),
        background=True,
    )
    report = table.start()
    print("started", report.checkpoint, flush=True)
    while True:
        time.sleep(1)
    """
)


class Producing(threading.Thread):
    """Keeps appending upserts and tombstones (1 KiB values) until stopped."""

    def __init__(self, kafka: Any, topic: str) -> None:
        super().__init__(daemon=True)
        self.kafka, self.topic = kafka, topic
        self.stop = threading.Event()
        self.produced: list[Any] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = random.Random(7)
        try:
            while not self.stop.is_set():
                batch = []
                for _ in range(200):
                    k = rng.randrange(KEYS)
                    value = None if rng.random() < 0.1 else rng.randbytes(8) * 128
                    batch.append((k % PARTITIONS, b"k%05d" % k, value))
                self.produced += self.kafka.produce(self.topic, batch)
                time.sleep(0.02)
        except BaseException as e:  # surfaced by the test
            self.error = e


def _debris(repo: CheckpointRepository) -> tuple[set[str], set[Path]]:
    """Data files no manifest references, and temp files of unfinished writes."""
    assert isinstance(repo.store, FileBlobStore)
    n = len(repo.directory) + 1
    data = {b.key[n:] for b in repo.store.list(repo.directory + "/") if b.key[n:].startswith("data/")}
    referenced: set[str] = set()
    for _, m in repo.manifests():
        if not isinstance(m, Exception):
            referenced |= {f.path for f in m.files}
    tmp = {p for p in (repo.store.root / repo.directory).rglob("*") if ".tmp-" in p.name}
    return data - referenced, tmp


def _generations(root: Path) -> tuple[set[int], set[int]]:
    """(generations with a manifest, generations with a data directory) under *root*."""
    manifests: set[int] = set()
    data: set[int] = set()
    for t in root.iterdir() if root.exists() else []:
        for p in (t / "snapshots").glob("*.json"):
            gen = layout.manifest_generation(f"snapshots/{p.name}")
            if gen is not None:
                manifests.add(gen)
        if (t / "data").exists():
            data |= {int(d.name) for d in (t / "data").iterdir() if d.name.isdigit()}
    return manifests, data


def _in_flight(root: Path, baseline: int) -> bool:
    """A checkpoint is being written right now: a generation newer than anything that existed
    when the writer started has a complete data file on disk but no manifest yet."""
    manifests, data = _generations(root)
    return any(
        g > baseline and g not in manifests and any(root.glob(f"*/data/{g:020d}/*.parquet")) for g in data
    )


def test_sigkill_during_checkpoint_writes(kafka: Any, tmp_path: Path) -> None:
    topic = kafka.create_topic(f"crash-{uuid.uuid4().hex[:10]}", PARTITIONS)
    root = tmp_path / "checkpoints"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    rng = random.Random(1234)
    producer = Producing(kafka, topic)
    producer.start()
    debris_seen = 0
    restored_from: list[str] = []
    try:
        for round_no in range(ROUNDS):
            committed_before = max(_generations(root)[0], default=0)
            errlog = tmp_path / f"writer-{round_no}.log"
            with errlog.open("w") as err:
                proc = subprocess.Popen(
                    [sys.executable, str(script), topic, kafka.bootstrap, root.as_uri()],
                    stdout=subprocess.PIPE,
                    stderr=err,
                    text=True,
                )
            try:
                line = proc.stdout.readline()  # type: ignore[union-attr]
                assert line.startswith("started"), (line, errlog.read_text()[-4000:])
                restored_from.append(line.split()[1])
                # Whatever its predecessor's crash left behind, a restarted writer goes on
                # committing checkpoints (it is not merely alive).
                deadline = time.monotonic() + 15
                while max(_generations(root)[0], default=0) <= committed_before:
                    assert proc.poll() is None, errlog.read_text()[-4000:]
                    assert time.monotonic() < deadline, (
                        f"round {round_no}: the restarted writer committed no checkpoint in 15 s; "
                        f"its log:\n{errlog.read_text()[-4000:]}"
                    )
                    time.sleep(0.005)
                if round_no % 2 == 0:
                    time.sleep(rng.uniform(0, 1.0))
                else:  # wait until a checkpoint is provably half-written, then kill at once
                    baseline = max(set().union(*_generations(root)), default=0)
                    deadline = time.monotonic() + 10
                    while not _in_flight(root, baseline) and time.monotonic() < deadline:
                        time.sleep(0.0002)
                assert proc.poll() is None, errlog.read_text()[-4000:]
            finally:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
                proc.stdout.close()  # type: ignore[union-attr]
            (table_dir,) = [d.name for d in root.iterdir()]
            repo = CheckpointRepository(FileBlobStore(root), table_dir)
            # Atomic visibility: whatever the crash interrupted, the newest manifest is complete.
            newest = repo.generations()[0]
            result = repo.verify(newest)
            assert result.ok, result.problems
            unreferenced, tmp = _debris(repo)
            debris_seen += bool(unreferenced or tmp)
    finally:
        producer.stop.set()
        producer.join(30)
    assert producer.error is None, producer.error
    assert debris_seen > 0, "no kill landed in the middle of a checkpoint write"
    assert any(g != "None" for g in restored_from[1:]), "restarts never restored a checkpoint"

    produced = kafka.read_all(topic, range(PARTITIONS))
    assert len(produced) == len(producer.produced)
    expected = table_digest(kafka.truth(produced).items())

    def restore(checkpoints: str | None) -> tuple[tuple[str, int], Any]:
        t = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=checkpoints, background=False)
        report = t.start()
        try:
            return table_digest(t.raw_items()), report
        finally:
            t.close(checkpoint=False)

    full, _ = restore(None)
    assert full == expected
    restored, report = restore(root.as_uri())
    assert report.checkpoint is not None
    assert report.skipped == []
    assert restored == full

    # GC removes the debris of every crash: unreferenced data files and temp files.
    (table_dir,) = [d.name for d in root.iterdir()]
    repo = CheckpointRepository(FileBlobStore(root), table_dir)
    collect_garbage(repo, RetentionPolicy(min_count=1, min_age=timedelta(0), orphan_grace=timedelta(0)))
    unreferenced, tmp = _debris(repo)
    assert unreferenced == set()
    assert tmp == set()
    assert len(repo.generations()) == 1
    assert repo.verify(repo.generations()[0]).ok
    after_gc, report = restore(root.as_uri())
    assert report.checkpoint == repo.generations()[0]
    assert after_gc == expected
