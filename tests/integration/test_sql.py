"""``statesnap sql``: DuckDB over any generation of a table or processor store, run as a user runs
it (a fresh CLI process of the venv's interpreter), on ``file://`` and on S3 (the moto server).

Checkpoints are written by a Python ``Table`` / ``Processor`` on the session's broker (Apache Kafka; Tansu
too). Ground truth is the records the broker acknowledged (a plain replay here: last write per key wins, a
tombstone deletes; the processor's sums recomputed from a plain consumer), and ``dump`` on every generation.
Broker behaviour relied on: ordered partitions and partition EOF (proved on Apache Kafka and on Tansu).
"""

from __future__ import annotations

import base64
import json
import shlex
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer

from docsite.blocks import by_test
from integration.cli_runner import digest, ok, statesnap
from integration.conftest import KafkaTool, Rec
from statesnap import CheckpointOptions, Processor, ProcessorContext, Record, RetentionPolicy, Table
from statesnap.checkpoint import CheckpointManifest
from statesnap.processor import StoreSpec, Windows

pytestmark = pytest.mark.integration

PARTITIONS = 2
KEEP_ALL = RetentionPolicy(min_count=100, min_age=timedelta(days=1))
DOC = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "incident-sql.md"
BASE_MS = 1_700_000_040_000
MINUTE = 60_000


def storage_args(options: dict[str, str]) -> list[str]:
    return [a for k, v in sorted(options.items()) for a in ("--storage-option", f"{k}={v}")]


def value(n: int, status: str) -> bytes:
    return json.dumps({"n": n, "status": status}).encode()


def churn(round_no: int) -> list[tuple[int, bytes, bytes | None]]:
    """Round 0 writes 50 keys; later rounds update some and delete some (tombstones); round 3
    brings back a key deleted in round 1."""
    statuses = ("open", "paid", "shipped")
    if round_no == 0:
        return [(i % PARTITIONS, b"k%03d" % i, value(i, statuses[i % 3])) for i in range(50)]
    batch: list[tuple[int, bytes, bytes | None]] = [
        (i % PARTITIONS, b"k%03d" % i, value(i * 10 + round_no, statuses[(i + round_no) % 3]))
        for i in range(round_no, 50, 6)
    ]
    batch += [(i % PARTITIONS, b"k%03d" % i, None) for i in range(round_no * 4, round_no * 4 + 4)]
    if round_no == 3:
        batch.append((4 % PARTITIONS, b"k004", value(4000, "open")))
    return batch


def write_table(
    kafka: KafkaTool, topic: str, url: str, options: dict[str, str], rounds: int = 4
) -> tuple[list[Rec], list[CheckpointManifest]]:
    """A base, then deltas holding tombstones: one checkpoint per round, every generation kept."""
    records: list[Rec] = []
    manifests: list[CheckpointManifest] = []
    t = Table(
        topic,
        bootstrap_servers=kafka.bootstrap,
        background=False,
        checkpoints=CheckpointOptions(
            url, storage_options=options, interval="1h", commit_interval="1h", retention=KEEP_ALL
        ),
    )
    t.start()
    try:
        for round_no in range(rounds):
            records += kafka.produce(topic, churn(round_no))
            kafka.drain(t, kafka.end_offsets(records, range(PARTITIONS)))
            m = t.checkpoint()
            assert m is not None
            manifests.append(m)
    finally:
        t.close(checkpoint=False)
    return records, manifests


def truth(records: list[Rec], offsets: dict[int, int]) -> dict[bytes, bytes]:
    return KafkaTool.truth(r for r in records if r.offset < offsets.get(r.partition, 0))


def sql(url: str, table: str, query: str, *args: str, options: dict[str, str] | None = None) -> Any:
    return ok(statesnap("sql", url, "--table", table, query, "--json", *args, *storage_args(options or {})))


def as_bytes(row: dict[str, Any], name: str) -> bytes:
    """A BLOB column as ``--json`` prints it: UTF-8 text, or base64 under ``<name>_b64``."""
    if name in row:
        return str(row[name]).encode()
    return base64.b64decode(row[f"{name}_b64"])


