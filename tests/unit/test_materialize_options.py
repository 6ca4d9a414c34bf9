"""``materialize()`` refuses what cannot be honoured before any I/O (the broker address is one
nothing listens on: reaching it would fail differently), and its result prints the CLI's keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from statesnap.errors import ConfigError, EngineOptionError
from statesnap.materialize import (
    Engine,
    EngineChoice,
    Followed,
    FollowOptions,
    MaterializeResult,
    RestoreFigures,
    SparkOptions,
    materialize,
)
from statesnap.task.options import CheckpointOptions, GroupOptions, StaticShare

NOWHERE = "127.0.0.1:1"


def test_an_option_the_engine_cannot_honour_is_refused_in_one_line(tmp_path: Path) -> None:
    url = str(tmp_path)
    refused = r"--state-store \(store=\) cannot be used with --engine spark"
    with pytest.raises(EngineOptionError, match=refused):
        materialize("t", bootstrap_servers=NOWHERE, checkpoints=url, engine="spark", store="rocksdb")
    with pytest.raises(EngineOptionError, match="--instances cannot be used with --engine spark"):
        materialize("t", bootstrap_servers=NOWHERE, checkpoints=url, engine="spark", share=StaticShare(0, 2))
    with pytest.raises(EngineOptionError, match="--spark-conf cannot be used with --engine python"):
        materialize(
            "t",
            bootstrap_servers=NOWHERE,
            checkpoints=url,
            engine=Engine.PYTHON,
            spark=SparkOptions(conf={"spark.executor.memory": "1g"}),
        )
    with pytest.raises(EngineOptionError, match="need different engines"):
        materialize(
            "t",
            bootstrap_servers=NOWHERE,
            checkpoints=url,
            store="memory",
            spark=SparkOptions(checkpoint_location=str(tmp_path / "q")),
        )


def test_a_group_needs_follow_and_no_generation(tmp_path: Path) -> None:
    group = GroupOptions("g")
    with pytest.raises(ConfigError, match="consumer group needs follow"):
        materialize("t", bootstrap_servers=NOWHERE, checkpoints=str(tmp_path), engine="python", share=group)
    with pytest.raises(ConfigError, match="not with a generation"):
        materialize(
            "t",
            bootstrap_servers=NOWHERE,
            checkpoints=CheckpointOptions(str(tmp_path), generation=3),
            engine="python",
            follow=FollowOptions(),
            share=group,
        )
    with pytest.raises(ConfigError, match="unknown engine 'flink'"):
        materialize("t", bootstrap_servers=NOWHERE, checkpoints=str(tmp_path), engine="flink")


def test_result_json_and_summary_of_a_follow_run() -> None:
    """A follow run's result: ``followed`` joins the keys, and the sentence gives the follow time
    and the final checkpoint's time apart (neither passes for the other)."""
    result = MaterializeResult(
        table="orders",
        topic="orders",
        engine=EngineChoice(Engine.SPARK, "asked for with --engine spark"),
        checkpoint=2,
        written=True,
        keys=1200,
        offsets={0: 700, 1: 500},
        restore=RestoreFigures(1, 700, 3.25),
        checkpoint_seconds=0.4567,
        seconds=9.0,
        bytes=4096,
        url="file:///c/x_orders",
        followed=Followed(120, 4.5),
    )
    as_json = result.to_json()
    assert as_json["followed"] == {"records": 120, "seconds": 4.5}
    assert (as_json["engine"], as_json["engine_reason"]) == ("spark", "asked for with --engine spark")
    assert as_json["checkpoint_seconds"] == 0.457
    assert as_json["offsets"] == {0: 700, 1: 500}
    assert result.summary() == (
        "checkpoint 2 of orders by spark: 1,200 keys, 4,096 bytes, written in 0.46s after following "
        "for 4.50s (read 820 records after checkpoint 1) → file:///c/x_orders"
    )
