"""statesnap on Spark: a Kafka source, bootstrap, streaming materialization and read-back.

The only package that imports pyspark. Everything here reads and writes the same checkpoint
format as :class:`statesnap.Table`, so a Spark job can build checkpoints a Python service boots
from, and the other way round::

    from statesnap.spark import bootstrap, read_table, register, spark_session

    spark = spark_session()              # workers checked to import statesnap; quiet; loopback
    register(spark)                      # (done by spark_session) statesnap-checkpoint & co.;
                                         # format("statesnap-kafka") works in any session
    manifest = bootstrap(spark, bootstrap_servers=..., topic="orders", table="orders",
                         checkpoints="s3://bucket/checkpoints")
    df = read_table(spark, "s3://bucket/checkpoints", "orders")
"""

from __future__ import annotations

from typing import Any

from statesnap.spark.bootstrap import bootstrap
from statesnap.spark.materialize import StreamMaterializer, materialize_stream
from statesnap.spark.options import KafkaSourceOptions, offsets_json, parse_options, source_options
from statesnap.spark.readback import CheckpointDataSource, count_keys, read_table
from statesnap.spark.session import check_workers, spark_session
from statesnap.spark.source import (
    RANGES_SOURCE_NAME,
    SOURCE_NAME,
    SPARK_SCHEMA,
    SPARK_SCHEMA_WITH_HEADERS,
    KafkaDataSource,
    KafkaRangesDataSource,
)

__all__ = [
    "RANGES_SOURCE_NAME",
    "SOURCE_NAME",
    "SPARK_SCHEMA",
    "SPARK_SCHEMA_WITH_HEADERS",
    "CheckpointDataSource",
    "KafkaDataSource",
    "KafkaRangesDataSource",
    "KafkaSourceOptions",
    "StreamMaterializer",
    "bootstrap",
    "check_workers",
    "count_keys",
    "materialize_stream",
    "offsets_json",
    "parse_options",
    "read_table",
    "register",
    "source_options",
    "spark_session",
]


def register(spark: Any) -> None:
    """Register ``statesnap-kafka``, ``statesnap-kafka-ranges`` and ``statesnap-checkpoint``
    with *spark*, so ``spark.read.format(...)`` finds them (idempotent).

    ``statesnap-kafka`` alone needs no call (PySpark finds it in :mod:`pyspark_statesnap`).
    The workers are checked first (:func:`check_workers`, once per application): Python workers
    that cannot import statesnap fail here in one line, not at every read with Spark's 17-line
    ``PYTHON_DATA_SOURCE_ERROR``. A source the session already has is left as it is: Spark logs
    a WARN line for every source registered over another."""
    check_workers(spark)
    for source in (KafkaDataSource, KafkaRangesDataSource, CheckpointDataSource):
        if not _has_source(spark, source.name()):
            spark.dataSource.register(source)


def _has_source(spark: Any, name: str) -> bool:
    """Whether *spark* already knows the Python data source *name* (found by PySpark's lookup
    of ``pyspark_*`` modules, or registered before)."""
    try:
        manager = spark._jsparkSession.sessionState().dataSourceManager()
        return bool(manager.dataSourceExists(name))
    except Exception:  # Spark Connect (no JVM in this process), or a Spark without the method
        return False
