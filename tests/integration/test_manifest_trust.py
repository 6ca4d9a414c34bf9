"""A manifest is its own proof: a manifest that parses but lists the wrong files, or holds values no
writer produces, is never a table. ``checkpoints verify`` says CORRUPT (exit 1), a restore skips it
for the older checkpoint, and ``dump`` falls back too; the restored table always equals an
independent replay (a plain consumer loop in the test).

Broker: the session's (Apache Kafka; Tansu proved it too; only produce and consume are relied on). Blob
stores: file://. Each tampering is tried two ways: edited in place (the version-2 checksum catches it) and
downgraded to an unsigned format-1 manifest (the checks behind the checksum must catch it on their own).
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from urllib.request import url2pathname

import pytest

from integration.cli_runner import digest, statesnap
from statesnap import CheckpointOptions, RetentionPolicy, SnapshotOptions, Table
from statesnap.blob import open_blob_store
from statesnap.checkpoint import CheckpointManifest, CheckpointRepository, layout

pytestmark = pytest.mark.integration

PARTITIONS = 2


@dataclass
class History:
    """A table with three checkpoints: a base, then two deltas per partition (each adding keys)."""

    topic: str
    url: str
    produced: list[Any]
    manifests: list[CheckpointManifest]
    repo: CheckpointRepository


def _table(kafka: Any, topic: str, url: str) -> Table:
    return Table(
        topic,
        bootstrap_servers=kafka.bootstrap,
        background=False,
        checkpoints=CheckpointOptions(
            url, interval="1h", commit_interval="1h", retention=RetentionPolicy(min_count=10)
        ),
    )


@pytest.fixture(scope="module")
def pristine(kafka: Any, tmp_path_factory: pytest.TempPathFactory) -> History:
    """One topic and its three checkpoints, written once; each test tampers with its own copy of
    the checkpoint store (the topic is only read)."""
    return _write_history(kafka, tmp_path_factory.mktemp("trust"))


def _history(pristine: History, tmp_path: Path) -> History:
    """A private copy of the pristine checkpoint store."""
    root = tmp_path / "checkpoints"
    shutil.copytree(Path(url2pathname(urlsplit(pristine.url).path)), root)
    url = root.as_uri()
    repo = CheckpointRepository(open_blob_store(url), pristine.repo.directory)
    return History(pristine.topic, url, pristine.produced, pristine.manifests, repo)


def _write_history(kafka: Any, tmp_path: Path) -> History:
    topic = kafka.create_topic(f"trust-{uuid.uuid4().hex[:12]}", PARTITIONS)
    url = (tmp_path / "checkpoints").as_uri()
    t = _table(kafka, topic, url)
    t.start()
    produced: list[Any] = []
    manifests = []
    try:
        for round_no in range(3):
            # new keys each round (so every delta changes each partition's key count), an update
            # and a tombstone of an older key
            batch: list[tuple[int, bytes, bytes | None]] = [
                (k % PARTITIONS, b"key-%d-%d" % (round_no, k), b"v%d" % k) for k in range(12)
            ]
            if round_no:
                batch += [(0, b"key-0-0", b"updated-%d" % round_no), (1, b"key-0-1", None)]
            produced += kafka.produce(topic, batch)
            kafka.drain(t, kafka.end_offsets(produced, range(PARTITIONS)))
            m = t.checkpoint()
            assert m is not None
            manifests.append(m)
        produced += kafka.produce(topic, [(0, b"tail", b"t"), (1, b"key-1-1", None)])
    finally:
        t.close(checkpoint=False)
    newest = manifests[-1]
    assert all([f.kind for f in pc.files] == ["base", "delta", "delta"] for pc in newest.partitions.values())
    return History(topic, url, produced, manifests, t.repo)  # type: ignore[arg-type]


def _rewrite(h: History, edit: Callable[[dict[str, Any]], None], *, downgrade: bool) -> None:
    """Edit the newest manifest's JSON in place; *downgrade* makes it an unsigned format-1 one."""
    newest = h.manifests[-1]
    obj = newest.to_json()
    edit(obj)
    if downgrade:
        obj["format_version"] = 1
        obj.pop("checksum")
    _put(h, json.dumps(obj, indent=2).encode())


def _put(h: History, data: bytes) -> None:
    h.repo.store.write(h.repo.key(layout.manifest_key(h.manifests[-1].generation)), data)


def _drop_a_delta(obj: dict[str, Any]) -> None:
    obj["partitions"]["0"]["files"].pop(1)


def _reverse_deltas(obj: dict[str, Any]) -> None:
    files = obj["partitions"]["0"]["files"]
    files[1], files[2] = files[2], files[1]


