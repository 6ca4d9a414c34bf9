"""Reading a checkpoint back as a DataFrame: base + deltas merged, tombstones removed.

The ``statesnap-checkpoint`` data source (:mod:`statesnap.spark.checkpoint_source`) plans one
task per Kafka partition; each task downloads its partition's files through the blob store
(checksums verified), merges them and hands Spark Arrow batches. It works for every blob store
statesnap supports (``file://``, ``s3://``) without Hadoop connectors. :func:`read_table`, here,
picks and checks the generation on the driver first, so a missing table or a corrupt checkpoint
fails with a typed error before any Spark job runs.

``as_of="now"`` adds the topic's tail: the driver fixes each partition's range ``[checkpoint's
next offset, end found by partition EOF)`` once, and each task folds its partition's range into the
checkpoint's rows (newest per key by offset, tombstones delete) — the fold the Spark bootstrap uses.
A key lives in one partition, so no shuffle is needed.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from statesnap.blob import BlobStore, open_blob_store
from statesnap.checkpoint import CheckpointManifest, CheckpointRepository, locate_table
from statesnap.checkpoint.restore import CheckpointSelector
from statesnap.errors import ConfigError
from statesnap.kafka.admin import KafkaAdmin
from statesnap.processor.readback import StoreInfo, spark_sql, store_info
from statesnap.spark.checkpoint_source import (
    CHECKPOINT_SOURCE_NAME,
    KAFKA_OPTION,
    STORAGE_OPTION,
    TAIL_OPTION,
)
from statesnap.spark.registration import register
from statesnap.spark.workers import is_local
from statesnap.spark.writer import check_table_options, table_options, topic_state

__all__ = ["AS_OF", "choose_manifest", "count_keys", "executor_storage_options", "read_table"]

log = logging.getLogger(__name__)

AS_OF = ("checkpoint", "now")


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
    store: str | None = None,
) -> Any:
    """The table as a DataFrame (``key, value, offset, timestamp, partition``), one row per key.

    ``store=NAME`` reads store NAME of the processor *table* instead: its rows as the checkpoint
    holds them (``key, value, offset, timestamp, partition``; a window store adds
    ``window_start, window_end`` after ``value``, epoch milliseconds), ``key`` being the user's key
    bytes. Always ``as_of="checkpoint"``: a store cannot be brought past its checkpoint without
    running the processor's handler. A name not among the manifest's stores raises
    :class:`ConfigError` listing them.

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
    if store is not None and as_of != "checkpoint":
        raise ConfigError(
            f"store={store!r} is read as its checkpoint holds it (as_of='checkpoint'): a store cannot be "
            "brought up to date from the topic without running the processor's handler"
        )
    if as_of == "now" and generation is not None:
        raise ConfigError(
            "as_of='now' reads the newest usable checkpoint plus the topic's tail; "
            "drop generation, or read generation as_of='checkpoint'"
        )
    if as_of == "now" and not bootstrap_servers:
        raise ConfigError("as_of='now' reads the topic's tail: bootstrap_servers is required")
    if as_of == "checkpoint" and (bootstrap_servers or kafka_config or topic):
        raise ConfigError("bootstrap_servers, kafka_config and topic apply to as_of='now' only")
    blobs = open_blob_store(url, **dict(storage_options or {}))
    blobs.check(writable=False)
    info: StoreInfo | None = None
    if as_of == "now":
        assert bootstrap_servers is not None
        kafka = {"bootstrap_servers": bootstrap_servers, "kafka_config": dict(kafka_config or {})}
        options = _as_of_now(blobs, url, table, cluster_id, topic, timeout, kafka)
    else:
        repo = locate_table(blobs, table, cluster_id)
        manifest = choose_manifest(repo, table, generation)
        if store is not None:  # on the driver: a typo'd store fails before any Spark job
            info = store_info(manifest, store)
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
        storage = executor_storage_options(blobs, storage)
    if storage and "url" in options:
        options[STORAGE_OPTION] = json.dumps(storage)
    rows = spark.read.format(CHECKPOINT_SOURCE_NAME).options(**options).load()
    if info is None:
        return rows
    where, columns = spark_sql(info)
    return rows.where(where).selectExpr(*columns)


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
    options = {TAIL_OPTION: json.dumps(tail), KAFKA_OPTION: json.dumps(secret)}
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
