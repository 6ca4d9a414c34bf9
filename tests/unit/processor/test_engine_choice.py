"""Which engine runs a processor (issue 34, item 5): a Spark run over history emits nothing, so the
Spark engine refuses exactly-once outputs and a dead-letter topic in one typed line, and ``auto``
never picks it for a processor (whose handlers may emit), on any machine, a configured Spark cluster
included; it says why in the reason line. No broker: the choice asks none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from statesnap import ProcessingOptions, Processor
from statesnap.errors import ConfigError, EngineOptionError
from statesnap.materialize import Engine, SparkOptions
from statesnap.materialize.engine import MASTER_ENV
from statesnap.processor.running import choose_processor_engine, run_processor


def processor(tmp_path: Path, **options: Any) -> Processor:
    proc = Processor(
        "tally", inputs=["payments"], bootstrap_servers="127.0.0.1:1", checkpoints=str(tmp_path), **options
    )
    proc.handler(lambda record, ctx: ctx.emit("out", record.key, record.value))
    return proc


@pytest.fixture
def spark_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Spark cluster configured: what made auto pick Spark before any backlog was weighed."""
    monkeypatch.setenv(MASTER_ENV, "spark://spark-master:7077")


@pytest.mark.usefixtures("spark_cluster")
def test_auto_runs_a_processor_in_python_and_says_why(tmp_path: Path) -> None:
    at_least_once = choose_processor_engine(processor(tmp_path))
    assert at_least_once.engine is Engine.PYTHON
    assert "a Spark run over history emits nothing" in at_least_once.reason
    exactly_once = choose_processor_engine(
        processor(tmp_path, processing=ProcessingOptions(exactly_once=True))
    )
    assert exactly_once.engine is Engine.PYTHON
    assert exactly_once.reason.startswith("exactly-once outputs need the python engine")
    dead_letters = choose_processor_engine(
        processor(tmp_path, processing=ProcessingOptions(dead_letter_topic="dlq"))
    )
    assert dead_letters.engine is Engine.PYTHON
    assert dead_letters.reason.startswith("a dead-letter topic needs the python engine")


def test_spark_refuses_exactly_once_and_dead_letters_in_one_typed_line(tmp_path: Path) -> None:
    for options, named in (
        (
            {"exactly_once": True},
            "--exactly-once (ProcessingOptions(exactly_once=True)) cannot be used with --engine spark",
        ),
        (
            {"dead_letter_topic": "dlq"},
            "ProcessingOptions(dead_letter_topic=) cannot be used with --engine spark",
        ),
    ):
        with pytest.raises(EngineOptionError) as refused:
            choose_processor_engine(
                processor(tmp_path, processing=ProcessingOptions(**options)), Engine.SPARK
            )
        message = str(refused.value)
        assert isinstance(refused.value, ConfigError)
        assert message.startswith(named)
        assert message.endswith("use --engine python")
        assert "\n" not in message


def test_a_spark_setting_with_exactly_once_needs_two_engines(tmp_path: Path) -> None:
    with pytest.raises(EngineOptionError, match=r"--exactly-once .* and --spark-conf need different engines"):
        choose_processor_engine(
            processor(tmp_path, processing=ProcessingOptions(exactly_once=True)),
            spark=SparkOptions({"spark.executor.memory": "1g"}),
        )


def test_the_library_refuses_before_a_spark_session_starts(tmp_path: Path) -> None:
    """``run_processor(..., engine="spark")`` of an exactly-once processor raises before it asks for
    a session (the session factory is never called) or the cluster."""
    asked: list[bool] = []

    def session() -> Any:
        asked.append(True)
        raise AssertionError("a SparkSession was asked for")

    with pytest.raises(EngineOptionError, match="use --engine python"):
        run_processor(
            processor(tmp_path, processing=ProcessingOptions(exactly_once=True)),
            engine="spark",
            spark=SparkOptions(session=session),
        )
    assert not asked
