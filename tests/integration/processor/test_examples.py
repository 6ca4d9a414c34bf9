"""The seeds' examples (``examples/*.py``) run as a user runs them — ``python examples/X.py --once``
in a fresh interpreter — and their outputs equal what the test computes on its own from the inputs. Proven on
Apache Kafka (the suite's broker) and on Tansu (the dev broker): ordered partitions and record timestamps
only."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from integration.conftest import KafkaTool
from statesnap.blob import open_blob_store
from statesnap.checkpoint import CheckpointRepository
from statesnap.processor.keyspace import WINDOW_BYTES, split_key

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
BASE = 1_700_000_000_000


def run_example(name: str, kafka: KafkaTool, checkpoints: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py"), "--once"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={
            "STATESNAP_BOOTSTRAP_SERVERS": kafka.bootstrap,
            "STATESNAP_CHECKPOINTS": str(checkpoints),
            "PATH": "",
        },
    )
    assert result.returncode == 0, result.stderr[-3000:]


def produce(kafka: KafkaTool, topic: str, records: list[tuple[str, dict[str, Any], int]]) -> None:
    """(key, JSON value, timestamp ms) in order, partitioned by key as the default partitioner does."""
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 2})
    for key, value, ts in records:
        producer.produce(topic, json.dumps(value).encode(), key.encode(), timestamp=ts)
    assert producer.flush(30) == 0


def outputs(kafka: KafkaTool, topic: str, partitions: int = 1) -> list[tuple[str, Any]]:
    return [
        (r.key.decode(), json.loads(r.value))
        for r in kafka.read_all(topic, range(partitions))
        if r.key is not None and r.value is not None
    ]


def test_running_tally(kafka: KafkaTool, tmp_path: Path) -> None:
    kafka.create_topic("payments", 1)
    kafka.create_topic("balances-out", 1)
    payments = [(f"acct-{i % 5}", {"amount": i}, BASE + i) for i in range(50)]
    produce(kafka, "payments", payments[:30])
    run_example("tally", kafka, tmp_path)
    produce(kafka, "payments", payments[30:])
    run_example("tally", kafka, tmp_path)  # restores the first run's checkpoint, then the tail
    expected: list[tuple[str, Any]] = []
    balances: dict[str, int] = {}
    for key, value, _ in payments:
        balances[key] = balances.get(key, 0) + value["amount"]
        expected.append((key, balances[key]))
    assert outputs(kafka, "balances-out") == expected


def test_operations_validator(kafka: KafkaTool, tmp_path: Path) -> None:
    for topic in ("operations", "operations-valid", "operations-rejected"):
        kafka.create_topic(topic, 1)
    ops: list[tuple[str, dict[str, Any]]] = [
        ("a", {"op": "deposit", "amount": 5}),  # not open
        ("a", {"op": "open"}),
        ("a", {"op": "deposit", "amount": 5}),
        ("a", {"op": "withdraw", "amount": 7}),  # insufficient
        ("a", {"op": "close"}),  # balance not zero
        ("a", {"op": "withdraw", "amount": 5}),
        ("a", {"op": "close"}),
        ("b", {"op": "open"}),
        ("b", {"op": "open"}),  # already open
    ]
    produce(kafka, "operations", [(k, v, BASE + i) for i, (k, v) in enumerate(ops)])
    run_example("validator", kafka, tmp_path)
    valid = outputs(kafka, "operations-valid")
    rejected = outputs(kafka, "operations-rejected")
    assert valid == [ops[i] for i in (1, 2, 5, 6, 7)]
    assert [(k, v["reason"]) for k, v in rejected] == [
        ("a", "account not open"),
        ("a", "insufficient funds"),
        ("a", "balance not zero"),
        ("b", "already open"),
    ]


def test_windowed_count_with_retention(kafka: KafkaTool, tmp_path: Path) -> None:
    from statesnap import Processor

    kafka.create_topic("views", 1)
    minute = 60_000
    views: list[tuple[str, dict[str, Any], int]] = [
        (f"/p{i % 3}", {}, BASE + i * 20_000) for i in range(60)
    ]  # 20 minutes of views
    views.append(("/p0", {}, BASE))  # late: its minute closed long ago
    produce(kafka, "views", views)
    run_example("windowed_count", kafka, tmp_path)
    reader = Processor(
        "page-views",
        inputs=["views"],
        bootstrap_servers=kafka.bootstrap,
        checkpoints=str(tmp_path),
        key_serde="string",
        value_serde="json",
    )
    from statesnap import Windows

    reader.count("views-per-minute", window=Windows.tumbling("1m", grace="10s", retention="10m"))
    reader.start()
    try:
        counts = dict(reader.store("views-per-minute").items())
    finally:
        reader.close(checkpoint=False)
    stream_time = BASE + 59 * 20_000
    expected: dict[tuple[str, int], int] = {}
    for key, _, ts in views[:60]:
        start = ts // minute * minute
        if stream_time < start + 10 * minute:
            expected[(key, start)] = expected.get((key, start), 0) + 1
    assert counts == expected
    assert len({start for _, start in counts}) == 10  # only the last 10 minutes are kept


def test_windowed_stream_stream_join(kafka: KafkaTool, tmp_path: Path) -> None:
    """Two co-partitioned inputs, impressions and clicks, merged by timestamp."""
    kafka.create_topic("ad-impressions", 1)
    kafka.create_topic("ad-clicks", 1)
    kafka.create_topic("ad-clicks-joined", 1)
    minute = 60_000
    produce(
        kafka,
        "ad-clicks",
        [
            ("ad1", {"id": "c1"}, BASE + 2 * minute),  # joins i1
            ("ad2", {"id": "c2"}, BASE + 3 * minute),  # its impression is produced later...
            ("ad1", {"id": "c3"}, BASE + 15 * minute),  # i1 is too old
        ],
    )
    # ...but is older: the merge hands it to the handler first; joins c2.
    impressions = [("ad1", {"id": "i1"}, BASE), ("ad2", {"id": "i2"}, BASE + 2 * minute)]
    # An hour of unrelated impressions: the join buffers must stay bounded by retention.
    impressions += [(f"ad{9 + i % 4}", {"id": f"x{i}"}, BASE + 16 * minute + i * 5_000) for i in range(720)]
    produce(kafka, "ad-impressions", impressions)
    run_example("join", kafka, tmp_path)
    assert outputs(kafka, "ad-clicks-joined") == [
        ("ad1", {"impression": "i1", "click": "c1"}),
        ("ad2", {"impression": "i2", "click": "c2"}),
    ]
    # The checkpoint holds the last 12 minutes' buckets of the 4 busy ads, not the hour's.
    repo = CheckpointRepository.for_table(open_blob_store(str(tmp_path)), "", "ad-joins")
    (table_dir,) = [b.key.split("/")[0] for b in repo.store.list("") if b.key.endswith("table.json")]
    repo = CheckpointRepository(repo.store, table_dir)
    manifest = repo.latest()
    assert manifest is not None
    ads = {
        (store, rest[WINDOW_BYTES:])
        for f in manifest.files
        for store, _, rest in map(split_key, repo.read_file(f).column("key").to_pylist())
        if store == "clicks-with-impressions-right"
    }
    assert 0 < len(ads) <= 4
    rows = sum(
        1
        for f in manifest.files
        for key in repo.read_file(f).column("key").to_pylist()
        if split_key(key)[0] == "clicks-with-impressions-right"
    )
    assert rows <= 4 * 14
