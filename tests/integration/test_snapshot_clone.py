"""``statesnap snapshot clone``: a generation copied into a new table, run as a user runs it (a
fresh CLI process of the venv's interpreter), on ``file://`` and on S3 (the moto server).

The checkpoints are written by a Python ``Table`` on the session's broker (Apache Kafka; Tansu too); ground
truth is the records the broker acknowledged (last write per key wins, a tombstone deletes), never statesnap's
own reader. Broker behaviour relied on: ordered partitions and partition EOF (proved on Apache Kafka and on
Tansu).
"""

from __future__ import annotations

import json
import shlex
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from docsite.blocks import by_test
from integration.cli_runner import digest, ok, statesnap
from integration.conftest import KafkaTool, Rec
from statesnap import CheckpointOptions, RetentionPolicy, Table
from statesnap.blob import open_blob_store
from statesnap.checkpoint import CheckpointManifest, locate_table

pytestmark = pytest.mark.integration

PARTITIONS = 2
KEEP_ALL = RetentionPolicy(min_count=100, min_age=timedelta(days=1))
DOC = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "migrations.md"


def storage_args(options: dict[str, str]) -> list[str]:
    return [a for k, v in sorted(options.items()) for a in ("--storage-option", f"{k}={v}")]


def truth(records: list[Rec], offsets: dict[int, int] | None = None) -> dict[bytes, bytes]:
    """The table below *offsets* (all of it without), replayed from the acknowledged records."""
    return KafkaTool.truth(r for r in records if offsets is None or r.offset < offsets.get(r.partition, 0))


def churn(kafka: KafkaTool, topic: str, round_no: int) -> list[Rec]:
    """Round 0 writes 40 keys; later rounds update a few and delete a few (tombstones)."""
    if round_no == 0:
        return kafka.produce(topic, [(i % PARTITIONS, b"k%03d" % i, b"v0-%d" % i) for i in range(40)])
    batch: list[tuple[int, bytes, bytes | None]] = [
        (i % PARTITIONS, b"k%03d" % i, b"v%d-%d" % (round_no, i)) for i in range(round_no, 40, 7)
    ]
    batch += [(i % PARTITIONS, b"k%03d" % i, None) for i in range(round_no * 3, round_no * 3 + 3)]
    return kafka.produce(topic, batch)


def write_generations(
    kafka: KafkaTool, topic: str, url: str, options: dict[str, str], rounds: int, *, full: bool = False
) -> tuple[list[Rec], list[CheckpointManifest]]:
    """One checkpoint per round (a base, then deltas with tombstones; with *full* every round
    compacts into new bases); every generation kept."""
    records: list[Rec] = []
    manifests: list[CheckpointManifest] = []
    t = Table(
        topic,
        bootstrap_servers=kafka.bootstrap,
        background=False,
        checkpoints=CheckpointOptions(
            url, storage_options=options, interval="1h", commit_interval="1h", retention=KEEP_ALL
        ),
    )
    t.start()
    try:
        for round_no in range(rounds):
            records += churn(kafka, topic, round_no)
            kafka.drain(t, kafka.end_offsets(records, range(PARTITIONS)))
            m = t.checkpoint(full=full)
            assert m is not None
            manifests.append(m)
    finally:
        t.close(checkpoint=False)
    return records, manifests


def restore(
    kafka: KafkaTool, topic: str, name: str, url: str, options: dict[str, str], *, write: bool = False
) -> tuple[dict[bytes, bytes], Any, CheckpointManifest | None]:
    """A new application of table *name*: restore, catch up, (optionally) checkpoint, close."""
    t = Table(
        topic,
        name=name,
        bootstrap_servers=kafka.bootstrap,
        background=False,
        checkpoints=CheckpointOptions(
            url, storage_options=options, interval="1h", commit_interval="1h", retention=KEEP_ALL
        ),
    )
    report = t.start()
    try:
        rows = dict(t.raw_items())
        written = t.checkpoint() if write else None
    finally:
        t.close(checkpoint=False)
    return rows, report, written


