"""The checkpoint manifest: one small JSON document that makes a checkpoint exist.

Data files are written first; the manifest is written last and write-once, so a reader that finds
a manifest finds a complete checkpoint, and a crash before it leaves only unreferenced files.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from statesnap.errors import CorruptCheckpointError

#: Bumped on any change a reader of the previous version would misread.
FORMAT_VERSION = 1
SUPPORTED_FORMAT_VERSIONS = frozenset({1})

FileKind = Literal["base", "delta"]
#: Data files live in the table's own ``data/<generation>/`` directory, nowhere else: a manifest
#: naming any other path (``../..``, an absolute one) is corrupt, not followed.
_DATA_PATH_RE = re.compile(r"^data/\d+/[A-Za-z0-9_][A-Za-z0-9._-]*\.parquet$")


class CheckpointState(StrEnum):
    """Life cycle of a manifest. Per-process checkpoints are written directly as COMPLETED."""

    CREATED = "CREATED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"


@dataclass(frozen=True, slots=True)
class DataFile:
    """One Parquet file of a partition. ``path`` is relative to the table directory."""

    path: str
    kind: FileKind
    rows: int
    bytes: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "kind": self.kind,
            "rows": self.rows,
            "bytes": self.bytes,
            "sha256": self.sha256,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> DataFile:
        kind = obj["kind"]
        if kind not in ("base", "delta"):
            raise ValueError(f"unknown file kind {kind!r}")
        path = str(obj["path"])
        if not _DATA_PATH_RE.fullmatch(path):
            raise ValueError(f"data file path {path!r} is not under data/<generation>/")
        return cls(path, kind, int(obj["rows"]), int(obj["bytes"]), str(obj["sha256"]))


@dataclass(frozen=True, slots=True)
class PartitionCheckpoint:
    """A partition's state: the next offset to consume and the files holding every record below it.

    Files apply in order: at most one ``base`` first, then ``delta`` files (merge-on-read).
    """

    partition: int
    next_offset: int
    files: tuple[DataFile, ...] = ()
    #: Live keys in the partition, where the writer knew it (rows count superseded ones and
    #: tombstones too once deltas pile up).
    keys: int | None = None

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"next_offset": self.next_offset, "files": [f.to_json() for f in self.files]}
        if self.keys is not None:
            obj["keys"] = self.keys
        return obj

    @classmethod
    def from_json(cls, partition: int, obj: Mapping[str, Any]) -> PartitionCheckpoint:
        keys = obj.get("keys")
        return cls(
            partition,
            int(obj["next_offset"]),
            tuple(DataFile.from_json(f) for f in obj["files"]),
            None if keys is None else int(keys),
        )


@dataclass(frozen=True, slots=True)
class CheckpointManifest:
    """Everything a reader needs to restore a table, and to check it is restoring the right one."""

    table: str
    topic: str
    cluster_id: str
    generation: int
    partitions: Mapping[int, PartitionCheckpoint]
    created_at: datetime
    state: CheckpointState = CheckpointState.COMPLETED
    writer: Mapping[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    #: Kafka's ID of the topic incarnation the checkpoint was taken from (None where unknown).
    topic_id: str | None = None

    def __post_init__(self) -> None:
        # The JSON form keeps milliseconds in UTC; normalize so a writer's manifest equals what
        # readers parse (and both agree on its age).
        ts = self.created_at if self.created_at.tzinfo else self.created_at.replace(tzinfo=UTC)
        ts = ts.astimezone(UTC)
        object.__setattr__(self, "created_at", ts.replace(microsecond=ts.microsecond // 1000 * 1000))

    @property
    def offsets(self) -> dict[int, int]:
        """Next offset to consume per partition (Kafka's committed-offset convention)."""
        return {p: pc.next_offset for p, pc in sorted(self.partitions.items())}

    @property
    def files(self) -> list[DataFile]:
        return [f for _, pc in sorted(self.partitions.items()) for f in pc.files]

    @property
    def total_bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    @property
    def total_rows(self) -> int:
        """Rows in the files (base + deltas: superseded rows and tombstones included)."""
        return sum(f.rows for f in self.files)

    @property
    def keys(self) -> int | None:
        """The table's key count at this checkpoint, when every partition's writer recorded it."""
        counts = [pc.keys for pc in self.partitions.values()]
        return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)

    def age_seconds(self, now: datetime | None = None) -> float:
        return ((now or datetime.now(UTC)) - self.created_at).total_seconds()

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "table": self.table,
            "topic": self.topic,
            "cluster_id": self.cluster_id,
            "generation": self.generation,
            "state": self.state.value,
            "created_at": self.created_at.astimezone(UTC).isoformat(timespec="milliseconds"),
            "writer": dict(self.writer),
            **({"topic_id": self.topic_id} if self.topic_id else {}),
            "partitions": {str(p): pc.to_json() for p, pc in sorted(self.partitions.items())},
        }

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json(), indent=2, sort_keys=False).encode() + b"\n"

    @classmethod
    def from_bytes(cls, data: bytes, *, source: str = "manifest") -> CheckpointManifest:
        """Parse and validate; anything malformed is a :class:`CorruptCheckpointError`."""
        try:
            obj = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CorruptCheckpointError(f"{source}: not valid JSON ({e})") from e
        if not isinstance(obj, dict):
            raise CorruptCheckpointError(f"{source}: not a JSON object")
        version = obj.get("format_version")
        if version not in SUPPORTED_FORMAT_VERSIONS:
            raise CorruptCheckpointError(
                f"{source}: unknown format version {version!r} "
                f"(this statesnap reads {sorted(SUPPORTED_FORMAT_VERSIONS)})"
            )
        try:
            partitions = {
                int(p): PartitionCheckpoint.from_json(int(p), pc) for p, pc in obj["partitions"].items()
            }
            created = datetime.fromisoformat(obj["created_at"])
            if created.tzinfo is None:
                created = created.replace(tzinfo=UTC)
            manifest = cls(
                table=str(obj["table"]),
                topic=str(obj["topic"]),
                cluster_id=str(obj["cluster_id"]),
                generation=int(obj["generation"]),
                partitions=partitions,
                created_at=created,
                state=CheckpointState(obj.get("state", "COMPLETED")),
                writer=dict(obj.get("writer") or {}),
                format_version=int(version),
                topic_id=str(obj["topic_id"]) if obj.get("topic_id") else None,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise CorruptCheckpointError(f"{source}: malformed manifest ({e!r})") from e
        for pc in partitions.values():
            if pc.next_offset < 0:
                raise CorruptCheckpointError(f"{source}: negative offset in partition {pc.partition}")
            kinds = [f.kind for f in pc.files]
            if "base" in kinds[1:]:
                raise CorruptCheckpointError(
                    f"{source}: partition {pc.partition} has a base file after a delta"
                )
        return manifest
