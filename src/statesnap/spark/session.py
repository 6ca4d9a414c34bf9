"""A SparkSession that can run statesnap's Python code on its workers, quietly.

Spark starts its Python workers with ``PYSPARK_PYTHON`` (else ``python3`` on the PATH), which is
often not the interpreter statesnap is installed in: jobs then die deep inside a task with
``ModuleNotFoundError``. :func:`spark_session` points local workers at this interpreter, binds
local mode to loopback and keeps Spark's own logs below WARN out of the terminal, and registers
statesnap's data sources (:func:`~statesnap.spark.registration.register`, which proves first that
the workers can import statesnap: :mod:`statesnap.spark.workers`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Mapping
from importlib import resources
from typing import Any

from statesnap.spark.jvm_stderr import without_jvm_notices
from statesnap.spark.registration import register

__all__ = ["MASTER_ENV", "default_master", "spark_session"]

log = logging.getLogger(__name__)

#: ``local[*]`` by default; point it at a cluster with STATESNAP_SPARK_MASTER.
MASTER_ENV = "STATESNAP_SPARK_MASTER"


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
    from pyspark import SparkContext

    # Imported here: `python -m statesnap.spark.class_archive` must find it not yet imported.
    from statesnap.spark.class_archive import discard, driver_options, without_archive

    launching = SparkContext._gateway is None and not os.environ.get("PYSPARK_GATEWAY_PORT")
    archive = driver_options() if launching else ""
    if archive:  # the driver this call launches maps its classes (see statesnap.spark.class_archive)
        extra = settings.get("spark.driver.extraJavaOptions", "")
        settings["spark.driver.extraJavaOptions"] = f"{extra} {archive}".strip()
    for key, value in settings.items():
        builder = builder.config(key, value)
    with without_jvm_notices() if launching and not verbose else contextlib.nullcontext():
        try:
            spark = builder.getOrCreate()
        except Exception:
            if not archive or SparkContext._gateway is not None:
                raise
            options = without_archive(settings["spark.driver.extraJavaOptions"])
            spark = builder.config("spark.driver.extraJavaOptions", options).getOrCreate()
            discard("did not start a driver")  # one without it started: the archive was what failed
    if not verbose:
        spark.sparkContext.setLogLevel("ERROR")
    if "spark.sql.shuffle.partitions" not in (conf or {}) and not local:
        # On a cluster, shuffles follow the cluster's cores, not the driver's.
        cores = int(spark.sparkContext.defaultParallelism)
        spark.conf.set("spark.sql.shuffle.partitions", str(max(2, cores)))
    log.info("Spark %s, master %s", spark.version, spark.sparkContext.master)
    register(spark)  # checks the workers too
    return spark
