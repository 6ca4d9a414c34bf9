"""Reading a checkpoint back as a DataFrame: base + deltas merged, tombstones removed.

The ``statesnap-checkpoint`` data source plans one task per Kafka partition; each task downloads
its partition's files through the blob store (checksums verified), merges them and hands Spark
Arrow batches. It works for every blob store statesnap supports (``file://``, ``s3://``) without
Hadoop connectors. :func:`read_table` picks and checks the generation on the driver first, so a
missing table or a corrupt checkpoint fails with a typed error before any Spark job runs.

``as_of="now"`` adds the topic's tail: the driver fixes each partition's range ``[checkpoint's
next offset, end found by partition EOF)`` once, and each task folds its partition's range into the
checkpoint's rows (newest per key by offset, tombstones delete) — the fold the Spark bootstrap uses.
A key lives in one partition, so no shuffle is needed.
"""

from __future__ import annotations

import dataclasses
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

from statesnap.blob import BlobStore, open_blob_store
from statesnap.checkpoint import CheckpointManifest, CheckpointRepository, datafile, locate_table
from statesnap.checkpoint.manifest import PartitionCheckpoint
from statesnap.checkpoint.repository import checked_merge
from statesnap.checkpoint.restore import CheckpointSelector
from statesnap.errors import ConfigError
from statesnap.kafka.admin import KafkaAdmin
from statesnap.spark.changes import ChangeFolder
from statesnap.spark.kafka_io import change_table, iter_range
from statesnap.spark.options import KafkaSourceOptions
from statesnap.spark.session import is_local
from statesnap.spark.writer import check_table_options, table_options, topic_state

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
#: ``as_of="now"``: Kafka settings as JSON, hidden the same way (SASL passwords).
_KAFKA_OPTION = "kafka.secret"
#: ``as_of="now"``: the tail each partition adds, ``{"partition": [start, end]}``, fixed on the driver.
_TAIL_OPTION = "tail"
AS_OF = ("checkpoint", "now")
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
    storage = json.loads(options.get(_STORAGE_OPTION, "{}"))
    return CheckpointRepository(open_blob_store(options["url"], **storage), options["directory"])


def _tail(options: Mapping[str, str]) -> dict[int, tuple[int, int]]:
    return {int(p): (int(r[0]), int(r[1])) for p, r in json.loads(options.get(_TAIL_OPTION, "{}")).items()}


def _kafka_options(options: Mapping[str, str]) -> KafkaSourceOptions:
    conf = json.loads(options[_KAFKA_OPTION])
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
            repo = _repo(self.options)
            rows = checked_merge(
                partition.checkpoint, [repo.read_file(f) for f in partition.checkpoint.files], source=repo.url
            )
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
        if _TAIL_OPTION in options:  # as of now: a checkpoint is optional, Kafka settings are not
            needed = [_KAFKA_OPTION, *(("url", "directory") if "generation" in options else ())]
        else:
            needed = ["url", "directory", "generation"]
        missing = [k for k in needed if k not in options]
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
    work = [p for p, pc_ in sorted(manifest.partitions.items()) if pc_.files]
    if not work:
        return 0

    def merged(partition: int) -> int:
        return int(repo.load_partition(manifest, partition).num_rows)

    return int(sum(spark.sparkContext.parallelize(work, len(work)).map(merged).collect()))


