"""One place reads a partition's files back: ``CheckpointRepository.merge_partition`` (checked
against the partition's manifest entry, as every restore and the Spark checkpoint source read) and
``merge_files`` (checksums only, for writers building on files they have no entry for). No broker:
a ``file://`` blob store."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from statesnap.blob import open_blob_store
from statesnap.checkpoint import CheckpointRepository, PartitionCheckpoint
from statesnap.errors import CorruptCheckpointError

from .conftest import rows


def _repo(tmp_path: Path) -> tuple[CheckpointRepository, PartitionCheckpoint]:
    repo = CheckpointRepository(open_blob_store(tmp_path.as_uri()), "c1_orders")
    base = repo.write_file(1, 0, "base", 0, rows([(b"a", b"1", 0), (b"b", b"2", 1)]))
    delta = repo.write_file(1, 0, "delta", 0, rows([(b"a", None, 2), (b"c", b"3", 3)]))
    return repo, PartitionCheckpoint(0, 4, (base, delta), 2)


def test_merge_partition_is_the_checked_merge_of_the_entry(tmp_path: Path) -> None:
    repo, entry = _repo(tmp_path)
    merged = repo.merge_partition(entry)
    assert merged.column("key").to_pylist() == [b"b", b"c"]  # the tombstone deleted a
    with pytest.raises(CorruptCheckpointError, match="merges to 2 keys, the manifest says 5"):
        repo.merge_partition(replace(entry, keys=5))


def test_merge_files_verifies_checksums_but_not_a_manifest_entry(tmp_path: Path) -> None:
    repo, entry = _repo(tmp_path)
    assert repo.merge_files(entry.files).column("key").to_pylist() == [b"b", b"c"]
    tampered = replace(entry.files[0], sha256="0" * 64)
    with pytest.raises(CorruptCheckpointError, match="checksum"):
        repo.merge_files((tampered, entry.files[1]))
