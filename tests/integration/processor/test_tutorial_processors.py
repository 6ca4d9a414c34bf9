"""The processor tutorials' code (docs/tutorials/processors.md's ``tally.py``,
docs/tutorials/windows-and-joins.md's ``basket.py`` and ``basket_out.py``, the files a reader saves),
run as written (topic names made unique, the broker and checkpoint store the test's) over a real
broker and checked against the test's own arithmetic. Proven on Apache Kafka (the suite's broker)
and on Tansu (the dev broker)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from docsite.blocks import ROOT, Kind, blocks
from integration.cli_runner import statesnap
from integration.conftest import KafkaTool

TUTORIALS = ROOT / "docs" / "tutorials"
BROKER = '"127.0.0.1:9092"'


def page_file(page: str, title: str, bootstrap: str, **topics: str) -> str:
    """The file *title* a reader of *page* saves, with the test's broker and each topic of
    *topics* (the page's name, as a keyword with dashes as underscores) made the test's."""
    (source,) = [b.body for b in blocks(TUTORIALS / page) if b.kind is Kind.FILE and b.title == title]
    assert BROKER in source, f"{page}: {title} names no broker"
    source = source.replace(BROKER, repr(bootstrap))
    for name, topic in topics.items():
        quoted = repr(name.replace("_", "-")).replace("'", '"')
        assert quoted in source, f"{page}: {title} names no topic {quoted}"
        source = source.replace(quoted, repr(topic))
    return source


def tally(bootstrap: str, topic: str, out: str, checkpoints: Path) -> str:
    source = page_file("processors.md", "tally.py", bootstrap, card_payments=topic, card_balances=out)
    assert '"./ckpt"' in source
    return source.replace('"./ckpt"', repr(str(checkpoints)))


def run(source: str, page: str) -> Any:
    """Execute a page's file as its module would run, and return its ``proc``."""
    namespace: dict[str, Any] = {}
    exec(compile(source, page, "exec"), namespace)
    return namespace["proc"]


def test_the_tally_block(kafka: KafkaTool, topic_name: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(topic_name, 2)
    out = kafka.create_topic(topic_name + "-out", 1)
    kafka.produce(
        topic, [(0, b"a", b'{"amount": 2}'), (0, b"a", b'{"amount": 3}'), (1, b"b", b'{"amount": 4}')]
    )
    run(tally(kafka.bootstrap, topic, out, tmp_path), "processors.md").run(follow=False)
    emitted = sorted((r.key, json.loads(r.value)) for r in kafka.read_all(out, [0]) if r.key and r.value)
    assert emitted == [(b"a", 2), (b"a", 5), (b"b", 4)]


def test_the_aggregations_block(kafka: KafkaTool, topic_name: str) -> None:
    topic = kafka.create_topic(topic_name, 1)
    kafka.produce(topic, [(0, b"k", json.dumps({"amount": n}).encode()) for n in (5, 9, 2)])
    source = page_file("windows-and-joins.md", "basket.py", kafka.bootstrap, basket_purchases=topic)
    proc = run(source, "windows-and-joins.md")
    proc.start()
    try:  # the page's processor reads keys as strings
        assert proc.store("counts")["k"] == 3
        assert proc.store("spent")["k"] == 16
        assert proc.store("largest")["k"] == 9
        assert proc.store("stats")["k"] == {"n": 3}
        assert sum(proc.store("per-minute").values()) == 3
        assert 10 <= len(proc.store("sliding")) <= 11  # records ms apart: 10 windows (11 across a minute)
    finally:
        proc.close(checkpoint=False)


def test_the_emission_block(kafka: KafkaTool, topic_name: str, tmp_path: Path) -> None:
    """Final window results and every change reach their topics as the page says."""
    topic = kafka.create_topic(topic_name, 1)
    finals, changes = kafka.create_topic(f"{topic_name}-final", 1), kafka.create_topic(f"{topic_name}-sum", 1)
    minute = 1_790_000_040_000
    records = [(minute + 1_000, 5), (minute + 2_000, 9), (minute + 75_000, 2)]  # the last closes [0, 1m)
    producer = kafka.producer
    for ts, amount in records:
        producer.produce(topic, json.dumps({"amount": amount}).encode(), b"k", partition=0, timestamp=ts)
    assert producer.flush(30) == 0
    source = page_file(
        "windows-and-joins.md", "basket_out.py", kafka.bootstrap,
        basket_purchases=topic, basket_minutes_final=finals, basket_spent_changes=changes,
    )  # fmt: skip
    assert '"./ckpt"' in source
    run(source.replace('"./ckpt"', repr(str(tmp_path))), "windows-and-joins.md").run(follow=False)
    final = [json.loads(r.value) for r in kafka.read_all(finals, [0]) if r.value]
    assert final == [{"start": minute, "end": minute + 60_000, "value": 2}]
    assert [json.loads(r.value) for r in kafka.read_all(changes, [0]) if r.value] == [5, 14, 16]


def test_the_tally_block_runs_on_what_produce_sample_events_writes(
    kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    """From an empty broker, as a new user goes: ``statesnap produce-sample --events`` (a fresh
    process of the venv's interpreter) feeds the tutorial's first processor as written, and
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
    run(tally(kafka.bootstrap, topic, out, tmp_path), "processors.md").run(follow=False)

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
