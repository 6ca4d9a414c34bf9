"""Finding a table's checkpoints under a root: by its cluster, or the only table of that name.

Table directories are ``<cluster id>_<table>`` (:func:`statesnap.checkpoint.layout.table_dir`);
a directory's descriptor (or, before the first one was written, its newest manifest) says which
table and cluster it holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from statesnap.blob.base import BlobStore
from statesnap.checkpoint import layout
from statesnap.checkpoint.repository import CheckpointRepository
from statesnap.errors import ConfigError, TableNotFoundError

__all__ = ["TableLocation", "discover_tables", "locate_table"]


@dataclass(frozen=True, slots=True)
class TableLocation:
    """A table directory found under a root, with what its newest manifest says about it."""

    directory: str
    table: str
    cluster_id: str | None


def locate_table(store: BlobStore, table: str, cluster_id: str | None = None) -> CheckpointRepository:
    """The one way to find a table under a checkpoint root: by its cluster, or the only one.

    Raises :class:`TableNotFoundError` when nothing of *table* is there, :class:`ConfigError` when
    several clusters' tables share the name and *cluster_id* does not pick one.
    """
    if cluster_id is not None:
        repo = CheckpointRepository.for_table(store, cluster_id, table)
        if repo.descriptor() is None and not repo.generations():
            raise TableNotFoundError(f"no table {table!r} of cluster {cluster_id!r} under {store.shown}")
        return repo
    found = discover_tables(store, table)
    if not found:
        raise TableNotFoundError(f"no table {table!r} under {store.shown}")
    if len(found) > 1:
        clusters = ", ".join(sorted(str(f.cluster_id) for f in found))
        raise ConfigError(
            f"table {table!r} exists for several clusters under {store.shown} ({clusters}); pick one "
            "with cluster_id"
        )
    return CheckpointRepository(store, found[0].directory)


def discover_tables(store: BlobStore, table: str | None = None) -> list[TableLocation]:
    """Table directories under the root; with *table*, only those of that table (any cluster)."""
    found = []
    for name in store.list_dirs(""):
        if table is not None and not name.endswith(f"_{table}"):
            continue
        repo = CheckpointRepository(store, name)
        described = repo.descriptor()
        if described is not None:
            if table is None or described.get("table") == table:
                found.append(TableLocation(name, str(described["table"]), str(described["cluster_id"])))
            continue
        latest = repo.latest()
        if latest is None:
            if not repo.generations() and not store.list(name + "/" + layout.DATA_DIR + "/"):
                continue
            guess = table if table is not None else name
            cluster = name[: -len(table) - 1] if table is not None else None
            found.append(TableLocation(name, guess, cluster))
            continue
        if table is not None and latest.table != table:
            continue
        found.append(TableLocation(name, latest.table, latest.cluster_id))
    return found
