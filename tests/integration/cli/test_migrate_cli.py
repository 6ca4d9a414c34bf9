"""``statesnap checkpoints migrate``, ``materialize --from-generation`` and ``run --from-generation``
as a user runs them: fresh processes of the venv's interpreter, started in a directory holding the user's
module. Proven on Apache Kafka (the suite's broker) and on Tansu (the dev broker): nothing here depends on
broker behaviour beyond ordered partitions and partition EOF (#20)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from integration.cli_runner import STATESNAP, ok
from integration.conftest import KafkaTool
from statesnap.blob import open_blob_store
from statesnap.checkpoint.discovery import locate_table
from statesnap.snapshot.api import SnapshotApi

pytestmark = pytest.mark.integration

PARTITIONS = 3


def run_in(where: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*STATESNAP, *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        cwd=where,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )


def one_line_error(result: subprocess.CompletedProcess[str], *words: str, code: int = 1) -> str:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for word in words:
        assert word in lines[0], result.stderr
    return lines[0]


def records(start: int, n: int) -> list[tuple[int, bytes, bytes | None]]:
    return [
        (i % PARTITIONS, b"k%02d" % (i % 30), json.dumps({"a": i, "b": "x" * (i % 5)}).encode())
        for i in range(start, start + n)
    ]


MIGRATION_MODULE = """
import json

def v1_to_v2(key, value):
    obj = json.loads(value)
    if obj["a"] % 4 == 0:
        return None
    return key, json.dumps({"a": obj["a"]}).encode()

MIGRATIONS = {1: v1_to_v2}
"""


def migrate(where: Path, url: str, topic: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_in(where, "checkpoints", "migrate", url, "--table", topic, *args)


def materialized(kafka: KafkaTool, topic: str, where: Path) -> tuple[str, list[str]]:
    """A table of *topic* materialized once (generation 1) and the user's migration module."""
    (where / "mig.py").write_text(MIGRATION_MODULE)
    url = str(where / "ckpt")
    kafka.produce(topic, records(0, 90))
    base = ["-b", kafka.bootstrap, "-t", topic, "-c", url, "--engine", "python", "--json", "-q"]
    assert ok(run_in(where, "materialize", *base))["checkpoint"] == 1
    return url, base


# The README's migration test runs migrate (dry run and real) and materialize --from-generation as
# subprocesses by default; this one adds the JSON counts, a {version: fn} chain and the refusal.
@pytest.mark.long
def test_migrate_then_start_from_on_the_command_line(
    kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    topic = kafka.create_topic(topic_name, PARTITIONS)
    url, base = materialized(kafka, topic, tmp_path)
    repo = locate_table(open_blob_store(url), topic)

    dry = ok(migrate(tmp_path, url, topic, "--function", "mig:v1_to_v2", "--dry-run", "--json"))
    truth = kafka.truth(kafka.read_all(topic, range(PARTITIONS)))
    dropped = sum(1 for v in truth.values() if json.loads(v)["a"] % 4 == 0)
    assert (dry["generation"], dry["dropped"]) == (None, dropped)
    assert dry["kept"] + dry["changed"] == len(truth) - dropped
    assert dry["sample"]
    assert repo.generations() == [1]  # a dry run writes nothing

    done = ok(migrate(tmp_path, url, topic, "--function", "mig:MIGRATIONS", "--to-version", "2", "--json"))
    assert (done["source_generation"], done["generation"], done["to_version"]) == (1, 2, 2)
    assert repo.read_manifest(2).state_version(topic) == 2
    api = SnapshotApi.for_repo(repo, topic)
    try:
        assert api.get(1).pinned
    finally:
        api.close()

    # materialize (state version 1) is refused the newest generation (version 2) and starts from 1.
    kafka.produce(topic, records(90, 40))
    one_line_error(run_in(tmp_path, "materialize", *base), "StateVersionError", "version 2", "version 1")
    again = ok(run_in(tmp_path, "materialize", *base, "--from-generation", "1"))
    assert (again["restore"]["checkpoint"], again["checkpoint"]) == (1, 3)
    assert again["keys"] == len(kafka.truth(kafka.read_all(topic, range(PARTITIONS))))
    assert set(repo.generations()) == {1, 2, 3}  # later generations stay


@pytest.mark.long
def test_migrate_refusals_dry_run_text_spark_and_the_generation_alias(
    kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    topic = kafka.create_topic(topic_name, PARTITIONS)
    url, base = materialized(kafka, topic, tmp_path)
    text = ok(migrate(tmp_path, url, topic, "--function", "mig:v1_to_v2", "--dry-run"))
    assert "dropped" in text
    assert "->" in text
    # --engine spark: mig.py is importable only from this directory, so it reaches the workers by value.
    on_python = ok(migrate(tmp_path, url, topic, "--function", "mig:v1_to_v2", "--dry-run", "--json"))
    on_spark = ok(
        migrate(
            tmp_path, url, topic, "--function", "mig:v1_to_v2", "--dry-run", "--json", "--engine", "spark"
        )
    )
    assert on_spark == {**on_python, "seconds": on_spark["seconds"]}
    one_line_error(
        migrate(tmp_path, url, topic, "--function", "mig:v1_to_v2", "--from-version", "3"),
        "StateVersionError",
        "state version 1, not 3",
    )
    one_line_error(migrate(tmp_path, url, topic, "--function", "mig:nope"), "ConfigError", "mig:nope")
    alias = ok(run_in(tmp_path, "materialize", *base, "--generation", "1"))  # the older name
    assert alias["restore"]["checkpoint"] == 1


def test_run_from_generation_with_exactly_once_needs_yes(kafka: KafkaTool, tmp_path: Path) -> None:
    """Refused before any work: no broker is contacted (the module only builds the processor);
    with --yes the run goes ahead (as far as the missing input topic, on Tansu)."""
    (tmp_path / "eo_app.py").write_text(
        textwrap.dedent(
            f"""
            from statesnap import ProcessingOptions, Processor

            proc = Processor("eo", inputs=["in"], bootstrap_servers={kafka.bootstrap!r},
                             checkpoints={str(tmp_path / "ckpt")!r}, stores=["s"],
                             processing=ProcessingOptions(exactly_once=True))

            @proc.handler
            def handle(record, ctx):
                ctx.emit("out", record.key, record.value)
            """
        )
    )
    one_line_error(
        run_in(tmp_path, "run", "eo_app:proc", "--from-generation", "1"),
        "ConfigError",
        "--yes",
        "emitted again",
    )
    # With --yes it goes ahead: here as far as the missing input topic (after the engine line:
    # an exactly-once processor runs in python without asking the broker for its backlog).
    ahead = run_in(tmp_path, "run", "eo_app:proc", "--from-generation", "1", "--yes", "--timeout", "5s")
    assert ahead.returncode == 1, ahead.stderr
    errors = [line for line in ahead.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, ahead.stderr
    assert "TopicNotFoundError" in errors[0], ahead.stderr
