"""Tests in this directory run on a real Apache Kafka broker (the session's ``apache_kafka``).

``kafka`` and ``bootstrap`` are overridden here: the same :class:`KafkaTool` (producer to explicit
partitions, plain-consumer ground truth) and the same address fixture as the Tansu tests use,
bound to Apache Kafka, so a Tansu test module's cases can run here unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from integration.conftest import KafkaTool
from statesnap.devstack import ApacheKafkaBroker

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def kafka(apache_kafka: ApacheKafkaBroker) -> Iterator[KafkaTool]:
    tool = KafkaTool(apache_kafka.bootstrap_servers)
    yield tool
    tool.close()


@pytest.fixture
def bootstrap(apache_kafka: ApacheKafkaBroker) -> str:
    return apache_kafka.bootstrap_servers