def gc(url: str, table: str, options: dict[str, str]) -> Any:
    return ok(
        statesnap(
            "checkpoints",
            "gc",
            url,
            "--table",
            table,
            "--min-count",
            "1",
            "--min-age",
            "0s",
            *storage_args(options),
            "--json",
        )
    )


def dump_at(kafka: KafkaTool, topic: str, table: str, url: str, options: dict[str, str], gen: int) -> Any:
    return ok(
        statesnap(
            "dump",
            "-b",
            kafka.bootstrap,
            "-t",
            topic,
            "--table",
            table,
            "--checkpoints",
            url,
            "--generation",
            str(gen),
            "--no-tail",
            "--digest",
            "--json",
            *storage_args(options),
        )
    )


def test_clone_survives_gc_of_its_source_and_vice_versa(
    kafka: KafkaTool, checkpoint_location: Any, topic_name: str
) -> None:
    """Clone generation 2 of 3; GC the source down to one newer checkpoint, then restore the clone
    as a new application (its files are copies/links of their own); then the clone's application
    checkpoints and GCs its own table, and the source still verifies and restores."""
    url, options = checkpoint_location.url, checkpoint_location.options
    topic = kafka.create_topic(topic_name, PARTITIONS)
    records, manifests = write_generations(kafka, topic, url, options, rounds=3)
    cloned = manifests[1]
    assert any(f.kind == "delta" for f in cloned.files), "the cloned generation has no deltas"
    assert {int(f.path.split("/")[1]) for f in cloned.files} != {cloned.generation}, (
        "the clone must copy files of older generations' directories too"
    )
    clone_name = f"{topic}.blue-green"
    result = ok(
        statesnap(
            "snapshot",
            "clone",
            url,
            "--table",
            topic,
            str(cloned.generation),
            "--to-table",
            clone_name,
            *storage_args(options),
            "--json",
        )
    )
    assert result["table"] == clone_name
    assert result["generation"] == cloned.generation
    assert result["files"] == len(cloned.files)
    assert result["copied"] == {("link" if url.startswith("file") else "server"): len(cloned.files)}
    assert not result["pinned"]
    assert "secret" not in json.dumps(result).lower()
    shown = ok(
        statesnap(
            "snapshot",
            "show",
            url,
            "--table",
            clone_name,
            str(cloned.generation),
            "--json",
            *storage_args(options),
        )
    )
    assert shown["state"] == "COMPLETED"
    assert shown["label"] == f"clone of {topic}@{cloned.generation}"
    if url.startswith("file"):
        root = Path(url.removeprefix("file://"))
        one = cloned.files[0].path
        source_file = next(root.glob(f"*_{topic}/{one}"))
        assert source_file.stat().st_nlink == 2, "a hard link, not a copy"

    # More history on the source, then GC it down to its newest checkpoint.
    records_later, newer = write_generations(kafka, topic, url, options, rounds=1, full=True)
    records += records_later  # round 0 again: 40 more upserts, compacted into new bases
    assert not {f.path for f in newer[0].files} & {f.path for f in cloned.files}
    report = gc(url, topic, options)
    blob = open_blob_store(url, **options)
    source = locate_table(blob, topic)
    assert source.generations() == [newer[0].generation], report
    left = {b.key for b in blob.list(source.directory + "/")}
    assert not {source.key(f.path) for f in cloned.files} & left, "GC left the cloned files in the source"

    # The clone is intact and a new application starts from it.
    assert dump_at(kafka, topic, clone_name, url, options, cloned.generation)["digest"] == digest(
        truth(records, cloned.offsets)
    )
    rows, started, written = restore(kafka, topic, clone_name, url, options, write=True)
    assert started.checkpoint == cloned.generation
    assert started.replayed_records == sum(1 for r in records if r.offset >= cloned.offsets[r.partition])
    assert rows == truth(records)
    assert written is not None
    assert written.generation > cloned.generation

    # Vice versa: the clone's GC removes the cloned generation's files, the source keeps its own.
    gc(url, clone_name, options)
    target = locate_table(blob, clone_name)
    assert target.generations() == [written.generation]
    assert source.verify(newer[0].generation).ok
    source_rows, source_report, _ = restore(kafka, topic, topic, url, options)
    assert source_report.checkpoint == newer[0].generation
    assert source_rows == truth(records)


