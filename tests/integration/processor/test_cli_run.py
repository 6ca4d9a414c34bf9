"""``statesnap run MODULE:OBJECT`` as a user runs it: a fresh process of the venv's interpreter, in
a directory holding the user's module. Proven on Apache Kafka (the suite's broker) and on Tansu (the dev
broker): nothing here depends on broker behaviour beyond ordered partitions, partition EOF and SIGTERM
reaching the command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from integration.cli_runner import STATESNAP, ok, statesnap
from integration.conftest import KafkaTool
from statesnap.materialize import spark_available
from statesnap.processor.running import spark_processor_available

#: ``materialize --json``'s keys (one-shot): ``run --json`` has every one of them.
MATERIALIZE_KEYS = {
    "table", "topic", "engine", "checkpoint", "written", "keys", "offsets", "restore",
    "checkpoint_seconds", "seconds", "bytes", "url", "engine_reason",
}  # fmt: skip
PROCESSOR_KEYS = {"processed", "emitted", "dead_lettered", "stores"}


def write_app(where: Path, topic: str, *, bootstrap: str, checkpoints: str | None) -> Path:
    """The README's running tally as a user's module ``tally_app.py`` (built, never started)."""
    where.mkdir(parents=True, exist_ok=True)
    ckpt = "None" if checkpoints is None else repr(checkpoints)
    (where / "tally_app.py").write_text(
        textwrap.dedent(
            f"""
            from statesnap import Processor

            proc = Processor("tally", inputs=[{topic!r}], bootstrap_servers={bootstrap!r},
                             checkpoints={ckpt}, stores=["balances"], value_serde="json", timeout=5)

            @proc.handler
            def on_payment(record, ctx):
                balances = ctx.stores["balances"]
                balances[record.key] = balances.get(record.key, 0) + record.value["amount"]
                ctx.emit({topic + "-out"!r}, record.key, balances[record.key])

            not_a_processor = 42
            """
        )
    )
    return where


def run_in(where: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``statesnap ARGS`` started in *where*, as a user in their project directory."""
    return subprocess.run(
        [*STATESNAP, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=where,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )


def payments(kafka: KafkaTool, topic: str, start: int, n: int) -> None:
    kafka.produce(
        topic,
        (
            (i % 13 % 3, f"acct-{i % 13}".encode(), json.dumps({"amount": i}).encode())
            for i in range(start, start + n)
        ),
    )


def recompute(kafka: KafkaTool, topic: str) -> dict[str, int]:
    """The ground truth: a plain consumer loop over the whole input, not statesnap."""
    out: dict[str, int] = {}
    for r in kafka.read_all(topic, range(3)):
        assert r.key is not None
        assert r.value is not None
        out[r.key.decode()] = out.get(r.key.decode(), 0) + json.loads(r.value)["amount"]
    return out


def dumped_balances(url: str) -> dict[str, int]:
    """``dump --store balances`` of the checkpoint store, as JSON lines through the JSON serde."""
    result = statesnap("dump", "--table", "tally", "--store", "balances", "-c", url, "--value-serde", "json")
    assert result.returncode == 0, result.stderr[-2000:]
    return {row["key"]: row["value"] for row in map(json.loads, result.stdout.splitlines())}


def test_run_restores_catches_up_and_checkpoints_as_materialize_does(
    kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    """One-shot runs: the first processes everything, the second restores the first's checkpoint
    and runs the handler over the tail only; ``--json`` has materialize's keys plus the
    processor's; the store the checkpoint holds equals a plain consumer's recomputation."""
    topic = kafka.create_topic(topic_name, 3)
    kafka.create_topic(topic + "-out", 3)
    url = str(tmp_path / "ckpt")
    app = write_app(tmp_path / "proj", topic, bootstrap=kafka.bootstrap, checkpoints=url)
    payments(kafka, topic, 0, 300)

    first = ok(run_in(app, "run", "tally_app:proc", "--json"))
    assert set(first) >= MATERIALIZE_KEYS | PROCESSOR_KEYS, first
    assert first["engine"] == "python"
    assert first["checkpoint"] == 1
    assert first["written"] is True
    assert first["restore"]["checkpoint"] is None
    assert first["processed"] == 300
    assert first["emitted"] == 300
    assert first["dead_lettered"] == 0
    assert first["stores"] == {"balances": 13}
    assert first["keys"] == 13  # the user's rows: statesnap's bookkeeping (stream time) is not counted

    payments(kafka, topic, 300, 120)
    second = ok(run_in(app, "run", "tally_app:proc", "--json"))
    assert second["restore"]["checkpoint"] == 1
    assert second["restore"]["replayed_records"] == 120
    assert second["processed"] == 120  # the tail only: the stores came from the checkpoint
    assert second["checkpoint"] == 2
    assert second["written"] is True
    assert second["offsets"] == {
        str(p): o for p, o in kafka.end_offsets(kafka.read_all(topic, range(3)), range(3)).items()
    }

    assert dumped_balances(url) == recompute(kafka, topic)
    nothing_new = ok(run_in(app, "run", "tally_app:proc", "--json"))
    assert nothing_new["written"] is False
    assert nothing_new["processed"] == 0


def test_command_line_overrides_what_the_object_was_built_with(
    kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    """The module names an unreachable broker and no checkpoint store; ``-b``, ``-c`` and
    ``--timeout`` on the command line win, and the checkpoint lands where ``-c`` says."""
    topic = kafka.create_topic(topic_name, 3)
    kafka.create_topic(topic + "-out", 3)
    app = write_app(tmp_path / "proj", topic, bootstrap="127.0.0.1:1", checkpoints=None)
    payments(kafka, topic, 0, 50)

    refused = run_in(app, "run", "tally_app:proc", "-b", kafka.bootstrap)
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1] == (
        "Error: ConfigError: processor 'tally' has no checkpoint store: give --checkpoints URL "
        "(a run writes a checkpoint)"
    )

    url = str(tmp_path / "elsewhere")
    result = ok(
        run_in(app, "run", "tally_app:proc", "-b", kafka.bootstrap, "-c", url, "--timeout", "20s", "--json")
    )
    assert result["checkpoint"] == 1
    assert result["url"].startswith(Path(url).as_uri())
    assert dumped_balances(url) == recompute(kafka, topic)


def test_follow_processes_until_sigterm_then_closes_with_a_final_checkpoint(
    kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    """``--follow`` keeps processing records produced while it runs; SIGTERM is a clean stop: a
    final checkpoint that holds every record processed, exit 0, the JSON result."""
    topic = kafka.create_topic(topic_name, 3)
    kafka.create_topic(topic + "-out", 3)
    url = str(tmp_path / "ckpt")
    app = write_app(tmp_path / "proj", topic, bootstrap=kafka.bootstrap, checkpoints=url)
    payments(kafka, topic, 0, 100)
    child = subprocess.Popen(
        [*STATESNAP, "run", "tally_app:proc", "--follow", "--json"],
        cwd=app,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(1.0)
        payments(kafka, topic, 100, 60)
        # Every input record emitted once processed: wait for the 160th output.
        kafka.wait_for(lambda: len(kafka.read_all(topic + "-out", range(3))) >= 160, 60, "160 outputs")
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, err[-2000:]
    result: dict[str, Any] = json.loads(out)
    assert result["written"] is True
    assert result["checkpoint"] == 1
    assert result["processed"] == 160
    assert result["followed"]["seconds"] > 0
    assert dumped_balances(url) == recompute(kafka, topic)


def test_a_module_or_object_that_is_not_a_processor_is_one_typed_line(
    kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    """Every mistake in MODULE:OBJECT is one typed line naming it, exit 1, no traceback; so is
    --follow on the spark engine (which runs history only); --help teaches with an example module."""
    app = write_app(tmp_path / "proj", topic_name, bootstrap=kafka.bootstrap, checkpoints=None)
    (app / "broken_app.py").write_text("raise RuntimeError('no config file')\n")
    cases = {
        "missing_app:proc": "Error: ConfigError: cannot import module 'missing_app': no such module here "
        "(run from the directory that holds it, or put that directory on PYTHONPATH)",
        "broken_app:proc": "Error: ConfigError: module 'broken_app' failed to import: RuntimeError: no "
        "config file",
        "tally_app:not_a_processor": "Error: ConfigError: tally_app:not_a_processor is a int, not a "
        "statesnap Processor",
        "tally_app:nope": "Error: ConfigError: module 'tally_app' has no attribute 'nope' (its "
        "processors: proc)",
        "tally_app": "Error: ConfigError: 'tally_app' is not MODULE:OBJECT: name the module and the "
        "Processor in it, as in app:proc",
    }
    for spec, line in cases.items():
        result = run_in(app, "run", spec, timeout=60)
        assert result.returncode == 1, (spec, result.stderr)
        assert result.stderr.strip().splitlines()[-1] == line
        assert "Traceback" not in result.stderr
    ckpt = str(tmp_path / "ckpt")
    refused = run_in(app, "run", "tally_app:proc", "-c", ckpt, "--follow", "--engine", "spark", timeout=60)
    assert refused.returncode == 1
    assert "EngineOptionError: --follow cannot be used with --engine spark" in refused.stderr
    unfollowed = run_in(
        app, "run", "tally_app:proc", "-c", ckpt, "--group", "g", "--exactly-once", timeout=60
    )
    assert unfollowed.returncode == 2  # a usage error, named by its options
    assert unfollowed.stderr.strip().splitlines()[-1] == (
        "Error: --group needs --follow: a group member holds only the partitions it is assigned, so a "
        "one-shot run could not checkpoint every partition"
    )
    help_text = ok(run_in(app, "run", "--help", timeout=60))
    assert "statesnap run tally:proc --follow" in help_text
    assert "@proc.handler" in help_text


@pytest.mark.long  # a Spark session and job (~80 s here); the CLI's spark refusals run by default
@pytest.mark.skipif(
    not (spark_available() and spark_processor_available()),
    reason="needs pyspark, Java and bootstrap_processor",
)
def test_spark_engine_runs_the_history_and_python_resumes(
    kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    """``--engine spark`` runs the handler over the history on Spark and commits the checkpoint a
    python run then resumes from (the tail only); both equal a plain consumer's recomputation."""
    topic = kafka.create_topic(topic_name, 3)
    kafka.create_topic(topic + "-out", 3)
    url = str(tmp_path / "ckpt")
    app = write_app(tmp_path / "proj", topic, bootstrap=kafka.bootstrap, checkpoints=url)
    payments(kafka, topic, 0, 200)
    on_spark = ok(run_in(app, "run", "tally_app:proc", "--engine", "spark", "--json", timeout=300))
    assert set(on_spark) >= MATERIALIZE_KEYS | PROCESSOR_KEYS, on_spark
    assert on_spark["engine"] == "spark"
    assert on_spark["checkpoint"] == 1
    assert on_spark["processed"] == 200
    # The same keys as a Python run's: the user's stores, without statesnap's bookkeeping store.
    assert (on_spark["stores"], on_spark["keys"]) == ({"balances": 13}, 13)
    assert dumped_balances(url) == recompute(kafka, topic)
    payments(kafka, topic, 200, 30)
    resumed = ok(run_in(app, "run", "tally_app:proc", "--engine", "python", "--json"))
    assert resumed["restore"]["checkpoint"] == 1
    assert resumed["processed"] == 30
    assert dumped_balances(url) == recompute(kafka, topic)
