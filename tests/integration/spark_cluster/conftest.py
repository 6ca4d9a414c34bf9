"""A Spark standalone cluster (one master, two workers of one core) on 127.0.0.1 for the session.

The cluster runs as separate JVMs started from the pyspark installation (see ``standalone.py``);
the tests drive it from *separate driver processes* (``cluster_driver.py``, ``spark-submit``), as
users do — never from a SparkSession inside pytest (the shared ``local[2]`` session of
``tests/integration/spark`` may already own this process's only SparkContext).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from integration.spark_cluster.standalone import ClusterError, StandaloneCluster, java_available


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """Master + 2 workers (1 core, 1 GiB each), work dirs and logs under a session tmp dir."""
    if not java_available():
        pytest.skip("a Spark standalone cluster needs a Java runtime (java on PATH or JAVA_HOME)")
    root: Path = tmp_path_factory.mktemp("spark-cluster")
    cluster = StandaloneCluster(root, workers=2, cores=1, memory="1g")
    try:
        cluster.start()
    except ClusterError as e:
        pytest.fail(f"standalone cluster did not start: {e}")
    yield cluster
    cluster.stop()
