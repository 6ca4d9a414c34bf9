"""SQL over any generation of a table or processor store, through DuckDB.

The checkpoint's files are read through statesnap's blob store, each one's size and checksum
verified against the manifest, and handed to DuckDB as Arrow tables: no second S3 client to
configure (DuckDB's ``httpfs`` would need its own endpoint, region and credentials), the same
``file://`` and ``s3://`` URLs and options as every other command, and a damaged file is refused
instead of queried. The merge-on-read is the one docs/reading-checkpoints.md gives in SQL: for each
key, the row of the partition's last file holding it wins (within a file the highest offset); a
winning tombstone (null value) removes the key (:data:`MERGE_SQL`).

A table is registered as a view named after it; a processor's store (``store=``) as a view named
after the store, its rows read by the shared readback core (:mod:`statesnap.processor.readback`:
key prefix removed, window stores with ``window_start``/``window_end``). Keys and values are BLOBs;
with a key or value serde (``string`` or ``json``) the view adds ``key_string``/``key_json`` and
``value_string``/``value_json`` (a DuckDB ``JSON`` value: ``value_json->>'name'``).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from statesnap.blob import BlobStore, open_blob_store
from statesnap.checkpoint.discovery import locate_table
from statesnap.checkpoint.manifest import CheckpointManifest, DataFile
from statesnap.checkpoint.repository import IO_THREADS, CheckpointRepository
from statesnap.checkpoint.restore import CheckpointSelector
from statesnap.errors import ConfigError, CorruptCheckpointError

if TYPE_CHECKING:
    import duckdb

__all__ = ["MERGE_SQL", "SERDE_COLUMNS", "SqlResult", "connect", "query_generation", "quote_name"]

#: The recipe's merge over ``_statesnap_rows`` (key, value, offset, timestamp, partition,
#: file_no: the file's place in its partition's apply order), as one view's body.
MERGE_SQL = """
SELECT key, value, "offset", "timestamp", partition
FROM _statesnap_rows
QUALIFY row_number() OVER (
            PARTITION BY key ORDER BY partition DESC, file_no DESC, "offset" DESC) = 1
    AND value IS NOT NULL
"""
#: Convenience columns per serde: the DuckDB expression over a BLOB column and its name's suffix.
SERDE_COLUMNS = {"string": "decode({c})", "json": "CAST(decode({c}) AS JSON)"}
_TIMESTAMP = pa.timestamp("ms", tz="UTC")
_INSTALL_HINT = "statesnap sql needs DuckDB: pip install 'statesnap[sql]' (or pip install duckdb)"


def quote_name(name: str) -> str:
    """*name* as a DuckDB identifier: table and store names may hold ``-`` and ``.``."""
    return '"' + name.replace('"', '""') + '"'


def connect() -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection; a one-line :class:`ConfigError` naming the extra when
    DuckDB is not installed."""
    try:
        import duckdb
    except ImportError as e:
        raise ConfigError(_INSTALL_HINT) from e
    return duckdb.connect(":memory:")


@dataclass(frozen=True, slots=True)
class SqlResult:
    """A query's answer over one generation: the view it ran against, the columns and rows."""

    view: str
    table: str
    store: str | None
    generation: int
    columns: list[str]
    rows: list[tuple[Any, ...]]
    seconds: float

    def records(self) -> list[dict[str, Any]]:
        """Rows as JSON-ready objects: bytes as UTF-8 text, or under ``<column>_b64`` (as
        ``dump`` prints them)."""
        out = []
        for row in self.rows:
            obj: dict[str, Any] = {}
            for name, value in zip(self.columns, row, strict=True):
                obj.update(_shown(name, value))
            out.append(obj)
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "view": self.view,
            "table": self.table,
            "store": self.store,
            "generation": self.generation,
            "columns": self.columns,
            "rows": self.records(),
        }

    def summary(self) -> str:
        return "\n".join(self.lines())

    def lines(self) -> Iterator[str]:
        """An aligned text table, then a line saying what was read."""
        cells = [[_cell(v) for v in row] for row in self.rows]
        widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(self.columns)]
        yield "  ".join(c.ljust(w) for c, w in zip(self.columns, widths, strict=True)).rstrip()
        yield "  ".join("-" * w for w in widths)
        for row in cells:
            yield "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        yield f"({len(self.rows)} rows; {self.view} at generation {self.generation}, {self.seconds:.2f}s)"


