"""Output a person reads names a checkpoint store as they gave it (issue #32): ``./ckpt`` stays
``./ckpt`` in materialize's summary, ``checkpoints list``/``verify``/``gc`` rows and an error
message, while ``--json``'s ``url`` stays the absolute identity scripts compare.

Run as a user runs it: ``statesnap`` subprocesses in a working directory, against the session's
broker (Apache Kafka by default), which proved it."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from integration.cli_runner import ok, statesnap
from integration.conftest import KafkaTool

pytestmark = pytest.mark.integration


def test_a_relative_store_stays_relative_in_what_a_person_reads(kafka: KafkaTool, tmp_path: Path) -> None:
    topic = kafka.create_topic(f"shown-{uuid.uuid4().hex[:8]}", 2)
    kafka.produce(topic, [(i % 2, b"k%d" % i, b"v%d" % i) for i in range(40)])
    common = ("-b", kafka.bootstrap, "-t", topic)
    absolute = str(tmp_path / "ckpt")

    def run(*args: str) -> str:
        text = ok(statesnap(*args, cwd=tmp_path, timeout=120))
        assert isinstance(text, str)
        assert absolute not in text, text
        assert "file://" not in text, text
        return text

    summary = run("materialize", *common, "--checkpoints", "./ckpt")
    assert "→ ./ckpt/" in summary, summary
    rows = run("checkpoints", "list", "./ckpt").splitlines()
    assert rows, "no checkpoint listed"
    assert all(r.startswith("./ckpt/") for r in rows), rows
    verified = run("checkpoints", "verify", "./ckpt").splitlines()
    assert len(verified) == 2, verified  # generation 1, then the table's metadata
    assert all(r.startswith("./ckpt/") for r in verified), verified
    (collected,) = run("checkpoints", "gc", "./ckpt", "--dry-run").splitlines()
    assert collected.startswith("./ckpt/"), collected

    missing = statesnap("dump", *common, "--checkpoints", "./ckpt", "--generation", "99", cwd=tmp_path)
    assert missing.returncode == 1, missing.stderr
    (error,) = missing.stderr.strip().splitlines()
    assert "no generation 99" in error, error
    assert "in ./ckpt/" in error, error
    assert absolute not in error, error

    # The JSON stays the absolute identity: scripts compare it across working directories.
    again = ok(statesnap("materialize", *common, "--checkpoints", "./ckpt", "--json", cwd=tmp_path))
    assert again["url"].startswith(f"file://{absolute}/"), again["url"]