def test_clone_into_another_checkpoint_store(
    kafka: KafkaTool, s3_location: Any, topic_name: str, tmp_path: Path
) -> None:
    """``--to`` another store: a file root cloned onto S3 (the bytes go through the process), and
    the application on S3 restores it."""
    url = (tmp_path / "ckpt").as_uri()
    topic = kafka.create_topic(topic_name, PARTITIONS)
    records, manifests = write_generations(kafka, topic, url, {}, rounds=2)
    result = ok(
        statesnap(
            "snapshot",
            "clone",
            url,
            "--table",
            topic,
            str(manifests[-1].generation),
            "--to-table",
            "green",
            "--to",
            s3_location.url,
            *[
                a.replace("--storage-option", "--to-storage-option")
                for a in storage_args(s3_location.options)
            ],
            "--json",
        )
    )
    assert result["copied"] == {"bytes": len(manifests[-1].files)}
    rows, report, _ = restore(kafka, topic, "green", s3_location.url, s3_location.options)
    assert report.checkpoint == manifests[-1].generation
    assert report.replayed_records == 0
    assert rows == truth(records)


def one_line_error(result: Any, error: str) -> str:
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert error in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    return str(lines[0])


def test_clone_refusals_are_one_typed_line_and_write_nothing(
    kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    """An existing target, a missing generation, a FAILED and a CREATED (in progress) snapshot, an
    invalid name: each refused in one line naming the error, nothing of the target written."""
    url = (tmp_path / "ckpt").as_uri()
    root = tmp_path / "ckpt"
    topic = kafka.create_topic(topic_name, PARTITIONS)
    _, manifests = write_generations(kafka, topic, url, {}, rounds=1)
    gen = str(manifests[0].generation)
    ok(statesnap("snapshot", "clone", url, "--table", topic, gen, "--to-table", "taken"))

    def clone(*args: str) -> Any:
        return statesnap("snapshot", "clone", url, "--table", topic, *args)

    before = sorted(p.name for p in root.iterdir())
    line = one_line_error(clone(gen, "--to-table", "taken"), "CheckpointConflictError")
    assert "'taken' already exists" in line
    line = one_line_error(clone(gen, "--to-table", topic), "CheckpointConflictError")
    one_line_error(clone("99", "--to-table", "t-missing"), "SnapshotNotFoundError")
    one_line_error(clone(gen, "--to-table", "bad/name"), "ConfigError")
    # A snapshot no task takes part in fails at its deadline; one with a long deadline is in progress.
    waited = statesnap("snapshot", "create", url, "--table", topic, "--timeout", "1s", "--wait", "--json")
    assert waited.returncode == 1  # --wait ending FAILED exits 1
    failed = json.loads(waited.stdout)
    assert failed["state"] == "FAILED"
    line = one_line_error(clone(str(failed["generation"]), "--to-table", "t-failed"), "SnapshotError")
    assert "FAILED, not COMPLETED" in line
    running = ok(statesnap("snapshot", "create", url, "--table", topic, "--timeout", "1h", "--json"))
    assert running["state"] == "CREATED"
    line = one_line_error(clone(str(running["generation"]), "--to-table", "t-running"), "SnapshotError")
    assert "CREATED, not COMPLETED" in line
    assert sorted(p.name for p in root.iterdir()) == before, "a refused clone wrote something"


def doc_block(name: str) -> str:
    """The one block of docs/how-to/migrations.md marked ``<!-- docs-test: by … name -->``."""
    (block,) = by_test(DOC, name)
    return block


def run_shell_block(block: str, replacements: dict[str, str]) -> list[Any]:
    """Every ``statesnap …`` command of a doc block, names substituted, in a fresh process."""
    outputs = []
    text = block.replace("\\\n", " ")
    for old, new in replacements.items():
        text = text.replace(old, new)
    for raw in text.splitlines():
        line = raw.split("  #", 1)[0].strip()
        if line:
            args = shlex.split(line)
            assert args[0] == "statesnap", line
            outputs.append(ok(statesnap(*args[1:])))
    return outputs


def test_docs_blue_green_clone(kafka: KafkaTool, topic_name: str, tmp_path: Path) -> None:
    """docs/how-to/migrations.md's blue/green blocks, run as written (names and the generation
    substituted): the new version starts from the clone and replays only the tail after it."""
    shell = doc_block("clone")
    python = doc_block("green")
    url = str(tmp_path / "ckpt")
    topic = kafka.create_topic(topic_name, PARTITIONS)
    records, manifests = write_generations(kafka, topic, url, {}, rounds=3)
    gen = manifests[1].generation
    listed, cloned = run_shell_block(
        shell, {"./ckpt": url, "orders-v2": f"{topic}-v2", "orders": topic, " 7 ": f" {gen} "}
    )
    assert f"gen {gen:>6}  COMPLETED" in listed
    assert cloned["table"] == f"{topic}-v2"
    assert cloned["generation"] == gen
    namespace: dict[str, Any] = {"BS": kafka.bootstrap, "URL": url}
    source = python.replace('"orders-v2"', repr(f"{topic}-v2")).replace('"orders"', repr(topic))
    exec(compile(source, "migrations.md", "exec"), namespace)
    green = namespace["green"]
    try:
        assert namespace["report"].checkpoint == gen
        assert namespace["report"].replayed_records == sum(
            1 for r in records if r.offset >= manifests[1].offsets[r.partition]
        )
        assert dict(green.raw_items()) == truth(records)
    finally:
        green.close(checkpoint=False)
    # The old version's table is untouched: its newest generation is still its own.
    assert locate_table(open_blob_store(url), topic).generations()[0] == manifests[-1].generation


def test_copy_blob_links_copies_server_side_or_through_the_process(s3_server: Any, tmp_path: Path) -> None:
    """The copy capability on real stores: a hard link on one filesystem, S3 ``CopyObject``
    within one service (moto server), bytes through the process between a directory and S3; each
    copy is an object of its own (deleting the source leaves it) and a missing source is
    ``BlobNotFoundError``."""
    from statesnap.blob import copy_blob
    from statesnap.errors import BlobNotFoundError

    options = s3_server.storage_options()
    bucket = s3_server.create_bucket(f"b-{uuid.uuid4().hex[:12]}")
    here, there = open_blob_store(str(tmp_path / "a")), open_blob_store(str(tmp_path / "b"))
    s3_a = open_blob_store(f"s3://{bucket}/a", **options)
    s3_b = open_blob_store(f"s3://{bucket}/b", **options)
    here.write("x/one.parquet", b"payload")
    assert copy_blob(here, "x/one.parquet", there, "y/one.parquet") == "link"
    assert copy_blob(here, "x/one.parquet", s3_a, "y/one.parquet") == "bytes"
    assert copy_blob(s3_a, "y/one.parquet", s3_b, "z/one.parquet") == "server"
    assert copy_blob(s3_b, "z/one.parquet", here, "back.parquet") == "bytes"
    here.delete(["x/one.parquet"])
    s3_a.delete(["y/one.parquet"])
    assert there.read("y/one.parquet") == b"payload"
    assert s3_b.read("z/one.parquet") == b"payload"
    assert here.read("back.parquet") == b"payload"
    for source, target in ((here, there), (s3_a, s3_b)):
        with pytest.raises(BlobNotFoundError):
            copy_blob(source, "x/one.parquet", target, "gone.parquet")


def test_clone_with_a_topic_snapshot_store(kafka: KafkaTool, topic_name: str, tmp_path: Path) -> None:
    """A table keeping its snapshot records in a Kafka topic: the clone's COMPLETED record goes to
    the same topic under the new table's name (proved on Tansu, whose transactions the topic
    store uses), and ``snapshot list`` of each table shows its own generations."""
    from statesnap import SnapshotOptions

    url = str(tmp_path / "ckpt")
    topic = kafka.create_topic(topic_name, PARTITIONS)
    records_topic = f"{topic_name}-snapshots"
    t = Table(
        topic,
        bootstrap_servers=kafka.bootstrap,
        background=False,
        checkpoints=CheckpointOptions(
            url, interval="1h", commit_interval="1h", snapshots=SnapshotOptions(f"topic:{records_topic}")
        ),
    )
    t.start()
    records: list[Rec] = []
    try:
        records += churn(kafka, topic, 0)
        kafka.drain(t, kafka.end_offsets(records, range(PARTITIONS)))
        first = t.checkpoint()
        assert first is not None
        records += churn(kafka, topic, 1)
        kafka.drain(t, kafka.end_offsets(records, range(PARTITIONS)))
        assert t.checkpoint() is not None
    finally:
        t.close(checkpoint=False)
    cluster = ["-b", kafka.bootstrap]
    missing_cluster = statesnap(
        "snapshot", "clone", url, "--table", topic, str(first.generation), "--to-table", "x"
    )
    one_line_error(missing_cluster, "SnapshotStoreError")
    ok(
        statesnap(
            "snapshot", "clone", url, "--table", topic, str(first.generation), "--to-table", "blue", *cluster
        )
    )
    listed = ok(statesnap("snapshot", "list", url, "--table", "blue", *cluster, "--json"))
    assert [(s["generation"], s["state"]) for s in listed] == [(first.generation, "COMPLETED")]
    assert len(ok(statesnap("snapshot", "list", url, "--table", topic, *cluster, "--json"))) == 2
    rows, report, _ = restore(kafka, topic, "blue", url, {})
    assert report.checkpoint == first.generation
    assert rows == truth(records)


def test_a_clone_that_fails_half_way_leaves_nothing_behind(
    kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    """The source's GC deleting a file while the clone copies (the race injected into a real
    directory store): the clone fails with a typed error, removes what it wrote, and the same
    target name can be cloned into at once."""
    from statesnap.blob import FileBlobStore
    from statesnap.errors import BlobNotFoundError
    from statesnap.snapshot.clone import clone_generation

    class RacedStore(FileBlobStore):
        """The target: before its second copy, the source's file of that copy is deleted."""

        copies = 0

        def copy_from(self, source: Any, source_key: str, key: str) -> str | None:
            RacedStore.copies += 1
            if RacedStore.copies == 2:
                source.delete([source_key])
            return super().copy_from(source, source_key, key)

    root = tmp_path / "ckpt"
    topic = kafka.create_topic(topic_name, PARTITIONS)
    records, manifests = write_generations(kafka, topic, str(root), {}, rounds=2, full=True)
    source = open_blob_store(str(root))
    with pytest.raises(BlobNotFoundError):
        clone_generation(source, topic, manifests[0].generation, "green", to=RacedStore(root))
    assert not list(root.glob("*_green")) or not any(root.glob("*_green/**/*.*")), "the partial clone stayed"
    result = clone_generation(source, topic, manifests[1].generation, "green")
    assert result.copied == {"link": len(manifests[1].files)}
    rows, report, _ = restore(kafka, topic, "green", str(root), {})
    assert report.checkpoint == manifests[1].generation
    assert rows == truth(records)
