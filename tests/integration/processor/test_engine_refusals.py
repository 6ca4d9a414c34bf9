"""``statesnap run --engine spark --exactly-once`` as a user runs it (a fresh process of the venv's
interpreter, in the directory holding the user's module): refused in one typed line, exit 1, before a
SparkSession starts or the cluster is asked anything (issue 34, item 5). Before the fix it ran the
history on Spark, printed "processed 2,000, emitted 0" and exited 0, and the python run resuming
from its checkpoint never emitted those outputs. No broker is involved: the refusal comes first.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

APP = """
from statesnap import Processor

proc = Processor("tally", inputs=["payments"], bootstrap_servers="127.0.0.1:1",
                 checkpoints={checkpoints!r}, stores=["balances"], value_serde="json", timeout=2)

@proc.handler
def on_payment(record, ctx):
    ctx.emit("payments-out", record.key, record.value)
"""


def run_in(where: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "statesnap.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=where,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )


def test_run_on_spark_refuses_exactly_once_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "tally_app.py").write_text(textwrap.dedent(APP.format(checkpoints=str(tmp_path / "ckpt"))))
    result = run_in(tmp_path, "run", "tally_app:proc", "--engine", "spark", "--exactly-once", "--quiet")
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(
        "Error: EngineOptionError: --exactly-once (ProcessingOptions(exactly_once=True)) cannot be "
        "used with --engine spark: a Spark run of a processor emits nothing"
    )
    assert line.endswith("use --engine python")
    assert not (tmp_path / "ckpt").exists()  # nothing was read or written
