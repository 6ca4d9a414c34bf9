"""State versions, migrations and start-from on a real broker (the suite's Apache Kafka and Tansu
proved every test here; none depends on a behaviour where they differ: produce, consume to partition
EOF).

Ground truth is independent of statesnap: a plain confluent-kafka consumer loop reads the topic
(``kafka.read_all``) and the KTable rule (last write wins, a tombstone deletes) builds the table a
full replay under the new code must hold (#20).
"""

from __future__ import annotations

import json
import random
import re
import shlex
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from docsite.blocks import by_test
from integration.cli_runner import STATESNAP, ok
from statesnap import CheckpointOptions, Follower, StateVersion, Table
from statesnap.blob import open_blob_store
from statesnap.checkpoint.discovery import locate_table
from statesnap.checkpoint.manifest import FileKind
from statesnap.checkpoint.repository import CheckpointRepository
from statesnap.errors import CheckpointMismatchError, ConfigError
from statesnap.snapshot.api import SnapshotApi
from statesnap.task.offline_migration import migrate_checkpoint
from statesnap.task.rowfilter import RowFilter

pytestmark = pytest.mark.integration

PARTITIONS = 3


def keep(*fields: str) -> Any:
    """A value projection keeping *fields* of a JSON object (idempotent, as a writer's must be:
    a restore applies it again to the rows it wrote)."""

    def project(value: bytes) -> bytes:
        obj = json.loads(value)
        return json.dumps({f: obj[f] for f in fields if f in obj}, sort_keys=True).encode()

    return project


V1, V2 = keep("a", "b"), keep("a")


def v1_to_v2(key: bytes, value: bytes) -> tuple[bytes, bytes]:
    """The worked migration: version-1 rows hold {a, b}; version 2 keeps only a."""
    return key, V2(value)


def batch(rng: random.Random, n: int, tag: str) -> list[tuple[int, bytes, bytes | None]]:
    out: list[tuple[int, bytes, bytes | None]] = []
    for i in range(n):
        key = b"k%03d" % rng.randrange(50)
        value = None if rng.random() < 0.1 else json.dumps({"a": i, "b": tag, "c": "x" * (i % 7)}).encode()
        out.append((key[-1] % PARTITIONS, key, value))
    return out


def table(
    kafka: Any, topic: str, url: str | CheckpointOptions, projection: Any, **kw: Any
) -> Table[bytes, bytes]:
    return Table(
        topic,
        bootstrap_servers=kafka.bootstrap,
        checkpoints=url,
        background=False,
        row_filter=RowFilter(value_projection=projection),
        **kw,
    )


def full_replay(kafka: Any, topic: str, projection: Any) -> dict[bytes, bytes]:
    """The table a full replay under *projection* holds, from a plain consumer loop."""
    return {k: projection(v) for k, v in kafka.truth(kafka.read_all(topic, range(PARTITIONS))).items()}


def generation_rows(repo: CheckpointRepository, generation: int) -> dict[bytes, bytes]:
    manifest = repo.read_manifest(generation)
    out: dict[bytes, bytes] = {}
    for _, rows in repo.iter_partitions(manifest):
        out.update(zip(rows.column("key").to_pylist(), rows.column("value").to_pylist(), strict=True))
    return out


@pytest.fixture
def version_1(kafka: Any, tmp_path: Path) -> dict[str, Any]:
    """A topic whose generation 1 was written by version-1 code (``tail()`` adds records it does
    not hold)."""
    rng = random.Random(20)
    topic = kafka.create_topic(f"mig-{uuid.uuid4().hex[:12]}", PARTITIONS)
    url = (tmp_path / "cp").as_uri()
    produced = kafka.produce(topic, batch(rng, 300, "one"))
    t = table(kafka, topic, url, V1)
    t.start()
    try:
        manifest = t.checkpoint()
        assert manifest is not None
        assert manifest.generation == 1
        assert manifest.state_version(topic) == 1
        assert manifest.state_versions == {topic: 1}  # recorded, not implied
    finally:
        t.close(checkpoint=False)
    return {
        "topic": topic,
        "url": url,
        "n": len(produced),
        "tail": lambda: len(kafka.produce(topic, batch(rng, 120, "two"))),
    }