def read_table(
    spark: Any,
    url: str,
    table: str,
    generation: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    cluster_id: str | None = None,
    *,
    as_of: str = "checkpoint",
    bootstrap_servers: str | None = None,
    kafka_config: Mapping[str, Any] | None = None,
    topic: str | None = None,
    timeout: float = 15.0,
) -> Any:
    """The table as a DataFrame (``key, value, offset, timestamp, partition``), one row per key.

    ``as_of="checkpoint"`` (the default): the table at a checkpoint, read without Kafka. Any
    writer's checkpoints work (Python ``Table``, Spark bootstrap or streaming). Without
    *generation*, the newest usable checkpoint is read (the selection restores use: corrupt ones
    are skipped with a warning, checksums verified on the driver and again as tasks read).

    ``as_of="now"``: the table at the moment of the call, from *bootstrap_servers* (librdkafka
    settings in *kafka_config*, ``read_committed`` like a ``Table``): the newest checkpoint usable
    for the topic as it is now, plus every record from its offsets to each partition's end. The
    ends are found by partition EOF on the driver, once, and fixed in the plan, so every action
    on the DataFrame sees the same rows. Checkpoints are chosen as a restore chooses them: one of
    another incarnation of the topic (deleted and recreated: another topic ID, or offsets past a
    partition's end) is skipped with every older one, as is one whose offsets retention deleted;
    with none usable — or none at all — the table is replayed from the beginning of the topic.
    *topic* defaults to the table's topic (its descriptor or checkpoints), else the table name;
    the checkpoints are those of the broker's cluster unless *cluster_id* names one.
    """
    if as_of not in AS_OF:
        raise ConfigError(f"as_of={as_of!r}: use 'checkpoint' (the default) or 'now'")
    if as_of == "now" and generation is not None:
        raise ConfigError(
            "as_of='now' reads the newest usable checkpoint plus the topic's tail; "
            "drop generation, or read generation as_of='checkpoint'"
        )
    if as_of == "now" and not bootstrap_servers:
        raise ConfigError("as_of='now' reads the topic's tail: bootstrap_servers is required")
    if as_of == "checkpoint" and (bootstrap_servers or kafka_config or topic):
        raise ConfigError("bootstrap_servers, kafka_config and topic apply to as_of='now' only")
    from statesnap.spark import register

    store = open_blob_store(url, **dict(storage_options or {}))
    store.check(writable=False)
    if as_of == "now":
        assert bootstrap_servers is not None
        kafka = {"bootstrap_servers": bootstrap_servers, "kafka_config": dict(kafka_config or {})}
        options = _as_of_now(store, url, table, cluster_id, topic, timeout, kafka)
    else:
        repo = locate_table(store, table, cluster_id)
        manifest = choose_manifest(repo, table, generation)
        options = {"url": url, "directory": repo.directory, "generation": str(manifest.generation)}
        log.info(
            "reading %s generation %d (%s)",
            repo.url,
            manifest.generation,
            json.dumps({"rows": manifest.total_rows, "files": len(manifest.files)}),
        )
    register(spark)
    storage = {k: str(v) for k, v in (storage_options or {}).items() if v is not None}
    if not is_local(spark):  # executors elsewhere do not share the driver's environment
        storage = executor_storage_options(store, storage)
    if storage and "url" in options:
        options[_STORAGE_OPTION] = json.dumps(storage)
    return spark.read.format(CHECKPOINT_SOURCE_NAME).options(**options).load()


def _as_of_now(
    store: BlobStore,
    url: str,
    table: str,
    cluster_id: str | None,
    topic: str | None,
    timeout: float,
    kafka: dict[str, Any],
) -> dict[str, str]:
    """Driver side of ``as_of="now"``: ask the cluster (ends by EOF), choose the checkpoint as a
    restore does, and fix per partition the tail ``[next offset, end)`` as source options."""
    config = {k: str(v) for k, v in kafka["kafka_config"].items()}
    opts = check_table_options(table_options(kafka["bootstrap_servers"], table, config, timeout))
    admin = KafkaAdmin(opts.settings())
    actual = admin.cluster_id()
    repo = CheckpointRepository.for_table(store, cluster_id or actual, table)
    if topic is None:
        known = repo.descriptor() or {}
        latest = repo.latest() if "topic" not in known else None
        topic = str(known.get("topic") or (latest.topic if latest is not None else table))
    opts = dataclasses.replace(opts, topic=topic)  # the same settings, for the table's topic
    info = admin.describe_topic(topic)
    state = topic_state(opts, actual, info)
    earliest, ends = dict(state.log_start), dict(state.log_end or {})
    manifest = CheckpointSelector(repo, table).newest_verified(state, datetime.now(UTC))
    prior = manifest.partitions if manifest is not None else {}
    starts = {p: prior[p].next_offset if p in prior else earliest[p] for p in info.partitions}
    tail = {str(p): [starts[p], ends[p]] for p in info.partitions}
    secret = {**kafka, "kafka_config": config, "topic": topic, "timeout": timeout}
    options = {_TAIL_OPTION: json.dumps(tail), _KAFKA_OPTION: json.dumps(secret)}
    if manifest is not None:
        options.update(url=url, directory=repo.directory, generation=str(manifest.generation))
    log.info(
        "reading %s as of now: %s + %d records of %r up to %s",
        repo.url,
        f"generation {manifest.generation}" if manifest is not None else "no checkpoint (full replay)",
        sum(max(0, e - s) for s, e in (tuple(r) for r in tail.values())),
        topic,
        json.dumps({p: r[1] for p, r in tail.items()}),
    )
    return options
