"""The streaming materializer's batch journal: what each finished micro-batch wrote.

Spark never replays a micro-batch once ``foreachBatch`` returned, but checkpoints are committed
only every ``checkpoint_interval``; between the two, the journal is what keeps a finished batch's
delta files known. One small JSON object per batch, written after its delta files and before
``foreachBatch`` returns::

    <root>/<cluster-id>_<table>/_spark/<journal-id>/<batch-id:020d>.json

``journal-id`` is derived from the query's ``checkpointLocation``. Readers ignore ``_spark/``;
retention GC keeps the data files its entries reference; the materializer deletes entries once a
manifest includes them.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from statesnap.checkpoint.jsonfields import as_int, as_partition, load_json
from statesnap.checkpoint.manifest import CheckpointManifest, DataFile
from statesnap.checkpoint.repository import CheckpointRepository
from statesnap.errors import BlobNotFoundError, CorruptCheckpointError

__all__ = [
    "JOURNAL_DIR",
    "BatchEntry",
    "BatchJournal",
    "BatchRange",
    "journal_id",
    "journal_references",
    "pending_entries",
    "verify_journal",
]

JOURNAL_DIR = "_spark"


def journal_id(checkpoint_location: str) -> str:
    """A stable name for one streaming query's journal (same location → same journal)."""
    location = checkpoint_location
    if not urlsplit(location).scheme:
        location = os.path.abspath(os.path.expanduser(location))
    return hashlib.sha256(location.rstrip("/").encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class BatchRange:
    """What one batch did to one partition: read ``[start, end)``, wrote ``file`` (or nothing)."""

    start: int
    end: int
    file: DataFile | None


@dataclass(frozen=True, slots=True)
class BatchEntry:
    batch_id: int
    partitions: Mapping[int, BatchRange]

    def to_bytes(self) -> bytes:
        return json.dumps(
            {
                "batch_id": self.batch_id,
                "partitions": {
                    str(p): {
                        "start": r.start,
                        "end": r.end,
                        "file": r.file.to_json() if r.file is not None else None,
                    }
                    for p, r in sorted(self.partitions.items())
                },
            },
            indent=1,
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes, source: str) -> BatchEntry:
        obj = load_json(data, source=source)
        try:
            return cls(
                as_int(obj["batch_id"], f"{source}: batch_id"),
                {
                    as_partition(p): BatchRange(
                        as_int(r["start"], f"{source}: start"),
                        as_int(r["end"], f"{source}: end"),
                        DataFile.from_json(r["file"]) if r["file"] else None,
                    )
                    for p, r in obj["partitions"].items()
                },
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CorruptCheckpointError(f"{source}: malformed journal entry ({e!r})") from e


class BatchJournal:
    """Journal entries of one query in one table's repository."""

    def __init__(self, repo: CheckpointRepository, checkpoint_location: str) -> None:
        self.repo = repo
        self.id = journal_id(checkpoint_location)
        self.prefix = repo.key(f"{JOURNAL_DIR}/{self.id}/")

    def _key(self, batch_id: int) -> str:
        return f"{self.prefix}{batch_id:020d}.json"

    def write(self, entry: BatchEntry) -> None:
        """Record a finished batch (a re-run of the same batch id overwrites its entry)."""
        self.repo.store.write(self._key(entry.batch_id), entry.to_bytes())

    def entries(self) -> list[BatchEntry]:
        out = []
        for blob in self.repo.store.list(self.prefix):
            out.append(BatchEntry.from_bytes(self.repo.store.read(blob.key), blob.key))
        return sorted(out, key=lambda e: e.batch_id)

    def delete(self, batch_ids: list[int]) -> None:
        self.repo.store.delete(self._key(b) for b in batch_ids)


def verify_journal(repo: CheckpointRepository) -> list[str]:
    """Problems with Spark journal entries (a garbled one makes the materializer re-read its batch)."""
    problems = []
    for blob in repo.store.list(repo.key(f"{JOURNAL_DIR}/")):
        try:
            BatchEntry.from_bytes(repo.store.read(blob.key), blob.key)
        except CorruptCheckpointError as e:
            problems.append(str(e))
        except BlobNotFoundError:
            continue
    return problems


def journal_references(repo: CheckpointRepository) -> set[str]:
    """Data files (relative to the table directory) that journal entries of any streaming query
    still reference: retention GC must keep them, whatever their age, until a manifest does."""
    referenced: set[str] = set()
    prefix = repo.key(f"{JOURNAL_DIR}/")
    for blob in repo.store.list(prefix):
        try:
            entry = BatchEntry.from_bytes(repo.store.read(blob.key), blob.key)
        except (CorruptCheckpointError, BlobNotFoundError):
            continue  # a garbled entry protects nothing; one deleted meanwhile neither
        referenced.update(r.file.path for r in entry.partitions.values() if r.file is not None)
    return referenced


def pending_entries(
    entries: list[BatchEntry], base: CheckpointManifest | None, present: set[str]
) -> tuple[list[BatchEntry], list[BatchEntry]]:
    """Split journal entries into (pending, obsolete) relative to the checkpoint *base*.

    An entry is obsolete when *base* already covers its ranges. Pending entries must continue
    exactly where the previous one (or *base*) ended and have all their files in *present*; the
    first one that does not, and everything after it, is obsolete too: the materializer reads
    from where the kept entries end, so nothing is lost, only read again.
    """
    offsets = dict(base.offsets) if base is not None else {}
    pending: list[BatchEntry] = []
    obsolete: list[BatchEntry] = []
    broken = False
    for entry in entries:
        if all(r.end <= offsets.get(p, 0) for p, r in entry.partitions.items()):
            obsolete.append(entry)
            continue
        chained = all(r.start == offsets.get(p, r.start) for p, r in entry.partitions.items())
        files_ok = all(r.file is None or r.file.path in present for r in entry.partitions.values())
        broken = broken or not (chained and files_ok)
        if broken:
            obsolete.append(entry)
            continue
        pending.append(entry)
        offsets.update({p: r.end for p, r in entry.partitions.items()})
    return pending, obsolete
