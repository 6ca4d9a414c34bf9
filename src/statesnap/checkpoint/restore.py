"""Choosing and restoring checkpoints: the newest one that verifies and may be continued.

The one selection path of statesnap: :class:`CheckpointSelector` walks the manifests newest first
for every reader and writer — a Python table's restore (verified as its files load), a follower,
the Spark bootstrap and streaming materializer and ``read_table`` (verified up front, checksums
included, by :meth:`CheckpointSelector.newest_verified`). A checkpoint is skipped (with the reason
logged) when its manifest or a data file fails verification, when continuing from it could not
equal a full replay (see :mod:`statesnap.checkpoint.selection`), when the log was truncated
below it (an unclean leader election: its leader epochs say so, KIP-320), or when it belongs to
another incarnation of the topic. A checkpoint of another topic or cluster is refused. When the
checkpoint being loaded disappears (the owner's GC deleted it) and a newer one exists, the restore
starts over from the newest.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from statesnap.checkpoint.manifest import CheckpointManifest
from statesnap.checkpoint.partition_files import DecodedPartition
from statesnap.checkpoint.repository import CheckpointRepository
from statesnap.checkpoint.selection import (
    TopicState,
    beyond_end,
    check_identity,
    diverged,
    same_incarnation,
    unusable_reason,
)
from statesnap.errors import BlobNotFoundError, CorruptCheckpointError, NoUsableCheckpointError

__all__ = ["RESTORE_ATTEMPTS", "CheckpointSelector", "SkippedCheckpoint"]

log = logging.getLogger(__name__)

#: How often a restore starts over when the checkpoint it loads is deleted under it.
RESTORE_ATTEMPTS = 5


@dataclass(frozen=True, slots=True)
class SkippedCheckpoint:
    generation: int
    reason: str


class _VanishedError(Exception):
    """The checkpoint being loaded was deleted and a newer one exists: start over."""


@dataclass
class CheckpointSelector:
    """Finds (and for a table, loads) the checkpoint to continue from.

    ``state`` is what the cluster reports (None for readers without Kafka access, such as
    ``read_table``: then only the table name is checked, not retention or compaction).
    """

    repo: CheckpointRepository
    table: str
    generation: int | None = None
    require_checkpoint: bool = False
    skipped: list[SkippedCheckpoint] = field(default_factory=list)
    #: Download bases' persisted key indexes with their files and hand partitions over split
    #: (base, index, changes) where that pays: for a store that reads them (the columnar store);
    #: every other one gets each partition merged.
    key_indexes: bool = False

    def candidates(self, state: TopicState | None, now: datetime) -> Iterator[CheckpointManifest]:
        """Manifests newest first that parse, belong to this table and may be continued; every
        other one is skipped with its reason logged. One of another topic or cluster raises; one
        of another incarnation of the topic is skipped with every older one (one past a
        partition's end whose topic ID matches was truncated under: older ones are judged on
        their own). The leader-epoch question to the cluster is asked last, of candidates that
        passed every other check."""
        other_incarnation: int | None = None
        for gen, item in self.repo.manifests():
            if self.generation is not None and gen != self.generation:
                continue
            if isinstance(item, CorruptCheckpointError):
                self._skip(gen, str(item))
                continue
            if state is not None:
                check_identity(item, self.table, state)  # another topic or cluster: refused
            if other_incarnation is not None:
                self._skip(gen, f"older than generation {other_incarnation} of another topic incarnation")
                continue
            if (why := beyond_end(item, state)) is not None:
                if not same_incarnation(item, state):
                    other_incarnation = gen
                self._skip(gen, why)
                continue
            if state is not None:
                reason = unusable_reason(item, state, now) or diverged(item, state)
            elif item.table != self.table:
                reason = f"it belongs to table {item.table!r}"
            else:
                reason = unusable_reason(item, None, now)
            if reason is not None:
                self._skip(gen, reason)
                continue
            yield item

    def newest_verified(
        self, state: TopicState | None, now: datetime, *, deep: bool = True
    ) -> CheckpointManifest | None:
        """The newest candidate whose files are all present with the right size and, when
        *deep*, the right checksum; None (or :class:`NoUsableCheckpointError` when a checkpoint
        was required) if there is none."""
        for manifest in self.candidates(state, now):
            verdict = self.repo.verify(manifest.generation, deep=deep)
            if verdict.vanished:
                continue  # deleted by GC since it was listed: the next-older one
            if verdict.restorable:  # a damaged key index is rebuilt by the restore, not fatal
                return manifest
            self._skip(manifest.generation, "; ".join(verdict.problems))
        self._none_usable()
        return None

    def restore(
        self,
        state: TopicState,
        partitions: Sequence[int],
        load: Callable[[DecodedPartition], None],
        clear: Callable[[], None],
        now: datetime,
    ) -> CheckpointManifest | None:
        """Load the chosen checkpoint's *partitions* through *load* (each with the checkpoint it
        belongs to: a store's migrations depend on its state version; split over its base's key
        index where :attr:`key_indexes` asks for that); None means replay everything.

        *clear* undoes a partial load before the next candidate is tried.
        """

        def fill(item: CheckpointManifest) -> None:
            wanted = [p for p in partitions if p in item.partitions]
            for _p, decoded in self.repo.iter_decoded(item, wanted, indexes=self.key_indexes):
                load(decoded)

        for _attempt in range(RESTORE_ATTEMPTS):
            try:
                return self._first_usable(self.candidates(state, now), fill, clear)
            except _VanishedError:
                continue
        self._none_usable()
        return None

    def _first_usable(
        self,
        candidates: Iterator[CheckpointManifest],
        fill: Callable[[CheckpointManifest], None],
        clear: Callable[[], None],
    ) -> CheckpointManifest | None:
        """The first of *candidates* that *fill* loads whole; *clear* undoes a partial load."""
        listed_top = next(iter(self.repo.generations()), None)
        for item in candidates:
            gen = item.generation
            try:
                fill(item)
            except (CorruptCheckpointError, BlobNotFoundError) as e:
                clear()
                # Deleted under us (the owner's GC) while a newer checkpoint appeared: start over
                # from that one. A newer one that was already listed (and skipped) does not count.
                newest = next(iter(self.repo.generations()), gen)
                if listed_top is not None and newest > listed_top and self.generation is None:
                    log.info(
                        "table %s: checkpoint %d vanished during restore; retrying with %d",
                        self.table,
                        gen,
                        newest,
                    )
                    raise _VanishedError from e
                self._skip(gen, str(e))
                continue
            return item
        self._none_usable()
        return None

    def _none_usable(self) -> None:
        if self.require_checkpoint or self.generation is not None:
            which = f"generation {self.generation}" if self.generation is not None else "checkpoint"
            raise NoUsableCheckpointError(
                f"no usable {which} for table {self.table!r} in {self.repo.shown}"
                + "".join(f"; {s.generation}: {s.reason}" for s in self.skipped[:3])
            )
        if self.skipped:
            log.warning("table %s: no usable checkpoint, replaying from the beginning", self.table)

    def _skip(self, generation: int, reason: str) -> None:
        log.warning("table %s: skipping checkpoint generation %d: %s", self.table, generation, reason)
        self.skipped.append(SkippedCheckpoint(generation, reason))
