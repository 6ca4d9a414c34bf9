"""The snapshot model: one record per generation, CREATED → COMPLETED | FAILED.

A snapshot is consistent across tasks: every task that owns partitions of the table reports the
offsets it committed and the checkpoint files it wrote for that generation; when the reports
cover every partition, the snapshot's checkpoint manifest is committed and it is COMPLETED.
Generation 0 is the empty snapshot that exists before any other (no offsets, no checkpoints).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from statesnap.checkpoint.jsonfields import MAX_INT64, as_int, as_map, as_partition, load_json
from statesnap.checkpoint.manifest import PartitionCheckpoint
from statesnap.errors import CorruptCheckpointError

__all__ = ["EMPTY", "CheckpointRef", "Snapshot", "SnapshotState", "TaskSnapshot"]


class SnapshotState(StrEnum):
    CREATED = "CREATED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"


def _ts(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat(timespec="milliseconds")


def _parse_ts(value: str | None) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 64:
        raise ValueError("a timestamp is not an ISO 8601 string")
    parsed = datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class CheckpointRef:
    """Where one state store's part of a snapshot lives: per partition, next offset and files
    (paths relative to the table directory ``location``)."""

    location: str
    partitions: Mapping[int, PartitionCheckpoint]

    def to_json(self) -> dict[str, Any]:
        return {
            "location": self.location,
            "partitions": {str(p): pc.to_json() for p, pc in sorted(self.partitions.items())},
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> CheckpointRef:
        return cls(
            str(obj["location"]),
            {
                as_partition(p): PartitionCheckpoint.from_json(as_partition(p), pc)
                for p, pc in as_map(obj["partitions"], "a checkpoint reference's partitions").items()
            },
        )


@dataclass(frozen=True, slots=True)
class TaskSnapshot:
    """One task's part: the next offset of every partition it owns and a checkpoint reference per
    state store name."""

    task_id: str
    offsets: Mapping[tuple[str, int], int]
    checkpoints: Mapping[str, CheckpointRef] = field(default_factory=dict)
    reported_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    #: How the task wrote its part (``engine``: python | spark, plus engine-specific figures);
    #: the committed manifest's ``writer`` record is built from it.
    writer: Mapping[str, Any] = field(default_factory=dict)

    @property
    def partitions(self) -> set[int]:
        return {p for _topic, p in self.offsets}

    def to_json(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "offsets": [
                {"topic": t, "partition": p, "next_offset": o} for (t, p), o in sorted(self.offsets.items())
            ],
            "checkpoints": {name: ref.to_json() for name, ref in sorted(self.checkpoints.items())},
            "reported_at": _ts(self.reported_at),
            "writer": dict(self.writer),
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> TaskSnapshot:
        return cls(
            str(obj["task_id"]),
            {
                (str(o["topic"]), as_partition(o["partition"])): as_int(o["next_offset"], "next_offset")
                for o in obj["offsets"]
            },
            {str(n): CheckpointRef.from_json(r) for n, r in (obj.get("checkpoints") or {}).items()},
            _parse_ts(obj.get("reported_at")) or datetime.now(UTC),
            dict(obj.get("writer") or {}),
        )


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A generation record. ``version`` counts updates of this generation's record (optimistic
    concurrency); ``expected_partitions`` are the partitions the task reports must cover."""

    generation: int
    state: SnapshotState
    created_at: datetime
    updated_at: datetime
    expected_partitions: tuple[int, ...] = ()
    tasks: Mapping[str, TaskSnapshot] = field(default_factory=dict)
    label: str | None = None
    pinned: bool = False
    expires_at: datetime | None = None
    deadline: datetime | None = None
    error: str | None = None
    version: int = 0

    @property
    def reported_partitions(self) -> set[int]:
        return {p for task in self.tasks.values() for p in task.partitions}

    @property
    def missing_partitions(self) -> list[int]:
        return sorted(set(self.expected_partitions) - self.reported_partitions)

    @property
    def complete(self) -> bool:
        return bool(self.expected_partitions) and not self.missing_partitions

    def retained(self, now: datetime) -> bool:
        """Whether retention must keep it regardless of the GC policy (pinned or not yet expired)."""
        return self.pinned or (self.expires_at is not None and self.expires_at > now)

    def evolve(self, **changes: Any) -> Snapshot:
        """A new version of this record (``updated_at`` and ``version`` advance)."""
        changes.setdefault("updated_at", datetime.now(UTC))
        changes.setdefault("version", self.version + 1)
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "state": self.state.value,
            "created_at": _ts(self.created_at),
            "updated_at": _ts(self.updated_at),
            "expected_partitions": list(self.expected_partitions),
            "tasks": [t.to_json() for _, t in sorted(self.tasks.items())],
            "label": self.label,
            "pinned": self.pinned,
            "expires_at": _ts(self.expires_at),
            "deadline": _ts(self.deadline),
            "error": self.error,
            "version": self.version,
        }

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json(), indent=1).encode()

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Snapshot:
        if not isinstance(obj, Mapping):
            raise CorruptCheckpointError(f"snapshot record is not a JSON object: {type(obj).__name__}")
        try:
            tasks = [TaskSnapshot.from_json(t) for t in obj.get("tasks", [])]
            return cls(
                generation=as_int(obj["generation"], "the record's generation"),
                state=SnapshotState(obj["state"]),
                created_at=_parse_ts(obj["created_at"]) or datetime.now(UTC),
                updated_at=_parse_ts(obj.get("updated_at")) or datetime.now(UTC),
                expected_partitions=tuple(as_partition(p) for p in obj.get("expected_partitions", [])),
                tasks={t.task_id: t for t in tasks},
                label=obj.get("label"),
                pinned=bool(obj.get("pinned", False)),
                expires_at=_parse_ts(obj.get("expires_at")),
                deadline=_parse_ts(obj.get("deadline")),
                error=obj.get("error"),
                version=as_int(obj.get("version", 0), "the record's version", hi=MAX_INT64),
            )
        except (AttributeError, KeyError, TypeError, ValueError) as e:  # a list or number where a map goes
            raise CorruptCheckpointError(f"malformed snapshot record: {e!r}") from e

    @classmethod
    def from_bytes(cls, data: bytes) -> Snapshot:
        return cls.from_json(load_json(data, source="snapshot record"))


#: The snapshot that exists before any other.
EMPTY = Snapshot(
    generation=0,
    state=SnapshotState.COMPLETED,
    created_at=datetime.fromtimestamp(0, UTC),
    updated_at=datetime.fromtimestamp(0, UTC),
)
