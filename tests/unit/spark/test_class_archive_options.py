"""Where the Spark driver's class archive lives and the options that use it (no JVM here: the
archive's making and use by real drivers are in tests/integration/spark/test_class_archive.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from statesnap.errors import ClassArchiveError
from statesnap.spark import class_archive
from statesnap.spark.class_archive import ARCHIVE_ENV, archive_path, driver_options, without_archive


def test_the_archive_is_keyed_by_spark_under_the_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import pyspark

    monkeypatch.delenv(ARCHIVE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = archive_path()
    assert path is not None
    assert path.parent == tmp_path / "statesnap" / "spark-classes"
    assert path.name.startswith(f"spark-{pyspark.__version__}-")
    assert archive_path() == path  # the same Java and Spark: the same archive


@pytest.mark.parametrize("off", ["off", "0", "OFF"])
def test_off_turns_it_off(monkeypatch: pytest.MonkeyPatch, off: str) -> None:
    monkeypatch.setenv(ARCHIVE_ENV, off)
    assert archive_path() is None
    assert driver_options() == ""


def test_no_java_no_archive(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ARCHIVE_ENV, raising=False)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    assert archive_path() is None
    with pytest.raises(ClassArchiveError, match="no java"):
        class_archive.create()


def test_options_name_the_archive_only_while_it_is_there_whole(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    archive = tmp_path / "classes.jsa"
    record = tmp_path / "classes.jsa.bytes"
    monkeypatch.setenv(ARCHIVE_ENV, str(archive))
    assert driver_options() == ""
    archive.write_bytes(b"0123456789")
    assert driver_options() == "", "an archive create() did not record was used"
    assert archive.exists(), "an archive statesnap did not record was removed"
    record.write_text("10\n")
    options = driver_options()
    assert f"-XX:SharedArchiveFile={archive}" in options
    assert "-Xlog:cds=off" in options, "a mismatched archive would print into a command's output"
    assert f"-XX:ErrorFile={tmp_path}/" in options, "a JVM crash log would land in the user's directory"
    user = f"-Dlog4j2.configurationFile=x {options} -Xmx1g"
    assert without_archive(user) == "-Dlog4j2.configurationFile=x -Xmx1g"
    assert archive.exists()
    class_archive.discard("was damaged")
    assert not archive.exists()
    assert not record.exists()
    class_archive.discard("was damaged")  # gone already: nothing to do


def test_a_truncated_archive_is_removed_not_used(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    archive = tmp_path / "classes.jsa"
    monkeypatch.setenv(ARCHIVE_ENV, str(archive))
    archive.write_bytes(b"01234")
    (tmp_path / "classes.jsa.bytes").write_text("10\n")
    assert driver_options() == ""
    assert list(tmp_path.iterdir()) == []


def test_a_killed_makings_leftovers_are_removed_once_stale(tmp_path: Path) -> None:
    """A create() killed mid-way leaves its staging file (never renamed into place); the next one
    removes those older than any making can take, and not one another process is writing now."""
    target = tmp_path / "classes.jsa"
    stale, fresh = tmp_path / "classes.jsa.0a1b.tmp", tmp_path / "classes.jsa.2c3d.tmp"
    stale.write_bytes(b"half an archive")
    fresh.write_bytes(b"being written")
    old = time.time() - 3 * class_archive.CREATE_TIMEOUT
    os.utime(stale, (old, old))
    with pytest.raises(ClassArchiveError, match="took over"):
        class_archive.create(target, timeout=0.01)  # the making itself is cut short at once
    assert not stale.exists()
    assert fresh.exists()
    assert not target.exists()
