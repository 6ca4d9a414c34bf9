"""The child :func:`statesnap.spark.class_archive.create` runs to make the archive: a Spark session
whose JVM dumps the classes it loaded as it exits. A module of its own because it starts a session,
and every session imports :mod:`statesnap.spark.class_archive`: the two would import each other.

    python -m statesnap.spark.class_archive_training STAGING_PATH
"""

from __future__ import annotations

import sys

from pyspark import SparkContext

from statesnap.spark.class_archive import CREATE_TIMEOUT
from statesnap.spark.session import spark_session

__all__ = ["train"]


def train(staging: str) -> None:
    """The work whose classes go into the archive at *staging*: a session, its workers' check, a
    shuffle, Arrow both ways. Waits for the JVM to exit: it writes the archive as it does."""
    dump = f"-XX:ArchiveClassesAtExit={staging}"
    spark = spark_session("local[2]", conf={"spark.driver.extraJavaOptions": dump})
    frame = spark.range(1000).selectExpr("id % 7 AS k", "CAST(id AS STRING) AS v")
    frame.groupBy("k").count().collect()
    spark.createDataFrame(frame.toArrow()).filter("k > 2").toArrow()
    spark.sql("SELECT 1").collect()
    gateway = SparkContext._gateway
    spark.stop()
    proc = getattr(gateway, "proc", None)
    if proc is not None:
        if proc.stdin is not None:
            proc.stdin.close()  # the gateway exits when its stdin closes
        proc.wait(CREATE_TIMEOUT)


if __name__ == "__main__":
    train(sys.argv[1])
