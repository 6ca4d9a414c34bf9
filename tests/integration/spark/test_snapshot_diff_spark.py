"""``snapshot diff --engine spark`` of a processor, on the suite's one SparkSession: the Spark
engine's diff (:func:`~statesnap.cli.spark_engine.diff_on_spark`, what ``--engine spark`` runs)
answers the Python engine's JSON — run as a user runs it, in a fresh process — key for key:
per-store counts, examples and totals. ``--engine spark`` itself runs in a fresh process in
test_cli_engines.py (a table's diff); a processor's diff goes through the same function.

Proven on Apache Kafka (the suite's broker) and on Tansu: nothing depends on broker behaviour
beyond ordered partitions and partition EOF; the diff reads only the checkpoint store.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from integration.cli_runner import ok, statesnap
from integration.conftest import KafkaTool
from integration.processor.test_store_readback import write_history
from statesnap.cli.spark_engine import diff_on_spark
from statesnap.snapshot.api import SnapshotApi

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_spark_diff_of_a_processor_answers_the_same_json(
    spark: Any, kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    url = str(tmp_path / "ckpt")
    write_history(kafka, topic_name, url, (200, 100))
    python = ok(statesnap("snapshot", "diff", url, "--table", "tally", "1", "2", "--json"))
    api = SnapshotApi.open(url, "tally")
    try:
        on_spark = json.loads(json.dumps(diff_on_spark(api, 1, 2, spark=spark).to_json()))
    finally:
        api.close()
    assert on_spark == python, json.dumps({"python": python, "spark": on_spark})[:3000]
    assert python["changed"] > 0
    assert set(python["stores"]) == {"balances", "per_minute"}
    assert spark.sparkContext._jsc is not None  # the suite's session is still running
