"""Bootstrap a checkpoint from a topic's history on Spark, in parallel over partitions.

Steps, in this order (the manifest last, so a crash leaves only unreferenced files):

1. Driver: cluster id, partitions, the true end of every partition (found by partition EOF), and
   the newest usable checkpoint of the table, if any: each partition resumes at its offsets.
2. Tasks (one per offset range; big partitions are split so every core works): read the range
   with confluent-kafka and fold it into newest-row-per-key in Arrow. A partition read by one task
   merges the previous checkpoint's rows and writes its sorted ``base`` file itself; partitions
   split over several tasks are merged in a second, small stage that writes the file.
3. Driver: commit the manifest with every partition's next offset = the end its tasks reached.

The Kafka reading runs in Python tasks directly (the same code as the ``statesnap-kafka``
source) rather than through a DataFrame: the records never cross into the JVM and back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from statesnap.blob import open_blob_store
from statesnap.checkpoint import (
    CheckpointManifest,
    CheckpointRepository,
    PartitionCheckpoint,
    RetentionPolicy,
    collect_garbage,
    datafile,
)
from statesnap.checkpoint.datafile import latest_per_key
from statesnap.checkpoint.layout import valid_table_name
from statesnap.checkpoint.manifest import DataFile
from statesnap.checkpoint.selection import TopicState, check_identity, unusable_reason
from statesnap.errors import CheckpointError, ConfigError
from statesnap.kafka.admin import KafkaAdmin
from statesnap.spark.changes import (
    ChangeFolder,
    commit_files,
    from_ipc,
    to_ipc,
    write_data_file,
)
from statesnap.spark.kafka_io import OffsetOracle, change_table, iter_range, split_ranges
from statesnap.spark.options import KafkaSourceOptions
from statesnap.spark.readback import newest_usable

log = logging.getLogger(__name__)

#: A partition is split over several tasks only in pieces of at least this many records.
MIN_SPLIT_RECORDS = 200_000


@dataclass(frozen=True, slots=True)
class _Split:
    partition: int
    index: int
    count: int
    start: int
    end: int
    previous: tuple[DataFile, ...]


def table_options(
    bootstrap_servers: str, topic: str, kafka_config: Mapping[str, Any] | None, timeout: float = 15.0
) -> KafkaSourceOptions:
    """Source options for table work: ``read_committed`` like :class:`statesnap.Table`;
    *timeout* bounds every wait for the cluster's metadata."""
    config = {"isolation.level": "read_committed"}
    config.update({k: str(v) for k, v in (kafka_config or {}).items() if k != "bootstrap.servers"})
    return KafkaSourceOptions(
        bootstrap_servers, topic, kafka_config=config, metadata_timeout_ms=max(1, int(timeout * 1000))
    )


def usable_previous(repo: CheckpointRepository, table: str, state: TopicState) -> CheckpointManifest | None:
    """The newest checkpoint a continuation may start from: one of another topic or cluster is
    refused, one retention or compaction made unsafe is skipped (the rules of a restore)."""
    now = datetime.now(UTC)

    def why_not(manifest: CheckpointManifest) -> str | None:
        check_identity(manifest, table, state)
        return unusable_reason(manifest, state, now)

    return newest_usable(repo, why_not)


def bootstrap(
    spark: Any,
    *,
    bootstrap_servers: str,
    topic: str,
    table: str,
    checkpoints: str,
    storage_options: Mapping[str, Any] | None = None,
    kafka_config: Mapping[str, Any] | None = None,
    retention: RetentionPolicy | None = None,
    min_partitions: int | None = None,
    timeout: float = 15.0,
) -> CheckpointManifest:
    """Write a checkpoint of *topic*'s table as of now, using the whole Spark cluster.

    With an existing checkpoint of *table* only the records after its offsets are read, and a
    new generation holds its rows plus those records; without one, the whole history is read.
    Returns the committed manifest (the previous one if nothing was appended since).
    ``retention`` runs GC after the commit. Partitions are split so that there are at least
    ``min_partitions`` tasks (default: the cluster's default parallelism, splitting only ranges
    of more than 2 × 200k records; an explicit value splits down to single records). An
    unreachable cluster fails after *timeout* seconds.
    """
    started = time.monotonic()
    if not valid_table_name(table):
        raise ConfigError(f"invalid table name {table!r}: use letters, digits, '.', '_', '-'")
    opts = table_options(bootstrap_servers, topic, kafka_config, timeout)
    admin = KafkaAdmin(opts.settings())
    cluster_id = admin.cluster_id()
    info = admin.describe_topic(topic)
    store = open_blob_store(checkpoints, **dict(storage_options or {}))
    store.check(writable=True)
    repo = CheckpointRepository.for_table(store, cluster_id, table)

    oracle = OffsetOracle(opts)
    try:
        earliest = oracle.earliest(info.partitions)
        ends = oracle.latest(info.partitions)
    finally:
        oracle.close()
    state = TopicState(topic, cluster_id, info.partitions, earliest, info.compacted, info.delete_retention_ms)
    previous = usable_previous(repo, table, state)
    prior = previous.partitions if previous is not None else {}
    starts = {}
    for p in info.partitions:
        starts[p] = prior[p].next_offset if p in prior else earliest[p]
        if starts[p] > ends[p]:
            raise CheckpointError(
                f"{repo.url} generation {previous.generation if previous else '?'} resumes partition "
                f"{p} at {starts[p]}, past the end of the topic ({ends[p]}): was it recreated?"
            )
    if (
        previous is not None
        and all(starts[p] == ends[p] for p in info.partitions)
        and set(info.partitions) <= set(previous.partitions)
    ):
        log.info("%s: nothing appended since generation %d", repo.url, previous.generation)
        return previous

    generation = repo.next_generation()
    planned = time.monotonic()
    sc = spark.sparkContext
    target = min_partitions or sc.defaultParallelism
    splits = _plan(starts, ends, previous, target, min_split=1 if min_partitions else MIN_SPLIT_RECORDS)
    results = _run(sc, splits, opts, repo, generation)
    ran = time.monotonic()

    files: dict[int, tuple[DataFile, ...]] = {}
    records = 0
    spent = {"read": 0.0, "fold": 0.0, "write": 0.0}
    for p, (meta, count, seconds) in results.items():
        files[p] = (DataFile.from_json(meta),)
        records += count
        spent = {k: spent[k] + seconds[k] for k in spent}
    for p in info.partitions:
        if p not in files:  # nothing new: keep referencing what the previous checkpoint holds
            files[p] = prior[p].files if p in prior else ()
    written = [f for p in results for f in files[p]]
    manifest = commit_files(
        repo,
        table=table,
        topic=topic,
        cluster_id=cluster_id,
        generation=generation,
        partitions={p: PartitionCheckpoint(p, ends[p], files[p]) for p in info.partitions},
        extra={
            "mode": "incremental" if previous is not None else "full",
            "base_generation": previous.generation if previous is not None else None,
            "tasks": len(splits),
            "files_written": len(written),
            "bytes_written": sum(f.bytes for f in written),
            "records_read": records,
            "duration_seconds": round(time.monotonic() - started, 3),
            "plan_seconds": round(planned - started, 3),
            "job_seconds": round(ran - planned, 3),
            "task_seconds": {k: round(v, 3) for k, v in spent.items()},
            "spark_version": spark.version,
        },
    )
    log.info(
        "bootstrapped %s generation %d: %d records read by %d tasks in %.1fs",
        repo.url,
        generation,
        records,
        len(splits),
        time.monotonic() - started,
    )
    if retention is not None:
        collect_garbage(repo, retention)
    return manifest


