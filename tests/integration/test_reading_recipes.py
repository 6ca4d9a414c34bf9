"""The recipes of docs/reading-checkpoints.md, run verbatim against a real checkpoint.

Each fenced block of the doc marked ``<!-- docs-test: by tests/… NAME -->`` is picked out with
``docsite.blocks.by_test`` and executed as it stands (the doc and the test cannot drift). The
checkpoint is written by a Python ``Table`` on the embedded broker with enough churn that every
partition of the newest checkpoint is a ``base`` and two ``delta`` files holding tombstones, while a
pinned older checkpoint keeps its own ``base`` files on disk. Ground truth is a replay of the
records the broker acknowledged (last write per key wins, a tombstone deletes), never statesnap's
reader. A naive glob of ``data/**`` is shown to resurrect deleted keys in this very store, so the
manifest rule is what makes the recipes right.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from base64 import b64decode
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from docsite.blocks import by_test
from statesnap import CheckpointOptions, RetentionPolicy, Table
from statesnap.checkpoint import CheckpointManifest
from statesnap.snapshot.api import SnapshotApi

pytestmark = pytest.mark.integration

DOC = Path(__file__).resolve().parents[2] / "docs" / "reading-checkpoints.md"
PARTITIONS = 2
KEYS = 240
#: key -> (value, partition, offset): what a reader of the table must return.
Truth = dict[bytes, tuple[bytes, int, int]]


def recipe(name: str) -> str:
    """The one block of the doc marked ``<!-- docs-test: by … name -->``."""
    found = by_test(DOC, name)
    assert len(found) == 1, f"{DOC.name} has {len(found)} blocks marked for {name}"
    return found[0]


def python_recipes(*names: str) -> dict[str, Any]:
    """Run the shared file-list block and then *names* in one namespace, as a user pastes them."""
    namespace: dict[str, Any] = {}
    for name in ("files", *names):
        exec(compile(recipe(name), f"{DOC.name}[{name}]", "exec"), namespace)
    return namespace


@dataclass(frozen=True)
class Written:
    """A checkpoint store after the churn, and everything the producer acknowledged."""

    topic: str
    bootstrap: str
    root: str  # the checkpoints URL the writer was given
    table_dir: str  # <root>/<cluster-id>_<table> as a local path
    newest: CheckpointManifest
    pinned: CheckpointManifest
    records: tuple[Any, ...]  # tests/integration/conftest.Rec, in produce order
    pinned_offsets: Mapping[int, int]  # end offsets of the records produced before the pin
    deleted_before_compaction: frozenset[bytes]  # deleted in deltas that GC has since removed
    started_ms: int

    def truth(self, manifest: CheckpointManifest) -> Truth:
        """Replay of the acknowledged records below the checkpoint's offsets."""
        table: Truth = {}
        for r in sorted(self.records, key=lambda r: (r.partition, r.offset)):
            if r.offset >= manifest.offsets.get(r.partition, 0):
                continue
            if r.value is None:
                table.pop(r.key, None)
            else:
                table[r.key] = (r.value, r.partition, r.offset)
        return table


def _value(i: int, version: int) -> bytes:
    return b"v%d-k%04d" % (version, i)


def _changes(round_no: int, live: set[int]) -> list[tuple[int, bytes, bytes | None]]:
    """A few updates and deletes in every partition (a key always goes to partition i % 2)."""
    updates = [i for i in sorted(live) if (i * 7 + round_no) % 9 == 0]
    deletes = [i for i in sorted(live) if i not in updates][round_no * 3 : round_no * 3 + 12]
    out: list[tuple[int, bytes, bytes | None]] = [
        (i % PARTITIONS, b"k%04d" % i, _value(i, round_no)) for i in updates
    ]
    out += [(i % PARTITIONS, b"k%04d" % i, None) for i in deletes]
    live.difference_update(deletes)
    return out


