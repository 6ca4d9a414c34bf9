"""Spark's Python workers: where they run, and proof that they can import statesnap.

Spark starts its Python workers with ``PYSPARK_PYTHON`` (else ``python3`` on the PATH), which is
often not the interpreter statesnap is installed in: jobs then die deep inside a task with
``ModuleNotFoundError``. :func:`check_workers` proves (with one tiny job, once per application)
that the workers of any session — local or a cluster — can import statesnap, or fails with one
line saying what to set. It is its own module because both the session factory and
:func:`~statesnap.spark.registration.register` run it.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from typing import Any

from statesnap.errors import ConfigError

__all__ = ["check_workers", "is_local"]

#: The Spark applications whose workers were proven to import statesnap.
_checked: set[str] = set()


def is_local(spark: Any) -> bool:
    """Whether *spark*'s executors run on this machine (and share its environment)."""
    return str(spark.sparkContext.master).startswith("local")


def check_workers(spark: Any) -> None:
    """Run one tiny task that imports statesnap; a worker that cannot fails here, in one line,
    instead of deep inside the first real job. Checked once per Spark application; a Spark
    Connect session has no SparkContext to run it with (its server owns the workers) and is not
    checked."""
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        return
    sc = spark.sparkContext
    app = str(sc.applicationId)
    if app in _checked:
        return

    def probe(_: Any) -> str:
        try:
            import pyarrow  # noqa: F401

            import statesnap

            for name in statesnap.__all__:  # loaded on first use: load them all, as a job would
                getattr(statesnap, name)
        except ImportError as e:  # answered, not raised: Spark would retry a failed task 4 times
            return f"ImportError: {e}"
        return statesnap.__version__

    try:
        (answer,) = sc.parallelize([0], 1).map(probe).collect()
        text = str(answer)
    except Exception as e:  # the worker died before the probe ran: unpickling, or Spark's own check
        text = str(e)
        if not any(sign in text for sign in _WORKER_PROBLEMS):
            raise
    else:
        if not text.startswith("ImportError"):
            _checked.add(app)
            return
    python = str(getattr(sc, "pythonExec", None) or os.environ.get("PYSPARK_PYTHON") or "python3")
    if is_local(spark) and os.sep not in python and shutil.which(python):
        python = f"{python} = {shutil.which(python)}"  # which python3 the PATH picked
    raise ConfigError(_workers_problem(text, python, local=is_local(spark))) from None


#: Spark's error class when the workers' Python is another minor version than the driver's.
_VERSION_MISMATCH = "PYTHON_VERSION_MISMATCH"
#: What Spark says when the workers' Python does not start: a path that is not there, or an
#: interpreter that exits at once (a pyenv shim of a version not selected, a broken venv).
_NOT_RUNNABLE = "Cannot run program"
_NO_START = "Error from python worker:"
_WORKER_PROBLEMS = ("ModuleNotFoundError", "ImportError", _VERSION_MISMATCH, _NOT_RUNNABLE, _NO_START)


def _workers_problem(text: str, python: str, *, local: bool) -> str:
    """One line: what the workers lack and the setting that fixes it for this kind of master.

    Spark names the workers' interpreter ``PYSPARK_PYTHON`` (else ``python3`` from ``PATH``, which
    outside an activated venv is rarely the driver's); a session already running keeps the one it
    started with, so the fix is for the next run.
    """
    missing = re.search(r"(?:ModuleNotFound|Import)Error: (.+)", text)
    if _VERSION_MISMATCH in text:
        found = re.search(r"different version: ([\d.]+) than that in driver: ([\d.]+)", text)
        versions = f"Python {found.group(1)}, the driver's {found.group(2)}" if found else "another Python"
        what = f"run {versions} (PySpark needs the same minor version)"
    elif missing is not None:  # also when the daemon module (statesnap.spark.daemon) is missing
        said = missing.group(1).strip()
        if said.count(")") > said.count("("):  # "(ModuleNotFoundError: No module named 'x')"
            said = said[: said.rindex(")")]
        what = f"cannot run statesnap ({said[:120]})"
    elif _NOT_RUNNABLE in text:
        found = re.search(r'Cannot run program "[^"]*": error=\d+, (.+)', text)
        what = f"cannot be started ({found.group(1).strip() if found else 'no such program'})"
    else:
        said_lines = [ln.strip() for ln in text.split(_NO_START, 1)[-1].splitlines() if ln.strip()]
        what = f"exited at start ({said_lines[0][:120] if said_lines else 'no output'})"
    if local:
        fix = (
            f"run the job from the activated venv, or set PYSPARK_PYTHON={sys.executable} before the "
            "session starts (spark-submit: --conf spark.pyspark.python=...)"
        )
    else:
        fix = (
            "ship statesnap and its dependencies to the executors and point spark.pyspark.python "
            "(or PYSPARK_PYTHON) at that interpreter: a cluster image, or spark-submit --archives of a "
            "packed venv (docs/spark-cluster.md)"
        )
    return f"Spark's Python workers ({python}) {what}: {fix}"
