"""A partition whose every record retention deleted (log start = log end > 0) is checkpointed with
an empty base file by both engines, so the manifest is one a reader trusts (a partition past
offset 0 without files is the mark of files dropped from a manifest, and is refused).

Apache Kafka 4.1.1 proved it: ``delete_records`` moved the log start to the end (Tansu crashes on
``delete_records``). Spark runs as the CLI in its own process.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from integration.apache.test_retention import _delete_records
from integration.cli_runner import digest, ok, statesnap

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("engine", ["python", pytest.param("spark", marks=pytest.mark.spark)])
def test_a_partition_retention_emptied_gets_an_empty_base(engine: str, kafka: Any, tmp_path: Path) -> None:
    topic = kafka.create_topic(f"emptied-{uuid.uuid4().hex[:10]}", 2)
    produced = kafka.produce(topic, [(p, b"k%d-%d" % (p, i), b"v%d" % i) for p in (0, 1) for i in range(20)])
    _delete_records(kafka.bootstrap, topic, {1: 20})
    url = str(tmp_path / "ckpt")
    args = ["materialize", "-b", kafka.bootstrap, "-t", topic, "--checkpoints", url, "--json"]
    assert ok(statesnap(*args, "--engine", engine, "--quiet"))["checkpoint"] == 1
    (manifest,) = (tmp_path / "ckpt").glob("*/snapshots/*.json")
    part = json.loads(manifest.read_text())["partitions"]["1"]
    assert part["next_offset"] == 20
    assert [(f["kind"], f["rows"]) for f in part["files"]] == [("base", 0)]
    ok(statesnap("checkpoints", "verify", url))
    dumped = ok(statesnap("dump", "-b", kafka.bootstrap, "-t", topic, "-c", url, "--digest", "--json"))
    assert dumped["checkpoint"] == 1  # trusted, not skipped
    truth = kafka.truth(r for r in produced if r.partition == 0)
    assert dumped["digest"] == digest(truth)