def write_checkpoints(kafka: Any, directory: Path) -> Written:
    """Base, pin, two deltas, compaction, two more deltas; eager GC keeps only newest and pinned.

    After it, the newest checkpoint lists per partition a base (written by the compaction) and two
    deltas with tombstones; the pinned first checkpoint's bases are still on disk and hold rows of
    keys deleted in deltas that GC removed — exactly what a glob of ``data/**`` trips over.
    """
    started_ms = int(time.time() * 1000)
    topic = kafka.create_topic(f"recipes-{uuid.uuid4().hex[:10]}", PARTITIONS)
    root = (directory / "checkpoints").as_uri()
    live = set(range(KEYS))
    records = kafka.produce(topic, [(i % PARTITIONS, b"k%04d" % i, _value(i, 0)) for i in range(KEYS)])
    pinned_offsets = kafka.end_offsets(records, range(PARTITIONS))
    eager = RetentionPolicy(min_count=1, min_age=timedelta(0), orphan_grace=timedelta(0))
    t = Table(
        topic,
        bootstrap_servers=kafka.bootstrap,
        checkpoints=CheckpointOptions(root, interval="1h", commit_interval="1h", retention=eager),
        background=False,
    )
    t.start()
    deleted_early: set[int] = set()
    try:
        pinned = t.checkpoint()
        assert pinned is not None
        api = SnapshotApi.open(root, topic)
        try:
            api.pin(pinned.generation)
        finally:
            api.close()
        newest = pinned
        for round_no in range(1, 6):
            before = set(live)
            batch = _changes(round_no, live)
            if round_no == 4:  # a key deleted earlier comes back: it must be in the table
                reborn = min(set(range(KEYS)) - live)
                batch.append((reborn % PARTITIONS, b"k%04d" % reborn, _value(reborn, round_no)))
                live.add(reborn)
                deleted_early.discard(reborn)
            if round_no <= 3:  # up to the compaction, whose new base has no tombstones
                deleted_early |= before - live
            records += kafka.produce(topic, batch)
            kafka.drain(t, kafka.end_offsets(records, range(PARTITIONS)))
            m = t.checkpoint(full=round_no == 3)  # round 3 compacts into a new base
            assert m is not None
            newest = m
        assert t.repo is not None
        assert t.repo.generations() == [newest.generation, pinned.generation], "GC kept others"
        table_dir = Path(t.repo.url.removeprefix("file://"))
    finally:
        t.close(checkpoint=False)
    return Written(
        topic,
        kafka.bootstrap,
        root,
        str(table_dir),
        newest,
        pinned,
        tuple(records),
        pinned_offsets,
        frozenset(b"k%04d" % i for i in deleted_early),
        started_ms,
    )


@pytest.fixture(scope="module")
def written(kafka: Any, tmp_path_factory: pytest.TempPathFactory) -> Written:
    w = write_checkpoints(kafka, tmp_path_factory.mktemp("recipes"))
    # the set-up is what the doc's rules are about, or the test proves nothing
    assert w.newest.offsets == kafka.end_offsets(w.records, range(PARTITIONS))
    assert w.pinned.offsets == w.pinned_offsets
    for p in range(PARTITIONS):
        files = w.newest.partitions[p].files
        assert [f.kind for f in files] == ["base", "delta", "delta"], files
        assert files[0].path not in {f.path for f in w.pinned.files}, "the base was not rewritten"
        tombstones = sum(pq.read_table(Path(w.table_dir, f.path)).column("value").null_count for f in files)
        assert tombstones > 0, f"partition {p}: no tombstone in the deltas"
    assert w.deleted_before_compaction, "no key was deleted before the compaction"
    assert {f.path for f in w.pinned.files} <= set(_data_files(w)), "pinned bases are gone"
    return w


def _data_files(w: Written) -> list[str]:
    return sorted(str(p.relative_to(w.table_dir)) for p in Path(w.table_dir, "data").rglob("*.parquet"))


