"""Retention GC: keep at least ``min_count`` checkpoints and every one younger than ``min_age``.

Order matters for concurrent readers: manifests are deleted first, then the data files that no
retained manifest references, then orphans (files of writers that crashed before their manifest)
older than a grace period, so a writer still uploading is never robbed of its files.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from statesnap.checkpoint import layout
from statesnap.checkpoint.manifest import CheckpointManifest
from statesnap.checkpoint.repository import CheckpointRepository
from statesnap.durations import parse_duration
from statesnap.errors import ConfigError

__all__ = [
    "MIN_ORPHAN_GRACE",
    "CheckpointAge",
    "GcReport",
    "RetentionPolicy",
    "collect_garbage",
    "orphan_grace_for",
    "retained_generations",
]

log = logging.getLogger(__name__)

#: The least time files no manifest references yet survive GC (a write still uploading).
MIN_ORPHAN_GRACE = timedelta(hours=1)


def orphan_grace_for(interval: timedelta | None) -> timedelta:
    """The orphan grace of a writer checkpointing every *interval*: an hour, or twice the interval
    when that is longer, so the files of a checkpoint in flight outlive the next one's GC. The one
    place the rule is written: the library, ``materialize`` and ``run`` apply it alike."""
    return MIN_ORPHAN_GRACE if interval is None else max(MIN_ORPHAN_GRACE, 2 * interval)


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """Which checkpoints survive GC.

    A checkpoint survives if it is among the newest ``min_count``, or younger than ``min_age``, or
    is the newest usable one. Files of unfinished writes survive ``orphan_grace``; None (the
    default) means :func:`orphan_grace_for` the writer's checkpoint interval (see
    :meth:`for_interval`), an hour where there is none (a GC of its own).
    """

    min_count: int = 10
    min_age: timedelta = timedelta(hours=12)
    orphan_grace: timedelta | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.min_count, int) or self.min_count < 1:
            raise ConfigError(f"min_count must be an integer >= 1, got {self.min_count!r}")
        object.__setattr__(self, "min_age", parse_duration(self.min_age))
        if self.orphan_grace is not None:
            object.__setattr__(self, "orphan_grace", parse_duration(self.orphan_grace))

    @classmethod
    def of(
        cls,
        min_count: int = 10,
        min_age: str | timedelta = "12h",
        orphan_grace: str | timedelta | None = None,
    ) -> RetentionPolicy:
        grace = None if orphan_grace is None else parse_duration(orphan_grace)
        return cls(min_count, parse_duration(min_age), grace)

    @property
    def grace(self) -> timedelta:
        """The orphan grace GC applies: the one given, else :data:`MIN_ORPHAN_GRACE`."""
        return self.orphan_grace if self.orphan_grace is not None else MIN_ORPHAN_GRACE

    def for_interval(self, interval: timedelta | None) -> RetentionPolicy:
        """This policy as a writer checkpointing every *interval* applies it: an orphan grace not
        given becomes :func:`orphan_grace_for` the interval."""
        if self.orphan_grace is not None:
            return self
        return RetentionPolicy(self.min_count, self.min_age, orphan_grace_for(interval))


@dataclass(frozen=True, slots=True)
class CheckpointAge:
    """What the GC rule needs to know about one generation."""

    generation: int
    created_at: datetime
    usable: bool


def retained_generations(
    checkpoints: Iterable[CheckpointAge],
    policy: RetentionPolicy,
    now: datetime,
    *,
    keep: Callable[[int], bool] = lambda _gen: False,
) -> set[int]:
    """The pure GC rule, separate from I/O so it can be tested exhaustively."""
    ordered = sorted(checkpoints, key=lambda c: c.generation, reverse=True)
    kept = {c.generation for c in ordered[: policy.min_count]}
    kept |= {c.generation for c in ordered if now - c.created_at < policy.min_age}
    kept |= {c.generation for c in ordered if keep(c.generation)}
    newest_usable = next((c.generation for c in ordered if c.usable), None)
    if newest_usable is not None:
        kept.add(newest_usable)
    return kept


@dataclass(slots=True)
class GcReport:
    """What a GC run deleted (or would delete, on a dry run)."""

    table_url: str
    retained: list[int] = field(default_factory=list)
    deleted_generations: list[int] = field(default_factory=list)
    deleted_files: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    deleted_records: list[int] = field(default_factory=list)
    pinned: list[int] = field(default_factory=list)
    aborted_uploads: int = 0
    dry_run: bool = False

    def to_json(self) -> dict[str, object]:
        return {
            "table_url": self.table_url,
            "retained": self.retained,
            "deleted_generations": self.deleted_generations,
            "deleted_files": len(self.deleted_files),
            "orphans_deleted": len(self.orphans),
            "snapshot_records_deleted": self.deleted_records,
            "pinned": self.pinned,
            "aborted_uploads": self.aborted_uploads,
            "dry_run": self.dry_run,
        }


def collect_garbage(
    repo: CheckpointRepository,
    policy: RetentionPolicy,
    *,
    now: datetime | None = None,
    dry_run: bool = False,
    keep: Callable[[int], bool] = lambda _gen: False,
    referenced_elsewhere: Iterable[str] = (),
) -> GcReport:
    """Apply *policy* to *repo*'s manifests and data files; ``now`` is injectable so the rule can
    be tested on a fake clock.

    The mechanism only: callers go through :meth:`statesnap.snapshot.SnapshotApi.gc`, which
    passes ``keep`` (pinned and unexpired snapshots) and ``referenced_elsewhere`` (files of snapshots in
    progress and of the Spark journal, relative to the table directory) and removes the
    snapshot records of deleted generations through the snapshot store.
    """
    now = now or datetime.now(UTC)
    report = GcReport(repo.url, dry_run=dry_run)
    blobs = repo.store.list(repo.directory + "/")
    prefix_len = len(repo.directory) + 1
    modified = {b.key[prefix_len:]: b.modified for b in blobs}
    present = set(modified)

    manifests: dict[int, CheckpointManifest | None] = {}
    ages = []
    for gen, item in repo.manifests():
        if isinstance(item, CheckpointManifest):
            manifests[gen] = item
            usable = all(f.path in present for f in item.files)
            ages.append(CheckpointAge(gen, item.created_at, usable))
        else:
            manifests[gen] = None
            stamp = modified.get(layout.manifest_key(gen), now)
            ages.append(CheckpointAge(gen, stamp, False))

    kept = retained_generations(ages, policy, now, keep=keep)
    report.retained = sorted(kept, reverse=True)
    report.deleted_generations = sorted(set(manifests) - kept)
    # Key indexes are kept and deleted with the manifests that list them, as data files are.
    referenced = {f.path for gen in kept if (m := manifests.get(gen)) is not None for f in m.all_files}
    referenced |= set(referenced_elsewhere)
    doomed_refs = {
        f.path
        for gen in report.deleted_generations
        if (m := manifests.get(gen)) is not None
        for f in m.all_files
    }
    for rel in sorted(present):
        if layout.data_generation(rel) is None or rel in referenced:
            continue
        if rel in doomed_refs:
            report.deleted_files.append(rel)
        elif now - modified[rel] >= policy.grace:
            report.orphans.append(rel)

    if not dry_run:
        repo.store.delete(repo.key(layout.manifest_key(g)) for g in report.deleted_generations)
        repo.store.delete(repo.key(rel) for rel in [*report.deleted_files, *report.orphans])
    report.aborted_uploads = repo.store.abort_stale_uploads(
        repo.directory, now - policy.grace, dry_run=dry_run
    )
    if report.deleted_generations or report.orphans or report.deleted_files:
        log.info(
            "gc %s: %s generations %s, %d files, %d orphans",
            repo.url,
            "would delete" if dry_run else "deleted",
            report.deleted_generations,
            len(report.deleted_files),
            len(report.orphans),
        )
    return report
