"""Aggregations and event-time windows: equal to an independent recomputation, equal across a
restore, and windows past retention gone from the store and the checkpoint's files. Proven on Apache Kafka
(the suite's broker) and Tansu (ordered partitions, record timestamps as produced, EOF): no other broker
behaviour is relied on."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from integration.conftest import KafkaTool
from statesnap import CheckpointOptions, Processor, Windows
from statesnap.blob import open_blob_store
from statesnap.checkpoint import CheckpointRepository
from statesnap.processor.keyspace import WINDOW_BYTES, split_key, window_start_of

MINUTE = 60_000
BASE = 1_700_000_000_000  # a real epoch: a zero timestamp means "now" to the producer


def produce_timed(bootstrap: str, topic: str, records: list[tuple[int, bytes, dict[str, Any], int]]) -> None:
    """(partition, key, value, timestamp ms) in order."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2})
    for partition, key, value, ts in records:
        producer.produce(topic, json.dumps(value).encode(), key, partition=partition, timestamp=ts)
    assert producer.flush(30) == 0


def events(n: int, seed: int, start_ms: int = BASE) -> list[tuple[int, bytes, dict[str, Any], int]]:
    """Keys k0..k9 (key i in partition i % 2), timestamps mostly rising with some out of order."""
    rng = random.Random(seed)
    out = []
    clock = start_ms
    for i in range(n):
        clock += rng.randrange(0, 4_000)
        ts = clock - (rng.randrange(0, 90_000) if rng.random() < 0.1 else 0)  # late-ish
        k = rng.randrange(10)
        out.append((k % 2, f"k{k}".encode(), {"amount": i % 7}, ts))
    return out


def windowed(name: str, topic: str, bootstrap: str, url: str | None) -> Processor:
    proc = Processor(
        name,
        inputs=[topic],
        bootstrap_servers=bootstrap,
        checkpoints=None if url is None else CheckpointOptions(url, interval="1h"),
        value_serde="json",
    )
    proc.count("counts")
    proc.sum("totals", "amount")
    proc.count("per-minute", window=Windows.tumbling("1m", grace="30s", retention="5m"))
    return proc


def model(
    records: list[tuple[int, bytes, dict[str, Any], int]],
) -> tuple[dict[bytes, int], dict[bytes, int], dict[tuple[bytes, int], int]]:
    """The independent recomputation, with Kafka Streams' window rules (per partition stream time,
    late records dropped after end + grace, windows dropped at start + retention)."""
    counts: dict[bytes, int] = {}
    totals: dict[bytes, int] = {}
    windows: dict[tuple[bytes, int], int] = {}
    stream_time: dict[int, int] = {}
    for partition, key, value, ts in records:
        counts[key] = counts.get(key, 0) + 1
        totals[key] = totals.get(key, 0) + value["amount"]
        st = stream_time[partition] = max(stream_time.get(partition, -1), ts)
        start = ts // MINUTE * MINUTE
        if st < start + MINUTE + 30_000:
            windows[(key, start)] = windows.get((key, start), 0) + 1
    final = {}
    for (key, start), n in windows.items():
        partition = int(key[1:]) % 2
        if stream_time[partition] < start + 5 * MINUTE:
            final[(key, start)] = n
    return counts, totals, final


def read(proc: Processor) -> tuple[dict[bytes, int], dict[bytes, int], dict[tuple[bytes, int], int]]:
    return (
        dict(proc.store("counts").items()),
        dict(proc.store("totals").items()),
        dict(proc.store("per-minute").items()),
    )


def test_windowed_and_plain_aggregations_survive_restores(
    kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    topic = kafka.create_topic(topic_name, 2)
    url = str(tmp_path / "ckpt")
    history = events(1500, seed=7)
    produce_timed(kafka.bootstrap, topic, history[:600])
    windowed("agg", topic, kafka.bootstrap, url).run(follow=False)
    produce_timed(kafka.bootstrap, topic, history[600:1100])
    windowed("agg", topic, kafka.bootstrap, url).run(follow=False)
    produce_timed(kafka.bootstrap, topic, history[1100:])

    resumed = windowed("agg", topic, kafka.bootstrap, url)
    resumed.start()
    try:
        assert resumed.report.replayed_records == 400
        restored = read(resumed)
    finally:
        resumed.close()
    scratch = windowed("agg-scratch", topic, kafka.bootstrap, None)
    scratch.start()
    try:
        everything = read(scratch)
    finally:
        scratch.close(checkpoint=False)
    truth = model(history)
    assert restored == everything == truth
    assert len(truth[2]) < 10 * 1500 * 4_000 // 2 // MINUTE  # retention bounded the window store


def test_windows_past_retention_are_absent_from_the_checkpoint_files(
    kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    topic = kafka.create_topic(topic_name, 2)
    url = str(tmp_path / "ckpt")
    produce_timed(kafka.bootstrap, topic, [(0, b"k0", {"amount": 1}, BASE + t * MINUTE) for t in range(3)])
    windowed("ret", topic, kafka.bootstrap, url).run(follow=False)
    # Stream time jumps 20 minutes: every earlier window is past its 5-minute retention.
    produce_timed(kafka.bootstrap, topic, [(0, b"k0", {"amount": 1}, BASE + 20 * MINUTE)])
    proc = windowed("ret", topic, kafka.bootstrap, url)
    proc.run(follow=False)
    manifest = proc.last_checkpoint
    assert manifest is not None
    repo = CheckpointRepository.for_table(open_blob_store(url), manifest.cluster_id, "ret")
    starts = set()
    for f in manifest.partitions[0].files:
        for key in repo.read_file(f).column("key").to_pylist():
            store, _, rest = split_key(key)
            if store == "per-minute":
                starts.add(window_start_of(rest[:WINDOW_BYTES]))
    assert starts == {(BASE + 20 * MINUTE) // MINUTE * MINUTE}
