"""Reading a checkpoint back as a DataFrame: base + deltas merged, tombstones removed.

The ``statesnap-checkpoint`` data source plans one task per Kafka partition; each task downloads
its partition's files through the blob store (checksums verified), merges them and hands Spark
Arrow batches. It works for every blob store statesnap supports (``file://``, ``s3://``) without
Hadoop connectors. :func:`read_table` picks and checks the generation on the driver first, so a
missing table or a corrupt checkpoint fails with a typed error before any Spark job runs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StructField,
    StructType,
    TimestampType,
)

from statesnap.blob import open_blob_store
from statesnap.checkpoint import CheckpointManifest, CheckpointRepository, datafile, locate_table
from statesnap.checkpoint.manifest import DataFile
from statesnap.checkpoint.restore import CheckpointSelector
from statesnap.errors import ConfigError
from statesnap.spark.session import is_local

log = logging.getLogger(__name__)

CHECKPOINT_SOURCE_NAME = "statesnap-checkpoint"
TABLE_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("partition", IntegerType()),
    ]
)
_ARROW = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("partition", pa.int32()),
    ]
)
#: Storage options as JSON under a key Spark's redaction regex always hides (credentials).
_STORAGE_OPTION = "storage.secret"
#: Rows per Arrow batch handed to Spark.
_BATCH_ROWS = 65_536


class PartitionFiles(InputPartition):
    """One task: the files of one Kafka partition, in apply order."""

    def __init__(self, partition: int, files: tuple[DataFile, ...]) -> None:
        super().__init__(partition)
        self.partition = partition
        self.files = files


def _repo(options: Mapping[str, str]) -> CheckpointRepository:
    storage = json.loads(options.get(_STORAGE_OPTION, "{}"))
    return CheckpointRepository(open_blob_store(options["url"], **storage), options["directory"])


def spark_rows(partition: int, rows: pa.Table) -> Iterator[pa.RecordBatch]:
    """Data-file rows as Arrow batches in :data:`TABLE_SCHEMA` (timestamps in µs, UTC)."""
    micros = pc.multiply(rows.column("timestamp").cast(pa.int64()), 1000)
    table = pa.table(
        [
            rows.column("key"),
            rows.column("value"),
            rows.column("offset"),
            micros.cast(pa.timestamp("us", tz="UTC")),
            pa.array(np.full(rows.num_rows, partition, np.int32)),
        ],
        schema=_ARROW,
    )
    yield from table.to_batches(max_chunksize=_BATCH_ROWS)


class CheckpointReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = dict(options)

    def partitions(self) -> list[InputPartition]:
        repo = _repo(self.options)
        manifest = repo.read_manifest(int(self.options["generation"]))
        return [PartitionFiles(p, pc_.files) for p, pc_ in sorted(manifest.partitions.items()) if pc_.files]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, PartitionFiles):
            return iter(())
        repo = _repo(self.options)
        rows = datafile.merge([repo.read_file(f) for f in partition.files])
        return spark_rows(partition.partition, rows)


class CheckpointDataSource(DataSource):
    """``spark.read.format("statesnap-checkpoint")``; use :func:`read_table` rather than this."""

    @classmethod
    def name(cls) -> str:
        return CHECKPOINT_SOURCE_NAME

    def schema(self) -> StructType:
        options = {str(k).lower(): str(v) for k, v in self.options.items()}
        missing = [k for k in ("url", "directory", "generation") if k not in options]
        if missing:
            raise ConfigError(f"option(s) {missing} are required by {CHECKPOINT_SOURCE_NAME}")
        return TABLE_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return CheckpointReader({str(k).lower(): str(v) for k, v in self.options.items()})


def executor_storage_options(store: Any, given: dict[str, str]) -> dict[str, str]:
    """*given* plus what the driver resolved from its environment (S3 endpoint, credentials)."""
    from statesnap.blob.s3 import S3BlobStore

    if not isinstance(store, S3BlobStore):
        return given
    return {**store.for_executors().options, **given}


def choose_manifest(repo: CheckpointRepository, table: str, generation: int | None) -> CheckpointManifest:
    """The asked-for generation or the newest usable one, fully verified (checksums included) —
    the selection every reader and writer of statesnap uses."""
    selector = CheckpointSelector(repo, table, generation, require_checkpoint=True)
    manifest = selector.newest_verified(None, datetime.now(UTC))
    assert manifest is not None  # require_checkpoint raises instead
    return manifest


def count_keys(spark: Any, repo: CheckpointRepository, manifest: CheckpointManifest) -> int:
    """The table's key count at *manifest*: recorded by the writer, or merged in tasks."""
    known = manifest.keys
    if known is not None:
        return known
    work = [(p, pc.files) for p, pc in sorted(manifest.partitions.items()) if pc.files]
    if not work:
        return 0

    def merged(item: tuple[int, tuple[DataFile, ...]]) -> int:
        return int(datafile.merge([repo.read_file(f) for f in item[1]]).num_rows)

    return int(sum(spark.sparkContext.parallelize(work, len(work)).map(merged).collect()))


def read_table(
    spark: Any,
    url: str,
    table: str,
    generation: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    cluster_id: str | None = None,
) -> Any:
    """The table at a checkpoint as a DataFrame (``key, value, offset, timestamp, partition``).

    Any writer's checkpoints work (Python ``Table``, Spark bootstrap or streaming). Without
    *generation*, the newest usable checkpoint is read (the selection restores use: corrupt ones
    are skipped with a warning, checksums verified on the driver and again as tasks read).
    """
    from statesnap.spark import register

    store = open_blob_store(url, **dict(storage_options or {}))
    store.check(writable=False)
    repo = locate_table(store, table, cluster_id)
    manifest = choose_manifest(repo, table, generation)
    register(spark)
    options = {"url": url, "directory": repo.directory, "generation": str(manifest.generation)}
    storage = {k: str(v) for k, v in (storage_options or {}).items() if v is not None}
    if not is_local(spark):  # executors elsewhere do not share the driver's environment
        storage = executor_storage_options(store, storage)
    if storage:
        options[_STORAGE_OPTION] = json.dumps(storage)
    log.info(
        "reading %s generation %d (%s)",
        repo.url,
        manifest.generation,
        json.dumps({"rows": manifest.total_rows, "files": len(manifest.files)}),
    )
    return spark.read.format(CHECKPOINT_SOURCE_NAME).options(**options).load()
