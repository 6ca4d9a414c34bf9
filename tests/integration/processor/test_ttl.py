"""A store with a TTL: entries read as absent once stream time passes their last write plus the
TTL — inside handlers, from outside, across a restore — and leave the checkpoint's files. Proven
on Apache Kafka (the suite's broker) and Tansu (record timestamps as produced, EOF)."""

from __future__ import annotations

import json
from pathlib import Path

from integration.cli_runner import statesnap
from integration.conftest import KafkaTool
from integration.processor.test_aggregations import BASE, MINUTE, produce_timed
from statesnap import CheckpointOptions, Processor, ProcessorContext, Record, StoreSpec
from statesnap.blob import open_blob_store
from statesnap.checkpoint import CheckpointRepository
from statesnap.processor.keyspace import split_key


def last_seen(topic: str, bootstrap: str, url: str, seen: list[tuple[bytes, object]]) -> Processor:
    proc = Processor(
        "sessions",
        inputs=[topic],
        bootstrap_servers=bootstrap,
        checkpoints=CheckpointOptions(url, interval="1h"),
        stores=[StoreSpec("last", ttl="10m")],
        value_serde="json",
    )

    @proc.handler
    def track(record: Record, ctx: ProcessorContext) -> None:
        last = ctx.stores["last"]
        seen.append((record.key, last.get(record.key)))
        last[record.key] = record.value["n"]

    return proc


def test_entries_expire_by_stream_time(kafka: KafkaTool, topic_name: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(topic_name, 1)
    url = str(tmp_path / "ckpt")
    produce_timed(
        kafka.bootstrap,
        topic,
        [
            (0, b"a", {"n": 1}, BASE),
            (0, b"b", {"n": 2}, BASE + 5 * MINUTE),
            (0, b"a", {"n": 3}, BASE + 9 * MINUTE),  # a's entry still live (9 < 10 minutes)
            (0, b"c", {"n": 4}, BASE + 16 * MINUTE),  # b's expired (written at 5, now 16)
        ],
    )
    seen: list[tuple[bytes, object]] = []
    first = last_seen(topic, kafka.bootstrap, url, seen)
    first.run(follow=False)
    assert seen == [(b"a", None), (b"b", None), (b"a", 1), (b"c", None)]
    produce_timed(kafka.bootstrap, topic, [(0, b"b", {"n": 5}, BASE + 17 * MINUTE)])
    seen.clear()
    resumed = last_seen(topic, kafka.bootstrap, url, seen)
    resumed.start()
    try:
        assert seen == [(b"b", None)]  # expired before the checkpoint: gone after the restore too
        assert dict(resumed.store("last").items()) == {b"a": 3, b"c": 4, b"b": 5}
    finally:
        resumed.close()
    manifest = resumed.last_checkpoint
    assert manifest is not None
    repo = CheckpointRepository.for_table(open_blob_store(url), manifest.cluster_id, "sessions")
    first_manifest = first.last_checkpoint
    assert first_manifest is not None
    keys = {
        split_key(k)[2]
        for f in first_manifest.partitions[0].files
        for k in repo.read_file(f).column("key").to_pylist()
        if split_key(k)[0] == "last"
    }
    assert keys == {b"a", b"c"}  # b expired before the first checkpoint: not in its files
    # dump reads a TTL store's values without the write stamps it keeps before them.
    dumped = statesnap("dump", "--table", "sessions", "--store", "last", "-c", url, "--value-serde", "json")
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    rows = [json.loads(line) for line in dumped.stdout.splitlines()]
    assert {r["key"]: r["value"] for r in rows} == {"a": 3, "c": 4, "b": 5}
