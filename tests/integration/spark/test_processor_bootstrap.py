"""A processor run over its input's history on Spark, then resumed by ``proc.run()`` in Python.

Invariant under test (DESIGN.md, processors): ``restore(checkpoint) + process(tail) == process(everything)``,
store for store and byte for byte, whichever engine wrote the checkpoint; a count folded by a Spark
aggregation writes the very rows the handler writes. Ground truth is a plain consumer loop in the test. Proven
on Apache Kafka (the suite's broker) and on Tansu (the dev broker): ordered partitions, record timestamps as
produced and partition EOF are all these tests rely on.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer

from integration.conftest import KafkaTool
from statesnap import (
    CheckpointOptions,
    ProcessingOptions,
    Processor,
    ProcessorContext,
    Record,
    StoreSpec,
    Windows,
)
from statesnap.blob import open_blob_store
from statesnap.checkpoint import CheckpointManifest, CheckpointRepository
from statesnap.errors import ConfigError, HandlerError
from statesnap.processor.keyspace import META_STORE, window_start_of
from statesnap.spark import CountPerKey, bootstrap_processor

pytestmark = [pytest.mark.spark, pytest.mark.integration]

BASE = 1_700_000_000_000  # a real epoch (ms): a zero timestamp means "now" to the producer
#: The keys every result of the materialize family prints (statesnap materialize --json).
MATERIALIZE_KEYS = {
    "table",
    "topic",
    "engine",
    "checkpoint",
    "written",
    "keys",
    "offsets",
    "restore",
    "checkpoint_seconds",
    "seconds",
    "bytes",
    "url",
    "engine_reason",
}


def payments(
    n: int,
    *,
    seed: int,
    partitions: int = 3,
    keys: int = 40,
    start: int = BASE,
    json_keys: bool = False,
    tombstones: bool = False,
) -> list[tuple[int, bytes | None, bytes | None, int]]:
    """(partition, key, value, timestamp): a key always in one partition; mostly rising event
    time with some records out of order; every 50th record has no key. With *json_keys*, keys are
    JSON objects spelled two ways (with and without a space), which a JSON key serde makes one;
    with *tombstones*, every 13th record has a null value (a count skips it, as Kafka Streams')."""
    rng = random.Random(seed)
    out: list[tuple[int, bytes | None, bytes | None, int]] = []
    clock = start
    for i in range(n):
        clock += rng.randrange(0, 3_000)
        ts = clock - (rng.randrange(0, 60_000) if rng.random() < 0.1 else 0)
        k = rng.randrange(keys)
        spelled = f'{{"id":{" " * (i % 2)}{k}}}' if json_keys else f"acct-{k}"
        key = None if i % 50 == 7 else spelled.encode()
        value = None if tombstones and i % 13 == 4 else json.dumps({"amount": i % 11}).encode()
        out.append((k % partitions, key, value, ts))
    return out


def produce(bootstrap: str, topic: str, records: list[Any]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for partition, key, value, ts in records:
        producer.produce(topic, value, key, partition=partition, timestamp=ts)
    assert producer.flush(30) == 0


def tally(name: str, topic: str, bootstrap: str, url: str | None, **options: Any) -> Processor:
    """A handler of the user's (balances), an aggregation (counts) and a windowed count whose
    windows expire: every kind of state a processor keeps. Built in a function, so Spark ships
    the handlers by value."""
    proc = Processor(
        name,
        inputs=[topic],
        bootstrap_servers=bootstrap,
        checkpoints=None if url is None else CheckpointOptions(url, interval="1h"),
        stores=["balances"],
        value_serde="json",
        **options,
    )

    @proc.handler
    def on_payment(record: Record, ctx: ProcessorContext) -> None:
        if record.key is None:
            return
        balances = ctx.stores["balances"]
        balances[record.key] = balances.get(record.key, 0) + record.value["amount"]
        ctx.emit(f"{topic}-out", record.key, balances[record.key])

    proc.count("counts")
    proc.count("per-minute", window=Windows.tumbling("1m", grace="10s", retention="3m"))
    return proc


def counting(name: str, topic: str, bootstrap: str, url: str) -> Processor:
    """A count per key of JSON keys (stored canonically: the stored key is not the raw key)."""
    proc = Processor(
        name,
        inputs=[topic],
        bootstrap_servers=bootstrap,
        checkpoints=CheckpointOptions(url, interval="1h"),
        key_serde="json",
    )
    proc.count("counts")
    return proc


def recompute(
    kafka: KafkaTool, topic: str, partitions: int = 3, *, json_keys: bool = False
) -> tuple[dict[bytes, int], dict[bytes, int]]:
    """Balances and counts per key by a plain consumer loop over the whole input (not statesnap);
    with *json_keys*, keyed by the canonical JSON of the key."""
    balances: dict[bytes, int] = {}
    counts: dict[bytes, int] = {}
    for r in kafka.read_all(topic, range(partitions)):
        if r.key is None or r.value is None:  # Kafka Streams' aggregations skip both
            continue
        key = json.dumps(json.loads(r.key), separators=(",", ":")).encode() if json_keys else r.key
        balances[key] = balances.get(key, 0) + json.loads(r.value)["amount"]
        counts[key] = counts.get(key, 0) + 1
    return balances, counts


def run_python(proc: Processor) -> tuple[Any, dict[str, dict[bytes, bytes]]]:
    """``proc.run(follow=False)``-like, keeping the state to compare: the restore report and
    every store's (stored key, value bytes)."""
    report = proc.start()
    try:
        stores = {name: dict(proc.store(name).raw_items()) for name in proc.stores}
    finally:
        proc.close()
    return report, stores


def checkpoint_rows(url: str, manifest: CheckpointManifest) -> dict[int, pa.Table]:
    repo = CheckpointRepository.for_table(open_blob_store(url), manifest.cluster_id, manifest.table)
    return {p: repo.merge_files(pc.files) for p, pc in manifest.partitions.items()}


def test_spark_bootstrap_of_a_processor_resumes_in_python(
    spark: Any, kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    """Spark runs the handler over the history (one task per partition, nothing emitted), a Python
    ``proc.run()`` resumes from its checkpoint with only the tail, and every store equals a full
    Python processing byte for byte and a plain consumer's recomputation."""
    topic = kafka.create_topic(topic_name, 3)
    kafka.create_topic(f"{topic}-out", 1)
    url = str(tmp_path / "ckpt")
    history = payments(1500, seed=1)
    produce(kafka.bootstrap, topic, history)
    heard: list[tuple[int, int, int]] = []

    result = bootstrap_processor(
        spark, tally("tally", topic, kafka.bootstrap, url), progress=lambda *a: heard.append(a)
    )
    manifest = result.manifest
    assert result.written
    assert result.path.value == "handler"
    assert result.processed == len(history)
    assert result.emitted == 0
    assert manifest.writer["engine"] == "spark"
    assert manifest.writer["processor"]["stores"]["per-minute"]["kind"] == "window"
    assert manifest.writer["records_read"] == len(history)
    assert manifest.writer["spark_tasks"] == 3
    assert all(len(pc.files) == 1 and pc.files[0].kind == "base" for pc in manifest.partitions.values())
    assert heard
    assert heard[-1] == (len(history), 3, 3)
    out = result.to_json()
    assert set(out) >= MATERIALIZE_KEYS
    assert out["restore"] == {
        "checkpoint": None,
        "replayed_records": len(history),
        "restore_seconds": out["restore"]["restore_seconds"],
    }
    assert out["stores"]["counts"] == 40
    assert out["checkpoint"] == manifest.generation
    assert kafka.read_all(f"{topic}-out", [0], timeout=5) == []  # a bootstrap emits nothing

    tail = payments(400, seed=2, start=history[-1][3])
    produce(kafka.bootstrap, topic, tail)
    report, resumed = run_python(tally("tally", topic, kafka.bootstrap, url))
    assert (report.checkpoint, report.replayed_records) == (manifest.generation, len(tail))
    _report, everything = run_python(tally("scratch", topic, kafka.bootstrap, None))
    assert resumed == everything  # every store, stored key and value bytes
    balances, counts = recompute(kafka, topic)
    assert {k: json.loads(v) for k, v in resumed["balances"].items()} == balances
    assert {k: json.loads(v) for k, v in resumed["counts"].items()} == counts
    assert resumed["per-minute"]  # recent windows are kept, the oldest dropped at retention
    starts = {window_start_of(k) for k in resumed["per-minute"]}
    assert len(starts) <= 4


def test_spark_bootstrap_continues_from_a_python_checkpoint(
    spark: Any, kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    """The other way round: Python checkpoints, more input, Spark continues from that checkpoint
    (loading its rows, reading only the records after it), and Python resumes from Spark's."""
    topic = kafka.create_topic(topic_name, 3)
    kafka.create_topic(f"{topic}-out", 1)
    url = str(tmp_path / "ckpt")
    first = payments(600, seed=3)
    produce(kafka.bootstrap, topic, first)
    python = tally("tally", topic, kafka.bootstrap, url)
    python.run(follow=False)
    assert python.last_checkpoint is not None
    more = payments(700, seed=4, start=first[-1][3])
    produce(kafka.bootstrap, topic, more)

    result = bootstrap_processor(spark, tally("tally", topic, kafka.bootstrap, url))
    assert result.restore.checkpoint == python.last_checkpoint.generation
    assert result.processed == len(more)
    assert result.manifest.writer["mode"] == "incremental"
    again = bootstrap_processor(spark, tally("tally", topic, kafka.bootstrap, url))
    assert not again.written
    assert again.manifest.generation == result.manifest.generation

    report, resumed = run_python(tally("tally", topic, kafka.bootstrap, url))
    assert (report.checkpoint, report.replayed_records) == (result.manifest.generation, 0)
    _report, everything = run_python(tally("scratch", topic, kafka.bootstrap, None))
    assert resumed == everything


def test_a_spark_count_writes_the_handler_path_rows_byte_for_byte(
    spark: Any, kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    """``CountPerKey``, in Python tasks (partitions split, partial counts merged) and as
    ``groupBy(partition, key).count()`` over the statesnap-kafka source, gives the handler
    path's data files row for row (key, value, offset and timestamp of every count;
    the stream time's key and value), from scratch and on top of a checkpoint, and Python resumes
    from it to the plain consumer's counts. Keys are JSON spelled two ways: the stored key is the
    key serde's, so two raw keys count as one, as the handler counts them; tombstones are not
    counted (a key's row carries its last counted record) and keyless records move no stream
    time."""
    topic = kafka.create_topic(topic_name, 3)
    url = str(tmp_path / "ckpt")
    produce(kafka.bootstrap, topic, payments(1200, seed=5, json_keys=True, tombstones=True))

    def both(generation_of: dict[str, int]) -> list[dict[int, pa.Table]]:
        by_handler = bootstrap_processor(spark, counting("by-handler", topic, kafka.bootstrap, url))
        rows = [checkpoint_rows(url, by_handler.manifest)]
        # Python tasks with partitions split in 4 pieces (the two-stage merge), and Spark SQL.
        for name, via, tasks in [("by-tasks", "tasks", 12), ("by-sql", "dataframe", None)]:
            by_count = bootstrap_processor(
                spark,
                counting(name, topic, kafka.bootstrap, url),
                aggregation=CountPerKey("counts", dataframe=via == "dataframe"),
                min_partitions=tasks,
            )
            assert by_count.path.value == "aggregation"
            assert by_count.manifest.writer["count_via"] == via
            assert by_count.processed == by_handler.processed
            # Keyless records and tombstones, counted alike by the fold and by the handler path.
            assert by_count.skipped == by_handler.skipped > 0
            assert by_count.to_json()["skipped"] == by_count.skipped
            assert by_count.stores == by_handler.stores
            assert by_count.manifest.offsets == by_handler.manifest.offsets
            generation_of[via] = by_count.manifest.generation
            rows.append(checkpoint_rows(url, by_count.manifest))
        return rows

    def same(handler_rows: dict[int, pa.Table], count_rows: dict[int, pa.Table]) -> None:
        assert set(handler_rows) == set(count_rows)
        for p, rows in handler_rows.items():
            other = count_rows[p]
            assert rows.column("key").to_pylist() == other.column("key").to_pylist()
            assert rows.column("value").to_pylist() == other.column("value").to_pylist()
            counts = [
                i
                for i, k in enumerate(rows.column("key").to_pylist())
                if not k.startswith(META_STORE.encode())
            ]
            for column in ("offset", "timestamp"):
                mine, theirs = rows.column(column).to_pylist(), other.column(column).to_pylist()
                assert [mine[i] for i in counts] == [theirs[i] for i in counts]

    gens: dict[str, int] = {}
    handler_rows, *count_rows = both(gens)
    for rows in count_rows:
        same(handler_rows, rows)
    produce(
        kafka.bootstrap, topic, payments(500, seed=6, start=BASE + 10**7, json_keys=True, tombstones=True)
    )
    first = dict(gens)
    handler_rows, *count_rows = both(gens)
    for rows in count_rows:
        same(handler_rows, rows)
    assert gens["tasks"] > first["tasks"]

    report, resumed = run_python(counting("by-tasks", topic, kafka.bootstrap, url))
    assert report.checkpoint == gens["tasks"]
    assert report.replayed_records == 0
    _balances, counts = recompute(kafka, topic, json_keys=True)
    assert len(counts) == 40
    assert {k: json.loads(v) for k, v in resumed["counts"].items()} == counts


@pytest.mark.long  # suite budget
def test_a_count_claim_the_handler_does_not_keep_is_refused(
    spark: Any, kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    """A processor declared ``CountPerKey`` whose handler sums instead is refused before any Spark
    job, in one typed line; nothing is committed."""
    topic = kafka.create_topic(topic_name, 3)
    url = str(tmp_path / "ckpt")
    produce(kafka.bootstrap, topic, payments(200, seed=7))
    proc = Processor(
        "sums", inputs=[topic], bootstrap_servers=kafka.bootstrap, checkpoints=url, value_serde="json"
    )
    proc.sum("counts", "amount")
    with pytest.raises(ConfigError, match="does not count records per key into store 'counts'"):
        bootstrap_processor(spark, proc, aggregation=CountPerKey("counts"))
    with pytest.raises(ConfigError, match="needs a key-value store named 'missing'"):
        bootstrap_processor(spark, proc, aggregation=CountPerKey("missing"))
    assert not list((tmp_path / "ckpt").glob("*_sums/snapshots/*.json"))
    expiring = Processor(
        "expiring", inputs=[topic], bootstrap_servers=kafka.bootstrap, checkpoints=url, value_serde="json"
    )
    expiring.add_store(StoreSpec("counts", ttl="1h"))
    expiring.handler(lambda record, ctx: None)
    with pytest.raises(ConfigError, match="has a ttl"):
        bootstrap_processor(spark, expiring, aggregation=CountPerKey("counts"))


def test_a_failing_handler_stops_the_bootstrap_with_its_record(
    spark: Any, kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    """A handler raising on a record (no dead-letter topic) ends the bootstrap with
    ``HandlerError`` naming the record, as the Python engine stops; no checkpoint is committed."""
    topic = kafka.create_topic(topic_name, 2)
    url = str(tmp_path / "ckpt")
    kafka.produce(topic, [(0, b"a", b'{"amount": 1}'), (1, b"b", b"not json"), (1, b"b", b'{"amount": 2}')])
    proc = tally("strict", topic, kafka.bootstrap, url)
    with pytest.raises(HandlerError, match=rf"{topic}\[1\]@0") as failed:
        bootstrap_processor(spark, proc)
    assert (failed.value.partition, failed.value.offset) == (1, 0)
    assert not list((tmp_path / "ckpt").glob("*_strict/snapshots/*.json"))
    with pytest.raises(ConfigError, match="no checkpoint store"):
        bootstrap_processor(spark, tally("none", topic, kafka.bootstrap, None))


@pytest.mark.long  # suite budget
def test_emit_true_sends_the_outputs_of_the_history(
    spark: Any, kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    """``emit=True``: the bootstrap is a backfill of the outputs too (at least once; here, with no
    task retried, exactly one per keyed record); an exactly-once processor refuses it."""
    topic = kafka.create_topic(topic_name, 2)
    kafka.create_topic(f"{topic}-out", 1)
    history = payments(300, seed=8, partitions=2)
    produce(kafka.bootstrap, topic, history)
    result = bootstrap_processor(spark, tally("backfill", topic, kafka.bootstrap, str(tmp_path)), emit=True)
    keyed = sum(1 for _p, key, _v, _ts in history if key is not None)
    assert result.emitted == keyed
    assert len(kafka.read_all(f"{topic}-out", [0])) == keyed
    with pytest.raises(ConfigError, match="exactly-once"):
        bootstrap_processor(
            spark,
            tally(
                "eos", topic, kafka.bootstrap, str(tmp_path), processing=ProcessingOptions(exactly_once=True)
            ),
            emit=True,
        )


def guarded(name: str, topic: str, bootstrap: str, url: str, *, strict: bool) -> Processor:
    """Balances that refuse a negative amount while *strict* (the bug a user then fixes)."""
    proc = Processor(
        name,
        inputs=[topic],
        bootstrap_servers=bootstrap,
        checkpoints=url,
        stores=["balances"],
        value_serde="json",
    )

    @proc.handler
    def on_payment(record: Record, ctx: ProcessorContext) -> None:
        if strict and record.value["amount"] < 0:
            raise ValueError("negative amount")
        balances = ctx.stores["balances"]
        balances[record.key] = balances.get(record.key, 0) + record.value["amount"]

    return proc


def test_a_run_joining_a_failed_runs_generation_writes_its_own_files(
    spark: Any, kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    """A run that failed on one partition leaves its snapshot open and another partition's file
    in the generation's directory. The next run joins that generation (more records since, and a
    fixed handler): it writes its own files instead of reusing rows the failed plan computed, so
    Python resumes to the plain consumer's balances."""
    topic = kafka.create_topic(topic_name, 2)
    url = str(tmp_path / "ckpt")
    kafka.produce(topic, [(0, b"a", b'{"amount": 1}'), (1, b"b", b'{"amount": -1}')])
    with pytest.raises(HandlerError, match="negative amount"):
        bootstrap_processor(spark, guarded("guarded", topic, kafka.bootstrap, url, strict=True))
    (left,) = (tmp_path / "ckpt").glob("*_guarded/data/*/p00000-base-*.parquet")
    kafka.produce(topic, [(0, b"a", b'{"amount": 5}')])

    result = bootstrap_processor(spark, guarded("guarded", topic, kafka.bootstrap, url, strict=False))
    assert f"/{result.manifest.generation:020d}/" in str(left)  # the failed run's generation, joined
    assert result.manifest.partitions[0].files[0].path != f"data/{left.parent.name}/{left.name}"
    report, resumed = run_python(guarded("guarded", topic, kafka.bootstrap, url, strict=False))
    assert (report.checkpoint, report.replayed_records) == (result.manifest.generation, 0)
    assert {k: json.loads(v) for k, v in resumed["balances"].items()} == {b"a": 6, b"b": -1}


def test_two_inputs_bootstrapped_on_spark_resume_in_python_and_back(
    spark: Any, kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    """Spark merges a partition's inputs as a Python task does (by timestamp, ties to the first
    input): its checkpoint + the Python tail, and a Python checkpoint + a Spark run over the rest,
    both equal the plain timestamp merge of everything."""
    from integration.processor.test_multiple_inputs import (
        PARTITIONS,
        contents,
        ledger,
        produce_split,
        recompute,
    )

    topics = [
        kafka.create_topic(f"{topic_name}-a", PARTITIONS),
        kafka.create_topic(f"{topic_name}-b", PARTITIONS),
    ]
    url = str(tmp_path / "ckpt")
    rng = random.Random(6)
    first = produce_split(kafka.bootstrap, topics, rng, 0, 100)
    with pytest.raises(ConfigError, match="a count by key folds one input's records"):
        bootstrap_processor(
            spark, ledger("join", topics, kafka.bootstrap, url), aggregation=CountPerKey("ledger")
        )
    result = bootstrap_processor(spark, ledger("join", topics, kafka.bootstrap, url))
    assert result.processed == first
    second = produce_split(kafka.bootstrap, topics, rng, 100, 200)
    resumed = ledger("join", topics, kafka.bootstrap, url)
    report = resumed.run(follow=False)
    assert report.checkpoint == result.manifest.generation
    assert report.replayed_records == second
    third = produce_split(kafka.bootstrap, topics, rng, 200, 300)
    again = bootstrap_processor(spark, ledger("join", topics, kafka.bootstrap, url))
    assert again.processed == third  # every input from the offsets the Python checkpoint holds
    final = ledger("join", topics, kafka.bootstrap, url)
    final.start()
    try:
        assert final.report.replayed_records == 0
        assert contents(final) == recompute(kafka.bootstrap, topics)
    finally:
        final.close(checkpoint=False)


def final_counts(name: str, topic: str, bootstrap: str, url: str | None, out: str) -> Processor:
    """A one-minute tumbling count per key emitting each window's final result to *out*."""
    proc = Processor(
        name,
        inputs=[topic],
        bootstrap_servers=bootstrap,
        checkpoints=None if url is None else CheckpointOptions(url, interval="1h"),
        value_serde="json",
    )
    proc.count("per-minute", window=Windows.tumbling("1m", grace="10s"), emit="final", to=out)
    return proc


def test_a_spark_backfill_emits_final_window_results_as_python_does(
    spark: Any, kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    """``emit=True`` over a windowed count with ``emit="final"``: the Spark bootstrap sends the
    final result of every window its history closed, the same records a Python run sends (the
    handler path runs the same fold and its punctuator); the count-by-key route, which folds
    counts and sends nothing, refuses ``emit=True`` in one line."""
    topic = kafka.create_topic(topic_name, 3)
    on_spark, in_python = kafka.create_topic(f"{topic}-spark", 3), kafka.create_topic(f"{topic}-python", 3)
    produce(kafka.bootstrap, topic, payments(900, seed=12))
    url = str(tmp_path / "ckpt")
    result = bootstrap_processor(
        spark, final_counts("finals", topic, kafka.bootstrap, url, on_spark), emit=True
    )
    run_python(final_counts("scratch", topic, kafka.bootstrap, None, in_python))

    def sent(out: str) -> list[tuple[bytes | None, bytes | None]]:
        return sorted((r.key, r.value) for r in kafka.read_all(out, range(3)))

    python_finals = sent(in_python)
    assert python_finals, "no window closed"
    assert sent(on_spark) == python_finals
    assert result.emitted == len(python_finals)
    with pytest.raises(ConfigError, match="sends no outputs"):
        bootstrap_processor(
            spark,
            counting("by-count", topic, kafka.bootstrap, url),
            aggregation=CountPerKey("counts"),
            emit=True,
        )
