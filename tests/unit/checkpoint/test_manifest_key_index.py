"""A base's persisted key index in the manifest (issue 21): nested in its base's entry, read back
as written, ignored by readers that do not know it, refused when it is not that base's."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from statesnap.checkpoint.manifest import (
    CheckpointManifest,
    DataFile,
    FileKind,
    PartitionCheckpoint,
    canonical_checksum,
    index_path,
)
from statesnap.errors import CorruptCheckpointError

BASE_PATH = "data/00000000000000000004/p00002-base-7.parquet"
INDEX = DataFile(index_path(BASE_PATH), FileKind.INDEX, 3, 640, "c" * 64)
BASE = DataFile(BASE_PATH, FileKind.BASE, 3, 1200, "a" * 64, next_offset=9, index=INDEX)
DELTA = DataFile("data/00000000000000000005/p00002-delta-0.parquet", FileKind.DELTA, 1, 400, "b" * 64)


def _manifest(*files: DataFile) -> CheckpointManifest:
    return CheckpointManifest(
        table="t",
        topic="t",
        cluster_id="c",
        generation=5,
        partitions={2: PartitionCheckpoint(2, 10, files)},
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
    )


def _resealed(obj: dict[str, Any]) -> bytes:
    obj["checksum"] = canonical_checksum(obj)
    return json.dumps(obj).encode()


def test_the_index_rides_on_its_base_and_counts_as_a_file() -> None:
    assert INDEX.path == "data/00000000000000000004/p00002-index-7.keyidx"
    m = _manifest(BASE, DELTA)
    back = CheckpointManifest.from_bytes(m.to_bytes())
    assert back == m
    assert back.files[0].index == INDEX
    assert back.files == [BASE, DELTA]  # loaders apply these: no index among them
    assert back.index_files == [INDEX]
    assert back.all_files == [BASE, DELTA, INDEX]
    assert back.total_bytes == 1200 + 400 + 640
    assert back.total_rows == 4


def test_a_manifest_without_index_reads_as_before() -> None:
    plain = DataFile(BASE_PATH, FileKind.BASE, 3, 1200, "a" * 64)
    obj = json.loads(_manifest(plain).to_bytes())
    assert "index" not in obj["partitions"]["2"]["files"][0]
    back = CheckpointManifest.from_bytes(_manifest(plain).to_bytes())
    assert back.index_files == []
    assert back.all_files == [plain]


def test_an_older_reader_sees_the_same_data_files() -> None:
    """What a reader from before indexes parses: only the keys it knows of each file entry (the
    index is one more key it skips), the same files in the same order, the checksum intact."""
    obj = json.loads(_manifest(BASE, DELTA).to_bytes())
    assert obj["checksum"] == canonical_checksum(obj)
    entry = obj["partitions"]["2"]["files"][0]
    assert entry["index"]["path"] == INDEX.path
    known = {k: v for k, v in entry.items() if k != "index"}
    assert DataFile.from_json(known) == DataFile(BASE_PATH, FileKind.BASE, 3, 1200, "a" * 64, next_offset=9)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"path": "data/00000000000000000004/p00003-index-7.keyidx"}, "does not belong to this base"),
        ({"path": "data/00000000000000000004/p00002-index-8.keyidx"}, "does not belong to this base"),
        ({"path": "data/00000000000000000003/p00002-index-7.keyidx"}, "does not belong to this base"),
        ({"path": "../p00002-index-7.keyidx"}, "does not belong to this base"),
        ({"kind": "base"}, "does not belong to this base"),
        ({"rows": 4}, "indexes 4 rows, its base holds 3"),
        ({"sha256": "zz"}, "64 hex digits"),
        ({"bytes": 0}, "bytes"),
    ],
)
def test_an_index_that_is_not_its_bases_is_corrupt(change: dict[str, Any], match: str) -> None:
    obj = json.loads(_manifest(BASE).to_bytes())
    obj["partitions"]["2"]["files"][0]["index"].update(change)
    with pytest.raises(CorruptCheckpointError, match=match):
        CheckpointManifest.from_bytes(_resealed(obj))


def test_only_a_base_has_an_index() -> None:
    obj = json.loads(_manifest(BASE, DELTA).to_bytes())
    obj["partitions"]["2"]["files"][1]["index"] = INDEX.to_json()
    with pytest.raises(CorruptCheckpointError, match="a delta file with a key index"):
        CheckpointManifest.from_bytes(_resealed(obj))
