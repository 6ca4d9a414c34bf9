"""``spark.read.format("statesnap-kafka")`` in any SparkSession, without ``register(spark)``.

PySpark (4.0+) looks up Python data sources once per session, in a Python worker on the driver:
it imports every top-level module whose name starts with ``pyspark_`` and registers the
``DefaultSource`` it defines under that class's ``name()``
(``pyspark/sql/worker/lookup_data_sources.py``). One module gives one source, so this one gives
the Kafka source, the one a job swapped from ``format("kafka")`` names; ``statesnap-checkpoint``
and ``statesnap-kafka-ranges`` come with :func:`statesnap.spark.register`.

That worker runs Spark's Python (``PYSPARK_PYTHON``, else ``python3`` from ``PATH``): it finds
this module only when that interpreter is the one statesnap is installed in (an activated venv,
or ``PYSPARK_PYTHON`` set); docs/spark-kafka-source.md says so.
"""

from __future__ import annotations

from statesnap.spark.source import KafkaDataSource as DefaultSource

__all__ = ["DefaultSource"]
