"""An application-wide snapshot of a processor: two stores, two instances, one generation.

Run on Apache Kafka (the session's ``apache_kafka``): nothing here needs more than ordered
partitions and EOF, but it is the broker issue #18's snapshot claim is made on. Both blob stores.

Each instance (``StaticShare(0, 2)`` and ``StaticShare(1, 2)``) is a task of the processor's
snapshots; ``statesnap snapshot create --wait`` completes when both reported, and a restart at
that one generation (``CheckpointOptions(url, generation=G)``) restores both stores of both
instances from it. The generation's files, read with pyarrow straight from the store, hold exactly
a plain loop's recomputation of the input below its offsets. Then pin, diff, delete and GC act on
it like on a table's, ``checkpoints verify`` passes, and a corrupted data file makes a restore
fall back to the older checkpoint for every store at once. Last, restore selection against the
broker: an input whose log start DeleteRecords moved past every checkpoint is never resumed over
the gap.
"""

from __future__ import annotations

import io
import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from integration.cli_runner import statesnap
from integration.conftest import KafkaTool, Rec
from statesnap import (
    CheckpointOptions,
    Processor,
    ProcessorContext,
    Record,
    RetentionPolicy,
    SnapshotOptions,
    StaticShare,
)
from statesnap.blob import open_blob_store
from statesnap.checkpoint import CheckpointRepository, layout
from statesnap.errors import GenerationNotFoundError, NoUsableCheckpointError

PARTITIONS = 4
INSTANCES = 2
ACCOUNTS = 60
NAME = "ledger"
STORES = ("balances", "payments")


@dataclass(frozen=True)
class Where:
    """A checkpoint location: the URL and options for the library, the CLI's URL and env."""

    url: str
    options: Mapping[str, str]
    cli_url: str
    env: Mapping[str, str]
    #: The snapshot store (None: blob, beside the checkpoints) and what the CLI needs to reach it.
    snapshot_store: str | None = None
    cli_extra: tuple[str, ...] = ()


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.long)])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Where:
    """``file``, ``s3``, or ``file+topic`` (snapshot records in a Kafka topic; only where a test
    asks for it with indirect parametrization)."""
    if request.param.startswith("file"):
        url = (tmp_path / "ckpt").as_uri()
        if request.param == "file+topic":
            kafka: KafkaTool = request.getfixturevalue("kafka")
            store = f"topic:snapshots-{os.urandom(6).hex()}"
            return Where(url, {}, url, {}, store, ("-b", kafka.bootstrap))
        return Where(url, {}, url, {})
    from statesnap.devstack.s3 import DEV_CREDENTIALS

    s3 = request.getfixturevalue("s3_server")
    bucket = s3.create_bucket(f"snap-{os.urandom(6).hex()}")
    url = f"s3://{bucket}/ckpt"
    return Where(url, s3.storage_options(), f"{url}?endpoint_url={s3.endpoint_url}", dict(DEV_CREDENTIALS))


