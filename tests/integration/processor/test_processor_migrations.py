"""A processor's side of issue #20: a store's format changed between versions (a per-store
migration while restoring equals processing everything with the new code), a checkpoint of an old
version refused without one, ``start_from=G`` restores exactly G and continues, and exactly-once
with ``start_from`` needs ``confirm=True``.

Proven on Apache Kafka (the suite's broker) and on Tansu (the dev broker): ordered partitions and EOF only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from integration.conftest import KafkaTool
from statesnap import CheckpointOptions, Processor, ProcessorContext, Record
from statesnap.errors import CheckpointMismatchError, ConfigError


def tally(version: int, topic: str, bootstrap: str, url: str | None, **options: Any) -> Processor:
    """Version 1 stores a balance as a number, version 2 as {"total": n}."""
    proc = Processor(
        "tally" if url is not None else "scratch",
        inputs=[topic],
        bootstrap_servers=bootstrap,
        checkpoints=None if url is None else CheckpointOptions(url, interval="1h"),
        stores=["balances"],
        value_serde="json",
        state_version=version,
        **options,
    )

    @proc.handler
    def on_payment(record: Record, ctx: ProcessorContext) -> None:
        balances = ctx.stores["balances"]
        amount = record.value["amount"]
        if version == 1:
            balances[record.key] = balances.get(record.key, 0) + amount
        else:
            balances[record.key] = {"total": balances.get(record.key, {"total": 0})["total"] + amount}

    return proc


def to_v2(key: bytes, value: bytes) -> tuple[bytes, bytes]:
    return key, json.dumps({"total": json.loads(value)}).encode()


def payments(kafka: KafkaTool, topic: str, start: int, n: int) -> None:
    kafka.produce(
        topic,
        (
            (i % 2, f"acct-{i % 7}".encode(), json.dumps({"amount": i}).encode())
            for i in range(start, start + n)
        ),
    )


def balances(proc: Processor) -> dict[bytes, Any]:
    return dict(proc.store("balances").items())


def test_store_migration_restart_and_start_from(kafka: KafkaTool, topic_name: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(topic_name, 2)
    url = str(tmp_path / "ckpt")
    payments(kafka, topic, 0, 100)
    v1 = tally(1, topic, kafka.bootstrap, url)
    v1.run(follow=False)
    first = v1.last_checkpoint
    assert first is not None
    payments(kafka, topic, 100, 50)

    with pytest.raises(CheckpointMismatchError, match="state version 1 but this code is version 2"):
        tally(2, topic, kafka.bootstrap, url).run(follow=False)

    v2 = tally(2, topic, kafka.bootstrap, url, migrations={1: {"balances": to_v2}})
    report = v2.run(follow=False)
    assert report.checkpoint == first.generation
    assert report.migrated_from == 1
    assert report.replayed_records == 50
    scratch = tally(2, topic, kafka.bootstrap, None)
    scratch.start()
    try:
        everything = balances(scratch)
    finally:
        scratch.close()
    migrated = tally(2, topic, kafka.bootstrap, url)
    migrated.start()  # the v2 checkpoint the migrated run wrote: no migration needed any more
    try:
        assert migrated.report.migrated_from is None
        assert balances(migrated) == everything
        assert len(everything) == 7
    finally:
        migrated.close(checkpoint=False)

    # start_from: exactly the first (version 1) generation again, migrated, then the whole tail.
    again = tally(
        2, topic, kafka.bootstrap, url, migrations={1: {"balances": to_v2}}, start_from=first.generation
    )
    again.start()
    try:
        assert again.report.checkpoint == first.generation
        assert again.report.replayed_records == 50
        assert balances(again) == everything
    finally:
        again.close(checkpoint=False)


def test_exactly_once_start_from_needs_confirm() -> None:
    with pytest.raises(
        ConfigError, match=r"start_from=3 with exactly_once=True produces the outputs .* confirm=True"
    ):
        tally(1, "t", "127.0.0.1:1", "/nonexistent", exactly_once=True, start_from=3)
    confirmed = tally(1, "t", "127.0.0.1:1", "/nonexistent", exactly_once=True, start_from=3, confirm=True)
    assert confirmed.settings.start_from == 3
    with pytest.raises(ConfigError, match="confirm=True"):
        tally(1, "t", "127.0.0.1:1", "/nonexistent", start_from=3).replace(exactly_once=True)
