"""Restoring from checkpoints: the newest one that verifies and may be continued, newest first.

A checkpoint is skipped (with the reason logged) when its manifest or a data file fails
verification, or when continuing from it could not equal a full replay (see
:mod:`statesnap.checkpoint.selection`). A checkpoint of another topic or cluster is refused. When
the checkpoint being loaded disappears (the owner's GC deleted it) and a newer one exists, the
restore starts over from the newest.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import pyarrow as pa

from statesnap.checkpoint.manifest import CheckpointManifest
from statesnap.checkpoint.repository import CheckpointRepository
from statesnap.checkpoint.selection import TopicState, check_identity, unusable_reason
from statesnap.errors import BlobNotFoundError, CorruptCheckpointError, NoUsableCheckpointError

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
class CheckpointRestorer:
    """Finds and loads the checkpoint a table continues from."""

    repo: CheckpointRepository
    table: str
    generation: int | None = None
    require_checkpoint: bool = False
    skipped: list[SkippedCheckpoint] = field(default_factory=list)

    def restore(
        self,
        state: TopicState,
        partitions: Sequence[int],
        load: Callable[[int, pa.Table], None],
        clear: Callable[[], None],
        now: datetime,
    ) -> CheckpointManifest | None:
        """Load the chosen checkpoint's *partitions* through *load*; None means replay everything.

        *clear* undoes a partial load before the next candidate is tried.
        """
        for _attempt in range(RESTORE_ATTEMPTS):
            try:
                return self._first_usable(state, partitions, load, clear, now)
            except _VanishedError:
                continue
        self._none_usable()
        return None

    def _first_usable(
        self,
        state: TopicState,
        partitions: Sequence[int],
        load: Callable[[int, pa.Table], None],
        clear: Callable[[], None],
        now: datetime,
    ) -> CheckpointManifest | None:
        listed_top: int | None = None
        for gen, item in self.repo.manifests():
            listed_top = gen if listed_top is None else listed_top
            if self.generation is not None and gen != self.generation:
                continue
            if isinstance(item, CorruptCheckpointError):
                self._skip(gen, str(item))
                continue
            check_identity(item, self.table, state)
            reason = unusable_reason(item, state, now)
            if reason is not None:
                self._skip(gen, reason)
                continue
            try:
                wanted = [p for p in partitions if p in item.partitions]
                for p, rows in self.repo.iter_partitions(item, wanted):
                    load(p, rows)
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
                f"no usable {which} for table {self.table!r} in {self.repo.url}"
                + "".join(f"; {s.generation}: {s.reason}" for s in self.skipped[:3])
            )
        if self.skipped:
            log.warning("table %s: no usable checkpoint, replaying from the beginning", self.table)

    def _skip(self, generation: int, reason: str) -> None:
        log.warning("table %s: skipping checkpoint generation %d: %s", self.table, generation, reason)
        self.skipped.append(SkippedCheckpoint(generation, reason))
