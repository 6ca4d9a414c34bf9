"""What changed between two snapshots: keys added, removed and changed.

It lives beside :mod:`statesnap.processor.readback`, whose reading of a processor's stores it
uses, above the task and snapshot layers (it was ``statesnap.snapshot.diff``: the snapshot
package, which every task imports, then imported the processor package, a cycle).

Runs on Arrow in this process (a hash join over the two checkpoints' merged rows); for tables
larger than memory, ``snapshot diff --engine spark`` (:func:`statesnap.cli.spark_engine.diff_on_spark`)
does the same join on Spark and answers the same JSON.

A processor's checkpoint is diffed store by store (``writer.processor.stores`` of its manifest):
a row is identified by its store, its partition and its key as the store holds it (a window
store's key and window start), so the counts are those of each store's rows and never include
the processor's own bookkeeping (the ``_statesnap`` stream-time keys). Examples are the first
keys of each kind in the order both engines sort them (identity columns ascending, bytes
unsigned), shown as the store's key (``key@window_start`` for a window store).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from statesnap.checkpoint.manifest import CheckpointManifest
from statesnap.checkpoint.repository import CheckpointRepository
from statesnap.errors import BlobNotFoundError, ConfigError, SnapshotNotFoundError
from statesnap.processor.keyspace import META_STORE, store_prefix
from statesnap.processor.readback import StoreInfo, processor_stores, read_store
from statesnap.processor.stores import StoreKind

__all__ = [
    "KINDS",
    "SAMPLE",
    "SnapshotDiff",
    "diff_snapshots",
    "diff_stores",
    "example_key",
    "identity_columns",
    "is_processor",
    "load_rows",
    "show_row",
]

#: Example keys of each kind a diff shows, on either engine.
SAMPLE = 5
#: The kinds of difference, in the order a diff shows them.
KINDS = ("added", "removed", "changed")


@dataclass(frozen=True, slots=True)
class SnapshotDiff:
    """Counts, plus up to ``sample`` example keys of each kind; a processor's also per store
    (``stores``; the counts are then their sums)."""

    old: int
    new: int
    added: int
    removed: int
    changed: int
    unchanged: int
    examples: dict[str, list[str]] = field(default_factory=dict)
    stores: dict[str, SnapshotDiff] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "old": self.old,
            "new": self.new,
            "added": self.added,
            "removed": self.removed,
            "changed": self.changed,
            "unchanged": self.unchanged,
            "examples": self.examples,
        }
        if self.stores:
            out["stores"] = {name: d.to_json() for name, d in sorted(self.stores.items())}
        return out

    @classmethod
    def of_stores(cls, stores: Mapping[str, SnapshotDiff], sample: int = SAMPLE) -> SnapshotDiff:
        """A processor's diff: the sums of its stores', examples as ``store:key`` (stores by name)."""
        ordered = sorted(stores.items())
        examples = {
            kind: [f"{name}:{key}" for name, d in ordered for key in d.examples.get(kind, [])][:sample]
            for kind in KINDS
        }

        def total(attr: str) -> int:
            return sum(int(getattr(d, attr)) for d in stores.values())

        return cls(
            old=total("old"),
            new=total("new"),
            added=total("added"),
            removed=total("removed"),
            changed=total("changed"),
            unchanged=total("unchanged"),
            examples=examples,
            stores=dict(ordered),
        )


def example_key(key: bytes, window_start: int | None = None) -> str:
    """A key as a diff shows it (both engines): UTF-8 with undecodable bytes escaped; a window
    store's with its window start (epoch ms)."""
    text = key.decode("utf-8", "backslashreplace")
    return text if window_start is None else f"{text}@{window_start}"


def identity_columns(info: StoreInfo) -> list[str]:
    """What identifies a store's row across two generations, in the order examples are sorted:
    a window store's stored key is its window start then its key; a key may be held in several
    partitions' stores (a handler may write any key), each its own row."""
    if info.kind is StoreKind.WINDOW:
        return ["window_start", "key", "partition"]
    return ["key", "partition"]


def is_processor(manifest: CheckpointManifest) -> bool:
    """Whether *manifest* is a processor's checkpoint (its writer lists stores)."""
    return isinstance(manifest.writer, Mapping) and "processor" in manifest.writer


def diff_stores(
    old: CheckpointManifest, new: CheckpointManifest, store: str | None = None
) -> dict[str, StoreInfo]:
    """The stores a processor diff compares: those of either generation (a store added or dropped
    between them is all added or all removed), or only *store* — :class:`ConfigError` listing
    the stores there are when it is in neither."""
    infos: dict[str, StoreInfo] = {}
    for manifest in (old, new):  # the newer description wins
        if is_processor(manifest):
            infos.update(processor_stores(manifest))
    infos.pop(META_STORE, None)
    if store is None:
        return infos
    if store not in infos:
        shown = ", ".join(sorted(infos)) or "none"
        raise ConfigError(
            f"processor {new.table!r} has no store {store!r} at generations {old.generation} and "
            f"{new.generation} (its stores: {shown})"
        )
    return {store: infos[store]}


