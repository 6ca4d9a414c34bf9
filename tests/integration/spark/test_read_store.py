"""``read_table(spark, url, table, store=NAME)``: a processor's store as a DataFrame, equal to an
independent recomputation from the input topic (a plain consumer loop, not statesnap). The checkpoints are
written by a Processor in this process on the session's broker (Apache Kafka; Tansu too); the read needs no
broker. Nothing here depends on broker behaviour beyond ordered partitions and EOF."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from integration.conftest import KafkaTool
from integration.processor.test_store_readback import MINUTE, PARTITIONS, recompute, write_history
from statesnap.errors import ConfigError
from statesnap.spark import read_table


def test_read_store_is_the_store_as_its_checkpoint_holds_it(
    spark: Any, kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    """Both store kinds, the newest generation and an older one: one row per stored key, the
    user's key bytes, window bounds for the window store, the partition each row came from."""
    url = str(tmp_path / "ckpt")
    write_history(kafka, topic_name, url, (300, 150))
    balances, minutes = recompute(kafka, topic_name)

    df = read_table(spark, url, "tally", store="balances")
    assert df.columns == ["key", "value", "offset", "timestamp", "partition"]
    rows = df.collect()
    assert {bytes(r.key).decode(): json.loads(bytes(r.value)) for r in rows} == balances
    assert len(rows) == len(balances)
    assert all(r.partition == int(bytes(r.key).decode().split("-")[1]) % PARTITIONS for r in rows)

    windows = read_table(spark, url, "tally", store="per_minute")
    assert windows.columns == [
        "key",
        "value",
        "window_start",
        "window_end",
        "offset",
        "timestamp",
        "partition",
    ]
    got = {(bytes(r.key).decode(), r.window_start): json.loads(bytes(r.value)) for r in windows.collect()}
    assert got == minutes
    assert windows.where(f"window_end != window_start + {MINUTE}").count() == 0

    older = read_table(spark, url, "tally", generation=1, store="balances").collect()
    assert {bytes(r.key).decode(): json.loads(bytes(r.value)) for r in older} == recompute(
        kafka, topic_name, upto=300
    )[0]


def test_read_store_refusals_come_before_any_spark_job(
    spark: Any, kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    """A store not in the manifest names the ones there; a store cannot be read as of now (that
    would mean running the handler over the tail)."""
    url = str(tmp_path / "ckpt")
    write_history(kafka, topic_name, url, (20,))
    with pytest.raises(
        ConfigError, match=r"has no store 'nope' at generation 1 \(its stores: balances, per_minute\)"
    ):
        read_table(spark, url, "tally", store="nope")
    with pytest.raises(ConfigError, match="is read as its checkpoint holds it"):
        read_table(spark, url, "tally", store="balances", as_of="now", bootstrap_servers=kafka.bootstrap)
