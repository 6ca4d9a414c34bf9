"""Fixtures of the fault-injection suite (issue 11): mode, ledger, Kafka tool, locations.

Two modes: *default* (CI, a few minutes on two cores) and *long* (more kills, every corruption on
S3 too, the Spark streaming kill), chosen by ``STATESNAP_FAULTS=long`` or ``--faults=long`` (the
option exists when pytest is pointed at tests/faults; the variable always works).

Session services come from tests/conftest.py and are never killed here: tests that kill a broker or
an S3 endpoint start their own. The suite's broker is Apache Kafka (the session's ``apache_kafka``),
the broker users run: every kill, corruption and race here is proven on it. Only a machine without
Java or the jars ``scripts/setup.sh`` fetches falls back to the embedded Tansu broker, and the run's
header says so.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from faults.harness import KafkaTool, Location, file_location, s3_location
from faults.ledger import (
    MODE_KEY,
    CaseLedger,
    pytest_runtest_makereport,
    pytest_sessionfinish,
    pytest_terminal_summary,
    session_ledger,
)
from statesnap.devstack import ApacheKafkaBroker, EmbeddedBroker, EmbeddedS3
from statesnap.devstack.apache import apache_kafka_missing

__all__ = ["pytest_runtest_makereport", "pytest_sessionfinish", "pytest_terminal_summary"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--faults",
        choices=("default", "long"),
        default=None,
        help="statesnap fault suite: 'long' runs more kills, S3 corruptions and the Spark kill "
        "(same as STATESNAP_FAULTS=long)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "faults: the fault-injection suite (tests/faults)")
    option = config.getoption("--faults", default=None)
    config.stash[MODE_KEY] = option or os.environ.get("STATESNAP_FAULTS", "default") or "default"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.faults)
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def mode(pytestconfig: pytest.Config) -> str:
    value = pytestconfig.stash[MODE_KEY]
    if value not in {"default", "long"}:
        raise pytest.UsageError(f"STATESNAP_FAULTS must be 'default' or 'long', not {value!r}")
    return value


@pytest.fixture(scope="session")
def long_mode(mode: str) -> bool:
    return mode == "long"


@pytest.fixture
def ledger(request: pytest.FixtureRequest) -> CaseLedger:
    return CaseLedger(session_ledger(request.config), request.node.nodeid)


def pytest_report_header(config: pytest.Config) -> str | None:
    missing = apache_kafka_missing()
    return None if missing is None else f"fault suite broker: Tansu ({missing})"


@pytest.fixture(scope="session")
def fault_broker(request: pytest.FixtureRequest) -> EmbeddedBroker | ApacheKafkaBroker:
    """Apache Kafka, else (no Java or jars) the embedded Tansu broker."""
    name = "apache_kafka" if apache_kafka_missing() is None else "broker"
    found: EmbeddedBroker | ApacheKafkaBroker = request.getfixturevalue(name)
    return found


@pytest.fixture
def bootstrap(fault_broker: EmbeddedBroker | ApacheKafkaBroker) -> str:
    return fault_broker.bootstrap_servers


@pytest.fixture(scope="session")
def kafka(fault_broker: EmbeddedBroker | ApacheKafkaBroker) -> Iterator[KafkaTool]:
    """Producer, admin and plain consumer on the suite's broker (as tests/integration has it)."""
    tool = KafkaTool(fault_broker.bootstrap_servers)
    yield tool
    tool.close()  # its clients are destroyed now, while their broker still answers


@pytest.fixture
def new_topic(kafka: KafkaTool) -> Any:
    def make(partitions: int, prefix: str = "fx") -> str:
        return kafka.create_topic(f"{prefix}-{uuid.uuid4().hex[:12]}", partitions)

    return make


@pytest.fixture
def new_location(tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    """A factory of fresh, empty checkpoint locations: ``new_location("file" | "s3")``."""
    count = iter(range(1000))

    def make(kind: str) -> Location:
        n = next(count)
        if kind == "file":
            return file_location(tmp_path / f"ckpt-{n}")
        s3: EmbeddedS3 = request.getfixturevalue("s3_server")
        bucket = s3.create_bucket(f"fx-{uuid.uuid4().hex[:12]}")
        return s3_location(s3, bucket)

    return make
