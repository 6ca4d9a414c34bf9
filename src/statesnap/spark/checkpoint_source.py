"""The ``statesnap-checkpoint`` data source: the executor side of reading a checkpoint back.

One task per Kafka partition: each downloads its partition's files through the blob store
(checksums verified, then checked against the manifest), merges them, folds in the partition's
tail of the topic where ``as_of="now"`` fixed one, and hands Spark Arrow batches. The driver side
(choosing the generation and the tail) is :mod:`statesnap.spark.readback`; this module is apart
from it because :func:`~statesnap.spark.registration.register` needs the source, and the
read-back driver needs ``register``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping

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
from statesnap.checkpoint import CheckpointRepository, datafile
from statesnap.checkpoint.manifest import PartitionCheckpoint
from statesnap.errors import ConfigError
from statesnap.spark.changes import ChangeFolder
from statesnap.spark.kafka_io import change_table, iter_range
from statesnap.spark.options import KafkaSourceOptions
from statesnap.spark.writer import table_options

__all__ = [
    "CHECKPOINT_SOURCE_NAME",
    "KAFKA_OPTION",
    "STORAGE_OPTION",
    "TABLE_SCHEMA",
    "TAIL_OPTION",
    "CheckpointDataSource",
    "CheckpointReader",
    "PartitionFiles",
    "fold_tail",
    "spark_rows",
]

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
STORAGE_OPTION = "storage.secret"
#: ``as_of="now"``: Kafka settings as JSON, hidden the same way (SASL passwords).
KAFKA_OPTION = "kafka.secret"
#: ``as_of="now"``: the tail each partition adds, ``{"partition": [start, end]}``, fixed on the driver.
TAIL_OPTION = "tail"
#: Rows per Arrow batch handed to Spark.
_BATCH_ROWS = 65_536


class PartitionFiles(InputPartition):
    """One task: the files of one Kafka partition, in apply order, then its tail offsets
    ``[start, end)`` (empty unless ``as_of="now"``)."""

    def __init__(
        self, partition: int, checkpoint: PartitionCheckpoint | None, start: int = 0, end: int = 0
    ) -> None:
        super().__init__(partition)
        self.partition = partition
        self.checkpoint = checkpoint
        self.start = start
        self.end = end


def _repo(options: Mapping[str, str]) -> CheckpointRepository:
    storage = json.loads(options.get(STORAGE_OPTION, "{}"))
    return CheckpointRepository(open_blob_store(options["url"], **storage), options["directory"])


def _tail(options: Mapping[str, str]) -> dict[int, tuple[int, int]]:
    return {int(p): (int(r[0]), int(r[1])) for p, r in json.loads(options.get(TAIL_OPTION, "{}")).items()}


def _kafka_options(options: Mapping[str, str]) -> KafkaSourceOptions:
    conf = json.loads(options[KAFKA_OPTION])
    return table_options(conf["bootstrap_servers"], conf["topic"], conf["kafka_config"], conf["timeout"])


def fold_tail(opts: KafkaSourceOptions, partition: int, rows: pa.Table, start: int, end: int) -> pa.Table:
    """*rows* (a partition's checkpointed table) with the records of ``[start, end)`` applied in
    offset order: newest row per key, tombstones delete, keyless records skipped."""
    if end <= start:
        return rows
    folder = ChangeFolder(rows)
    for msgs in iter_range(opts, partition, start, end):
        folder.add(change_table(msgs))
    return folder.result()


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
        files: dict[int, PartitionCheckpoint] = {}
        if "generation" in self.options:
            manifest = _repo(self.options).read_manifest(int(self.options["generation"]))
            files = {p: pc_ for p, pc_ in manifest.partitions.items() if pc_.files}
        tail = _tail(self.options)
        out: list[InputPartition] = []
        for p in sorted(set(files) | set(tail)):
            start, end = tail.get(p, (0, 0))
            if p in files or end > start:
                out.append(PartitionFiles(p, files.get(p), start, end))
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, PartitionFiles):
            return iter(())
        rows = datafile.empty_table()
        if partition.checkpoint is not None:  # the files, checked against what the manifest claims
            rows = _repo(self.options).merge_partition(partition.checkpoint)
        if partition.end > partition.start:
            opts = _kafka_options(self.options)
            rows = fold_tail(opts, partition.partition, rows, partition.start, partition.end)
        return spark_rows(partition.partition, rows)


class CheckpointDataSource(DataSource):
    """``spark.read.format("statesnap-checkpoint")``; use :func:`read_table` rather than this."""

    @classmethod
    def name(cls) -> str:
        return CHECKPOINT_SOURCE_NAME

    def schema(self) -> StructType:
        options = {str(k).lower(): str(v) for k, v in self.options.items()}
        if TAIL_OPTION in options:  # as of now: a checkpoint is optional, Kafka settings are not
            needed = [KAFKA_OPTION, *(("url", "directory") if "generation" in options else ())]
        else:
            needed = ["url", "directory", "generation"]
        missing = [k for k in needed if k not in options]
        if missing:
            raise ConfigError(f"option(s) {missing} are required by {CHECKPOINT_SOURCE_NAME}")
        return TABLE_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return CheckpointReader({str(k).lower(): str(v) for k, v in self.options.items()})
