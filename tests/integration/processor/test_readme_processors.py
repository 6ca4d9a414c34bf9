"""The README's "Stateful processors" code blocks, run as written (topic names made unique) over a
real broker and checked against the test's own arithmetic. Proven on Apache Kafka (the suite's broker) and on
Tansu (the dev broker)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from integration.cli_runner import statesnap
from integration.conftest import KafkaTool
from statesnap import Processor, Windows

README = Path(__file__).resolve().parents[3] / "README.md"


def blocks() -> list[str]:
    text = README.read_text()
    section = text[text.index("## Stateful processors") : text.index("## Command line")]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_tally_block(kafka: KafkaTool, topic_name: str, tmp_path: Path) -> None:
    source = blocks()[0]
    topic = kafka.create_topic(topic_name, 2)
    out = kafka.create_topic(topic_name + "-out", 1)
    source = source.replace('"payments"', repr(topic)).replace('"balances-out"', repr(out))
    source = source.replace("proc.run()", "proc.run(follow=False)")
    kafka.produce(
        topic, [(0, b"a", b'{"amount": 2}'), (0, b"a", b'{"amount": 3}'), (1, b"b", b'{"amount": 4}')]
    )
    namespace: dict[str, Any] = {"BS": kafka.bootstrap, "URL": str(tmp_path)}
    exec(compile(source, "README.md", "exec"), namespace)
    emitted = sorted((r.key, json.loads(r.value)) for r in kafka.read_all(out, [0]) if r.key and r.value)
    assert emitted == [(b"a", 2), (b"a", 5), (b"b", 4)]


def test_the_aggregations_block(kafka: KafkaTool, topic_name: str) -> None:
    topic = kafka.create_topic(topic_name, 1)
    kafka.produce(topic, [(0, b"k", json.dumps({"amount": n}).encode()) for n in (5, 9, 2)])
    proc = Processor(
        "readme-aggregations", inputs=[topic], bootstrap_servers=kafka.bootstrap, value_serde="json"
    )
    exec(compile(blocks()[1], "README.md", "exec"), {"proc": proc, "Windows": Windows})
    proc.start()
    try:
        assert proc.store("counts")[b"k"] == 3
        assert proc.store("spent")[b"k"] == 16
        assert proc.store("largest")[b"k"] == 9
        assert proc.store("stats")[b"k"] == {"n": 3}
        assert sum(proc.store("per-minute").values()) == 3
        assert 10 <= len(proc.store("sliding")) <= 11  # records ms apart: 10 windows (11 across a minute)
    finally:
        proc.close(checkpoint=False)


def test_the_emission_block(kafka: KafkaTool, topic_name: str) -> None:
    """Final window results and every change reach their topics as the README says."""
    topic = kafka.create_topic(topic_name, 1)
    finals, changes = kafka.create_topic(f"{topic_name}-final", 1), kafka.create_topic(f"{topic_name}-sum", 1)
    minute = 1_790_000_040_000
    records = [(minute + 1_000, 5), (minute + 2_000, 9), (minute + 75_000, 2)]  # the last closes [0, 1m)
    producer = kafka.producer
    for ts, amount in records:
        producer.produce(topic, json.dumps({"amount": amount}).encode(), b"k", partition=0, timestamp=ts)
    assert producer.flush(30) == 0
    source = blocks()[2].replace('"per-minute-out"', repr(finals)).replace('"spent-out"', repr(changes))
    proc = Processor("readme-emission", inputs=[topic], bootstrap_servers=kafka.bootstrap, value_serde="json")
    exec(compile(source, "README.md", "exec"), {"proc": proc})
    proc.run(follow=False)
    final = [json.loads(r.value) for r in kafka.read_all(finals, [0]) if r.value]
    assert final == [{"start": minute, "end": minute + 60_000, "value": 2}]
    assert [json.loads(r.value) for r in kafka.read_all(changes, [0]) if r.value] == [5, 14, 16]


def test_the_tally_block_runs_on_what_produce_sample_events_writes(
    kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    """From an empty broker, as a new user goes: ``statesnap produce-sample --events`` (a fresh
    process of the venv's interpreter) feeds the README's first processor block as written, and
    its outputs equal a plain consumer's sums of the input. (The changelog sample's opaque values
    made the block fail with a DeserializationError.) Proven on the suite's broker."""
    topic, out = topic_name, topic_name + "-out"
    produced = statesnap(
        "produce-sample", "-b", kafka.bootstrap, "-t", topic, "--partitions", "2", "--keys", "20",
        "--updates", "300", "--events", "--json",
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr[-2000:]
    assert json.loads(produced.stdout)["records"] == 300
    kafka.create_topic(out, 1)
    source = blocks()[0].replace('"payments"', repr(topic)).replace('"balances-out"', repr(out))
    source = source.replace("proc.run()", "proc.run(follow=False)")
    exec(compile(source, "README.md", "exec"), {"BS": kafka.bootstrap, "URL": str(tmp_path)})

    sums: dict[bytes, int] = {}
    for r in kafka.read_all(topic, [0, 1]):
        assert r.key is not None
        assert r.value is not None
        sums[r.key] = sums.get(r.key, 0) + json.loads(r.value)["amount"]
    final: dict[bytes, int] = {}
    for r in kafka.read_all(out, [0]):
        assert r.key is not None
        assert r.value is not None
        final[r.key] = json.loads(r.value)
    assert final == sums
    assert len(sums) == 20
