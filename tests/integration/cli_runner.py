"""Running ``statesnap`` as a user does — a subprocess of the installed CLI — and the README's
digest computed independently of statesnap, for the tests that compare the two."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from typing import Any

STATESNAP = [sys.executable, "-m", "statesnap.cli"]


def statesnap(
    *args: str,
    timeout: float = 240,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``statesnap ARGS`` (in *cwd*, for relative paths as a user types them); Spark's Python
    workers run this interpreter."""
    return subprocess.run(
        [*STATESNAP, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=cwd,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable, **(env or {})},
    )


def ok(result: subprocess.CompletedProcess[str]) -> Any:
    """The command's JSON output (or its text), after asserting it exited 0."""
    assert result.returncode == 0, (
        f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    )
    return json.loads(result.stdout) if result.stdout.strip().startswith(("{", "[")) else result.stdout


def digest(table: dict[bytes, bytes]) -> str:
    """The README's digest, computed here independently of statesnap."""
    h = hashlib.sha256()
    for key in sorted(table):
        value = table[key]
        h.update(struct.pack(">I", len(key)) + key + struct.pack(">I", len(value)) + value)
    return h.hexdigest()
