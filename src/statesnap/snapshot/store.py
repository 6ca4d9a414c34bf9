"""``SnapshotStore``: the table of all snapshots keyed by generation, with an atomic update.

Backends: :class:`BlobSnapshotStore` (the default, beside the checkpoints) and
:class:`~statesnap.snapshot.topic_store.TopicSnapshotStore` (a single-partition Kafka topic).
"""

from __future__ import annotations

import builtins
import json
import logging
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol, runtime_checkable

from statesnap.blob import BlobStore
from statesnap.errors import BlobExistsError, GenerationConflictError, SnapshotNotFoundError
from statesnap.snapshot.model import EMPTY, Snapshot

log = logging.getLogger(__name__)

#: ``fn(current) -> new | None``; None leaves the store unchanged.
Update = Callable[[Snapshot], Snapshot | None]

#: Key under which a sealed record names the generation that succeeds it.
_NEXT = "next_generation_record"
_RECORD_RE = re.compile(r"generations/(\d{20})/(\d{10})\.json$")
#: A lost optimistic race is retried this often before giving up (contention is a few tasks).
MAX_ATTEMPTS = 50


@runtime_checkable
class SnapshotStore(Protocol):
    """Snapshots of one table. ``update_current`` is atomic across threads and processes."""

    def current(self, block: bool = True) -> Snapshot:
        """The newest generation (``EMPTY`` before any). ``block=False`` may answer from cache."""
        ...

    def list(self) -> builtins.list[Snapshot]:
        """Every snapshot, newest generation first (generation 0 excluded)."""
        ...

    def get(self, generation: int) -> Snapshot:
        """One snapshot; :class:`SnapshotNotFoundError` if it does not exist."""
        ...

    def update_current(self, fn: Update) -> Snapshot:
        """Apply *fn* to the current snapshot atomically (retrying lost races); returns the result.

        *fn* may return the same generation (a new version) or a higher one (a new snapshot);
        a lower generation raises :class:`GenerationConflictError`.
        """
        ...

    def update(self, generation: int, fn: Update) -> Snapshot:
        """Atomically update an older generation's record (pin, unpin, fail)."""
        ...

    def delete(self, generation: int) -> None:
        """Forget a generation's record (its checkpoint files are GC's business)."""
        ...


def check_successor(current: Snapshot, new: Snapshot) -> None:
    """Generations only grow: a new record is the same generation or a higher one."""
    if new.generation < current.generation:
        raise GenerationConflictError(
            f"generation would go backwards: {current.generation} → {new.generation}"
        )


class BlobSnapshotStore:
    """Records as write-once objects ``<dir>/generations/<gen:020d>/<version:010d>.json``.

    Every update writes the next version with a conditional create; losing the race to another
    writer means re-reading and re-applying the update, so no update is ever lost.
    """

    def __init__(self, store: BlobStore, directory: str) -> None:
        self.store = store
        self.directory = directory.strip("/")
        self._cache: Snapshot = EMPTY

    def _key(self, generation: int, version: int) -> str:
        return f"{self.directory}/generations/{generation:020d}/{version:010d}.json"

    def _versions(self) -> dict[int, int]:
        """Newest version per generation."""
        newest: dict[int, int] = {}
        for blob in self.store.list(f"{self.directory}/generations/"):
            m = _RECORD_RE.search(blob.key)
            if m:
                gen, ver = int(m.group(1)), int(m.group(2))
                newest[gen] = max(ver, newest.get(gen, -1))
        return newest

    def _read(self, generation: int, version: int) -> Snapshot:
        return Snapshot.from_bytes(self.store.read(self._key(generation, version)))

    def current(self, block: bool = True) -> Snapshot:
        if not block:
            return self._cache
        versions = self._versions()
        if not versions:
            self._cache = EMPTY
            return EMPTY
        gen = max(versions)
        data = self.store.read(self._key(gen, versions[gen]))
        successor = json.loads(data).get(_NEXT)
        if successor is not None:
            # A writer sealed this generation and may have died before creating the next one:
            # finish its work (idempotently) so nobody updates a sealed generation.
            nxt = Snapshot.from_json(successor)
            self._put(replace(nxt, version=0), ok_if_exists=True)
            return self.current(block=True)
        self._cache = Snapshot.from_bytes(data)
        return self._cache

    def list(self) -> builtins.list[Snapshot]:
        versions = self._versions()
        return [self._read(g, versions[g]) for g in sorted(versions, reverse=True)]

    def get(self, generation: int) -> Snapshot:
        if generation == 0:
            return EMPTY
        versions = self._versions()
        if generation not in versions:
            raise SnapshotNotFoundError(
                f"no snapshot generation {generation} in {self.store.url}/{self.directory}"
            )
        return self._read(generation, versions[generation])

    def _write(self, current: Snapshot, new: Snapshot) -> bool:
        """Publish *new* as the next version of its generation; False if another writer won.

        Starting a new generation first *seals* the current one: its next version, unchanged but
        naming the successor. A concurrent update of the current generation needs that same
        conditional create, so exactly one of the two wins; and anyone who finds a sealed
        generation creates the successor it names before doing anything else, so a writer that
        dies between the two writes loses nothing either.
        """
        same = new.generation == current.generation and current is not EMPTY
        if same or current is EMPTY:
            return self._put(replace(new, version=current.version + 1 if same else 0))
        first = replace(new, version=0)
        if not self._put(replace(current, version=current.version + 1), successor=first):
            return False
        return self._put(first, ok_if_exists=True)

    def _put(
        self, record: Snapshot, *, successor: Snapshot | None = None, ok_if_exists: bool = False
    ) -> bool:
        body = record.to_json()
        if successor is not None:
            body[_NEXT] = successor.to_json()
        data = json.dumps(body, indent=1).encode()
        try:
            self.store.write(self._key(record.generation, record.version), data, if_absent=True)
        except BlobExistsError:
            if not ok_if_exists:
                return False
        if record.generation >= self._cache.generation:
            self._cache = Snapshot.from_bytes(data)  # what readers will parse (ms timestamps)
        return True

    def update_current(self, fn: Update) -> Snapshot:
        for _ in range(MAX_ATTEMPTS):
            current = self.current(block=True)
            new = fn(current)
            if new is None:
                return current
            check_successor(current, new)
            if self._write(current, new):
                return self._cache
            log.debug("lost a race updating generation %d; retrying", current.generation)
        raise GenerationConflictError(f"could not update {self.directory} after {MAX_ATTEMPTS} attempts")

    def update(self, generation: int, fn: Update) -> Snapshot:
        for _ in range(MAX_ATTEMPTS):
            current = self.get(generation)
            new = fn(current)
            if new is None:
                return current
            if new.generation != generation:
                raise GenerationConflictError("update() cannot change a record's generation")
            if self._write(current, new):
                return self.get(generation)
        raise GenerationConflictError(
            f"could not update generation {generation} after {MAX_ATTEMPTS} attempts"
        )

    def delete(self, generation: int) -> None:
        keys = [b.key for b in self.store.list(f"{self.directory}/generations/{generation:020d}/")]
        if not keys:
            raise SnapshotNotFoundError(f"no snapshot generation {generation}")
        self.store.delete(keys)
