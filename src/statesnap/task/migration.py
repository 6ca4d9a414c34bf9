"""State versions and migrations: the code that restores a store must read its rows' format.

A table (or a processor's store) declares its state version (``state=2``; default 1); every manifest records
the version of each store's rows. A checkpoint of another version is refused in one line naming
both, unless ``state=StateVersion(3, {1: fn, 2: fn2})`` chains it up to the code's version: each
``fn(key, value)`` gets a STORED row and returns the row of the next version, ``None`` to drop it,
or ``(key, value, partition)`` to say which partition the new key belongs to. A migration runs
while a checkpoint is loaded (:func:`statesnap.task.restore.restore_into_store`, the Spark
bootstrap's tasks) or offline into a new generation (:mod:`statesnap.task.offline_migration`). Keys may
change only within their partition: a table's reads and its consumer find a key in the partition
the producers' partitioner puts it in, so a key moved elsewhere would be lost or duplicated.

Readers (followers, ``dump``, ``read_table``, ``sql``) read any version as it is: they do not run
the owner's code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeAlias

import pyarrow as pa
import pyarrow.compute as pc

from statesnap.checkpoint.manifest import CheckpointManifest
from statesnap.errors import (
    ConfigError,
    EngineOptionError,
    MigrationError,
    StateVersionError,
)
from statesnap.kafka.partitioner import PartitionerSpec, resolve_partitioner

__all__ = [
    "MigratedRow",
    "Migration",
    "MigrationCounts",
    "RowMigrator",
    "StateVersion",
    "check_base",
    "migrate_rows",
]

#: A migration step: a stored row in, the next version's row out (None drops it; a 3-tuple names
#: the new key's partition).
MigratedRow: TypeAlias = tuple[bytes, bytes] | tuple[bytes, bytes, int] | None
Migration: TypeAlias = Callable[[bytes, bytes], MigratedRow]

#: Versions are int32 in manifests; nobody needs more.
_MAX_VERSION = 2**31 - 1


@dataclass(frozen=True, slots=True, init=False)
class StateVersion:
    """The version of the rows a task's code reads and writes, and how to bring older ones up.

    ``migrations[v]`` turns version-``v`` rows into version ``v + 1``; every step from a
    checkpoint's version up to ``version`` must be there.
    """

    version: int
    migrations: Mapping[int, Migration | Mapping[str, Migration]]

    def __init__(
        self, version: int = 1, migrations: Mapping[int, Migration | Mapping[str, Migration]] | None = None
    ) -> None:
        if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= _MAX_VERSION:
            raise ConfigError(f"a state version must be an integer >= 1, got {version!r}")
        steps = dict(migrations or {})
        for v, fn in steps.items():
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v < version:
                raise ConfigError(
                    f"migrations[{v!r}]: a migration is keyed by the version it reads, 1 to "
                    f"{version - 1} for state version {version}"
                )
            per_store = isinstance(fn, Mapping) and all(callable(f) for f in fn.values())
            if not callable(fn) and not per_store:
                raise ConfigError(
                    f"migrations[{v}] is not callable (fn(key, value) -> (key, value) | None), nor a "
                    'processor\'s {"store": fn}'
                )
        object.__setattr__(self, "version", version)
        object.__setattr__(self, "migrations", MappingProxyType(steps))

    @classmethod
    def of(cls, state: int | StateVersion) -> StateVersion:
        """``state=2`` as ``StateVersion(2)``; a StateVersion as it is."""
        return state if isinstance(state, StateVersion) else cls(state)

    def row_steps(self, owner: str) -> Mapping[int, Migration]:
        """The steps as a table runs them, on its rows: a processor's per-store form
        (``{1: {"balances": fn}}``) is refused in one line naming *owner*."""
        steps: dict[int, Migration] = {}
        for v, fn in self.migrations.items():
            if isinstance(fn, Mapping):
                raise ConfigError(
                    f"{owner}: migrations[{v}] maps store names to steps, a Processor's form; a "
                    "table's step is fn(key, value)"
                )
            steps[v] = fn
        return steps

    def steps(self, found: int, *, store: str, generation: int | None = None) -> tuple[Migration, ...]:
        """The migrations that bring version-*found* rows of *store* to this version (empty when
        it is this version); :class:`CheckpointMismatchError` naming both versions when there is
        no way: a newer checkpoint than the code, or a step missing."""
        if found == self.version:
            return ()
        where = f"checkpoint generation {generation}" if generation is not None else "the checkpoint"
        if found > self.version:
            raise StateVersionError(
                f"{store}: {where} holds state version {found}, newer than this code's version "
                f"{self.version}; run the newer code, or start from an older generation"
            )
        missing = [v for v in range(found, self.version) if v not in self.migrations]
        if missing:
            raise StateVersionError(
                f"{store}: {where} holds state version {found} but this code is version "
                f"{self.version}; register migrations for {', '.join(f'{v}→{v + 1}' for v in missing)} "
                "(StateVersion(version, migrations={...})) or start from a generation of version "
                f"{self.version}; refusing to mix formats"
            )
        rows = self.row_steps(store)
        return tuple(rows[v] for v in range(found, self.version))

    def migrator(
        self,
        manifest: CheckpointManifest,
        store: str,
        *,
        partitions: int,
        partitioner: PartitionerSpec = "murmur2_random",
    ) -> RowMigrator | None:
        """What loading *store* from *manifest* needs: None when its rows are of this version."""
        found = manifest.state_version(store)
        steps = self.steps(found, store=store, generation=manifest.generation)
        if not steps:
            return None
        return RowMigrator(store, found, self.version, steps, resolve_partitioner(partitioner), partitions)


def check_base(state: StateVersion, previous: CheckpointManifest | None, store: str, *, engine: str) -> None:
    """A writer that builds on *previous*'s files without ever reading their rows (Spark's
    streaming materializer appends deltas to them) can continue only a checkpoint of its own
    state version: another is refused in one line (with migrations registered, they run where
    rows are read: a Python table's restore, a Spark bootstrap, ``statesnap checkpoints migrate``)."""
    if previous is None:
        return
    if state.steps(previous.state_version(store), store=store, generation=previous.generation):
        raise EngineOptionError(
            f"{store}: generation {previous.generation} holds state version "
            f"{previous.state_version(store)} and the {engine} engine does not run migrations; migrate it "
            f"with the python engine or `statesnap checkpoints migrate` first (to version {state.version})"
        )


@dataclass(slots=True)
class MigrationCounts:
    """What a migration did to the rows it saw (a dry run prints these)."""

    kept: int = 0
    changed: int = 0
    dropped: int = 0

    def add(self, other: MigrationCounts) -> None:
        self.kept += other.kept
        self.changed += other.changed
        self.dropped += other.dropped

    def to_json(self) -> dict[str, int]:
        return {"kept": self.kept, "changed": self.changed, "dropped": self.dropped}


@dataclass(slots=True)
class RowMigrator:
    """Brings one store's rows from version ``source`` to ``target``, partition by partition."""

    store: str
    source: int
    target: int
    steps: Sequence[Migration]
    partition_of: Callable[[bytes, int], int]
    partitions: int
    counts: MigrationCounts = field(default_factory=MigrationCounts)
    #: (partition, old key, old value, new key, new value) of the first changed or dropped rows.
    samples: list[tuple[int, bytes, bytes, bytes | None, bytes | None]] = field(default_factory=list)
    sample_size: int = 0

    def rows(self, partition: int, rows: pa.Table) -> pa.Table:
        """*rows* (a partition's checkpoint rows) migrated: sorted by key, one row per key."""
        return migrate_rows(
            rows, self.steps, partition=partition, check=self._check, counts=self.counts, sample=self._sample
        )

    def _sample(self, partition: int, old: tuple[bytes, bytes], new: tuple[bytes, bytes] | None) -> None:
        if len(self.samples) < self.sample_size:
            self.samples.append((partition, old[0], old[1], *(new or (None, None))))

    def _check(self, key: bytes, partition: int, claimed: int | None) -> None:
        if claimed is not None:
            where = claimed
        elif self.partitions > 0:
            where = self.partition_of(key, self.partitions)
        else:
            return
        if where != partition:
            shown = repr(key) if len(repr(key)) <= 60 else repr(key)[:57] + "…"
            how = "the migration says" if claimed is not None else "the table's partitioner puts it in"
            hint = (
                ""
                if claimed is not None
                else " (producers with another partitioner: return (key, value, partition) to say where)"
            )
            raise MigrationError(
                f"{self.store}: migration {self.source}→{self.target} moved key {shown} out of "
                f"partition {partition} ({how} partition {where}); keys may change only within "
                f"their partition{hint}"
            )


def migrate_rows(
    rows: pa.Table,
    steps: Sequence[Migration],
    *,
    partition: int,
    check: Callable[[bytes, int, int | None], None] | None = None,
    counts: MigrationCounts | None = None,
    sample: Callable[[int, tuple[bytes, bytes], tuple[bytes, bytes] | None], None] | None = None,
) -> pa.Table:
    """Apply *steps* in order to every row of *rows* (``key``/``value`` plus any other columns,
    kept as they are). A step returning None drops the row; a changed key is checked by *check*
    (key, this partition, the partition the step named or None). Two rows migrated onto one key
    keep the one written last (the highest ``offset``, as a replay would), and the result is
    sorted by key: what a store's ``load`` expects."""
    counts = counts if counts is not None else MigrationCounts()
    if rows.num_rows == 0 or not steps:
        counts.kept += rows.num_rows
        return rows
    keys: list[bytes | None] = rows.column("key").to_pylist()
    values: list[bytes | None] = rows.column("value").to_pylist()
    out_keys: list[bytes] = []
    out_values: list[bytes] = []
    take: list[int] = []
    for i, (key, value) in enumerate(zip(keys, values, strict=True)):
        assert key is not None  # checkpoint rows: no tombstones
        assert value is not None
        new = _apply(steps, key, value, partition, check)
        if sample is not None and new != (key, value):
            sample(partition, (key, value), new)
        if new is None:
            counts.dropped += 1
            continue
        if new == (key, value):
            counts.kept += 1
        else:
            counts.changed += 1
        out_keys.append(new[0])
        out_values.append(new[1])
        take.append(i)
    kept = rows.take(pa.array(take, pa.int64()))
    for name, column in (("key", out_keys), ("value", out_values)):  # same fields: schemas must match
        i = kept.schema.get_field_index(name)
        kept = kept.set_column(i, kept.schema.field(i), pa.array(column, kept.schema.field(i).type))
    return _one_per_key(kept)


def _apply(
    steps: Sequence[Migration],
    key: bytes,
    value: bytes,
    partition: int,
    check: Callable[[bytes, int, int | None], None] | None,
) -> tuple[bytes, bytes] | None:
    """One row through every step; None once a step drops it."""
    original = key
    claimed: int | None = None
    for step in steps:
        out = step(key, value)
        if out is None:
            return None
        if not isinstance(out, tuple) or len(out) not in (2, 3):
            raise MigrationError(
                f"a migration returned {type(out).__name__}; "
                "return (key, value), (key, value, partition) or None"
            )
        key, value = out[0], out[1]
        if not isinstance(key, bytes) or not isinstance(value, bytes):
            raise MigrationError("a migration must return the stored key and value as bytes")
        if len(out) == 3:
            claimed = out[2]
    if check is not None and (key != original or claimed is not None):
        check(key, partition, claimed)
    return key, value


def _one_per_key(rows: pa.Table) -> pa.Table:
    """Sorted by key; where migrated keys collide, the row written last wins."""
    order = [("key", "ascending")]
    if "offset" in rows.column_names:
        order.append(("offset", "descending"))
    rows = rows.sort_by(order)
    if rows.num_rows < 2:
        return rows
    key_col = rows.column("key")
    same = pc.equal(key_col.slice(1), key_col.slice(0, rows.num_rows - 1))
    first = pa.concat_arrays([pa.array([True]), pc.invert(same.combine_chunks())])
    return rows.filter(first)
