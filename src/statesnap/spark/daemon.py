"""Spark's Python daemon (``pyspark.daemon``) in a process group of its own, for local sessions.

A Ctrl-C in a terminal reaches the whole foreground process group: Spark's JVM ignores it, but
PySpark's workers restore Python's handler and die mid-task, so every interrupted job printed
pages of "Python worker exited unexpectedly" errors. The driver handles Ctrl-C instead (it
cancels the job, then stops), and the workers finish or are cancelled like any task.
``spark.python.daemon.module`` names this module (set by :func:`statesnap.spark.spark_session`).
"""

from __future__ import annotations

import os

from pyspark import daemon

if __name__ == "__main__":
    os.setpgid(0, 0)
    daemon.manager()