def test_projection_change_is_refused_without_a_migration_and_equals_full_replay_with_one(
    kafka: Any, version_1: dict[str, Any]
) -> None:
    topic, url = version_1["topic"], version_1["url"]
    tail = version_1["tail"]()
    new_code = table(kafka, topic, url, V2, state=2)
    with pytest.raises(CheckpointMismatchError) as e:
        new_code.start()
    new_code.close(checkpoint=False)
    assert "state version 1" in str(e.value)
    assert "version 2" in str(e.value)
    assert "\n" not in str(e.value)

    migrated = table(kafka, topic, url, V2, state=StateVersion(2, {1: v1_to_v2}))
    report = migrated.start()
    try:
        assert report.checkpoint == 1
        assert report.migrated_from == 1
        assert report.replayed_records == tail  # from generation 1's offsets, not 0
        assert dict(migrated.raw_items()) == full_replay(kafka, topic, V2)
        manifest = migrated.checkpoint()
        assert manifest is not None
        assert manifest.generation == 2
        assert manifest.state_version(topic) == 2
        # A full base per partition: no file of the version-1 generation is built on.
        assert all(f.kind is FileKind.BASE and f.path.startswith(f"data/{2:020d}/") for f in manifest.files)
    finally:
        migrated.close(checkpoint=False)

    # The new code restarts from its own generation without migrating; the old code is refused.
    again = table(kafka, topic, url, V2, state=2)
    report = again.start()
    try:
        assert (report.checkpoint, report.migrated_from) == (2, None)
        assert dict(again.raw_items()) == full_replay(kafka, topic, V2)
    finally:
        again.close(checkpoint=False)
    old_code = table(kafka, topic, url, V1)
    with pytest.raises(CheckpointMismatchError, match="newer than this code's version 1"):
        old_code.start()
    old_code.close(checkpoint=False)
    # Readers run no user code: they read either version as it is (version 1 rows still hold b).
    for gen in (1, 2):
        options = CheckpointOptions(url, generation=gen)
        with Follower(topic, bootstrap_servers=kafka.bootstrap, checkpoints=options, tail=False) as reader:
            assert reader.report.checkpoint == gen
            assert {"b" in json.loads(v) for v in reader.values()} == {gen == 1}


def test_offline_migration_equals_the_lazy_one_and_pins_its_source(
    kafka: Any, version_1: dict[str, Any]
) -> None:
    topic, url = version_1["topic"], version_1["url"]
    repo = locate_table(open_blob_store(url), topic)
    dry = migrate_checkpoint(url, topic, v1_to_v2, dry_run=True)
    assert (dry.generation, dry.from_version, dry.to_version) == (None, 1, 2)
    assert dry.counts.kept + dry.counts.changed + dry.counts.dropped == repo.read_manifest(1).keys
    assert dry.counts.changed > 0
    assert dry.samples
    assert repo.generations() == [1]  # a dry run writes nothing

    offline = migrate_checkpoint(url, topic, {1: v1_to_v2})
    assert (offline.generation, offline.to_version) == (2, 2)
    assert repo.read_manifest(2).state_version(topic) == 2
    # Running it again is refused, not applied twice.
    with pytest.raises(CheckpointMismatchError, match="holds state version 2, not 1"):
        migrate_checkpoint(url, topic, v1_to_v2)
    with pytest.raises(ConfigError, match="above the checkpoint's state version 2"):
        migrate_checkpoint(url, topic, {1: v1_to_v2})
    assert repo.generations() == [2, 1]
    api = SnapshotApi.for_repo(repo, topic)
    try:
        assert api.get(1).pinned
    finally:
        api.close()

    # The lazy one: version-2 code restoring generation 1 (nothing past its offsets to consume)
    # writes its first checkpoint at version 2 even though no offset moved.
    lazy = table(kafka, topic, CheckpointOptions(url, generation=1), V2, state=StateVersion(2, {1: v1_to_v2}))
    report = lazy.start()
    try:
        assert (report.checkpoint, report.migrated_from, report.replayed_records) == (1, 1, 0)
        lazy_manifest = lazy.checkpoint()
        assert lazy_manifest is not None
        assert lazy_manifest.generation == 3
        assert lazy_manifest.offsets == repo.read_manifest(2).offsets
    finally:
        lazy.close(checkpoint=False)
    assert generation_rows(repo, 2) == generation_rows(repo, 3) == full_replay(kafka, topic, V2)

    # And a table of version 2 restores the newest (the lazy one's) as it is.
    after = table(kafka, topic, url, V2, state=2)
    report = after.start()
    try:
        assert (report.checkpoint, report.migrated_from) == (3, None)
        assert dict(after.raw_items()) == full_replay(kafka, topic, V2)
    finally:
        after.close(checkpoint=False)


