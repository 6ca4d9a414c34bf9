"""``SnapshotStore``: the table of all snapshots keyed by generation, with an atomic update.

Backends: :class:`BlobSnapshotStore` (the default, beside the checkpoints) and
:class:`~statesnap.snapshot.topic_store.TopicSnapshotStore` (a single-partition Kafka topic).
:class:`SnapshotStoreSpec` names one of them (a table's descriptor records it); the factory that
opens the store a spec names, :func:`~statesnap.snapshot.factory.open_snapshot_store`, lives in
its own module so that this contract imports no backend.
"""

from __future__ import annotations

import builtins
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

from statesnap.blob import BlobStore
from statesnap.errors import (
    BlobExistsError,
    BlobNotFoundError,
    CorruptCheckpointError,
    GenerationConflictError,
    SnapshotNotFoundError,
    SnapshotStoreError,
)
from statesnap.snapshot.model import EMPTY, Snapshot

__all__ = [
    "DEFAULT_SPEC",
    "MAX_ATTEMPTS",
    "SPEC_ENV",
    "BlobSnapshotStore",
    "SnapshotStore",
    "SnapshotStoreSpec",
    "Update",
    "check_successor",
    "resolve_spec",
]

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
        key = self._key(generation, version)
        snap = Snapshot.from_bytes(self.store.read(key))
        if snap.generation != generation:
            raise CorruptCheckpointError(
                f"{key}: record says generation {snap.generation}, its name {generation}"
            )
        return snap

    def current(self, block: bool = True) -> Snapshot:
        if not block:
            return self._cache
        versions = self._versions()
        if not versions:
            self._cache = EMPTY
            return EMPTY
        gen = max(versions)
        try:
            data = self.store.read(self._key(gen, versions[gen]))
        except BlobNotFoundError:  # deleted (snapshot delete, GC) since listed: look again
            return self.current(block=True)
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
        """Every readable record, newest first: one GC deleted meanwhile is left out, a corrupt one
        is skipped with a warning (``checkpoints verify`` reports it)."""
        versions = self._versions()
        out = []
        for g in sorted(versions, reverse=True):
            try:
                out.append(self._read(g, versions[g]))
            except BlobNotFoundError:
                continue
            except CorruptCheckpointError as e:
                log.warning("skipping snapshot record: %s", e)
        return out

    def get(self, generation: int) -> Snapshot:
        if generation == 0:
            return EMPTY
        versions = self._versions()
        if generation not in versions:
            raise SnapshotNotFoundError(
                f"no snapshot generation {generation} in {self.store.shown}/{self.directory}"
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

    def verify(self) -> builtins.list[str]:
        """Problems with any record version readers may parse (every version of every generation)."""
        problems = []
        for blob in self.store.list(f"{self.directory}/generations/"):
            if not _RECORD_RE.search(blob.key):
                continue
            try:
                data = self.store.read(blob.key)
                named = int(_RECORD_RE.search(blob.key).group(1))  # type: ignore[union-attr]
                if Snapshot.from_bytes(data).generation != named:
                    problems.append(f"{blob.key}: the record names another generation than its key")
                    continue
                successor = json.loads(data).get(_NEXT)
                if successor is not None:
                    Snapshot.from_json(successor)
            except BlobNotFoundError:
                continue
            except (CorruptCheckpointError, ValueError) as e:
                problems.append(f"{blob.key}: {e}")
        return problems

    def insert(self, snapshot: Snapshot) -> Snapshot:
        """Give an older generation that has no record one (a checkpoint an older statesnap
        committed without a record); a record that appeared meanwhile wins."""
        self._put(replace(snapshot, version=0), ok_if_exists=True)
        return self.get(snapshot.generation)

    def delete(self, generation: int) -> None:
        keys = [b.key for b in self.store.list(f"{self.directory}/generations/{generation:020d}/")]
        if not keys:
            raise SnapshotNotFoundError(f"no snapshot generation {generation}")
        self.store.delete(keys)


# --- which store a table uses (statesnap.snapshot.factory opens it) ---------------------------

#: Where a table keeps its snapshot records unless told otherwise: beside its checkpoints.
DEFAULT_SPEC = "blob"
#: The environment variable every entry point reads the choice from.
SPEC_ENV = "STATESNAP_SNAPSHOT_STORE"


@dataclass(frozen=True, slots=True)
class SnapshotStoreSpec:
    """``blob`` (records under ``generations/`` beside the checkpoints) or ``topic:NAME`` (records
    in the single-partition Kafka topic NAME, see
    :class:`~statesnap.snapshot.topic_store.TopicSnapshotStore`)."""

    kind: str
    topic: str | None = None

    @classmethod
    def parse(cls, spec: str | None) -> SnapshotStoreSpec:
        text = (spec or DEFAULT_SPEC).strip()
        if text == "blob":
            return cls("blob")
        kind, _, topic = text.partition(":")
        if kind == "topic" and topic.strip():
            return cls("topic", topic.strip())
        raise SnapshotStoreError(
            f"invalid snapshot store {text!r}: use 'blob' (beside the checkpoints) or 'topic:NAME'"
        )

    def __str__(self) -> str:
        return self.kind if self.topic is None else f"{self.kind}:{self.topic}"


def resolve_spec(asked: str | None, described: str | None, table: str) -> SnapshotStoreSpec:
    """The store a table uses: the one its descriptor records; one asked for must agree with it."""
    recorded = SnapshotStoreSpec.parse(described) if described else None
    wanted = SnapshotStoreSpec.parse(asked) if asked else None
    if recorded is not None and wanted is not None and recorded != wanted:
        raise SnapshotStoreError(
            f"table {table!r} keeps its snapshots in {recorded}, not {wanted}: drop the option or "
            "use a new table name"
        )
    return wanted or recorded or SnapshotStoreSpec(DEFAULT_SPEC)
