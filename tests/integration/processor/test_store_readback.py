"""A processor's stores read back as a user reads them — ``statesnap dump --store`` and ``statesnap
serve --store`` in fresh processes of the venv's interpreter — equal an independent recomputation from the
input topic (a plain consumer loop here, not statesnap). The checkpoints are written by a Processor in this
process. Proven on Apache Kafka (the suite's broker) and on Tansu (the dev broker): nothing here depends on
broker behaviour beyond ordered partitions and partition EOF; the readers need no broker at all."""

from __future__ import annotations

import json
import re
import struct
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from integration.cli_runner import STATESNAP, digest, ok, statesnap
from integration.conftest import KafkaTool
from statesnap import CheckpointOptions, Processor, ProcessorContext, Record, Table
from statesnap.blob import open_blob_store
from statesnap.devstack import EmbeddedS3
from statesnap.processor import StoreSpec, Windows
from statesnap.processor.store_follower import StoreFollower

#: Record timestamps: one second apart from here, so a minute window holds 60 of a partition's.
BASE_MS = 1_700_000_040_000
MINUTE = 60_000
PARTITIONS = 3


def tally(topic: str, bootstrap: str, url: str, storage: dict[str, str] | None = None) -> Processor:
    """A running tally per account and a per-minute count (a window store kept a day)."""
    proc = Processor(
        "tally",
        inputs=[topic],
        bootstrap_servers=bootstrap,
        checkpoints=CheckpointOptions(url, interval="1h", storage_options=storage),
        stores=["balances", StoreSpec("per_minute", window=Windows.tumbling("1m", retention="1d"))],
        value_serde="json",
    )

    @proc.handler
    def on_payment(record: Record, ctx: ProcessorContext) -> None:
        balances = ctx.stores["balances"]
        balances[record.key] = balances.get(record.key, 0) + record.value["amount"]
        minutes = ctx.window_stores["per_minute"]
        for start in minutes.windows_for(record.timestamp):
            minutes.put(record.key, start, (minutes.get(record.key, start) or 0) + 1)

    return proc


def produce_payments(bootstrap: str, topic: str, start: int, n: int) -> None:
    """Payments ``start..start+n``: account ``i % 11``, its partition fixed by the account, the
    record's timestamp (also in the value) rising one second per record."""
    # One request in flight: a retried batch (a loaded machine) cannot overtake the next, so the
    # timestamps of a partition rise as its offsets do (a window without grace drops a late one).
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 5,
            "enable.idempotence": False,
            "max.in.flight.requests.per.connection": 1,
        }
    )
    errors: list[str] = []
    for i in range(start, start + n):
        account = i % 11
        ts = BASE_MS + i * 1000
        producer.produce(
            topic,
            json.dumps({"amount": i, "ts": ts}).encode(),
            f"acct-{account}".encode(),
            partition=account % PARTITIONS,
            timestamp=ts,
            on_delivery=lambda err, _msg: errors.append(str(err)) if err else None,
        )
    assert producer.flush(30) == 0
    assert not errors, errors


def write_history(
    kafka: KafkaTool, topic: str, url: str, batches: tuple[int, ...], storage: dict[str, str] | None = None
) -> None:
    """Produce *batches* of payments, running the processor once after each: one checkpoint
    generation per batch."""
    kafka.create_topic(topic, PARTITIONS)
    produced = 0
    for n in batches:
        produce_payments(kafka.bootstrap, topic, produced, n)
        produced += n
        tally(topic, kafka.bootstrap, url, storage).run(follow=False)


def recompute(
    kafka: KafkaTool, topic: str, upto: int | None = None
) -> tuple[dict[str, int], dict[tuple[str, int], int]]:
    """The ground truth from a plain consumer: balances per account and records per (account,
    minute window), over every payment (or the first *upto*), by the window rule itself: in
    partition order, a record whose window stream time has passed (no grace) is late and not
    counted — so a batch the producer retried behind a later one (a fresh topic's first requests,
    on a loaded machine) is judged as the processor judges it, not assumed away."""
    balances: dict[str, int] = {}
    minutes: dict[tuple[str, int], int] = {}
    clock: dict[int, int] = {}
    for r in kafka.read_all(topic, range(PARTITIONS)):  # by partition and offset
        assert r.key is not None
        assert r.value is not None
        payment = json.loads(r.value)
        if upto is not None and payment["amount"] >= upto:
            continue
        key = r.key.decode()
        balances[key] = balances.get(key, 0) + payment["amount"]
        now = clock[r.partition] = max(clock.get(r.partition, -1), payment["ts"])
        start = payment["ts"] // MINUTE * MINUTE
        if now < start + MINUTE:  # the window has not closed
            minutes[(key, start)] = minutes.get((key, start), 0) + 1
    return balances, minutes


def storage_args(storage: dict[str, str] | None) -> list[str]:
    return [a for k, v in sorted((storage or {}).items()) for a in ("--storage-option", f"{k}={v}")]