def test_sql_counts_equal_dump_on_every_generation(
    kafka: KafkaTool, checkpoint_location: Any, topic_name: str
) -> None:
    """On every generation of a table with deltas and tombstones: ``count(*)`` equals ``dump
    --no-tail``'s keys, the rows' digest equals dump's and a replay's, a JSON field's sum equals
    the replay's; the view is the table's name (with ``-``, so quoted)."""
    url, options = checkpoint_location.url, checkpoint_location.options
    topic = kafka.create_topic(topic_name, PARTITIONS)
    records, manifests = write_table(kafka, topic, url, options)
    newest = manifests[-1]
    for p in range(PARTITIONS):  # the set-up is what merge-on-read is about
        kinds = [f.kind.value for f in newest.partitions[p].files]
        assert kinds[0] == "base"
        assert kinds.count("delta") >= 2, kinds
    if url.startswith("file"):
        table_dir = Path(url.removeprefix("file://"))
        nulls = sum(
            pq.read_table(next(table_dir.glob(f"*/{f.path}"))).column("value").null_count
            for f in newest.files
        )
        assert nulls > 0, "no tombstone in the deltas"
    view = f'"{topic}"'
    for m in manifests:
        gen = ["--generation", str(m.generation)]
        expected = truth(records, m.offsets)
        dumped = ok(
            statesnap(
                "dump",
                "-b",
                kafka.bootstrap,
                "-t",
                topic,
                "--checkpoints",
                url,
                *gen,
                "--no-tail",
                "--digest",
                "--json",
                *storage_args(options),
            )
        )
        counted = sql(url, topic, f"SELECT count(*) AS n FROM {view}", *gen, options=options)
        assert counted["generation"] == m.generation
        assert counted["rows"] == [{"n": dumped["keys"]}]
        assert dumped["keys"] == len(expected)
        rows = sql(url, topic, f"SELECT key, value FROM {view} ORDER BY key", *gen, options=options)["rows"]
        got = {as_bytes(r, "key"): as_bytes(r, "value") for r in rows}
        assert got == expected
        assert digest(got) == dumped["digest"]
    total = sql(
        url,
        topic,
        f"SELECT sum(CAST(value_json->>'n' AS BIGINT)) AS total FROM {view}",
        "--value-serde",
        "json",
        options=options,
    )
    assert total["generation"] == newest.generation  # no --generation: the newest
    assert total["rows"] == [
        {"total": sum(json.loads(v)["n"] for v in truth(records, newest.offsets).values())}
    ]


def tally(name: str, topic: str, bootstrap: str, url: str) -> Processor:
    """A running balance per account and a per-minute count (a window store with '-' in its name)."""
    proc = Processor(
        name,
        inputs=[topic],
        bootstrap_servers=bootstrap,
        checkpoints=CheckpointOptions(url, interval="1h", retention=KEEP_ALL),
        stores=["balances", StoreSpec("per-minute", window=Windows.tumbling("1m", retention="1d"))],
        value_serde="json",
    )

    @proc.handler
    def on_payment(record: Record, ctx: ProcessorContext) -> None:
        balances = ctx.stores["balances"]
        balances[record.key] = balances.get(record.key, 0) + record.value["amount"]
        minutes = ctx.window_stores["per-minute"]
        for start in minutes.windows_for(record.timestamp):
            minutes.put(record.key, start, (minutes.get(record.key, start) or 0) + 1)

    return proc


