"""The checkpoint manifest: one small JSON document that makes a checkpoint exist.

Data files are written first; the manifest is written last and write-once, so a reader that finds
a manifest finds a complete checkpoint, and a crash before it leaves only unreferenced files.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Self

from statesnap.checkpoint.jsonfields import as_int, as_map, as_optional_int, as_partition, as_str, load_json
from statesnap.errors import CorruptCheckpointError

__all__ = [
    "FORMAT_VERSION",
    "SUPPORTED_FORMAT_VERSIONS",
    "UNVERSIONED",
    "CheckpointManifest",
    "CheckpointState",
    "DataFile",
    "FileKind",
    "NextOffset",
    "PartitionCheckpoint",
    "canonical_checksum",
    "index_path",
    "leader_epoch_of",
]

#: Bumped on any change a reader of the previous version would misread. Version 2 adds the
#: manifest's own ``checksum``; version 1 manifests (no checksum) are still read. A partition's
#: optional ``leader_epoch`` needed no bump: a reader that ignores it restores as before, and the
#: checksum covers it either way.
FORMAT_VERSION = 2
SUPPORTED_FORMAT_VERSIONS = frozenset({1, 2})

#: Data files live in the table's own ``data/<generation>/`` directory, nowhere else: a manifest
#: naming any other path (``../..``, an absolute one) is corrupt, not followed. Writers name them
#: ``p<partition>-<kind>-<n>``; the name must agree with where the manifest lists the file.
_DATA_PATH_RE = re.compile(r"^data/(\d{1,20})/[A-Za-z0-9_][A-Za-z0-9._-]*\.parquet$")
_DATA_NAME_RE = re.compile(r"^data/\d+/p(\d+)-(base|delta)-(\d{1,18})\.parquet$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
#: A base file's persisted key index: beside it, same generation, partition and ``<n>``.
_INDEX_SUFFIX = ".keyidx"


def index_path(base_path: str) -> str:
    """Where the key index of the base file at *base_path* lives (``p<p>-index-<n>.keyidx``)."""
    head, _, name = base_path.rpartition("/")
    return f"{head}/{name.replace('-base-', '-index-', 1).removesuffix('.parquet')}{_INDEX_SUFFIX}"


#: The state version of a store a manifest does not name (every manifest written before versions
#: were recorded): the version every table and store starts at.
UNVERSIONED = 1


class FileKind(StrEnum):
    """A data file's role: a partition's full contents, or changes to apply on top (in order);
    or a base's persisted key index (never a data file: it rides on its base's entry)."""

    BASE = "base"
    DELTA = "delta"
    INDEX = "index"


def canonical_checksum(obj: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of *obj* without its ``checksum`` key, in canonical JSON (sorted keys, no
    spaces, ASCII): what a manifest's ``checksum`` must equal, whatever its indentation."""
    body = {k: v for k, v in obj.items() if k != "checksum"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


class NextOffset(int):
    """A next offset to consume that remembers the leader epoch of the record before it (KIP-320).

    An ``int`` wherever an offset goes (comparisons, JSON, dict copies), so the epoch travels from
    a reader's positions through code that knows nothing of epochs (a commit point's offsets, a
    writer's updates) into the manifest, and from a manifest back into a reader's assignment, where
    the broker checks the log still holds that record. Arithmetic gives a plain ``int``: an offset
    computed is not one a record was read at, so its epoch is unknown.
    """

    leader_epoch: int | None

    def __new__(cls, offset: int, leader_epoch: int | None = None) -> Self:
        self = super().__new__(cls, offset)
        # librdkafka says -1 (or None) where the broker sent no epoch: unknown, today's behaviour.
        self.leader_epoch = leader_epoch if leader_epoch is not None and leader_epoch >= 0 else None
        return self

    def __reduce__(self) -> tuple[type[NextOffset], tuple[int, int | None]]:
        return (NextOffset, (int(self), self.leader_epoch))


def leader_epoch_of(offset: int) -> int | None:
    """The leader epoch *offset* carries (a :class:`NextOffset`'s), or None where unknown."""
    return offset.leader_epoch if isinstance(offset, NextOffset) else None


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
    #: The partition's next offset when the file was written: it holds records below it only.
    next_offset: int | None = None
    #: A delta's: the ``next_offset`` of the file it applies on top of, so a partition's files form
    #: a chain in which a missing or reordered delta shows (None where the writer did not record it).
    after: int | None = None
    #: A base's persisted key index (its ``rows`` are the base's), or None: then a restore builds
    #: the index. Nested in the base's entry, so every writer that carries a base into a later
    #: manifest carries its index, and readers that do not know it ignore it (no format bump).
    index: DataFile | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", FileKind(self.kind))

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "path": self.path,
            "kind": self.kind.value,
            "rows": self.rows,
            "bytes": self.bytes,
            "sha256": self.sha256,
        }
        if self.next_offset is not None:
            obj["next_offset"] = self.next_offset
        if self.after is not None:
            obj["after"] = self.after
        if self.index is not None:
            obj["index"] = self.index.to_json()
        return obj

    @property
    def order(self) -> tuple[int, int]:
        """(generation, n) from the file's name: the order writers create a partition's files in."""
        match = _DATA_NAME_RE.fullmatch(self.path)
        if match is None:
            return (int(self.path.split("/")[1]), 0)
        return (int(self.path.split("/")[1]), int(match.group(3)))

    @classmethod
    def from_json(cls, obj: Any) -> DataFile:
        """Parse one file entry; anything malformed is a :class:`CorruptCheckpointError`."""
        obj = as_map(obj, "a file entry")
        path = as_str(obj.get("path"), "a file's path")
        match = _DATA_PATH_RE.fullmatch(path)
        if match is None:
            raise CorruptCheckpointError(f"data file path {path[:120]!r} is not under data/<generation>/")
        kind = obj.get("kind")
        if kind not in ("base", "delta"):
            raise CorruptCheckpointError(f"{path}: unknown file kind {str(kind)[:40]!r}")
        index = None
        if obj.get("index") is not None:
            if kind != "base":
                raise CorruptCheckpointError(f"{path}: a {kind} file with a key index")
            index = cls._index_from_json(obj["index"], path)
        sha = as_str(obj.get("sha256"), f"{path}: sha256")
        if not _SHA256_RE.fullmatch(sha):
            raise CorruptCheckpointError(f"{path}: sha256 is not 64 hex digits")
        parsed = cls(
            path,
            FileKind(kind),
            as_int(obj.get("rows"), f"{path}: rows"),
            as_int(obj.get("bytes"), f"{path}: bytes", lo=1),
            sha,
            as_optional_int(obj.get("next_offset"), f"{path}: next_offset"),
            as_optional_int(obj.get("after"), f"{path}: after"),
            index,
        )
        if index is not None and index.rows != parsed.rows:
            raise CorruptCheckpointError(
                f"{index.path}: indexes {index.rows} rows, its base holds {parsed.rows}"
            )
        return parsed

    @classmethod
    def _index_from_json(cls, obj: Any, base: str) -> DataFile:
        """A base's index entry: it must sit beside *base* under the name :func:`index_path` gives
        (an index of another partition, generation or file is not this base's)."""
        obj = as_map(obj, f"{base}: index")
        path = as_str(obj.get("path"), f"{base}: index path")
        if path != index_path(base) or obj.get("kind") != FileKind.INDEX.value:
            raise CorruptCheckpointError(
                f"{base}: key index {path[:120]!r} does not belong to this base file"
            )
        sha = as_str(obj.get("sha256"), f"{path}: sha256")
        if not _SHA256_RE.fullmatch(sha):
            raise CorruptCheckpointError(f"{path}: sha256 is not 64 hex digits")
        return cls(
            path,
            FileKind.INDEX,
            as_int(obj.get("rows"), f"{path}: rows"),
            as_int(obj.get("bytes"), f"{path}: bytes", lo=1),
            sha,
        )


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
    #: The leader epoch of the record before ``next_offset``, where the writer knew it (None in
    #: manifests written before it was kept, and by writers that never see records' epochs): a
    #: restore asks the broker whether its log still holds that epoch up to ``next_offset``, so a
    #: log an unclean leader election truncated below the checkpoint is told apart (KIP-320).
    leader_epoch: int | None = None

    def __post_init__(self) -> None:
        # A reader's position (a NextOffset) brings its epoch along; the field keeps a plain int.
        if isinstance(self.next_offset, NextOffset):
            if self.leader_epoch is None:
                object.__setattr__(self, "leader_epoch", self.next_offset.leader_epoch)
            object.__setattr__(self, "next_offset", int(self.next_offset))

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def position(self) -> int:
        """``next_offset`` with its leader epoch (a :class:`NextOffset`), for a reader to resume at."""
        return (
            NextOffset(self.next_offset, self.leader_epoch)
            if self.leader_epoch is not None
            else self.next_offset
        )

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"next_offset": self.next_offset, "files": [f.to_json() for f in self.files]}
        if self.keys is not None:
            obj["keys"] = self.keys
        if self.leader_epoch is not None:
            obj["leader_epoch"] = self.leader_epoch
        return obj

    @classmethod
    def from_json(cls, partition: int, obj: Any) -> PartitionCheckpoint:
        """Parse one partition entry and check it could have been written (see :meth:`problem`)."""
        obj = as_map(obj, f"partition {partition}")
        files = obj.get("files")
        if not isinstance(files, list):
            raise CorruptCheckpointError(f"partition {partition}: files is not a list")
        parsed = cls(
            partition,
            as_int(obj.get("next_offset"), f"partition {partition}: next_offset"),
            tuple(DataFile.from_json(f) for f in files),
            as_optional_int(obj.get("keys"), f"partition {partition}: keys"),
            as_optional_int(obj.get("leader_epoch"), f"partition {partition}: leader_epoch", hi=2**31 - 1),
        )
        problem = parsed.problem()
        if problem is not None:
            raise CorruptCheckpointError(f"partition {partition}: {problem}")
        return parsed

    def problem(self) -> str | None:
        """Why no writer could have described a partition so, or None.

        Writers name every file after its partition and create a partition's files in
        (generation, n) order, a base first; a base holds no tombstones, so with a base alone the
        live keys are its rows; keys never exceed the rows that hold them. Every writer writes a
        partition's first checkpoint as a base file (empty if need be) and every record it reads
        leaves a row, so a partition past offset 0 with no files has lost them. A leader epoch is
        the epoch of the record before ``next_offset``, so there is none at offset 0.
        """
        if not self.files and self.next_offset > 0:
            return f"no files, yet it resumes at offset {self.next_offset} (its base file is missing)"
        if self.leader_epoch is not None and self.next_offset == 0:
            return f"leader epoch {self.leader_epoch} of a record before offset 0"
        for f in self.files:
            match = _DATA_NAME_RE.fullmatch(f.path)
            if match is None or int(match.group(1)) != self.partition or match.group(2) != f.kind:
                return f"file {f.path} is not a {f.kind} file of partition {self.partition}"
        kinds = [f.kind for f in self.files]
        if FileKind.BASE in kinds[1:]:
            return "a base file after a delta"
        deltas = [f.order for f in self.files if f.kind is FileKind.DELTA]
        base_generation = self.files[0].order[0] if kinds[:1] == [FileKind.BASE] else 0
        if any(later <= earlier for earlier, later in itertools.pairwise(deltas)) or (
            deltas and deltas[0][0] < base_generation
        ):
            return "files are not in the order they were written"
        for earlier, later in itertools.pairwise(self.files):
            if (
                later.after is not None
                and earlier.next_offset is not None
                and later.after != earlier.next_offset
            ):
                return (
                    f"{later.path} applies after offset {later.after}, "
                    f"the file before it ends at {earlier.next_offset} (a delta missing or moved?)"
                )
        for f in self.files:
            if f.next_offset is not None and f.next_offset > self.next_offset:
                return f"{f.path} holds records up to {f.next_offset}, past partition's {self.next_offset}"
        if self.keys is not None:
            if self.keys > self.rows:
                return f"claims {self.keys} keys in {self.rows} rows"
            if kinds == [FileKind.BASE] and self.keys != self.rows:
                return f"claims {self.keys} keys but its base file holds {self.rows}"
        return None


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
    #: The state version of each store's rows (a table has one store, named after it): the code
    #: that restores them must be of the same version or migrate them. A store not named is at
    #: :data:`UNVERSIONED`. Optional in the JSON, so no format bump: an older reader ignores it
    #: (and the checksum covers it either way).
    state_versions: Mapping[str, int] = field(default_factory=dict)

    def state_version(self, store: str) -> int:
        """The state version *store*'s rows were written at (:data:`UNVERSIONED` if not named)."""
        return self.state_versions.get(store, UNVERSIONED)

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
        """The data files (Parquet), partition by partition in the order they apply."""
        return [f for _, pc in sorted(self.partitions.items()) for f in pc.files]

    @property
    def index_files(self) -> list[DataFile]:
        """The bases' persisted key indexes (restores read them when present)."""
        return [f.index for f in self.files if f.index is not None]

    def __repr__(self) -> str:
        """One line: a manifest lists every file of every partition, and a result that holds
        one (``print(bootstrap_processor(...))``) printed kilobytes of it."""
        created = self.created_at.astimezone(UTC).isoformat(timespec="seconds")
        return (
            f"CheckpointManifest(table={self.table!r}, generation={self.generation}, "
            f"partitions={len(self.partitions)}, files={len(self.all_files)}, keys={self.keys}, "
            f"bytes={self.total_bytes}, created_at={created!r})"
        )

    @property
    def all_files(self) -> list[DataFile]:
        """Every file the checkpoint references: what GC keeps, verify checks and clone copies."""
        return [*self.files, *self.index_files]

    @property
    def total_bytes(self) -> int:
        return sum(f.bytes for f in self.all_files)

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
        """The manifest as written; from version 2 on it carries the checksum of its content."""
        obj: dict[str, Any] = {
            "format_version": self.format_version,
            "table": self.table,
            "topic": self.topic,
            "cluster_id": self.cluster_id,
            "generation": self.generation,
            "state": self.state.value,
            "created_at": self.created_at.astimezone(UTC).isoformat(timespec="milliseconds"),
            "writer": dict(self.writer),
            **({"topic_id": self.topic_id} if self.topic_id else {}),
            **({"state_versions": dict(sorted(self.state_versions.items()))} if self.state_versions else {}),
            "partitions": {str(p): pc.to_json() for p, pc in sorted(self.partitions.items())},
        }
        if self.format_version >= 2:
            obj["checksum"] = canonical_checksum(obj)
        return obj

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json(), indent=2, sort_keys=False).encode() + b"\n"

    @classmethod
    def from_bytes(cls, data: bytes, *, source: str = "manifest") -> CheckpointManifest:
        """Parse and validate; anything malformed or implausible is a :class:`CorruptCheckpointError`.

        A version-2 manifest must match its own checksum, so a file list edited by hand (a delta
        dropped, files swapped between partitions) is refused even where every data file is intact.
        """
        obj = load_json(data, source=source)
        if not isinstance(obj, dict):
            raise CorruptCheckpointError(f"{source}: not a JSON object")
        version = obj.get("format_version")
        if (
            isinstance(version, bool)
            or not isinstance(version, int)
            or version not in SUPPORTED_FORMAT_VERSIONS
        ):
            shown = repr(version) if len(repr(version)) <= 40 else "an oversized value"
            raise CorruptCheckpointError(
                f"{source}: unknown format version {shown} "
                f"(this statesnap reads {sorted(SUPPORTED_FORMAT_VERSIONS)})"
            )
        if version >= 2 and obj.get("checksum") != canonical_checksum(obj):
            raise CorruptCheckpointError(
                f"{source}: the manifest does not match its own checksum (edited or damaged)"
            )
        try:
            return cls._from_json(obj, int(version))
        except CorruptCheckpointError as e:
            raise CorruptCheckpointError(f"{source}: {e}") from e

    @classmethod
    def _from_json(cls, obj: Mapping[str, Any], version: int) -> CheckpointManifest:
        raw_partitions = as_map(obj.get("partitions"), "partitions")
        partitions: dict[int, PartitionCheckpoint] = {}
        for name, entry in raw_partitions.items():
            p = as_partition(name)
            partitions[p] = PartitionCheckpoint.from_json(p, entry)
        paths = [f.path for pc in partitions.values() for f in pc.files]
        paths += [f.index.path for pc in partitions.values() for f in pc.files if f.index is not None]
        if len(paths) != len(set(paths)):
            raise CorruptCheckpointError("a data file is listed twice")
        generation = as_int(obj.get("generation"), "generation")
        newest = max((f.order[0] for pc in partitions.values() for f in pc.files), default=0)
        if newest > generation:
            raise CorruptCheckpointError(f"generation {generation} lists files of generation {newest}")
        try:
            created = datetime.fromisoformat(as_str(obj.get("created_at"), "created_at", max_len=64))
            state = CheckpointState(obj.get("state", "COMPLETED"))
        except (TypeError, ValueError) as e:
            raise CorruptCheckpointError(f"malformed manifest ({str(e)[:120]})") from e
        if created.tzinfo is None:
            created = created.replace(tzinfo=UTC)
        topic_id = obj.get("topic_id")
        versions = {
            as_str(store, "a state version's store", max_len=255): as_int(
                v, f"state version of {store[:60]!r}", lo=1, hi=2**31 - 1
            )
            for store, v in as_map(obj.get("state_versions") or {}, "state_versions").items()
        }
        return cls(
            table=as_str(obj.get("table"), "table", max_len=255),
            topic=as_str(obj.get("topic"), "topic", max_len=255),
            cluster_id=as_str(obj.get("cluster_id"), "cluster_id", max_len=255),
            generation=generation,
            partitions=partitions,
            created_at=created,
            state=state,
            writer=dict(as_map(obj.get("writer") or {}, "writer")),
            format_version=version,
            topic_id=as_str(topic_id, "topic_id", max_len=64) if topic_id else None,
            state_versions=versions,
        )