def _shown(name: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
        try:
            return {name: data.decode("utf-8")}
        except UnicodeDecodeError:
            return {f"{name}_b64": base64.b64encode(data).decode()}
    if isinstance(value, datetime):
        return {name: value.isoformat()}
    return {name: value}


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return "0x" + data.hex()
    return str(value)


def query_generation(
    checkpoints: str | BlobStore,
    table: str,
    query: str,
    *,
    generation: int | None = None,
    store: str | None = None,
    key_serde: str | None = None,
    value_serde: str | None = None,
    cluster_id: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> SqlResult:
    """Run *query* against *table* (or its processor *store*) at *generation* (default: the
    newest usable checkpoint), registered as a view named after it."""
    started = time.monotonic()
    for what, serde in (("key", key_serde), ("value", value_serde)):
        if serde not in (None, "bytes", *SERDE_COLUMNS):
            raise ConfigError(f"--{what}-serde {serde!r}: sql decodes bytes, string or json")
    blob = (
        open_blob_store(checkpoints, **(storage_options or {}))
        if isinstance(checkpoints, str)
        else checkpoints
    )
    con = connect()
    try:
        if store is None:
            manifest = register_table(con, blob, table, generation=generation, cluster_id=cluster_id)
            view = table
        else:
            manifest = register_store(con, blob, table, store, generation=generation, cluster_id=cluster_id)
            view = store
        _create_view(con, view, "_statesnap_merged", key_serde, value_serde)
        try:
            cursor = con.execute(query)
            columns = [d[0] for d in cursor.description or []]
            rows = cursor.fetchall() if cursor.description else []
        except Exception as e:  # duckdb.Error: the user's SQL (or a value its serde cannot read)
            message = " ".join(str(e).split())
            raise ConfigError(f"SQL error on {view!r}: {message[:400]}") from e
    finally:
        con.close()
    return SqlResult(
        view, table, store, manifest.generation, columns, [tuple(r) for r in rows], time.monotonic() - started
    )


def register_table(
    con: duckdb.DuckDBPyConnection,
    blob: BlobStore,
    table: str,
    *,
    generation: int | None = None,
    cluster_id: str | None = None,
) -> CheckpointManifest:
    """Register the chosen checkpoint's rows as ``_statesnap_rows`` and their merge-on-read as
    ``_statesnap_merged``; returns the manifest read."""
    repo = locate_table(blob, table, cluster_id)
    manifest = _chosen(repo, table, generation)
    con.register("_statesnap_rows", checkpoint_rows(repo, manifest))
    con.execute(f"CREATE TEMP VIEW _statesnap_merged AS {MERGE_SQL}")
    return manifest


def checkpoint_rows(repo: CheckpointRepository, manifest: CheckpointManifest) -> pa.Table:
    """Every row of the manifest's files, each file verified (size, checksum, rows), with its
    partition and its place in the partition's apply order (``file_no``)."""
    listed = [
        (partition, file_no, f)
        for partition, pc in sorted(manifest.partitions.items())
        for file_no, f in enumerate(pc.files)
    ]

    def read(item: tuple[int, int, DataFile]) -> pa.Table:
        partition, file_no, f = item
        rows = repo.read_file(f)  # size and checksum against the manifest
        if rows.num_rows != f.rows:
            raise CorruptCheckpointError(
                f"{repo.shown}/{f.path}: {rows.num_rows} rows, the manifest says {f.rows}"
            )
        rows = rows.select(["key", "value", "offset", "timestamp"])
        # Files of older statesnap versions lack the UTC flag: one instant type for all.
        rows = rows.set_column(3, "timestamp", rows.column("timestamp").cast(_TIMESTAMP))
        return rows.append_column(
            "partition", pa.array(np.full(rows.num_rows, partition, np.int32))
        ).append_column("file_no", pa.array(np.full(rows.num_rows, file_no, np.int32)))

    # S3 latency dominates small files: several downloads in flight, as a restore does.
    with ThreadPoolExecutor(IO_THREADS, thread_name_prefix="statesnap-sql") as pool:
        parts = list(pool.map(read, listed))
    if not parts:  # an empty table: a view of no rows, not DuckDB's "cannot take NULL list"
        return pa.table(
            {
                "key": pa.array([], pa.binary()),
                "value": pa.array([], pa.binary()),
                "offset": pa.array([], pa.int64()),
                "timestamp": pa.array([], _TIMESTAMP),
                "partition": pa.array([], pa.int32()),
                "file_no": pa.array([], pa.int32()),
            }
        )
    return pa.concat_tables(parts, promote_options="permissive")


def register_store(
    con: duckdb.DuckDBPyConnection,
    blob: BlobStore,
    table: str,
    store: str,
    *,
    generation: int | None = None,
    cluster_id: str | None = None,
) -> CheckpointManifest:
    """Register processor *table*'s *store* at the chosen generation as ``_statesnap_merged`` (read by the
    readback core, which merges and verifies as a restore does)."""
    from statesnap.processor.readback import StoreCheckpoint, spark_columns

    chosen = StoreCheckpoint.open(blob, table, store, generation=generation, cluster_id=cluster_id)
    columns = spark_columns(chosen.info)
    tables = [rows.select(columns) for _, rows in chosen.partitions()]
    schema = pa.schema([chosen.info.schema.field(c) for c in columns])
    rows = pa.concat_tables(tables, promote_options="permissive") if tables else schema.empty_table()
    con.register("_statesnap_merged", rows)
    return chosen.manifest


def _chosen(repo: CheckpointRepository, table: str, generation: int | None) -> CheckpointManifest:
    """The generation asked for, or the newest usable one: files present with their sizes
    (checksums are checked as the files are read)."""
    selector = CheckpointSelector(repo, table, generation, require_checkpoint=True)
    manifest = selector.newest_verified(None, datetime.now(UTC), deep=False)
    assert manifest is not None  # require_checkpoint raises instead
    return manifest


def _create_view(
    con: duckdb.DuckDBPyConnection, view: str, source: str, key_serde: str | None, value_serde: str | None
) -> None:
    """The view the user queries: every column of *source*, plus the serdes' decoded columns."""
    extra = [
        f"{SERDE_COLUMNS[serde].format(c=column)} AS {column}_{serde}"
        for column, serde in (("key", key_serde), ("value", value_serde))
        if serde in SERDE_COLUMNS
    ]
    columns = ", ".join(["*", *extra])
    con.execute(f"CREATE TEMP VIEW {quote_name(view)} AS SELECT {columns} FROM {source}")