def as_truth(table: pa.Table) -> Truth:
    """An engine's answer as key -> (value, partition, offset), with no key twice."""
    rows = table.select(["key", "value", "partition", "offset"]).to_pylist()
    out = {r["key"]: (r["value"], r["partition"], r["offset"]) for r in rows}
    assert len(out) == len(rows), "a key appears twice"
    return out


def assert_timestamps_are_the_records(table: pa.Table, w: Written) -> None:
    """UTC instants of when the test produced the records (not shifted, not null)."""
    millis = pc.cast(pc.cast(table["timestamp"], pa.timestamp("ms", tz="UTC")), pa.int64())
    assert millis.null_count == 0
    assert (
        w.started_ms - 5_000 <= pc.min(millis).as_py() <= pc.max(millis).as_py() <= time.time() * 1000 + 5_000
    )


def _checkpoints(w: Written) -> Iterator[tuple[int | None, CheckpointManifest]]:
    """(generation argument, manifest): the newest by default, and the pinned one by number."""
    yield None, w.newest
    yield w.pinned.generation, w.pinned


def test_pyarrow_recipe_reads_the_table(written: Written) -> None:
    ns = python_recipes("pyarrow")
    assert ns["checkpoint_files"](written.table_dir) == [
        (p, f"{written.table_dir}/{f.path}")
        for p, pc_ in sorted(written.newest.partitions.items())
        for f in pc_.files
    ]
    for generation, manifest in _checkpoints(written):
        table = ns["read_checkpoint_arrow"](written.table_dir, generation)
        assert table.schema.field("timestamp").type == pa.timestamp("ms", tz="UTC")
        assert as_truth(table) == written.truth(manifest)
        assert table["key"].to_pylist() == sorted(written.truth(manifest))
        assert_timestamps_are_the_records(table, written)
    # the same through a file:// URL, as `checkpoints list --json` prints the location
    table = ns["read_checkpoint_arrow"](Path(written.table_dir).as_uri())
    assert as_truth(table) == written.truth(written.newest)


def test_duckdb_recipe_reads_the_table(written: Written) -> None:
    duckdb = pytest.importorskip("duckdb")
    for generation, manifest in _checkpoints(written):
        con = duckdb.connect()
        # the doc's SET VARIABLE block, its example directory and generation replaced
        variables = recipe("duckdb-variables").replace(
            "'/data/statesnap/my-cluster-id_orders'", f"'{written.table_dir}'"
        )
        if generation is None:
            variables = "\n".join(line for line in variables.splitlines() if "generation" not in line)
        else:
            variables = variables.replace("generation = 7;", f"generation = {generation};")
        assert written.table_dir in variables
        con.execute(variables)
        result = con.sql(recipe("duckdb"))
        types = dict(zip(result.columns, map(str, result.types), strict=True))
        assert types["timestamp"] == "TIMESTAMP WITH TIME ZONE"
        table = _arrow(result)
        assert as_truth(table) == written.truth(manifest)
        assert table["key"].to_pylist() == sorted(written.truth(manifest))
        assert_timestamps_are_the_records(table, written)
        con.close()


def test_polars_recipe_reads_the_table(written: Written) -> None:
    pl = pytest.importorskip("polars")
    ns = python_recipes("polars")
    for generation, manifest in _checkpoints(written):
        df = ns["read_checkpoint_polars"](written.table_dir, generation)
        assert df.schema["timestamp"] == pl.Datetime("ms", "UTC")
        table = df.to_arrow()
        assert as_truth(table) == written.truth(manifest)
        assert table["key"].to_pylist() == sorted(written.truth(manifest))
        assert_timestamps_are_the_records(table, written)