def test_an_exact_generation_equals_reprocessing_up_to_its_offsets_plus_the_rest(
    kafka: Any, tmp_path: Path
) -> None:
    rng = random.Random(21)
    topic = kafka.create_topic(f"from-{uuid.uuid4().hex[:12]}", PARTITIONS)
    url = (tmp_path / "cp").as_uri()
    owner: Table[bytes, bytes] = Table(
        topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False
    )
    owner.start()
    produced: list[Any] = []
    offsets: dict[int, dict[int, int]] = {}
    try:
        for gen in (1, 2, 3):
            produced += kafka.produce(topic, batch(rng, 150, f"g{gen}"))
            kafka.drain(owner, kafka.end_offsets(produced, range(PARTITIONS)))
            manifest = owner.checkpoint()
            assert manifest is not None
            assert manifest.generation == gen
            offsets[gen] = manifest.offsets
    finally:
        owner.close(checkpoint=False)
    produced += kafka.produce(topic, batch(rng, 80, "tail"))
    repo = locate_table(open_blob_store(url), topic)
    api = SnapshotApi.for_repo(repo, topic)
    try:
        api.pin(2)
    finally:
        api.close()
    before = {g: repo.store.read(repo.key(f"snapshots/{g:020d}.json")) for g in (1, 2, 3)}

    # Ground truth: re-process, with a plain consumer loop, everything below generation 1's
    # offsets, then the rest.
    records = kafka.read_all(topic, range(PARTITIONS))
    upto = [r for r in records if r.offset < offsets[1][r.partition]]
    rest = [r for r in records if r.offset >= offsets[1][r.partition]]
    expected = kafka.truth(upto)
    for r in rest:
        if r.value is None:
            expected.pop(r.key, None)
        else:
            expected[r.key] = r.value

    t: Table[bytes, bytes] = Table(
        topic,
        bootstrap_servers=kafka.bootstrap,
        checkpoints=CheckpointOptions(url, generation=1),
        background=False,
    )
    report = t.start()
    try:
        assert report.checkpoint == 1
        assert report.replayed_records == len(rest)
        assert dict(t.raw_items()) == expected
        manifest = t.checkpoint()
        assert manifest is not None
        assert manifest.generation == 4  # numbered above the later generations
    finally:
        t.close(checkpoint=False)
    assert set(repo.generations()) == {1, 2, 3, 4}  # later generations stay
    assert {g: repo.store.read(repo.key(f"snapshots/{g:020d}.json")) for g in (1, 2, 3)} == before
    api = SnapshotApi.for_repo(repo, topic)
    try:
        assert api.get(2).pinned
    finally:
        api.close()


DOC = Path(__file__).resolve().parents[3] / "docs" / "how-to" / "migrations.md"


def doc_block(name: str) -> str:
    """The one block of docs/how-to/migrations.md marked ``<!-- docs-test: by … name -->``."""
    (block,) = by_test(DOC, name)
    return block


def run_doc_commands(block: str, names: dict[str, str], cwd: Path) -> list[Any]:
    """Every ``statesnap …`` line of a doc block, arguments substituted, in a fresh process
    started in *cwd* (where the user's migration module is)."""
    outputs = []
    for line in block.replace("\\\n", " ").splitlines():
        if line.strip():
            args = [names.get(a, a) for a in shlex.split(line.split("  #", 1)[0])]
            assert args[0] == "statesnap", line
            result = subprocess.run(
                [*STATESNAP, *args[1:]], capture_output=True, text=True, timeout=180, check=False, cwd=cwd
            )
            outputs.append(ok(result))
    return outputs