def cli(where: Where, *args: str) -> Any:
    """``statesnap ARGS --json`` as a user runs it; the parsed output (asserting exit 0)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "STATESNAP_"))}
    result = statesnap(*args, "--json", env={**env, **where.env}, timeout=120)
    assert result.returncode == 0, f"{args}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return json.loads(result.stdout)


def ledger(
    bootstrap: str,
    topic: str,
    where: Where,
    instance: int,
    *,
    generation: int | None = None,
    require: bool = False,
) -> Processor:
    """One instance of the processor: per account a balance and a payment count, JSON values."""
    proc = Processor(
        NAME,
        inputs=[topic],
        bootstrap_servers=bootstrap,
        checkpoints=CheckpointOptions(
            where.url,
            storage_options=where.options,
            interval="1h",
            commit_interval="100ms",
            retention=RetentionPolicy(min_count=10),
            snapshots=SnapshotOptions(where.snapshot_store, timeout="45s"),
            generation=generation,
            require=require,
        ),
        stores=STORES,
        value_serde="json",
        partitions=StaticShare(instance, INSTANCES),
        timeout=20.0,
    )

    @proc.handler
    def on_payment(record: Record, ctx: ProcessorContext) -> None:
        balances, payments = ctx.stores["balances"], ctx.stores["payments"]
        balances[record.key] = balances.get(record.key, 0) + record.value["amount"]
        payments[record.key] = payments.get(record.key, 0) + 1

    return proc


def pay(kafka: KafkaTool, topic: str, start: int, n: int) -> None:
    kafka.produce(
        topic,
        (
            (i % ACCOUNTS % PARTITIONS, b"acct-%03d" % (i % ACCOUNTS), json.dumps({"amount": i}).encode())
            for i in range(start, start + n)
        ),
    )


def recompute(
    records: Sequence[Rec], offsets: Mapping[int, int] | None = None
) -> dict[str, dict[bytes, Any]]:
    """Both stores from the records below *offsets* (all without): a plain loop, not statesnap."""
    balances: dict[bytes, Any] = {}
    payments: dict[bytes, Any] = {}
    for r in records:
        if offsets is not None and r.offset >= offsets[r.partition]:
            continue
        assert r.key is not None
        assert r.value is not None
        balances[r.key] = balances.get(r.key, 0) + json.loads(r.value)["amount"]
        payments[r.key] = payments.get(r.key, 0) + 1
    return {"balances": balances, "payments": payments}


def generation_files(where: Where, generation: int) -> tuple[dict[int, int], dict[str, dict[bytes, Any]]]:
    """(input offsets, both stores) of one generation, read from its manifest and Parquet files
    with pyarrow (the store key layout of processor/keyspace.py decoded here)."""
    store = open_blob_store(where.url, **where.options)
    (directory,) = store.list_dirs("")
    manifest = json.loads(store.read(f"{directory}/{layout.manifest_key(generation)}"))
    offsets: dict[int, int] = {}
    stores: dict[str, dict[bytes, Any]] = {s: {} for s in STORES}
    for partition, entry in manifest["partitions"].items():
        offsets[int(partition)] = int(entry["next_offset"])
        rows: dict[bytes, bytes | None] = {}
        for f in entry["files"]:
            table = pq.read_table(io.BytesIO(store.read(f"{directory}/{f['path']}"))).to_pydict()
            rows.update(zip(table["key"], table["value"], strict=True))
        for key, value in rows.items():
            name, _, rest = key.partition(b"\x00")
            assert int.from_bytes(rest[:4], "big") == int(partition), key
            if value is None or name == b"_statesnap":
                continue
            stores[name.decode()][rest[4:]] = json.loads(value)
    return offsets, stores


def repo_of(where: Where) -> CheckpointRepository:
    store = open_blob_store(where.url, **where.options)
    (directory,) = store.list_dirs("")
    return CheckpointRepository(store, directory)


@dataclass
class Running:
    """Both instances, started (background threads), closed without a checkpoint at the end."""

    procs: list[Processor]

    def close(self) -> None:
        for proc in self.procs:
            proc.close(checkpoint=False)

    def stores(self) -> dict[str, dict[bytes, Any]]:
        out: dict[str, dict[bytes, Any]] = {s: {} for s in STORES}
        for proc in self.procs:
            for s in STORES:
                mine = dict(proc.store(s).items())
                assert not mine.keys() & out[s].keys(), "two instances hold one key"
                out[s].update(mine)
        return out

    def wait_until(self, kafka: KafkaTool, records: Sequence[Rec]) -> None:
        """Until both instances processed every record (their tasks' offsets)."""
        ends = kafka.end_offsets(records, range(PARTITIONS))

        def caught_up() -> bool:
            return all(p.task.offsets.get(q, 0) >= ends[q] for p in self.procs for q in p.task.partitions)

        kafka.wait_for(caught_up, timeout=30, what="both instances catching up")


def start_both(bootstrap: str, topic: str, where: Where, generation: int | None = None) -> Running:
    procs = [ledger(bootstrap, topic, where, i, generation=generation) for i in range(INSTANCES)]
    for proc in procs:
        proc.start()
    return Running(procs)


@pytest.fixture
def app(kafka: KafkaTool, where: Where) -> Iterator[tuple[str, Running]]:
    topic = kafka.create_topic(f"pay-{os.urandom(6).hex()}", PARTITIONS)
    pay(kafka, topic, 0, 600)
    running = start_both(kafka.bootstrap, topic, where)
    try:
        yield topic, running
    finally:
        running.close()


def snapshot(where: Where) -> dict[str, Any]:
    snap: dict[str, Any] = cli(
        where,
        "snapshot",
        "create",
        where.cli_url,
        "--table",
        NAME,
        "--wait",
        "--timeout",
        "45s",
        *where.cli_extra,
    )
    assert snap["state"] == "COMPLETED", snap
    assert sorted(t["task_id"] for t in snap["tasks"]) == ["instance-0", "instance-1"]
    assert sorted(o["partition"] for t in snap["tasks"] for o in t["offsets"]) == list(range(PARTITIONS))
    return snap


@pytest.mark.parametrize(
    "where",
    ["file", pytest.param("s3", marks=pytest.mark.long), pytest.param("file+topic", marks=pytest.mark.long)],
    indirect=True,
)
def test_app_snapshot_over_two_stores_and_two_instances_restores_at_one_generation(
    kafka: KafkaTool, where: Where, app: tuple[str, Running]
) -> None:
    """Apache Kafka; file and S3, and snapshot records in a Kafka topic (beside file)."""
    topic, running = app
    pay(kafka, topic, 600, 400)  # the snapshot is taken while both instances process
    snap = snapshot(where)
    gen = snap["generation"]
    offsets, files = generation_files(where, gen)
    records = kafka.read_all(topic, range(PARTITIONS))
    assert offsets == {o["partition"]: o["next_offset"] for t in snap["tasks"] for o in t["offsets"]}
    assert files == recompute(records, offsets)  # every store, every partition, at one set of offsets
    writer = repo_of(where).read_manifest(gen).writer
    assert writer["processor"] == {
        "inputs": [topic],
        "stores": {s: {"kind": "key_value"} for s in STORES},
    }, writer

    pay(kafka, topic, 1000, 300)
    records = kafka.read_all(topic, range(PARTITIONS))
    running.wait_until(kafka, records)
    assert running.stores() == recompute(records)
    running.close()

    # A restart at that one generation: both instances restore both stores from it, then the tail.
    again = start_both(kafka.bootstrap, topic, where, generation=gen)
    try:
        reports = [p.report for p in again.procs]
        assert [r.checkpoint for r in reports] == [gen, gen]
        assert sum(r.replayed_records for r in reports) == len(records) - sum(offsets.values())
        assert again.stores() == recompute(records)
    finally:
        again.close()


def new_accounts(kafka: KafkaTool, topic: str, first: int, n: int) -> None:
    """Payments of accounts no earlier record touched (keys a diff must call added)."""
    kafka.produce(
        topic,
        (
            (a % PARTITIONS, b"acct-%03d" % a, json.dumps({"amount": 1}).encode())
            for a in range(first, first + n)
        ),
    )


def test_pin_diff_delete_gc_and_verify_act_on_a_processor_snapshot(
    kafka: KafkaTool, where: Where, app: tuple[str, Running]
) -> None:
    """Apache Kafka; file and S3. A processor's snapshot is pinned, diffed, deleted and
    collected as a table's is, through the same CLI."""
    topic, running = app
    old = snapshot(where)["generation"]
    pay(kafka, topic, 600, 10)  # ten accounts change
    new_accounts(kafka, topic, ACCOUNTS, 5)  # five accounts appear
    new = snapshot(where)["generation"]
    running.close()

    diff = cli(where, "snapshot", "diff", where.cli_url, str(old), str(new), "--table", NAME)
    # Counted in (store, key) pairs of the processor's stores only (not its stream-time keys):
    # 60 accounts in two stores; ten change, five appear.
    got = (diff["old"], diff["new"], diff["added"], diff["removed"], diff["changed"], diff["unchanged"])
    assert got == (120, 130, 10, 0, 20, 100), diff

    states = {
        s["generation"]: s["state"] for s in cli(where, "snapshot", "list", where.cli_url, "--table", NAME)
    }
    assert (states[old], states[new]) == ("COMPLETED", "COMPLETED"), states
    shown = cli(where, "snapshot", "show", where.cli_url, "--table", NAME, str(new))
    assert sorted(t["task_id"] for t in shown["tasks"]) == ["instance-0", "instance-1"], shown
    assert cli(where, "snapshot", "pin", where.cli_url, "--table", NAME, str(old))["pinned"] is True
    refused = statesnap(
        "snapshot", "delete", where.cli_url, "--table", NAME, str(old), env={**os.environ, **where.env}
    )
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert [line for line in refused.stderr.splitlines() if line.startswith("Error:")], refused.stderr
    assert "Traceback" not in refused.stderr
    gc = ["checkpoints", "gc", where.cli_url, "--min-count", "1", "--min-age", "0s", "--orphan-grace", "0s"]
    cli(where, *gc)
    assert set(repo_of(where).generations()) == {old, new}, "GC removed a pinned snapshot"
    pinned_files = {f.path for f in repo_of(where).read_manifest(old).files}

    cli(where, "snapshot", "unpin", where.cli_url, "--table", NAME, str(old))
    deleted = statesnap(
        "snapshot", "delete", where.cli_url, "--table", NAME, str(old), env={**os.environ, **where.env}
    )
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr
    cli(where, *gc)
    repo = repo_of(where)
    assert repo.generations() == [new]
    kept = {f.path for f in repo.read_manifest(new).files}
    listed = {b.key[len(repo.directory) + 1 :] for b in repo.store.list(repo.directory + "/data/")}
    assert listed == kept, (
        f"GC left {sorted(listed - kept)} (the deleted snapshot had {sorted(pinned_files)})"
    )
    verified = cli(where, "checkpoints", "verify", where.cli_url)
    assert all(v["ok"] for v in verified), verified
    assert {v["generation"] for v in verified} == {new, None}

    records = kafka.read_all(topic, range(PARTITIONS))
    gone = ledger(kafka.bootstrap, topic, where, 0, generation=old)
    with pytest.raises(GenerationNotFoundError, match=str(old)):
        gone.start()
    gone.close(checkpoint=False)
    latest = start_both(kafka.bootstrap, topic, where)
    try:
        assert [p.report.checkpoint for p in latest.procs] == [new, new]
        assert latest.stores() == recompute(records)
    finally:
        latest.close()


def test_corrupt_data_file_falls_back_to_the_older_checkpoint_for_every_store(
    kafka: KafkaTool, where: Where, app: tuple[str, Running]
) -> None:
    """Apache Kafka; file and S3. A flipped byte in one partition's file of the newest snapshot
    (same size: only the checksum tells): ``checkpoints verify`` fails naming it, and a restart
    restores both stores from the older snapshot plus the tail, never one store from each."""
    topic, running = app
    older = snapshot(where)["generation"]
    pay(kafka, topic, 600, 200)
    newer = snapshot(where)["generation"]
    running.close()
    repo = repo_of(where)
    only_newer = [f for f in repo.read_manifest(newer).partitions[0].files if f"/{newer:020d}/" in f.path]
    assert only_newer, "the newer snapshot wrote no file of partition 0"
    key = repo.key(only_newer[-1].path)
    data = bytearray(repo.store.read(key))
    data[len(data) // 2] ^= 0x5A
    repo.store.write(key, bytes(data))

    verify = statesnap("checkpoints", "verify", where.cli_url, "--json", env={**os.environ, **where.env})
    assert verify.returncode == 1, verify.stdout + verify.stderr
    bad = {v["generation"] for v in json.loads(verify.stdout) if not v["ok"]}
    assert bad == {newer}, verify.stdout

    records = kafka.read_all(topic, range(PARTITIONS))
    again = start_both(kafka.bootstrap, topic, where)
    try:
        first, second = (p.report for p in again.procs)
        # Instance 0 owns partition 0: both its stores come from the older snapshot (one keyspace,
        # one set of files per partition), and its whole tail since then is re-processed.
        assert first.checkpoint == older
        assert [s.generation for s in first.skipped] == [newer]
        assert "checksum" in first.skipped[0].reason
        older_offsets = repo.read_manifest(older).offsets
        mine = [r for r in records if r.partition % INSTANCES == 0]
        assert first.replayed_records == sum(1 for r in mine if r.offset >= older_offsets[r.partition])
        # Instance 1's partitions' files are intact: a task's choice is its own partitions'.
        assert (second.checkpoint, second.skipped) == (newer, [])
        assert again.stores() == recompute(records)
    finally:
        again.close()


@pytest.mark.parametrize("where", ["file"], indirect=True)  # restore selection: the store plays no part
def test_input_log_start_past_every_checkpoint_is_never_skipped_silently(
    kafka: KafkaTool, where: Where, app: tuple[str, Running], caplog: pytest.LogCaptureFixture
) -> None:
    """Apache Kafka (DeleteRecords moves partition 0's log start past both snapshots' offsets):
    with ``require`` the instance owning it fails naming the log start; without, it never resumes
    at a checkpoint's offsets over the gap (Quix Streams #1115, Faust #651): it processes what
    the log holds, says so, and its stores equal that recomputation. The other instance, whose
    partitions kept their history, restores the newest snapshot."""
    topic, running = app
    older = snapshot(where)["generation"]
    pay(kafka, topic, 600, 200)
    newer = snapshot(where)["generation"]
    running.close()
    pay(kafka, topic, 800, 200)  # records past the newest snapshot, some of which go
    history = kafka.read_all(topic, range(PARTITIONS))
    cut = repo_of(where).read_manifest(newer).offsets[0] + 10
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, cut)]).values():
        future.result(15)
    left = kafka.read_all(topic, range(PARTITIONS))
    assert min(r.offset for r in left if r.partition == 0) == cut

    strict = ledger(kafka.bootstrap, topic, where, 0, require=True)
    with pytest.raises(NoUsableCheckpointError, match=f"log now starts at {cut}"):
        strict.start()
    strict.close(checkpoint=False)

    caplog.set_level(logging.WARNING)
    again = start_both(kafka.bootstrap, topic, where)
    try:
        first, second = (p.report for p in again.procs)
        assert first.checkpoint is None
        assert [s.generation for s in first.skipped] == [newer, older]
        assert all(f"log now starts at {cut}" in s.reason for s in first.skipped), first.skipped
        assert f"log now starts at {cut}" in caplog.text
        assert (second.checkpoint, second.skipped) == (newer, [])
        stores = again.stores()
    finally:
        again.close()
    want = recompute(left)
    mine = {r.key for r in left if r.partition % INSTANCES == 0}
    for s in STORES:
        assert {k: v for k, v in stores[s].items() if k in mine} == {
            k: v for k, v in want[s].items() if k in mine
        }
    full = recompute(history)
    assert {k: v for k, v in stores["balances"].items() if k not in mine} == {
        k: v for k, v in full["balances"].items() if k not in mine
    }