def test_a_glob_of_data_resurrects_deleted_keys(written: Written) -> None:
    """The same merge over every file under data/ (instead of the manifest's list) is wrong:
    the pinned checkpoint's bases bring back keys whose tombstones GC removed with their deltas."""
    duckdb = pytest.importorskip("duckdb")
    assert len(_data_files(written)) > len(written.newest.files)
    naive = _arrow(
        duckdb.connect().sql(
            f"""SELECT key, value FROM read_parquet('{written.table_dir}/data/**/*.parquet')
                QUALIFY row_number() OVER (PARTITION BY key ORDER BY "offset" DESC) = 1
                    AND value IS NOT NULL"""
        )
    )
    truth = written.truth(written.newest)
    got = dict(zip(naive["key"].to_pylist(), naive["value"].to_pylist(), strict=True))
    resurrected = set(got) - set(truth)
    assert resurrected, "a glob of data/** gave the right table: the test set-up proves nothing"
    assert resurrected <= written.deleted_before_compaction
    assert {k: v for k, v in got.items() if k in truth} == {k: v[0] for k, v in truth.items()}


def test_cli_prints_the_manifest_for_scripts(written: Written) -> None:
    """`checkpoints list --json` gives the table directory, `checkpoints show --json` the files."""
    cli = [str(Path(sys.executable).with_name("statesnap")), "checkpoints"]
    listed = json.loads(_run([*cli, "list", written.root, "--table", written.topic, "--json"]))
    assert {row["location"] for row in listed} == {Path(written.table_dir).as_uri()}
    shown = json.loads(_run([*cli, "show", written.root, "--table", written.topic, "--json"]))
    assert shown["generation"] == written.newest.generation
    assert shown["state"] == "COMPLETED"
    files = [
        (int(p), f"{listed[0]['location']}/{f['path']}")
        for p, part in sorted(shown["partitions"].items(), key=lambda kv: int(kv[0]))
        for f in part["files"]
    ]
    ns = python_recipes()
    assert files == ns["checkpoint_files"](listed[0]["location"])
    assert shown["location"] == listed[0]["location"]
    urls = [
        (int(p), f["url"])
        for p, part in sorted(shown["partitions"].items(), key=lambda kv: int(kv[0]))
        for f in part["files"]
    ]
    assert urls == files


def test_dump_recipe_prints_a_checkpoint_exactly(written: Written, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "BOOTSTRAP": written.bootstrap,
        "TOPIC": written.topic,
        "CHECKPOINTS": written.root,
        "GENERATION": str(written.pinned.generation),
    }
    subprocess.run(
        ["bash", "-euo", "pipefail", "-c", recipe("dump")], env=env, cwd=tmp_path, check=True, timeout=60
    )
    rows = [json.loads(line) for line in (tmp_path / "table.jsonl").read_text().splitlines()]
    got = {_field(r, "key"): _field(r, "value") for r in rows}
    assert got == {k: v[0] for k, v in written.truth(written.pinned).items()}


def test_python_recipes_read_a_checkpoint_on_s3(
    written: Written, s3_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same store copied to S3 (moto), read with the usual AWS environment variables."""
    bucket = s3_server.create_bucket(f"b-{uuid.uuid4().hex[:12]}")
    client = s3_server.client()
    name = Path(written.table_dir).name
    for path in Path(written.table_dir).rglob("*"):
        if path.is_file():
            client.upload_file(str(path), bucket, f"statesnap/{name}/{path.relative_to(written.table_dir)}")
    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    table_dir = f"s3://{bucket}/statesnap/{name}"
    ns = python_recipes("pyarrow", "polars")
    for generation, manifest in _checkpoints(written):
        assert as_truth(ns["read_checkpoint_arrow"](table_dir, generation)) == written.truth(manifest)
        assert as_truth(ns["read_checkpoint_polars"](table_dir, generation).to_arrow()) == written.truth(
            manifest
        )


def _field(row: Mapping[str, str], name: str) -> bytes:
    return row[name].encode() if name in row else b64decode(row[f"{name}_b64"])


def _run(argv: list[str]) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=60).stdout


def _arrow(relation: Any) -> pa.Table:
    """A DuckDB relation as an Arrow table (``to_arrow_table`` in newer DuckDB, else the old name)."""
    fetch = getattr(relation, "to_arrow_table", None) or relation.fetch_arrow_table
    table: pa.Table = fetch()
    return table
