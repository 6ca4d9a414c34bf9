"""A SparkSession that can run statesnap's Python code on its workers, quietly.

Spark starts its Python workers with ``PYSPARK_PYTHON`` (else ``python3`` on the PATH), which is
often not the interpreter statesnap is installed in: jobs then die deep inside a task with
``ModuleNotFoundError``. :func:`spark_session` points local workers at this interpreter, binds
local mode to loopback and keeps Spark's own logs below WARN out of the terminal;
:func:`check_workers` proves (with one tiny job, once per application) that the workers of any
session — local or a cluster — can import statesnap, or fails with one line saying what to set.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import sys
from collections.abc import Mapping
from importlib import resources
from typing import Any

from statesnap.errors import ConfigError
from statesnap.spark.jvm_stderr import without_jvm_notices

log = logging.getLogger(__name__)

#: ``local[*]`` by default; point it at a cluster with STATESNAP_SPARK_MASTER.
MASTER_ENV = "STATESNAP_SPARK_MASTER"
_checked: set[str] = set()


def default_master() -> str:
    """``$STATESNAP_SPARK_MASTER``; under ``spark-submit`` the ``--master`` it was given; else
    ``local[*]``."""
    if os.environ.get(MASTER_ENV):
        return os.environ[MASTER_ENV]
    if os.environ.get("PYSPARK_GATEWAY_PORT"):  # launched by spark-submit: its conf rules
        from pyspark import SparkConf, SparkContext

        SparkContext._ensure_initialized()
        return str(SparkConf().get("spark.master", "local[*]"))
    return "local[*]"


def spark_session(
    master: str | None = None,
    *,
    app_name: str = "statesnap",
    conf: Mapping[str, str] | None = None,
    verbose: bool = False,
) -> Any:
    """A session (new, or the active one) with the statesnap sources registered and its Python
    workers checked. *conf* passes any Spark setting (``spark.executor.memory``, …); *verbose*
    keeps Spark's INFO logs."""
    from pyspark.sql import SparkSession

    from statesnap.spark import register

    master = master or default_master()
    local = master.startswith("local")
    settings = dict(conf or {})
    if settings.get("spark.pyspark.python"):  # PySpark reads the workers' Python from the environment
        os.environ["PYSPARK_PYTHON"] = settings["spark.pyspark.python"]
    if local:
        # Local workers must run this interpreter: it is the one with statesnap installed.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master)
    if not os.environ.get("PYSPARK_GATEWAY_PORT"):  # spark-submit's --name stays
        builder = builder.appName(app_name)
    builder = builder.config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
    if not verbose:
        quiet = resources.files("statesnap.spark").joinpath("log4j2-quiet.properties")
        extra = settings.get("spark.driver.extraJavaOptions", "")
        settings["spark.driver.extraJavaOptions"] = f"{extra} -Dlog4j2.configurationFile={quiet}".strip()
    if local:
        builder = builder.config("spark.driver.host", "127.0.0.1").config(
            "spark.driver.bindAddress", "127.0.0.1"
        )
    if local:  # workers out of the terminal's process group: Ctrl-C is the driver's to handle
        settings.setdefault("spark.python.daemon.module", "statesnap.spark.daemon")
    if "spark.sql.shuffle.partitions" not in settings and local:
        settings["spark.sql.shuffle.partitions"] = str(max(2, os.cpu_count() or 2))
    for key, value in settings.items():
        builder = builder.config(key, value)
    from pyspark import SparkContext

    launching = SparkContext._gateway is None and not os.environ.get("PYSPARK_GATEWAY_PORT")
    with without_jvm_notices() if launching and not verbose else contextlib.nullcontext():
        spark = builder.getOrCreate()
    if not verbose:
        spark.sparkContext.setLogLevel("ERROR")
    if "spark.sql.shuffle.partitions" not in (conf or {}) and not local:
        # On a cluster, shuffles follow the cluster's cores, not the driver's.
        cores = int(spark.sparkContext.defaultParallelism)
        spark.conf.set("spark.sql.shuffle.partitions", str(max(2, cores)))
    log.info("Spark %s, master %s", spark.version, spark.sparkContext.master)
    register(spark)  # checks the workers too
    return spark


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