def _swap_partitions(obj: dict[str, Any]) -> None:
    parts = obj["partitions"]
    parts["0"]["files"], parts["1"]["files"] = parts["1"]["files"], parts["0"]["files"]


def _no_files(obj: dict[str, Any]) -> None:
    obj["partitions"]["1"]["files"] = []


def _claim_more_rows(obj: dict[str, Any]) -> None:
    obj["partitions"]["0"]["files"][0]["rows"] += 1


TAMPERINGS: dict[str, Callable[[dict[str, Any]], None]] = {
    "a-delta-dropped": _drop_a_delta,
    "deltas-reversed": _reverse_deltas,
    "partitions-swapped": _swap_partitions,
    "files-emptied": _no_files,
    "rows-overclaimed": _claim_more_rows,
}


def _assert_falls_back(kafka: Any, h: History) -> None:
    """verify says CORRUPT for the newest generation only; restore and dump use the one before and
    equal the independent replay."""
    newest, older = h.manifests[-1].generation, h.manifests[-2].generation
    result = statesnap("checkpoints", "verify", h.url, "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    verdicts = {r["generation"]: r for r in json.loads(result.stdout)}
    assert not verdicts[newest]["ok"]
    assert verdicts[older]["ok"]
    assert verdicts[None]["ok"], verdicts[None]

    t = _table(kafka, h.topic, h.url)
    report = t.start()
    try:
        assert report.checkpoint == older
        assert [s.generation for s in report.skipped] == [newest]
        assert dict(t.raw_items()) == kafka.truth(h.produced)
    finally:
        t.close(checkpoint=False)

    dump = statesnap("dump", "-b", kafka.bootstrap, "-t", h.topic, "-c", h.url, "--digest", "--json")
    assert dump.returncode == 0, dump.stderr
    assert "Traceback" not in dump.stderr
    out = json.loads(dump.stdout)
    assert out["checkpoint"] == older
    assert out["digest"] == digest(kafka.truth(h.produced))


@pytest.mark.parametrize("downgrade", [False, True], ids=["edited", "downgraded-unsigned"])
@pytest.mark.parametrize("tampering", sorted(TAMPERINGS))
def test_a_manifest_listing_the_wrong_files_is_never_a_table(
    tampering: str, downgrade: bool, pristine: History, kafka: Any, tmp_path: Path
) -> None:
    h = _history(pristine, tmp_path)
    _rewrite(h, TAMPERINGS[tampering], downgrade=downgrade)
    _assert_falls_back(kafka, h)


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


PATHOLOGICAL: dict[str, Callable[[History], bytes]] = {
    "5000-digit-generation": lambda h: h.repo.store.read(
        h.repo.key(layout.manifest_key(h.manifests[-1].generation))
    ).replace(b'"generation": ', b'"generation": ' + b"9" * 5000 + b', "was": ', 1),
    "100000-nested-brackets": lambda h: _nested(100_000),
    "next-offset-1e300": lambda h: _edited(h, lambda o: o["partitions"]["0"].update(next_offset=1e300)),
    "next-offset-2^64": lambda h: _edited(h, lambda o: o["partitions"]["0"].update(next_offset=2**64)),
    "generation-as-string": lambda h: _edited(h, lambda o: o.update(generation=str(o["generation"]))),
    "next-offset-as-string": lambda h: _edited(h, lambda o: o["partitions"]["1"].update(next_offset="7")),
}


def _edited(h: History, edit: Callable[[dict[str, Any]], None]) -> bytes:
    """Edited and unsigned (format 1), so the value itself must be refused, not the checksum."""
    obj = h.manifests[-1].to_json()
    edit(obj)
    obj["format_version"] = 1
    obj.pop("checksum")
    return json.dumps(obj).encode()


@pytest.mark.parametrize("case", sorted(PATHOLOGICAL))
def test_pathological_manifests_are_skipped_not_crashed_on(
    case: str, pristine: History, kafka: Any, tmp_path: Path
) -> None:
    h = _history(pristine, tmp_path)
    _put(h, PATHOLOGICAL[case](h))
    _assert_falls_back(kafka, h)


def _verify(h: History, *extra: str) -> tuple[int, dict[Any, Any]]:
    result = statesnap("checkpoints", "verify", h.url, "--json", *extra)
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, {r["generation"]: r for r in json.loads(result.stdout)}


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (b"{garbled", "not valid JSON"),
        (b'{"generation": -3}', "outside"),
        (b'{"generation": "12"}', "not an integer"),
        (b"[7]", "not a JSON object"),
    ],
    ids=["garbled", "negative", "string", "array"],
)
def test_verify_reads_the_high_water_mark(
    body: bytes, named: str, pristine: History, kafka: Any, tmp_path: Path
) -> None:
    h = _history(pristine, tmp_path)
    h.repo.store.write(h.repo.key(layout.HIGH_WATER), body)
    code, verdicts = _verify(h)
    assert code == 1
    assert any(named in p and "high-water" in p for p in verdicts[None]["problems"]), verdicts[None]
    # A writer ignores the bad mark (with a warning) and still never reuses a generation.
    t = _table(kafka, h.topic, h.url)
    t.start()
    try:
        m = t.checkpoint(full=True)
        assert m is not None
        assert m.generation > h.manifests[-1].generation
    finally:
        t.close(checkpoint=False)