def _manifest(repo: CheckpointRepository, generation: int) -> CheckpointManifest:
    """A generation's manifest; one that is gone (deleted, collected) is :class:`SnapshotNotFoundError`,
    as ``snapshot show`` and ``delete`` say."""
    try:
        return repo.read_manifest(generation)
    except BlobNotFoundError:
        raise SnapshotNotFoundError(f"no snapshot generation {generation} in {repo.shown}") from None


def load_rows(repo: CheckpointRepository, generation: int) -> pa.Table:
    """Every (key, value) of a checkpoint, all partitions merged (a processor's without its
    bookkeeping rows); a generation that is gone is :class:`SnapshotNotFoundError`."""
    manifest = _manifest(repo, generation)
    parts = [rows.select(["key", "value"]) for _p, rows in repo.iter_partitions(manifest)]
    if not parts:
        return pa.table({"key": pa.array([], pa.binary()), "value": pa.array([], pa.binary())})
    rows = pa.concat_tables(parts)
    if is_processor(manifest):  # a processor's own bookkeeping (stream time) is no state
        bookkeeping = pc.starts_with(rows.column("key").cast(pa.binary()), store_prefix(META_STORE).decode())
        rows = rows.filter(pc.invert(bookkeeping))
    return rows


def _store_frame(repo: CheckpointRepository, manifest: CheckpointManifest, info: StoreInfo) -> pa.Table:
    """*info*'s rows at *manifest* (identity columns and value); none when the store is not there."""
    columns = [*identity_columns(info), "value"]
    held = processor_stores(manifest) if is_processor(manifest) else {}
    parts = (
        [rows.select(columns) for _p, rows in read_store(repo, manifest, info)] if info.name in held else []
    )
    if not parts:
        return pa.table({c: pa.array([], info.schema.field(c).type) for c in columns})
    return pa.concat_tables(parts)


def _diff(
    a: pa.Table, b: pa.Table, keys: list[str], sample: int, show: Callable[[dict[str, Any]], str]
) -> SnapshotDiff:
    """The diff of rows *a* (old) and *b* (new) identified by *keys*, each with a ``value``."""
    a = a.select([*keys, "value"]).rename_columns([*keys, "old_value"])
    a = a.append_column("in_old", pa.array([True] * a.num_rows, pa.bool_()))
    b = b.select([*keys, "value"]).rename_columns([*keys, "new_value"])
    b = b.append_column("in_new", pa.array([True] * b.num_rows, pa.bool_()))
    joined = a.join(b, keys=keys, join_type="full outer")
    has_old = pc.is_valid(joined.column("in_old"))
    has_new = pc.is_valid(joined.column("in_new"))
    both = pc.and_(has_old, has_new)
    same = pc.fill_null(pc.equal(joined.column("old_value"), joined.column("new_value")), False)
    masks = {
        "added": pc.and_(pc.invert(has_old), has_new),
        "removed": pc.and_(has_old, pc.invert(has_new)),
        "changed": pc.and_(both, pc.invert(same)),
    }

    def count(mask: Any) -> int:
        return int(pc.sum(pc.cast(mask, pa.int64())).as_py() or 0)

    def first(mask: Any) -> list[str]:
        chosen = joined.filter(mask).select(keys).sort_by([(k, "ascending") for k in keys]).slice(0, sample)
        return [show(row) for row in chosen.to_pylist()]

    return SnapshotDiff(
        old=a.num_rows,
        new=b.num_rows,
        added=count(masks["added"]),
        removed=count(masks["removed"]),
        changed=count(masks["changed"]),
        unchanged=count(pc.and_(both, same)),
        examples={kind: first(mask) for kind, mask in masks.items()},
    )


def show_row(info: StoreInfo | None) -> Callable[[dict[str, Any]], str]:
    """How an example row (identity columns by name) is shown, on both engines."""
    if info is not None and info.kind is StoreKind.WINDOW:
        return lambda row: example_key(bytes(row["key"]), int(row["window_start"]))
    return lambda row: example_key(bytes(row["key"]))


def diff_snapshots(
    repo: CheckpointRepository, old: int, new: int, *, sample: int = SAMPLE, store: str | None = None
) -> SnapshotDiff:
    """Compare generation *old* with generation *new* of the same table — or of the same
    processor, store by store (only *store* with one)."""
    old_manifest, new_manifest = _manifest(repo, old), _manifest(repo, new)
    if is_processor(old_manifest) or is_processor(new_manifest):
        per_store = {
            name: _diff(
                _store_frame(repo, old_manifest, info),
                _store_frame(repo, new_manifest, info),
                identity_columns(info),
                sample,
                show_row(info),
            )
            for name, info in diff_stores(old_manifest, new_manifest, store).items()
        }
        return SnapshotDiff.of_stores(per_store, sample)
    if store is not None:
        raise ConfigError(
            f"{new_manifest.table!r} is a table, not a processor: it has no stores; diff it without --store"
        )
    return _diff(load_rows(repo, old), load_rows(repo, new), ["key"], sample, show_row(None))
