"""`checkpoints verify` checks everything a restore reads, and restore skips what verify flags.

Regression tests for cases an adversarial user found (issue "Nothing lost, nothing hung, nothing
wrong"): a manifest naming ``../..`` blocked every restore; verify passed a manifest of another
topic or cluster and a FAILED one; a garbled snapshot record crashed ``dump`` while verify said
all was well; joining a snapshot in progress dropped ``--pin``/``--label``; a snapshot past its
deadline stayed CREATED for readers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from statesnap import Table
from statesnap.blob import open_blob_store
from statesnap.checkpoint import CheckpointRepository, layout, locate_table
from statesnap.errors import SnapshotError
from statesnap.snapshot import SnapshotApi, SnapshotState

pytestmark = pytest.mark.integration
STATESNAP = [sys.executable, "-m", "statesnap.cli"]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*STATESNAP, *args], capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def table(
    kafka: Any, topic_name: str, tmp_path: Path
) -> tuple[str, CheckpointRepository, dict[bytes, bytes]]:
    kafka.create_topic(topic_name, 2)
    recs = kafka.produce(topic_name, [(i % 2, b"k%d" % (i % 30), b"v%d" % i) for i in range(300)])
    url = str(tmp_path / "ckpt")
    for _ in range(2):
        t = Table(topic_name, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)
        t.start()
        t.close()  # a final checkpoint each time
        kafka.produce(topic_name, [(0, b"extra", b"x%d" % len(recs))])
    repo = locate_table(open_blob_store(url), topic_name)
    return url, repo, kafka.truth(kafka.read_all(topic_name, [0, 1]))


def _rewrite_manifest(repo: CheckpointRepository, gen: int, change: Any) -> None:
    key = repo.key(layout.manifest_key(gen))
    obj = json.loads(repo.store.read(key))
    change(obj)
    repo.store.delete([key])
    repo.store.write(key, json.dumps(obj).encode())


def _dump(kafka: Any, topic: str, url: str) -> dict[str, Any]:
    out = cli("dump", "-b", kafka.bootstrap, "-t", topic, "--checkpoints", url, "--digest", "--json")
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


@pytest.mark.parametrize(
    ("name", "change"),
    [
        (
            "path escapes the table",
            lambda o: o["partitions"]["0"]["files"][0].update(path="../../etc/passwd"),
        ),
        ("another topic", lambda o: o.update(topic="someone-else")),
        ("FAILED", lambda o: o.update(state="FAILED")),
    ],
)
def test_verify_flags_and_restore_skips(
    table: Any, kafka: Any, topic_name: str, name: str, change: Any
) -> None:
    url, repo, truth = table
    newest = repo.generations()[0]
    _rewrite_manifest(repo, newest, change)
    out = cli("checkpoints", "verify", url, "--json")
    assert out.returncode == 1, name
    bad = [r for r in json.loads(out.stdout) if not r["ok"]]
    assert [r["generation"] for r in bad] == [newest], name
    if name != "another topic":  # another topic's checkpoint is refused outright, not skipped
        dumped = _dump(kafka, topic_name, url)
        assert dumped["checkpoint"] == repo.generations()[1]
        assert dumped["keys"] == len(truth)
        assert newest in [s["generation"] for s in dumped["skipped"]]


def test_verify_reads_snapshot_records_descriptor_and_journal(
    table: Any, kafka: Any, topic_name: str
) -> None:
    url, repo, truth = table
    assert cli("checkpoints", "verify", url).returncode == 0
    record = next(b.key for b in repo.store.list(repo.key("generations/")) if b.key.endswith(".json"))
    repo.store.delete([record])
    repo.store.write(record, b"{not json")
    out = cli("checkpoints", "verify", url, "--json")
    assert out.returncode == 1
    (bad,) = [r for r in json.loads(out.stdout) if not r["ok"]]
    assert bad["generation"] is None
    assert "generations/" in bad["problems"][0]
    assert _dump(kafka, topic_name, url)["keys"] == len(truth)  # dump reads no records: unaffected


def test_create_joining_a_snapshot_in_progress_keeps_pin_and_label(table: Any) -> None:
    url, repo, _truth = table
    api = SnapshotApi.open(url, repo.descriptor()["table"])
    first = api.create(timeout="1h")
    joined = api.create(pin=True, label="release", timeout="1h")
    assert joined.generation == first.generation
    assert joined.pinned
    assert joined.label == "release"
    with pytest.raises(SnapshotError, match="label 'release'"):
        api.create(label="other")


def test_a_snapshot_past_its_deadline_reads_failed_and_create_starts_a_new_one(table: Any) -> None:
    _url, repo, _truth = table
    now = [datetime.now(UTC)]
    api = SnapshotApi.for_repo(repo, repo.descriptor()["table"], clock=lambda: now[0])
    stale = api.create(timeout="1h")
    now[0] += timedelta(hours=2)  # past the deadline
    assert api.get(stale.generation).state is SnapshotState.FAILED  # every reader sees it
    assert api.store.get(stale.generation).state is SnapshotState.CREATED  # reading wrote nothing
    fresh = api.create(timeout="1h")
    assert fresh.generation > stale.generation
    assert api.store.get(stale.generation).state is SnapshotState.FAILED
