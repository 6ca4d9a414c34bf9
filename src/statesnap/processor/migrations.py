"""A processor's migrations, per store: ``state=StateVersion(2, {1: {"balances": fn}})``.

Every store of a task lives in one keyspace (:mod:`statesnap.processor.keyspace`), and a restore
migrates the task's stored rows (:mod:`statesnap.task.migration`). A user writes a step for one
store, on that store's key and value as the store holds them (the key without the keyspace prefix,
and for a window store without the window start; the value as stored, serialized, with a TTL
store's stamp): :func:`row_migrations` turns the per-store steps into the row-level steps a restore
runs. A step keeps its row in its store, partition and window (the prefix is put back); rows of
other stores and the task's bookkeeping pass unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from statesnap.errors import ConfigError, MigrationError
from statesnap.processor.keyspace import META_STORE, WINDOW_BYTES, partition_prefix, split_key
from statesnap.processor.stores import StoreSpec
from statesnap.task.migration import MigratedRow, Migration

__all__ = ["StoreMigration", "per_store", "row_migrations"]

#: A store's migration step: the store's key and value bytes in, the next version's out (None drops).
StoreMigration = Callable[[bytes, bytes], tuple[bytes, bytes] | None]


def row_migrations(
    processor: str,
    specs: Mapping[str, StoreSpec],
    migrations: Mapping[int, Migration | Mapping[str, Migration]] | None,
) -> dict[int, Migration]:
    """The row-level steps of *migrations* (version → store → step); a store that is not declared
    is a :class:`ConfigError` naming it."""
    out: dict[int, Migration] = {}
    for version, steps in per_store(processor, migrations).items():
        for store, fn in steps.items():
            if store not in specs or store == META_STORE:
                shown = ", ".join(specs) or "none"
                raise ConfigError(
                    f"processor {processor!r}: migrations[{version}] names store {store!r}, which it "
                    f"does not have (stores: {shown})"
                )
            if not callable(fn):
                raise ConfigError(
                    f"processor {processor!r}: migrations[{version}][{store!r}] is not callable"
                )
        out[version] = _row_step(dict(steps), {name: spec.window is not None for name, spec in specs.items()})
    return out


def per_store(
    processor: str, migrations: Mapping[int, Migration | Mapping[str, Migration]] | None
) -> dict[int, Mapping[str, Migration]]:
    """*migrations* in a processor's form, version → store → step; a table's form (a function
    per version) is a :class:`ConfigError` — checked when the processor is built, the store
    names when it starts (stores may be declared in between)."""
    out: dict[int, Mapping[str, Migration]] = {}
    for version, steps in (migrations or {}).items():
        if not isinstance(steps, Mapping):
            raise ConfigError(
                f"processor {processor!r}: migrations[{version!r}] must map store names to "
                'fn(key, value), as in {1: {"balances": fn}}'
            )
        out[version] = steps
    return out


def _row_step(steps: dict[str, Migration], windowed: Mapping[str, bool]) -> Migration:
    def step(key: bytes, value: bytes) -> MigratedRow:
        try:
            store, partition, rest = split_key(key)
        except ValueError:
            return key, value  # not a store's row
        fn = steps.get(store)
        if fn is None:
            return key, value
        window = b""
        if windowed.get(store, False):
            window, rest = rest[:WINDOW_BYTES], rest[WINDOW_BYTES:]
        new = fn(rest, value)
        if new is None:
            return None
        if not isinstance(new, tuple) or len(new) != 2:
            raise MigrationError(
                f"a migration of store {store!r} returned {type(new).__name__}; return (key, value) or None"
            )
        new_key, new_value = new
        if not isinstance(new_key, bytes) or not isinstance(new_value, bytes):
            raise MigrationError(f"a migration of store {store!r} must return the key and value as bytes")
        # The row stays in its partition: the keyspace prefix says which, not a partitioner.
        return partition_prefix(store, partition) + window + new_key, new_value, partition

    return step
