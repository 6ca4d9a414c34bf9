"""Checkpoints during catch-up: a processor killed (SIGKILL) again and again during one long
catch-up makes progress from kill to kill, because it checkpoints at the checkpoint interval while
it catches up, not only once caught up; the run that finally finishes equals a plain consumer's
recomputation. ``statesnap run`` in fresh processes of the venv's interpreter. Proven on the
suite's broker (Apache Kafka; Tansu too): nothing here depends on broker behaviour beyond ordered
partitions and partition EOF."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from integration.cli_runner import STATESNAP
from integration.conftest import KafkaTool
from integration.processor.test_cli_run import dumped_balances, payments, recompute
from statesnap.blob import open_blob_store
from statesnap.checkpoint import CheckpointRepository
from statesnap.checkpoint.discovery import locate_table
from statesnap.errors import TableNotFoundError

#: 0.1 ms a record: some 10 s of catch-up in batches of up to 10,000 records (a commit point
#: follows each batch), so three kills each land within it.
RECORDS = 100_000


def slow_app(where: Path, topic: str, bootstrap: str, url: str) -> None:
    """The README's tally, slowed to 0.1 ms a record: a catch-up to kill in the middle of."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "slow_tally.py").write_text(
        textwrap.dedent(
            f"""
            import time
            from statesnap import CheckpointOptions, Processor

            proc = Processor("tally", inputs=[{topic!r}], bootstrap_servers={bootstrap!r},
                             checkpoints=CheckpointOptions({url!r}, interval="1s"),
                             stores=["balances"], value_serde="json", timeout=5)

            @proc.handler
            def on_payment(record, ctx):
                time.sleep(0.0001)
                balances = ctx.stores["balances"]
                balances[record.key] = balances.get(record.key, 0) + record.value["amount"]
            """
        )
    )


def checkpointed(url: str) -> tuple[int, int]:
    """(generation, records its offsets cover) of the newest checkpoint; (0, 0) with none."""
    try:
        repo: CheckpointRepository = locate_table(open_blob_store(url), "tally")
    except TableNotFoundError:
        return 0, 0
    latest = repo.latest()
    return (0, 0) if latest is None else (latest.generation, sum(latest.offsets.values()))


def test_repeated_kills_during_one_catch_up_make_progress(
    kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    kafka.create_topic(topic_name, 3)
    payments(kafka, topic_name, 0, RECORDS)
    url = str(tmp_path / "ckpt")
    app = tmp_path / "app"
    slow_app(app, topic_name, kafka.bootstrap, url)
    env = {**os.environ, "PYTHONPATH": str(app)}
    covered = [0]
    for kill in range(3):
        child = subprocess.Popen(
            [*STATESNAP, "run", "slow_tally:proc", "--quiet"],
            cwd=app,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 90
            while checkpointed(url)[1] <= covered[-1]:
                if child.poll() is not None:
                    assert checkpointed(url)[1] > covered[-1], f"run {kill} ended: {child.returncode}"
                    break
                assert time.monotonic() < deadline, f"run {kill}: no checkpoint during the catch-up"
                time.sleep(0.05)
            child.send_signal(signal.SIGKILL)
            child.wait(30)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(30)
        covered.append(checkpointed(url)[1])
    assert covered == sorted(covered)
    assert len(set(covered)) == len(covered), covered  # every run got further
    assert covered[-1] < RECORDS, covered  # each was killed within the catch-up

    done = subprocess.run(
        [*STATESNAP, "run", "slow_tally:proc", "--quiet"],
        cwd=app,
        env={**env, "PYSPARK_PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert checkpointed(url)[1] == RECORDS
    assert dumped_balances(url) == recompute(kafka, topic_name)
