"""The Spark driver's class archive on real Spark, each driver a fresh subprocess as a command
starts one: a driver maps the archive ``scripts/setup.sh`` made (CI's setup makes it; the
suite's Spark commands all start from it). In ``long`` mode: a damaged archive is removed and the
driver started without it, in one warning line, and its making (``python -m
statesnap.spark.class_archive``, a Spark job of its own, about 35 s; CI's setup runs it too)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from statesnap.spark.class_archive import ARCHIVE_ENV, archive_path, create

pytestmark = [pytest.mark.integration, pytest.mark.spark]

#: A driver as a command starts it; prints the JVM's own arguments.
DRIVER = """
from statesnap.spark.session import spark_session
spark = spark_session("local[1]")
jvm = spark.sparkContext._jvm
print("JVM-ARGS", " ".join(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()))
print("ROWS", spark.range(5).count())
spark.stop()
"""


def _driver(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", DRIVER],
        env={**os.environ, "PYSPARK_PYTHON": sys.executable, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The archive setup made, or one made here (a machine set up before there was one)."""
    made = archive_path()
    if made is not None and made.is_file():
        return made
    return create(tmp_path_factory.mktemp("class-archive") / "spark.jsa")


def test_a_driver_maps_the_archive(archive: Path, tmp_path: Path) -> None:
    """Real Spark: the driver a command launches is given the archive, and runs a job."""
    out = _driver({ARCHIVE_ENV: str(archive)}, tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"-XX:SharedArchiveFile={archive}" in out.stdout
    assert "ROWS 5" in out.stdout
    said = [ln for ln in (out.stdout + out.stderr).splitlines() if not ln.startswith("JVM-ARGS")]
    assert not [ln for ln in said if "cds" in ln], "the JVM spoke of the archive"


def _truncated(archive: Path, where: Path, *, recorded: int) -> Path:
    """The first MiB of *archive* at *where*, its size on record *recorded*."""
    where.parent.mkdir(parents=True, exist_ok=True)
    with archive.open("rb") as whole:
        where.write_bytes(whole.read(1 << 20))
    where.with_name(f"{where.name}.bytes").write_text(f"{recorded}\n")
    return where


@pytest.mark.long  # the size check itself: tests/unit/spark/test_class_archive_options.py
def test_a_truncated_archive_is_removed_not_given_to_a_driver(archive: Path, tmp_path: Path) -> None:
    """Real Spark: an archive cut short (its size is not the one recorded when it was made) would
    crash the JVM that maps it (SIGBUS); it is removed with one warning line instead, and the
    driver starts without it."""
    damaged = _truncated(archive, tmp_path / "cache" / "damaged.jsa", recorded=archive.stat().st_size)
    out = _driver({ARCHIVE_ENV: str(damaged)}, tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ROWS 5" in out.stdout
    assert "SharedArchiveFile" not in out.stdout.split("JVM-ARGS", 1)[1]
    assert list(damaged.parent.iterdir()) == []
    warned = [ln for ln in out.stderr.splitlines() if "class archive" in ln]
    assert len(warned) == 1, out.stderr[-2000:]
    assert str(damaged) in warned[0]


@pytest.mark.long
def test_an_archive_that_crashes_the_driver_is_removed_and_the_driver_started_without_it(
    archive: Path, tmp_path: Path
) -> None:
    """Real Spark: damage its record does not show (here: a record that agrees with the truncated
    file) crashes the JVM; the session starts a driver without the archive, then removes it with
    one warning line. The JVM's crash log goes beside the archive, not into the cwd."""
    damaged = _truncated(archive, tmp_path / "cache" / "damaged.jsa", recorded=1 << 20)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    out = _driver({ARCHIVE_ENV: str(damaged)}, cwd)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ROWS 5" in out.stdout
    assert "SharedArchiveFile" not in out.stdout.split("JVM-ARGS", 1)[1]
    assert not damaged.exists()
    warned = [ln for ln in out.stderr.splitlines() if "class archive" in ln]
    assert len(warned) == 1, out.stderr[-2000:]
    assert "did not start a driver" in warned[0]
    assert list(cwd.iterdir()) == [], "the crashed JVM left files in the working directory"


@pytest.mark.long
def test_making_the_archive(tmp_path: Path) -> None:
    """Real Spark: ``python -m statesnap.spark.class_archive --path`` makes it, prints where, and
    a driver maps it."""
    target = tmp_path / "made.jsa"
    made = subprocess.run(
        [sys.executable, "-m", "statesnap.spark.class_archive", "--path", str(target)],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert made.returncode == 0, made.stderr[-2000:]
    assert made.stdout.strip() == str(target)
    assert target.is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["made.jsa", "made.jsa.bytes"], "staging stayed"
    assert int((tmp_path / "made.jsa.bytes").read_text()) == target.stat().st_size
    out = _driver({ARCHIVE_ENV: str(target)}, tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ROWS 5" in out.stdout
