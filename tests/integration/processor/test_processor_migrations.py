"""A processor's side of issue #20: a store's format changed between versions (a per-store
migration while restoring equals processing everything with the new code), a checkpoint of an old
version refused without one, ``CheckpointOptions(generation=G)`` restores exactly G and continues,
and exactly-once with an exact generation needs ``ProcessingOptions(reemit_confirmed=True)``.

Proven on Apache Kafka (the suite's broker) and on Tansu (the dev broker): ordered partitions and EOF only."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from integration.conftest import KafkaTool
from statesnap import CheckpointOptions, ProcessingOptions, Processor, ProcessorContext, Record, StateVersion
from statesnap.errors import CheckpointMismatchError, ConfigError
from statesnap.task.migration import Migration


def tally(
    version: int,
    topic: str,
    bootstrap: str,
    url: str | None,
    *,
    migrations: Mapping[int, Mapping[str, Migration]] | None = None,
    generation: int | None = None,
    processing: ProcessingOptions | None = None,
) -> Processor:
    """Version 1 stores a balance as a number, version 2 as {"total": n}."""
    proc = Processor(
        "tally" if url is not None else "scratch",
        inputs=[topic],
        bootstrap_servers=bootstrap,
        checkpoints=None if url is None else CheckpointOptions(url, interval="1h", generation=generation),
        stores=["balances"],
        value_serde="json",
        state=StateVersion(version, migrations),
        processing=processing,
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

    # An exact generation: the first (version 1) again, migrated, then the whole tail.
    again = tally(
        2, topic, kafka.bootstrap, url, migrations={1: {"balances": to_v2}}, generation=first.generation
    )
    again.start()
    try:
        assert again.report.checkpoint == first.generation
        assert again.report.replayed_records == 50
        assert balances(again) == everything
    finally:
        again.close(checkpoint=False)


def test_exactly_once_from_an_exact_generation_needs_confirming() -> None:
    once = ProcessingOptions(exactly_once=True)
    with pytest.raises(
        ConfigError,
        match=r"generation 3 with exactly_once=True produces the outputs .* reemit_confirmed=True",
    ):
        tally(1, "t", "127.0.0.1:1", "/nonexistent", generation=3, processing=once)
    confirmed = tally(
        1, "t", "127.0.0.1:1", "/nonexistent", generation=3, processing=once.with_reemit_confirmed()
    )
    assert confirmed.settings.checkpoints_generation == 3
    with pytest.raises(ConfigError, match="reemit_confirmed=True"):
        tally(1, "t", "127.0.0.1:1", "/nonexistent", generation=3).replace(processing=once)


def test_a_tables_migration_is_a_function_and_a_processors_is_per_store() -> None:
    """The one state bundle, two owners: a processor's per-store form is refused by a table."""
    from statesnap import Table

    with pytest.raises(ConfigError, match=r"migrations\[1\] maps store names to steps"):
        Table("t", bootstrap_servers="127.0.0.1:1", state=StateVersion(2, {1: {"balances": to_v2}}))
    with pytest.raises(ConfigError, match=r"must map store names to fn\(key, value\)"):
        tally(2, "t", "127.0.0.1:1", None, migrations={1: to_v2})  # type: ignore[dict-item]