def produce_payments(bootstrap: str, topic: str, start: int, n: int) -> list[tuple[str, int, int]]:
    """Payments ``start..start+n`` (account ``i % 7``, a second apart); returns (account, amount, ts)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": False})
    errors: list[str] = []
    out = []
    for i in range(start, start + n):
        account, ts = f"acct-{i % 7}", BASE_MS + i * 1000
        producer.produce(
            topic,
            json.dumps({"amount": i}).encode(),
            account.encode(),
            partition=(i % 7) % PARTITIONS,
            timestamp=ts,
            on_delivery=lambda err, _msg: errors.append(str(err)) if err else None,
        )
        out.append((account, i, ts))
    assert producer.flush(30) == 0
    assert not errors, errors
    return out


def write_processor(kafka: KafkaTool, name: str, topic: str, url: str) -> list[list[tuple[str, int, int]]]:
    """Two runs of the processor over two batches of payments: two generations."""
    kafka.create_topic(topic, PARTITIONS)
    batches = []
    for start, n in ((0, 90), (90, 130)):
        batches.append(produce_payments(kafka.bootstrap, topic, start, n))
        tally(name, topic, kafka.bootstrap, url).run(follow=False)
    return batches


def test_sql_over_a_processor_store(kafka: KafkaTool, topic_name: str, tmp_path: Path) -> None:
    """``--store``: a key-value store with its values decoded, and a window store (quoted name)
    with its windows, each equal to a plain recomputation at the newest and an older generation;
    a clone of the processor reads the same and restores under its new name."""
    url = str(tmp_path / "ckpt")
    name = f"tally.{topic_name}"
    batches = write_processor(kafka, name, topic_name, url)
    generations = [
        g["generation"]
        for g in ok(statesnap("snapshot", "list", url, "--table", name, "--json"))
        if g["state"] == "COMPLETED"
    ]
    assert len(generations) == 2
    for gen, payments in ((max(generations), batches[0] + batches[1]), (min(generations), batches[0])):
        balances: dict[str, int] = {}
        windows: dict[tuple[str, int], int] = {}
        for account, amount, ts in payments:
            balances[account] = balances.get(account, 0) + amount
            windows[(account, ts // MINUTE * MINUTE)] = windows.get((account, ts // MINUTE * MINUTE), 0) + 1
        got = sql(
            url,
            name,
            "SELECT key_string, value_json::BIGINT AS balance FROM balances ORDER BY key_string",
            "--store",
            "balances",
            "--key-serde",
            "string",
            "--value-serde",
            "json",
            "--generation",
            str(gen),
        )
        assert got["view"] == "balances"
        assert got["generation"] == gen
        assert {r["key_string"]: r["balance"] for r in got["rows"]} == balances
        got = sql(
            url,
            name,
            "SELECT key_string AS account, window_start, window_end, value_json::BIGINT AS n "
            'FROM "per-minute" ORDER BY account, window_start',
            "--store",
            "per-minute",
            "--key-serde",
            "string",
            "--value-serde",
            "json",
            "--generation",
            str(gen),
        )
        assert {(r["account"], r["window_start"]): r["n"] for r in got["rows"]} == windows
        assert all(r["window_end"] - r["window_start"] == MINUTE for r in got["rows"])

    # A processor clones like a table: its stores read the same from the clone, and the processor
    # started under the new name restores the cloned generation (nothing left to process).
    newest = max(generations)
    green = f"{name}-green"
    ok(statesnap("snapshot", "clone", url, "--table", name, str(newest), "--to-table", green))
    query = "SELECT key, value, partition FROM balances ORDER BY key"
    source_rows = sql(url, name, query, "--store", "balances")["rows"]
    assert sql(url, green, query, "--store", "balances")["rows"] == source_rows
    report = tally(green, topic_name, kafka.bootstrap, url).run(follow=False)
    assert report.checkpoint == newest
    assert report.replayed_records == 0


def one_line_error(result: Any, error: str) -> str:
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert error in lines[0], result.stderr
    return str(lines[0])


def test_sql_errors_are_one_typed_line(kafka: KafkaTool, topic_name: str, tmp_path: Path) -> None:
    """A missing generation, table or store, a store asked of a table, bad SQL, a damaged data
    file, and DuckDB not installed: each one line naming the error (and, for DuckDB, the extra to
    install)."""
    url = str(tmp_path / "ckpt")
    topic = kafka.create_topic(topic_name, PARTITIONS)
    _, manifests = write_table(kafka, topic, url, {}, rounds=1)
    query = f'SELECT count(*) FROM "{topic}"'
    one_line_error(
        statesnap("sql", url, "--table", topic, "--generation", "99", query), "NoUsableCheckpointError"
    )
    one_line_error(statesnap("sql", url, "--table", "nope", query), "TableNotFoundError")
    line = one_line_error(
        statesnap("sql", url, "--table", topic, "--store", "balances", query), "ConfigError"
    )
    assert "is a table, not a processor" in line
    line = one_line_error(statesnap("sql", url, "--table", topic, f'SELEC * FROM "{topic}"'), "ConfigError")
    assert "SQL error" in line
    line = one_line_error(
        statesnap("sql", url, "--table", topic, "SELECT * FROM missing_view"), "ConfigError"
    )
    assert "missing_view" in line
    # A data file damaged in place (same size): its checksum refuses it, nothing is queried.
    manifest = manifests[0]
    damaged = next(Path(url).glob(f"*/{manifest.files[0].path}"))
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    one_line_error(statesnap("sql", url, "--table", topic, query), "CorruptCheckpointError")
    shadow = tmp_path / "no-duckdb"
    shadow.mkdir()
    (shadow / "duckdb.py").write_text("raise ImportError('No module named duckdb')\n")
    line = one_line_error(
        statesnap("sql", url, "--table", topic, query, env={"PYTHONPATH": str(shadow)}), "ConfigError"
    )
    assert "statesnap[sql]" in line


def test_docs_incident_queries(kafka: KafkaTool, topic_name: str, tmp_path: Path) -> None:
    """docs/how-to/incident-sql.md's incident queries, run as written (names and the generation
    substituted)."""
    (block,) = by_test(DOC, "incident-queries")
    url = str(tmp_path / "ckpt")
    topic = kafka.create_topic(topic_name, PARTITIONS)
    records, manifests = write_table(kafka, topic, url, {}, rounds=3)
    tally_name = f"tally-{topic_name}"
    batches = write_processor(kafka, tally_name, f"{topic_name}-payments", url)
    gen = manifests[1]
    names = {"./ckpt": url, "orders": topic, "tally": tally_name, "7": str(gen.generation)}
    outputs = []
    for line in block.replace("\\\n", " ").splitlines():
        if line.strip():
            args = [names.get(a, a.replace("FROM orders", f'FROM "{topic}"')) for a in shlex.split(line)]
            assert args[0] == "statesnap", line
            outputs.append(ok(statesnap(*args[1:])))
    statuses: dict[str, int] = {}
    for v in truth(records, gen.offsets).values():
        statuses[json.loads(v)["status"]] = statuses.get(json.loads(v)["status"], 0) + 1
    printed = outputs[0].splitlines()
    assert printed[0].split() == ["status", "n"]
    assert [line.split() for line in printed[2:-1]] == [[s, str(n)] for s, n in sorted(statuses.items())]
    assert f"at generation {gen.generation}" in printed[-1]
    balances: dict[str, int] = {}
    for account, amount, _ in batches[0] + batches[1]:
        balances[account] = balances.get(account, 0) + amount
    top = sorted(balances.items(), key=lambda kv: -kv[1])[:5]
    assert [(r["key_string"], r["balance"]) for r in outputs[1]["rows"]] == top
