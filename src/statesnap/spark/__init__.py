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

from statesnap.spark.bootstrap import bootstrap
from statesnap.spark.checkpoint_source import CheckpointDataSource
from statesnap.spark.materialize import StreamMaterializer, materialize_stream
from statesnap.spark.option_parsing import parse_options
from statesnap.spark.options import KafkaSourceOptions, offsets_json, source_options
from statesnap.spark.processor_bootstrap import CountPerKey, ProcessorBootstrapResult, bootstrap_processor
from statesnap.spark.readback import count_keys, read_table
from statesnap.spark.registration import register
from statesnap.spark.session import spark_session
from statesnap.spark.source import (
    RANGES_SOURCE_NAME,
    SOURCE_NAME,
    SPARK_SCHEMA,
    SPARK_SCHEMA_WITH_HEADERS,
    KafkaDataSource,
    KafkaRangesDataSource,
)
from statesnap.spark.workers import check_workers

__all__ = [
    "RANGES_SOURCE_NAME",
    "SOURCE_NAME",
    "SPARK_SCHEMA",
    "SPARK_SCHEMA_WITH_HEADERS",
    "CheckpointDataSource",
    "CountPerKey",
    "KafkaDataSource",
    "KafkaRangesDataSource",
    "KafkaSourceOptions",
    "ProcessorBootstrapResult",
    "StreamMaterializer",
    "bootstrap",
    "bootstrap_processor",
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
