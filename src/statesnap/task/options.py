"""Option bundles: what a task is told, as values shared by every entry point.

``Table``, ``Follower``, the Spark drivers and the CLI take the same frozen dataclasses, so a
setting means the same thing everywhere and no entry point grows thirty keywords. The common call
stays one line: a plain URL string is ``CheckpointOptions(url)`` with every default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from statesnap.checkpoint.retention import RetentionPolicy
from statesnap.durations import parse_duration
from statesnap.errors import ConfigError
from statesnap.kafka.partitioner import PartitionerSpec

if TYPE_CHECKING:
    from statesnap.blob import BlobStore

__all__ = [
    "CheckpointOptions",
    "Duration",
    "GroupOptions",
    "SnapshotOptions",
    "StaticShare",
    "StoreName",
    "StoreOptions",
    "utc_now",
]

#: A duration as users write it: ``"90s"``, ``"5m"``, ``"1h"``, seconds, or a ``timedelta``.
Duration = str | float | timedelta

#: The local state store kinds; ``auto`` picks by the size of the checkpoint to restore.
StoreName = Literal["auto", "memory", "columnar", "rocksdb"]


def utc_now() -> datetime:
    """The default clock: what "now" is when a checkpoint's age is judged."""
    return datetime.now(UTC)


def _frozen(mapping: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True, slots=True, init=False)
class SnapshotOptions:
    """How a task takes part in its table's snapshots.

    ``store``: where snapshot records live, ``blob`` (beside the checkpoints) or ``topic:NAME`` (a
    Kafka topic on the table's cluster); None means ``$STATESNAP_SNAPSHOT_STORE``, else what the
    table was created with. ``timeout``: a snapshot not complete within it is marked FAILED.
    ``task_id``: this task's name in snapshots (default ``main``, ``instance-<i>``, or unique per
    group member).
    """

    store: str | None
    timeout: timedelta
    task_id: str | None

    def __init__(
        self, store: str | None = None, timeout: Duration = "60s", task_id: str | None = None
    ) -> None:
        if task_id is not None and not task_id.strip():
            raise ConfigError("task_id must be a non-empty name")
        object.__setattr__(self, "store", store)
        object.__setattr__(self, "timeout", parse_duration(timeout))
        object.__setattr__(self, "task_id", task_id)


@dataclass(frozen=True, slots=True, init=False)
class CheckpointOptions:
    """Where a task's checkpoints live and how it writes and chooses them.

    Args:
        location: blob store URL (``file://…``, a path, ``s3://bucket/prefix``) or a store.
        storage_options: blob-store options (``endpoint_url``, ``region``, ``sse``, …).
        interval: minimum time between periodic checkpoints (taken at commit points).
        commit_interval: how often a commit point happens while consuming; a checkpoint
            interval below it raises the cadence to it (:attr:`commit_every`), since a checkpoint
            can only be taken at a commit point.
        retention: the GC policy applied after each checkpoint.
        require: fail instead of replaying from the beginning when no checkpoint verifies.
        generation: restore exactly this generation instead of the newest valid one, then continue
            from its offsets (``--from-generation`` on ``statesnap run`` and ``materialize``);
            later generations stay, new ones are numbered above them.
        snapshots: how the task takes part in the table's snapshots.
        clock: what "now" is when a checkpoint's age is judged (tests move it).
    """

    location: str | BlobStore
    storage_options: Mapping[str, Any]
    interval: timedelta
    commit_interval: timedelta
    retention: RetentionPolicy
    require: bool
    generation: int | None
    snapshots: SnapshotOptions
    clock: Callable[[], datetime]

    def __init__(
        self,
        location: str | BlobStore,
        *,
        storage_options: Mapping[str, Any] | None = None,
        interval: Duration = "1h",
        commit_interval: Duration = "5s",
        retention: RetentionPolicy | None = None,
        require: bool = False,
        generation: int | None = None,
        snapshots: SnapshotOptions | None = None,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        if generation is not None and (isinstance(generation, bool) or generation < 1):
            raise ConfigError(f"generation must be >= 1, got {generation}")
        set_ = object.__setattr__
        set_(self, "location", location)
        set_(self, "storage_options", _frozen(storage_options))
        set_(self, "interval", parse_duration(interval))
        set_(self, "commit_interval", parse_duration(commit_interval))
        set_(self, "retention", retention if retention is not None else RetentionPolicy())
        set_(self, "require", require)
        set_(self, "generation", generation)
        set_(self, "snapshots", snapshots if snapshots is not None else SnapshotOptions())
        set_(self, "clock", clock)

    @property
    def commit_every(self) -> timedelta:
        """The time between commit points a task keeps: ``commit_interval``, or ``interval`` when
        shorter. ``interval="1s"`` with the 5 s default commit interval meant a checkpoint every
        5 s at best, said nowhere."""
        return min(self.commit_interval, self.interval)

    @classmethod
    def of(cls, checkpoints: str | BlobStore | CheckpointOptions | None) -> CheckpointOptions | None:
        """What an entry point's ``checkpoints=`` means: None (no checkpoints), a bundle, or a
        location with every default."""
        if checkpoints is None or isinstance(checkpoints, CheckpointOptions):
            return checkpoints
        return cls(checkpoints)

    @property
    def url(self) -> str | None:
        """The location as the user gave it, when it is a URL (for messages: redact first)."""
        return self.location if isinstance(self.location, str) else None


@dataclass(frozen=True, slots=True)
class StoreOptions:
    """The local state store: ``kind`` (``auto``: ``columnar`` for checkpoints of at least 10 k rows,
    else ``memory``; ``memory``; ``columnar``; ``rocksdb``) and where an on-disk one lives."""

    kind: StoreName | str = "auto"
    path: str | Path | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("auto", "memory", "columnar", "rocksdb"):
            raise ConfigError(
                f"unknown state store {self.kind!r}; choose one of auto, memory, columnar, rocksdb"
            )

    @classmethod
    def of(cls, store: StoreName | str | StoreOptions) -> StoreOptions:
        return store if isinstance(store, StoreOptions) else cls(store)


@dataclass(frozen=True, slots=True)
class StaticShare:
    """A fixed share of the partitions: ``p`` with ``p % instances == instance``, each instance a
    task of the table's snapshots (no consumer group, no rebalancing)."""

    instance: int
    instances: int

    def __post_init__(self) -> None:
        if not 0 <= self.instance < self.instances:
            raise ConfigError(f"instance must be in [0, {self.instances}), got {self.instance}")

    def select(self, partitions: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(p for p in partitions if p % self.instances == self.instance)


@dataclass(frozen=True, slots=True)
class GroupOptions:
    """Take partitions from a Kafka consumer group, with rebalancing.

    ``partitioner``: the producers' partitioner (``murmur2_random``, Java clients' default;
    ``consistent_random``, librdkafka's; or ``(key_bytes, n) -> p``): it tells which member
    serves a key.
    """

    group_id: str
    partitioner: PartitionerSpec = "murmur2_random"

    def __post_init__(self) -> None:
        if not isinstance(self.group_id, str) or not self.group_id.strip():
            raise ConfigError("group must be a non-empty consumer group id")

    @classmethod
    def of(cls, group: str | GroupOptions | None) -> GroupOptions | None:
        return group if group is None or isinstance(group, GroupOptions) else cls(group)
