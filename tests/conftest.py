"""Session-wide real services: one Tansu broker, one Apache Kafka broker and one moto S3 server,
each started on first use (a session that asks for no Apache Kafka test starts no JVM).

They stop at the session's end, and on Linux also when the test run is killed without a teardown
(a timeout's SIGKILL): the dev stack asks the kernel to signal them when their parent dies
(``statesnap.devstack.orphans``; proved by ``test_services_die_with_a_killed_test_run``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from statesnap.devstack import ApacheKafkaBroker, EmbeddedBroker, EmbeddedS3
from statesnap.devstack.apache import apache_kafka_missing


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker]:
    """A real Kafka-protocol broker (Tansu, in-memory storage) on loopback."""
    b = EmbeddedBroker()
    b.start()
    yield b
    b.stop()


@pytest.fixture(scope="session")
def apache_kafka() -> Iterator[ApacheKafkaBroker]:
    """A real Apache Kafka broker (single-node KRaft on loopback; settings that let compaction and
    retention act within seconds). Skipped, with what to install, only where Java or the jars
    ``bash scripts/setup.sh`` fetches are missing."""
    missing = apache_kafka_missing()
    if missing is not None:
        pytest.skip(missing)
    b = ApacheKafkaBroker()
    b.start()
    yield b
    b.stop()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[EmbeddedS3]:
    """A real S3 HTTP endpoint (moto server) on loopback."""
    s = EmbeddedS3()
    s.start()
    yield s
    s.stop()


@pytest.fixture
def bootstrap(broker: EmbeddedBroker) -> str:
    return broker.bootstrap_servers


@pytest.fixture
def topic_name() -> str:
    """A fresh topic name per test: the broker is shared by the whole session."""
    return f"t-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class S3Location:
    url: str
    bucket: str
    options: dict[str, str]


@pytest.fixture
def s3_location(s3_server: EmbeddedS3) -> S3Location:
    """A fresh bucket per test, with the options a client needs to reach the moto server."""
    bucket = s3_server.create_bucket(f"b-{uuid.uuid4().hex[:12]}")
    return S3Location(f"s3://{bucket}/checkpoints", bucket, s3_server.storage_options())


@pytest.fixture(params=["file", "s3"])
def checkpoint_location(request: pytest.FixtureRequest, tmp_path: object) -> S3Location:
    """Both blob stores, for tests that must hold on each (url + storage options)."""
    if request.param == "file":
        return S3Location(f"file://{tmp_path}/checkpoints", "", {})
    loc: S3Location = request.getfixturevalue("s3_location")
    return loc
