"""``examples/spend.py`` as its docstring runs it: the history folded on Spark
(``bootstrap_processor``, the session's local Spark), then the service resuming in a fresh Python process
(``python examples/spend.py --once``), equal to a plain consumer's sums. Proven on Apache Kafka (the suite's
broker) and Tansu (the dev broker): ordered partitions and EOF only."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from integration.conftest import KafkaTool
from statesnap import Processor
from statesnap.spark import bootstrap_processor

pytestmark = [pytest.mark.spark, pytest.mark.integration]

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "spend.py"


def load_example(monkeypatch: pytest.MonkeyPatch, bootstrap: str, checkpoints: Path) -> Processor:
    monkeypatch.setenv("STATESNAP_BOOTSTRAP_SERVERS", bootstrap)
    monkeypatch.setenv("STATESNAP_CHECKPOINTS", str(checkpoints))
    spec = importlib.util.spec_from_file_location("spend_example", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    proc = module.proc
    assert isinstance(proc, Processor)
    return proc


def test_spend_bootstrapped_on_spark_and_resumed_in_python(
    spark: Any, kafka: KafkaTool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kafka.create_topic("purchases", 2)
    # Each customer in one partition, as the producer's partitioner puts a key.
    history = [
        (i % 13 % 2, f"c{i % 13}".encode(), json.dumps({"amount": i % 50}).encode()) for i in range(2000)
    ]
    kafka.produce("purchases", history)
    result = bootstrap_processor(spark, load_example(monkeypatch, kafka.bootstrap, tmp_path))
    assert result.processed == 2000
    kafka.produce("purchases", [(0, b"c0", b'{"amount": 1000}')])

    resumed = subprocess.run(
        [sys.executable, str(EXAMPLE), "--once"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={
            "STATESNAP_BOOTSTRAP_SERVERS": kafka.bootstrap,
            "STATESNAP_CHECKPOINTS": str(tmp_path),
            "PATH": "",
        },
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    reader = load_example(monkeypatch, kafka.bootstrap, tmp_path)
    reader.start()
    try:
        assert reader.report.replayed_records == 0  # the Python run checkpointed the tail
        got = dict(reader.store("spent").items())
    finally:
        reader.close(checkpoint=False)
    truth: dict[str, int] = {}
    for r in kafka.read_all("purchases", range(2)):
        assert r.key is not None
        assert r.value is not None
        truth[r.key.decode()] = truth.get(r.key.decode(), 0) + json.loads(r.value)["amount"]
    assert got == truth
