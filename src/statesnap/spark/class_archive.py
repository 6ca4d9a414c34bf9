"""A class-data-sharing archive of the Spark driver's JVM: Spark commands start seconds sooner.

A Spark driver loads some 10,000 classes before its first job, every time a command starts it
(``materialize --engine spark``, ``bootstrap``, a test's CLI run). Java's AppCDS maps them from
an archive made once instead: :func:`create` runs a short Spark job in a JVM that dumps the
classes it loaded when it exits (``-XX:ArchiveClassesAtExit``), and
:func:`~statesnap.spark.session.spark_session` passes ``-XX:SharedArchiveFile`` to every driver it
launches while the archive is there (``benchmarks/spark_startup.py`` measures the difference).

The archive is keyed by the Java executable and the Spark version, so an upgrade of either gets a
new one (an old archive that no longer matches is ignored by the JVM, silently). It is written
under a temporary name and renamed once its JVM exited cleanly, its size recorded beside it: a
truncated archive would crash the JVM (SIGBUS), so one whose size is not the recorded one is
removed instead of used (:func:`usable`), and one that fails to start a driver anyway, where a
driver without it starts, is removed too. ``scripts/setup.sh`` makes it;
``STATESNAP_SPARK_CLASS_ARCHIVE=off`` turns it off, or names the file to use instead of the one
under ``~/.cache/statesnap``.

Run ``python -m statesnap.spark.class_archive`` to make it (again).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from statesnap.errors import ClassArchiveError

__all__ = [
    "ARCHIVE_ENV",
    "archive_path",
    "create",
    "discard",
    "driver_options",
    "usable",
    "without_archive",
]

log = logging.getLogger(__name__)

ARCHIVE_ENV = "STATESNAP_SPARK_CLASS_ARCHIVE"
#: How long making the archive may take (a Spark session, one job, the JVM's dump).
CREATE_TIMEOUT = 300.0
#: Logging of the archive's use off: a mismatched archive must not print into a command's output.
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
#: The child that makes it (its own module: it starts a session, and sessions import this one).
_TRAINING = "statesnap.spark.class_archive_training"


def _java() -> Path | None:
    """The ``java`` Spark's launcher runs: ``$JAVA_HOME/bin/java``, else the PATH's."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not found or not os.path.exists(found):
        return None
    return Path(os.path.realpath(found))


def archive_path() -> Path | None:
    """Where this Java and Spark's archive is (or goes), or None when it is turned off or there
    is no Java to key it by."""
    setting = os.environ.get(ARCHIVE_ENV, "").strip()
    if setting.lower() in {"off", "0", "no", "false"}:
        return None
    if setting:
        return Path(setting).expanduser()
    java = _java()
    if java is None:
        return None
    import pyspark

    stat = java.stat()
    spark_home = os.environ.get("SPARK_HOME", os.path.dirname(pyspark.__file__))
    key = f"{java}:{stat.st_size}:{stat.st_mtime_ns}:{pyspark.__version__}:{os.path.realpath(spark_home)}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "statesnap" / "spark-classes" / f"spark-{pyspark.__version__}-{digest}.jsa"


def _record(path: Path) -> Path:
    """Beside the archive: its size as :func:`create` wrote it (a JVM maps a truncated archive
    past its end and dies of SIGBUS, so a size that differs means it is never given to one)."""
    return path.with_name(f"{path.name}.bytes")


def usable() -> Path | None:
    """The archive, if it is there whole; one that is not (its size is not the one recorded when
    it was made) is removed, with its record."""
    path = archive_path()
    if path is None or not path.is_file():
        return None
    try:
        recorded = int(_record(path).read_text().strip())
    except (OSError, ValueError):
        log.debug("the Spark class archive %s has no record of its size: not used", path)
        return None  # not made by create(): not ours to judge, nor to remove
    if recorded == path.stat().st_size:
        return path
    discard("is not the size it was made at")
    return None


def driver_options() -> str:
    """The driver JVM options that use the archive, or "" while there is none."""
    path = usable()
    if path is None:
        return ""
    # A JVM that crashes on it anyway logs beside it, not in the cwd.
    crash_log = path.parent / "hs_err_%p.log"
    return f"-XX:SharedArchiveFile={path} {_QUIET} -XX:ErrorFile={crash_log}"


def without_archive(options: str) -> str:
    """*options* without :func:`driver_options`."""
    ours = driver_options()
    return " ".join(options.replace(ours, "").split()) if ours else options


def discard(why: str) -> None:
    """Remove the archive (and its record): it is damaged; ``scripts/setup.sh`` makes it again."""
    path = archive_path()
    if path is None or not path.is_file():
        return
    log.warning("the Spark class archive %s %s; removed, Spark starts without it", path, why)
    for gone in (path, _record(path)):
        with contextlib.suppress(FileNotFoundError):
            gone.unlink()


def create(path: Path | None = None, *, timeout: float = CREATE_TIMEOUT) -> Path:
    """Make the archive at *path* (default :func:`archive_path`) and return where it is: a Spark
    session runs one job in a JVM that dumps its classes as it exits, under a temporary name
    renamed into place once that JVM exited cleanly."""
    target = path or archive_path()
    if target is None:
        raise ClassArchiveError(f"no Spark class archive to make: {ARCHIVE_ENV}=off, or no java found")
    target.parent.mkdir(parents=True, exist_ok=True)
    for left in target.parent.glob(f"{target.name}.*.tmp*"):  # of a create() killed mid-way
        with contextlib.suppress(OSError):
            if time.time() - left.stat().st_mtime > 2 * CREATE_TIMEOUT:
                left.unlink()
    staging = target.with_name(f"{target.name}.{uuid.uuid4().hex}.tmp")
    from statesnap.devstack.orphans import guarded  # here: every Spark session imports this module

    env = {**os.environ, ARCHIVE_ENV: "off"}  # a dump made while mapping another archive is refused
    started = time.monotonic()
    try:
        proc = subprocess.run(
            # SIGTERM when this process dies: its JVM exits with it (stdin closed), never renamed
            guarded([sys.executable, "-m", _TRAINING, str(staging)], signal.SIGTERM),
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        staging.unlink(missing_ok=True)
        raise ClassArchiveError(f"making the Spark class archive took over {timeout:.0f}s") from e
    if proc.returncode != 0 or not staging.is_file() or not staging.stat().st_size:
        staging.unlink(missing_ok=True)
        said = [ln for ln in (proc.stderr or "").splitlines() if ln.strip()]
        last = said[-1][:200] if said else "no output"
        raise ClassArchiveError(f"making the Spark class archive failed (exit {proc.returncode}): {last}")
    record = target.with_name(f"{staging.name}.bytes")
    record.write_text(f"{staging.stat().st_size}\n")
    os.replace(record, _record(target))  # the record first: an archive is never there without it
    os.replace(staging, target)
    log.info("Spark class archive %s made in %.1fs", target, time.monotonic() - started)
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m statesnap.spark.class_archive",
        description="Make the Spark driver's class archive, so Spark commands start sooner.",
    )
    default = f"${ARCHIVE_ENV}, else under ~/.cache/statesnap"
    parser.add_argument("--path", type=Path, help=f"where to write it (default: {default})")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        made = create(args.path)
    except ClassArchiveError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    print(made)
    return 0


if __name__ == "__main__":
    sys.exit(main())
