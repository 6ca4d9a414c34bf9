"""Writing a checkpoint's data files (in parallel); the manifest is committed after them, by the
snapshot orchestrator (:mod:`statesnap.snapshot.participant`), never by a writer directly.

The order is the whole crash-safety story: a crash before the manifest leaves unreferenced files
that retention GC removes after a grace period; after it, the checkpoint is complete.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import pyarrow as pa

from statesnap.checkpoint.manifest import CheckpointManifest, DataFile, PartitionCheckpoint, leader_epoch_of
from statesnap.checkpoint.repository import IO_THREADS, CheckpointRepository
from statesnap.errors import CheckpointConflictError

__all__ = ["PartitionUpdate", "write_partition_files"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PartitionUpdate:
    """What a writer knows about one partition at a commit point.

    ``base``: the partition's full contents (sorted or not) → a new base file.
    ``delta``: upserts and tombstones since ``previous`` → appended as a delta file.
    Neither: unchanged since ``previous``; its files are referenced again, not rewritten.
    ``next_offset`` may be a reader's position (a :class:`~statesnap.checkpoint.manifest.NextOffset`):
    its leader epoch goes into the manifest with it.
    """

    partition: int
    next_offset: int
    base: pa.Table | None = None
    delta: pa.Table | None = None
    #: The partition's live key count after a ``delta``, where the writer knows it.
    keys: int | None = None


#: A generation directory may hold files of earlier, crashed attempts at the same generation.
_NAME_ATTEMPTS = 100


def _write_new_file(
    repo: CheckpointRepository, generation: int, partition: int, kind: str, table: pa.Table
) -> DataFile:
    """Write one data file under the first free ``<n>``: a writer killed while writing this
    generation may have left a same-named orphan. The manifest decides which attempt wins."""
    for n in range(_NAME_ATTEMPTS):
        try:
            return repo.write_file(generation, partition, kind, n, table)
        except CheckpointConflictError:
            continue
    raise CheckpointConflictError(
        f"{repo.shown}: {_NAME_ATTEMPTS} data files of partition {partition} already exist "
        f"in generation {generation}"
    )


def write_partition_files(
    repo: CheckpointRepository,
    generation: int,
    updates: Mapping[int, PartitionUpdate],
    previous: CheckpointManifest | None = None,
) -> dict[int, PartitionCheckpoint]:
    """Write the data files of *updates* into *generation* (in parallel) and describe each
    partition as the manifest will: new base, previous files + a new delta, or previous files."""
    jobs: list[tuple[int, str, pa.Table]] = []
    for p, upd in updates.items():
        if upd.base is not None:
            jobs.append((p, "base", upd.base))
        elif upd.delta is not None and upd.delta.num_rows:
            jobs.append((p, "delta", upd.delta))

    with ThreadPoolExecutor(min(IO_THREADS, max(1, len(jobs)))) as pool:
        written = dict(
            zip(
                [(p, kind) for p, kind, _ in jobs],
                pool.map(lambda job: _write_new_file(repo, generation, *job), jobs),
                strict=True,
            )
        )

    partitions: dict[int, PartitionCheckpoint] = {}
    for p, upd in sorted(updates.items()):
        before = previous.partitions.get(p) if previous is not None else None
        prior = before.files if before is not None else ()
        if (p, "base") in written:
            files: tuple[DataFile, ...] = (replace(written[(p, "base")], next_offset=upd.next_offset),)
            keys: int | None = written[(p, "base")].rows  # a base holds no tombstones
        elif (p, "delta") in written:
            after = prior[-1].next_offset if prior else None
            delta = replace(written[(p, "delta")], next_offset=upd.next_offset, after=after)
            files, keys = (*prior, delta), upd.keys
        else:
            files, keys = prior, (before.keys if before is not None else 0)
        epoch = leader_epoch_of(upd.next_offset)
        if epoch is None and before is not None and before.next_offset == upd.next_offset:
            epoch = before.leader_epoch  # the same record before the same offset
        partitions[p] = PartitionCheckpoint(p, int(upd.next_offset), files, keys, epoch)
    return partitions