def _plan(
    starts: Mapping[int, int],
    ends: Mapping[int, int],
    previous: CheckpointManifest | None,
    target: int,
    *,
    min_split: int,
) -> list[_Split]:
    pieces = split_ranges(
        {p: (starts[p], ends[p]) for p in starts},
        min_partitions=target,
        max_records=None,
        min_split=min_split,
    )
    counts: dict[int, int] = {}
    for p, _s, _e in pieces:
        counts[p] = counts.get(p, 0) + 1
    splits, seen = [], dict.fromkeys(counts, 0)
    for p, s, e in pieces:
        known = previous.partitions.get(p) if previous is not None else None
        prior = known.files if known is not None and seen[p] == 0 else ()
        splits.append(_Split(p, seen[p], counts[p], s, e, prior))
        seen[p] += 1
    return splits


def _run(
    sc: Any, splits: list[_Split], opts: KafkaSourceOptions, repo: CheckpointRepository, generation: int
) -> dict[int, tuple[dict[str, Any], int, dict[str, float]]]:
    """Both stages; per partition: the written file (as JSON), records read, task seconds spent
    reading (Kafka + Arrow conversion), folding and writing."""
    if not splits:
        return {}

    def read_split(split: _Split) -> tuple[int, tuple[Any, ...]]:
        clock = time.perf_counter
        spent = {"read": 0.0, "fold": 0.0, "write": 0.0}
        mark = clock()
        start = None
        if split.previous:
            start = datafile.merge([repo.read_file(f) for f in split.previous])
        folder = ChangeFolder(start, keep_tombstones=split.index > 0)
        count = 0
        for msgs in iter_range(opts, split.partition, split.start, split.end):
            count += len(msgs)
            changes = change_table(msgs)
            now = clock()
            spent["read"] += now - mark
            folder.add(changes)
            mark = clock()
            spent["fold"] += mark - now
        rows = folder.result()
        now = clock()
        spent["fold"] += now - mark
        if split.count == 1:
            written = write_data_file(repo, generation, split.partition, "base", 0, rows)
            spent["write"] += clock() - now
            return split.partition, ("file", split.index, written.to_json(), count, spent)
        return split.partition, ("part", split.index, to_ipc(rows), count, spent)

    def finish(group: tuple[int, Iterable[tuple[Any, ...]]]) -> tuple[int, tuple[Any, ...]]:
        partition, items = group
        parts = sorted(items, key=lambda item: item[1])
        count = sum(item[3] for item in parts)
        spent = {k: sum(item[4][k] for item in parts) for k in ("read", "fold", "write")}
        if len(parts) == 1 and parts[0][0] == "file":
            return partition, (parts[0][2], count, spent)
        mark = time.perf_counter()
        rows = latest_per_key([from_ipc(item[2]) for item in parts], keep_tombstones=False)
        written = write_data_file(repo, generation, partition, "base", 0, rows)
        spent["write"] += time.perf_counter() - mark
        return partition, (written.to_json(), count, spent)

    n_partitions = len({s.partition for s in splits})
    stage1 = sc.parallelize(splits, len(splits)).map(read_split)
    if n_partitions == len(splits):  # every partition in one task: no second stage needed
        collected: Iterator[Any] = iter(stage1.map(lambda kv: finish((kv[0], [kv[1]]))).collect())
    else:
        stage2 = stage1.groupByKey(min(n_partitions, sc.defaultParallelism)).map(finish)
        collected = iter(stage2.collect())
    return dict(collected)
