"""Spark in a user's own program: workers that cannot import statesnap fail at once, in one line.

Proven with a real local Spark (a subprocess, as a user's script runs) whose Python workers are a
system interpreter without statesnap installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SCRIPT = """
import sys
from statesnap.errors import ConfigError
from statesnap.spark import spark_session
try:
    spark_session("local[1]")
except ConfigError as e:
    print("CONFIG-ERROR", e)
    sys.exit(3)
print("no error")
"""


def _python_without_statesnap() -> str | None:
    for candidate in ("/usr/bin/python3", shutil.which("python3.11"), shutil.which("python3")):
        if not candidate or Path(candidate).resolve() == Path(sys.executable).resolve():
            continue
        probe = subprocess.run([candidate, "-c", "import statesnap"], capture_output=True, check=False)
        if probe.returncode != 0:
            return candidate
    return None


# Long: spark_session() checks the workers through register(), whose one-line answer
# test_first_job.py::test_workers_without_statesnap_are_one_line_at_register proves by default.
@pytest.mark.long
def test_workers_without_statesnap_fail_with_one_line_naming_the_fix(tmp_path: Path) -> None:
    python = _python_without_statesnap()
    if python is None or shutil.which("java") is None:
        pytest.skip("needs Java and a Python interpreter without statesnap")
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env={**os.environ, "PYSPARK_PYTHON": python, "HOME": str(tmp_path)},
    )
    assert out.returncode == 3, out.stdout + out.stderr[-3000:]
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("CONFIG-ERROR")]
    assert "cannot run statesnap" in line
    assert f"PYSPARK_PYTHON={sys.executable}" in line