@pytest.mark.parametrize(
    ("state", "reports", "named"),
    [
        ("FAILED", True, "snapshot record says FAILED"),
        ("CREATED", False, "snapshot record says CREATED with reports missing"),
        ("CREATED", True, None),  # every report in: the snapshot is being finished, not corrupt
    ],
    ids=["failed", "created-missing-reports", "created-being-finished"],
)
def test_verify_reports_a_record_that_disagrees_with_its_manifest(
    state: str, reports: bool, named: str | None, pristine: History, kafka: Any, tmp_path: Path
) -> None:
    h = _history(pristine, tmp_path)
    gen = h.manifests[-1].generation
    prefix = h.repo.key(f"generations/{gen:020d}/")
    newest = max(b.key for b in h.repo.store.list(prefix))
    record = json.loads(h.repo.store.read(newest))
    record["state"] = state
    if not reports:
        record["tasks"] = []
    h.repo.store.write(newest, json.dumps(record).encode())
    code, verdicts = _verify(h)
    if named is None:
        assert code == 0, verdicts
        return
    assert code == 1
    assert any(named in p for p in verdicts[None]["problems"]), verdicts[None]


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda d: d.update(partitions=7), "checksum"),
        (lambda d: d.update(partitions="2"), "partitions is the string"),
        (lambda d: d.update(partitions=0), "outside"),
        (lambda d: d.update(table="other"), "checksum"),
        (lambda d: d.update(cluster_id="elsewhere"), "checksum"),
        (lambda d: d.update(snapshot_store="kafka://x"), "checksum"),
        (lambda d: (d.update(table="other"), d.pop("checksum")), "not the table directory"),
        (lambda d: (d.update(snapshot_store="kafka://x"), d.pop("checksum")), "not a snapshot store"),
    ],
    ids=[
        "partitions",
        "partitions-string",
        "partitions-zero",
        "table",
        "cluster",
        "snapshot-store",
        "table-unsigned",
        "snapshot-store-unsigned",
    ],
)
def test_verify_reads_the_descriptor(
    edit: Callable[[dict[str, Any]], Any], named: str, pristine: History, kafka: Any, tmp_path: Path
) -> None:
    h = _history(pristine, tmp_path)
    key = h.repo.key(layout.DESCRIPTOR)
    descriptor = json.loads(h.repo.store.read(key))
    assert "checksum" in descriptor
    edit(descriptor)
    h.repo.store.write(key, json.dumps(descriptor).encode())
    code, verdicts = _verify(h)
    assert code == 1
    assert any(named in p for p in verdicts[None]["problems"]), verdicts[None]


def test_verify_reads_a_topic_snapshot_store_only_with_its_cluster(
    pristine: History, kafka: Any, tmp_path: Path
) -> None:
    """Tansu: the records are produced to and read back from a real topic."""
    topic = kafka.create_topic(f"trust-topic-{uuid.uuid4().hex[:12]}", 1)
    url = (tmp_path / "checkpoints").as_uri()
    kafka.produce(topic, [(0, b"k", b"v")])
    snapshots = f"topic:{topic}-snapshots"
    t = Table(
        topic,
        bootstrap_servers=kafka.bootstrap,
        background=False,
        checkpoints=CheckpointOptions(url, interval="1h", snapshots=SnapshotOptions(store=snapshots)),
    )
    t.start()
    try:
        assert t.checkpoint() is not None
    finally:
        t.close(checkpoint=False)
    unchecked = statesnap("checkpoints", "verify", url)
    assert unchecked.returncode == 1
    assert "were not checked: pass --bootstrap-servers" in unchecked.stdout
    checked = statesnap("checkpoints", "verify", url, "-b", kafka.bootstrap)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "CORRUPT" not in checked.stdout
