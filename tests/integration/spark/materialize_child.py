"""A materializer in its own driver process (own JVM), for the SIGKILL test.

python materialize_child.py BOOTSTRAP TOPIC CHECKPOINTS CHECKPOINT_LOCATION
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta


def main() -> None:
    bootstrap, topic, checkpoints, location = sys.argv[1:5]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from statesnap import CheckpointOptions
    from statesnap.spark import materialize_stream

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    m = materialize_stream(
        spark,
        bootstrap_servers=bootstrap,
        topic=topic,
        table="mat",
        checkpoints=CheckpointOptions(
            checkpoints, interval=timedelta(0), commit_interval=timedelta(seconds=0.2)
        ),
        checkpoint_location=location,
        max_offsets_per_trigger=300,
        compact_after=2,
    )
    m.query.awaitTermination()


if __name__ == "__main__":
    main()