def dump_rows(
    url: str, store: str, *extra: str, storage: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    result = statesnap(
        "dump", "--table", "tally", "--store", store, "-c", url, *storage_args(storage), *extra
    )
    assert result.returncode == 0, result.stderr[-2000:]
    for secret in (storage or {}).values():
        if "secret" in secret.lower() or len(secret) > 30:
            assert secret not in result.stdout + result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def window_key(start: int, key: str) -> bytes:
    """A window store's stored key, as the README's digest covers it: the window start as 8
    big-endian bytes, offset-binary (so byte order is time order), then the key."""
    return struct.pack(">Q", start + (1 << 63)) + key.encode()


def test_dump_store_prints_and_digests_each_store_as_its_checkpoint_holds_it(
    kafka: KafkaTool, topic_name: str, checkpoint_location: Any
) -> None:
    """Both stores of the newest checkpoint, rows and digest, equal a plain consumer's
    recomputation: the key-value store by the user's key, the window store with its window's
    bounds and a digest over window start + key. On both blob stores (a directory, moto S3)."""
    url, storage = checkpoint_location.url, checkpoint_location.options
    write_history(kafka, topic_name, url, (400, 250), storage)
    balances, minutes = recompute(kafka, topic_name)
    more = storage_args(storage)

    rows = dump_rows(url, "balances", storage=storage)
    assert {r["key"]: json.loads(r["value"]) for r in rows} == balances
    assert all(r["partition"] == int(r["key"].split("-")[1]) % PARTITIONS for r in rows)
    summary = ok(
        statesnap("dump", "--table", "tally", "--store", "balances", "-c", url, *more, "--digest", "--json")
    )
    assert summary["digest"] == digest({r["key"].encode(): r["value"].encode() for r in rows})
    assert summary["keys"] == len(balances)
    assert summary["checkpoint"] == 2
    assert summary["tail"] is False
    assert summary["replayed_records"] == 0
    assert summary["kind"] == "key_value"
    typed = dump_rows(url, "balances", "--value-serde", "json", "--key-serde", "string", storage=storage)
    assert {r["key"]: r["value"] for r in typed} == balances

    windows = dump_rows(url, "per_minute", storage=storage)
    assert {(r["key"], r["window_start"]): json.loads(r["value"]) for r in windows} == minutes
    assert all(r["window_end"] == r["window_start"] + MINUTE for r in windows)
    summary = ok(
        statesnap("dump", "--table", "tally", "--store", "per_minute", "-c", url, *more, "--digest", "--json")
    )
    assert summary["kind"] == "window"
    assert summary["digest"] == digest(
        {window_key(r["window_start"], r["key"]): r["value"].encode() for r in windows}
    )


def test_dump_store_at_an_older_generation_is_that_point_in_time(
    kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    """``--generation 1 --no-tail`` reads the first checkpoint, not the newest: the state after the
    first 300 payments exactly."""
    url = str(tmp_path / "ckpt")
    write_history(kafka, topic_name, url, (300, 200))
    balances, _ = recompute(kafka, topic_name, upto=300)
    rows = dump_rows(url, "balances", "--generation", "1", "--no-tail", "--value-serde", "json")
    assert {r["key"]: r["value"] for r in rows} == balances
    summary = ok(statesnap("dump", "--table", "tally", "--store", "balances", "-c", url, "--generation", "1",
                           "--digest", "--json"))  # fmt: skip
    assert summary["checkpoint"] == 1


def test_dump_store_refuses_what_it_cannot_honour_in_one_line(
    kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    """A store that is not there lists the stores that are; a table (no stores), a wrong input
    topic, no checkpoint store, no --table, or a local store kind (--store's old meaning) are each
    one line."""
    url = str(tmp_path / "ckpt")
    write_history(kafka, topic_name, url, (30,))
    table_topic = kafka.create_topic(topic_name + "-tbl", 1)
    kafka.produce(table_topic, [(0, b"k", b"v")])
    with Table(table_topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False) as t:
        t.checkpoint()

    def last_line(*args: str) -> tuple[int, str]:
        result = statesnap("dump", *args)
        assert "Traceback" not in result.stderr
        return result.returncode, result.stderr.strip().splitlines()[-1]

    assert last_line("--table", "tally", "--store", "nope", "-c", url) == (
        1,
        "Error: ConfigError: processor 'tally' has no store 'nope' at generation 1 (its stores: "
        "balances, per_minute)",
    )
    code, line = last_line("--table", table_topic, "--store", "balances", "-c", url)
    assert code == 1
    assert line.startswith(f"Error: ConfigError: {table_topic!r} (generation 1) is a table, not a processor")
    code, line = last_line("--table", "tally", "--store", "balances", "-c", url, "-t", "other")
    assert code == 1
    assert line == (
        f"Error: ConfigError: processor 'tally' reads topic {topic_name!r}, not 'other' (drop -t, or fix it)"
    )
    assert last_line("--table", "tally", "--store", "balances") == (
        2,
        "Error: --store reads a store from its checkpoint: give --checkpoints URL (and no --no-checkpoint)",
    )
    assert last_line("-b", kafka.bootstrap, "-t", topic_name, "--store", "memory") == (
        2,
        "Error: --store names a processor's store (with --table); the local store kind is "
        "--state-store memory",
    )
    assert last_line("--store", "balances", "-c", url) == (
        2,
        "Error: --store needs --table NAME: the processor whose store to read",
    )


@pytest.fixture
def served(tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    """Servers a test starts, stopped with SIGTERM (then killed) at its end."""
    children: list[subprocess.Popen[str]] = []
    yield children
    for child in children:
        child.terminate()
        try:
            child.wait(20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(10)


def _get(url: str) -> tuple[int, bytes, dict[str, str]]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read(), dict(answer.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)
    except urllib.error.URLError:  # bound, not yet listening: the server prints its URL first
        return 0, b"", {}


def _wait(predicate: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_serve_store_answers_from_the_newest_checkpoint_and_follows_new_ones(
    kafka: KafkaTool, topic_name: str, tmp_path: Path, served: list[subprocess.Popen[str]]
) -> None:
    """``serve --store`` answers lookups and scans as the newest checkpoint holds the store, and
    moves to a newer generation once the processor writes one (polled: a store cannot be tailed)."""
    url = str(tmp_path / "ckpt")
    write_history(kafka, topic_name, url, (200,))
    child = subprocess.Popen(
        [
            *STATESNAP,
            "serve",
            "--table",
            "tally",
            "--store",
            "balances",
            "-c",
            url,
            "--port",
            "0",
            "--poll-interval",
            "0.3s",
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    served.append(child)
    assert child.stderr is not None
    line = child.stderr.readline()
    found = re.search(r"on (http://\S+) ", line)
    assert found, line
    base = found.group(1)
    _wait(lambda: _get(f"{base}/health")[0] == 200, "the store to load")

    balances, _ = recompute(kafka, topic_name)
    status, body, headers = _get(f"{base}/tables/balances/keys/acct-3")
    assert status == 200
    assert json.loads(body) == balances["acct-3"]
    assert headers["x-statesnap-caught-up"] == "true"
    page = json.loads(_get(f"{base}/tables/balances/keys?limit=100")[1])
    assert {item["key"]: json.loads(item["value"]) for item in page["items"]} == balances
    assert _get(f"{base}/tables/balances/keys/acct-99")[0] == 404
    assert json.loads(_get(f"{base}/tables/balances")[1])["checkpoint_generation"] == 1

    produce_payments(kafka.bootstrap, topic_name, 200, 100)
    tally(topic_name, kafka.bootstrap, url).run(follow=False)
    balances, _ = recompute(kafka, topic_name)
    _wait(
        lambda: json.loads(_get(f"{base}/tables/balances")[1])["checkpoint_generation"] == 2,
        "generation 2 to be served",
    )
    assert json.loads(_get(f"{base}/tables/balances/keys/acct-3")[1]) == balances["acct-3"]
    child.terminate()
    assert child.wait(20) == 0


def test_an_idle_store_follower_only_lists_the_manifests(
    kafka: KafkaTool, topic_name: str, s3_server: EmbeddedS3, s3_location: Any
) -> None:
    """An idle ``serve --store`` replica costs one S3 LIST a poll: the manifest and the store's
    files are read only when a newer generation appears (it used to re-open and re-verify the
    newest checkpoint, a GET of the manifest and of every partition's file, at every poll).
    Counted at the real S3 endpoint (the moto server's request log); the writer runs on the
    suite's broker, which the follower never talks to."""
    url, storage = s3_location.url, s3_location.options
    write_history(kafka, topic_name, url, (200,), storage)
    follower = StoreFollower(open_blob_store(url, **storage), "tally", "balances", poll_seconds=0.1)
    follower.start_in_background()
    try:
        assert follower.wait_caught_up(30)
        assert follower.generation == 1

        def requests() -> list[str]:
            return [
                line for line in s3_server.log_tail(100_000).splitlines() if f"/{s3_location.bucket}" in line
            ]

        before = len(requests())
        time.sleep(2.0)
        idle = requests()[before:]
        reads = [line for line in idle if ".json" in line or ".parquet" in line]
        assert not reads, reads[:3]
        assert 5 <= len(idle) <= 30, len(idle)  # ~20 polls of 0.1 s, each one LIST

        produce_payments(kafka.bootstrap, topic_name, 200, 100)
        tally(topic_name, kafka.bootstrap, url, storage).run(follow=False)
        _wait(lambda: follower.generation == 2, "generation 2 to be loaded")
        balances, _ = recompute(kafka, topic_name)
        assert json.loads(follower.get_raw(b"acct-3") or b"null") == balances["acct-3"]
    finally:
        follower.close()
