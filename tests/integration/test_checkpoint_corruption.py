"""A corrupt newest checkpoint is skipped for the previous one, and the result is still
equivalent to a full replay; without any usable checkpoint ``require_checkpoint`` fails; a
checkpoint of another topic under the same table name is refused and nothing is deleted.

Corruption is applied through the BlobStore API, so every case runs on file:// and s3:// alike.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from statesnap import CheckpointOptions, RetentionPolicy, Table
from statesnap.blob import BlobStore, open_blob_store
from statesnap.checkpoint import CheckpointManifest, CheckpointRepository, layout
from statesnap.digest import table_digest
from statesnap.errors import CheckpointMismatchError, NoUsableCheckpointError

pytestmark = pytest.mark.integration

PARTITIONS = 2


@dataclass
class History:
    """A topic with two checkpoints (generations *older* < *newer*) and a tail after them."""

    topic: str
    produced: list[Any]
    older: CheckpointManifest
    newer: CheckpointManifest
    repo: CheckpointRepository


def _batch(round_no: int, n: int = 40) -> list[tuple[int, bytes, bytes | None]]:
    out: list[tuple[int, bytes, bytes | None]] = []
    for i in range(n):
        k = (i * 7 + round_no) % 25
        value = None if (i + round_no) % 6 == 0 else b"r%d-%d" % (round_no, i)
        out.append((k % PARTITIONS, b"key-%02d" % k, value))
    return out


def _table(
    kafka: Any, topic: str, location: Any, *, require_checkpoint: bool = False, name: str | None = None
) -> Table:
    return Table(
        topic,
        name=name,
        bootstrap_servers=kafka.bootstrap,
        background=False,
        checkpoints=CheckpointOptions(
            location.url,
            storage_options=location.options,
            interval="1h",
            commit_interval="1h",
            retention=RetentionPolicy(min_count=10),
            require=require_checkpoint,
        ),
    )


def _history(kafka: Any, location: Any) -> History:
    topic = kafka.create_topic(f"cor-{uuid.uuid4().hex[:12]}", PARTITIONS)
    parts = range(PARTITIONS)
    t = _table(kafka, topic, location)
    t.start()
    produced: list[Any] = []
    manifests = []
    try:
        for round_no in range(2):  # every round touches every partition: each gets a new file
            produced += kafka.produce(topic, _batch(round_no))
            kafka.drain(t, kafka.end_offsets(produced, parts))
            m = t.checkpoint()
            assert m is not None
            manifests.append(m)
        produced += kafka.produce(topic, _batch(2))  # the tail, in no checkpoint
    finally:
        t.close(checkpoint=False)
    older, newer = manifests
    prefix = f"data/{newer.generation:020d}/"
    # incremental: the newer checkpoint adds a delta per partition on top of the older base
    assert all(pc.files[-1].path.startswith(prefix) for pc in newer.partitions.values())
    assert all(pc.files[-1].kind == "delta" for pc in newer.partitions.values())
    return History(topic, produced, older, newer, t.repo)  # type: ignore[arg-type]


def _flip_data_file(repo: CheckpointRepository, m: CheckpointManifest) -> None:
    key = repo.key(m.files[-1].path)  # a file of this checkpoint only
    data = bytearray(repo.store.read(key))
    data[len(data) // 2] ^= 0x5A  # same size: only the checksum can tell
    repo.store.write(key, bytes(data))


def _truncate_manifest(repo: CheckpointRepository, m: CheckpointManifest) -> None:
    key = repo.key(layout.manifest_key(m.generation))
    repo.store.write(key, repo.store.read(key)[:57])


def _delete_data_file(repo: CheckpointRepository, m: CheckpointManifest) -> None:
    repo.store.delete([repo.key(m.files[-1].path)])


def _future_format(repo: CheckpointRepository, m: CheckpointManifest) -> None:
    obj = m.to_json()
    obj["format_version"] = 99
    import json

    repo.store.write(repo.key(layout.manifest_key(m.generation)), json.dumps(obj).encode())


CORRUPTIONS: dict[str, tuple[Callable[[CheckpointRepository, CheckpointManifest], None], str]] = {
    "flipped-bytes": (_flip_data_file, "checksum"),
    "truncated-manifest": (_truncate_manifest, "not valid JSON"),
    "deleted-data-file": (_delete_data_file, "missing"),
    "unknown-format-version": (_future_format, "format version 99"),
}


def _listing(store: BlobStore) -> dict[str, bytes]:
    return {b.key: store.read(b.key) for b in store.list("")}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one(
    corruption: str, checkpoint_location: Any, kafka: Any
) -> None:
    h = _history(kafka, checkpoint_location)
    corrupt, reason = CORRUPTIONS[corruption]
    corrupt(h.repo, h.newer)

    t = _table(kafka, h.topic, checkpoint_location)
    report = t.start()
    try:
        assert report.checkpoint == h.older.generation
        assert [s.generation for s in report.skipped] == [h.newer.generation]
        assert reason in report.skipped[0].reason
        # Restored from the older checkpoint: its tail, i.e. rounds 1 and 2, was replayed.
        keyed_after = sum(1 for r in h.produced if r.offset >= h.older.offsets[r.partition])
        assert report.replayed_records == keyed_after
        assert t.offsets == kafka.end_offsets(h.produced, range(PARTITIONS))
        assert table_digest(t.raw_items()) == table_digest(kafka.truth(h.produced).items())
        assert dict(t.raw_items()) == kafka.truth(h.produced)
        # The next checkpoint after a fallback is complete and restorable on its own.
        m = t.checkpoint()
        assert m is not None
        assert m.generation > h.newer.generation
        assert h.repo.verify(m.generation).ok
    finally:
        t.close(checkpoint=False)
    again = _table(kafka, h.topic, checkpoint_location)
    report = again.start()
    try:
        assert report.checkpoint == m.generation
        assert report.replayed_records == 0
        assert dict(again.raw_items()) == kafka.truth(h.produced)
    finally:
        again.close(checkpoint=False)


def test_verify_reports_the_corruption(checkpoint_location: Any, kafka: Any) -> None:
    h = _history(kafka, checkpoint_location)
    assert h.repo.verify(h.newer.generation).ok
    _flip_data_file(h.repo, h.newer)
    shallow = h.repo.verify(h.newer.generation, deep=False)
    assert shallow.ok  # same size: only a deep verify reads the bytes
    deep = h.repo.verify(h.newer.generation)
    assert not deep.ok
    assert "checksum" in deep.problems[0]
    assert h.repo.verify(h.older.generation).ok


def test_require_checkpoint_with_none_usable(checkpoint_location: Any, kafka: Any) -> None:
    h = _history(kafka, checkpoint_location)
    _truncate_manifest(h.repo, h.newer)
    _delete_data_file(h.repo, h.older)
    before = _listing(h.repo.store)
    t = _table(kafka, h.topic, checkpoint_location, require_checkpoint=True)
    with pytest.raises(NoUsableCheckpointError, match=h.topic):
        t.start()
    assert _listing(h.repo.store) == before

    # Without require_checkpoint the same state replays from the beginning, still equivalent.
    t = _table(kafka, h.topic, checkpoint_location)
    report = t.start()
    try:
        assert report.checkpoint is None
        assert {s.generation for s in report.skipped} == {h.older.generation, h.newer.generation}
        assert dict(t.raw_items()) == kafka.truth(h.produced)
    finally:
        t.close(checkpoint=False)


def test_require_checkpoint_with_no_checkpoint_at_all(checkpoint_location: Any, kafka: Any) -> None:
    topic = kafka.create_topic(f"req-{uuid.uuid4().hex[:12]}", 1)
    kafka.produce(topic, [(0, b"k", b"v")])
    t = _table(kafka, topic, checkpoint_location, require_checkpoint=True)
    with pytest.raises(NoUsableCheckpointError):
        t.start()


def test_checkpoint_of_another_topic_under_the_same_name_is_refused(
    checkpoint_location: Any, kafka: Any
) -> None:
    """Two topics configured with one table name share a checkpoint directory. Restoring
    topic B from topic A's checkpoint would serve A's rows as B's; statesnap must refuse with
    CheckpointMismatchError naming both topics, and must not delete or overwrite anything."""
    h = _history(kafka, checkpoint_location)
    other = kafka.create_topic(f"other-{uuid.uuid4().hex[:12]}", PARTITIONS)
    kafka.produce(other, [(0, b"x", b"y")])
    store = open_blob_store(checkpoint_location.url, **checkpoint_location.options)
    before = _listing(store)
    t = _table(kafka, other, checkpoint_location, name=h.topic)
    with pytest.raises(CheckpointMismatchError) as info:
        t.start()
    assert h.topic in str(info.value)
    assert other in str(info.value)
    assert _listing(store) == before
