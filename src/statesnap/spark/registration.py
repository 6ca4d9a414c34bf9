"""Making statesnap's data sources known to a SparkSession: ``register(spark)``.

Its own module, imported normally by the session factory and the read-back driver: it needs the
data sources (Kafka, checkpoint) and the workers' check, and they need nothing of it.
"""

from __future__ import annotations

from typing import Any

from statesnap.spark.checkpoint_source import CheckpointDataSource
from statesnap.spark.source import KafkaDataSource, KafkaRangesDataSource
from statesnap.spark.workers import check_workers

__all__ = ["register"]


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