def test_docs_migration_and_start_from(kafka: Any, tmp_path: Path) -> None:
    """docs/how-to/migrations.md's "Migrations" and "Start from any snapshot" blocks, run as
    written (names, the store and the generation substituted): the lazy migration equals a full
    replay under the new code, the offline one equals the lazy one, and materialize starts from the
    generation named."""
    python = doc_block("lazy-migration")
    offline = doc_block("offline-migration")
    start_from = doc_block("start-from")
    topic = kafka.create_topic(f"orders-{uuid.uuid4().hex[:12]}", PARTITIONS)
    url = str(tmp_path / "ckpt")
    statuses = ["new", "paid", "shipped"]
    kafka.produce(
        topic,
        [
            (  # a key always lives in one partition, as with a partitioner
                i % 40 % PARTITIONS,
                b"o-%02d" % (i % 40),
                json.dumps({"status": statuses[i % 3], "amount": i}).encode(),
            )
            for i in range(200)
        ],
    )
    old = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)
    old.start()
    try:
        assert old.checkpoint() is not None  # generation 1, written by version-1 code
    finally:
        old.close(checkpoint=False)

    namespace: dict[str, Any] = {"BS": kafka.bootstrap, "URL": url}
    exec(compile(python.replace('"orders"', repr(topic)), "migrations.md", "exec"), namespace)
    orders, status_only = namespace["orders"], namespace["status_only"]
    try:
        assert (namespace["report"].checkpoint, namespace["report"].migrated_from) == (1, 1)
        lazy = dict(orders.raw_items())
        assert lazy == full_replay(kafka, topic, status_only)
    finally:
        orders.close(checkpoint=False)

    migration = re.search(r"def v1_to_v2.*?\n\n", python, re.S)
    assert migration is not None
    (tmp_path / "order_migrations.py").write_text("import json\n\n" + migration.group(0))
    dry, done = run_doc_commands(offline, {"./ckpt": url, "orders": topic}, tmp_path)
    assert "0 dropped" in dry
    assert (done["source_generation"], done["generation"], done["to_version"]) == (1, 2, 2)
    repo = locate_table(open_blob_store(url), topic)
    assert generation_rows(repo, 2) == lazy
    api = SnapshotApi.for_repo(repo, topic)
    try:
        assert api.get(1).pinned
    finally:
        api.close()

    kafka.produce(topic, [(0, b"o-99", json.dumps({"status": "new", "amount": 1}).encode())])
    (started,) = run_doc_commands(
        start_from, {"./ckpt": url, "orders": topic, "7": "1", "127.0.0.1:9092": kafka.bootstrap}, tmp_path
    )
    assert (started["restore"]["checkpoint"], started["restore"]["replayed_records"]) == (1, 1)
    assert started["checkpoint"] == 3
    assert started["keys"] == len(kafka.truth(kafka.read_all(topic, range(PARTITIONS))))


@pytest.mark.long
def test_a_group_member_migrates_the_partitions_it_gains(kafka: Any, version_1: dict[str, Any]) -> None:
    """A consumer-group member restores the partitions a rebalance gives it through the same
    migration (Tansu's classic group protocol assigns them), and its checkpoint is complete at the
    new version."""
    topic, url = version_1["topic"], version_1["url"]
    version_1["tail"]()
    member: Table[bytes, bytes] = Table(
        topic,
        bootstrap_servers=kafka.bootstrap,
        checkpoints=CheckpointOptions(url, commit_interval="1s"),
        group=f"g-{uuid.uuid4().hex[:8]}",
        row_filter=RowFilter(value_projection=V2),
        state=StateVersion(2, {1: v1_to_v2}),
    )
    report = member.start()
    try:
        assert (report.checkpoint, report.migrated_from) == (1, 1)
        expected = full_replay(kafka, topic, V2)
        kafka.wait_for(lambda: dict(member.raw_items()) == expected, what="the member to catch up")
        manifest = member.checkpoint()
        assert manifest is not None
        assert manifest.state_version(topic) == 2
        assert all(f.kind is FileKind.BASE and f.path.startswith(f"data/{2:020d}/") for f in manifest.files)
    finally:
        member.close(checkpoint=False)


@pytest.mark.long
def test_offline_migration_on_s3_with_a_topic_snapshot_store(kafka: Any, s3_location: Any) -> None:
    """The other blob store (moto's S3 server) and the other snapshot store (records in a Kafka topic,
    on Tansu): the offline migration pins its source and commits the new generation through them."""
    from statesnap.kafka.config import KafkaSettings
    from statesnap.task.options import SnapshotOptions

    topic = kafka.create_topic(f"mig-s3-{uuid.uuid4().hex[:12]}", PARTITIONS)
    spec = f"topic:{topic}-snapshots"
    kafka.produce(topic, batch(random.Random(22), 200, "one"))
    options = CheckpointOptions(
        s3_location.url, storage_options=s3_location.options, snapshots=SnapshotOptions(store=spec)
    )
    t = table(kafka, topic, options, V1)
    t.start()
    try:
        assert t.checkpoint() is not None
    finally:
        t.close(checkpoint=False)
    settings = KafkaSettings(kafka.bootstrap)
    done = migrate_checkpoint(
        s3_location.url,
        topic,
        v1_to_v2,
        storage_options=s3_location.options,
        snapshot_store=spec,
        kafka=settings,
    )
    assert (done.source_generation, done.generation) == (1, 2)
    repo = locate_table(open_blob_store(s3_location.url, **s3_location.options), topic)
    api = SnapshotApi.for_repo(repo, topic, snapshot_store=spec, kafka=settings)
    try:
        assert api.get(1).pinned
        assert api.get(2).state.value == "COMPLETED"
    finally:
        api.close()
    after = table(kafka, topic, options, V2, state=2)
    report = after.start()
    try:
        assert (report.checkpoint, report.migrated_from) == (2, None)
        assert dict(after.raw_items()) == full_replay(kafka, topic, V2)
    finally:
        after.close(checkpoint=False)
