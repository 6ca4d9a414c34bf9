"""The documentation site builds strictly, and the strict build is a gate: a broken link fails it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MKDOCS = [
    sys.executable,
    "-m",
    "mkdocs",
    "build",
    "--strict",
]  # not --quiet: it hides the warnings strict turns into a failure


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MKDOCS, "--site-dir", str(site)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    result = build(ROOT, tmp_path / "site")
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").read_text().count("statesnap run") > 1


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    for part in ("docs", "src", "scripts"):
        shutil.copytree(ROOT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    index = copy / "docs" / "index.md"
    index.write_text(index.read_text() + "\nSee [the missing page](tutorials/missing.md#nowhere).\n")
    result = build(copy, tmp_path / "site")
    assert result.returncode != 0
    assert "missing.md" in result.stderr
