"""Session-wide real services: one Tansu broker, one Apache Kafka broker and one moto S3 server,
each started on first use. Integration tests run on Apache Kafka (``kafka``/``bootstrap``; see
:func:`suite_broker_impl`), the quick-start tests on Tansu.

They stop at the session's end, and on Linux also when the test run is killed without a teardown
(a timeout's SIGKILL): the dev stack asks the kernel to signal them when their parent dies
(``statesnap.devstack.orphans``; proved by ``test_services_die_with_a_killed_test_run``).

Tests marked ``long`` are slow variants of a behaviour another default test already proves; the
default run deselects them (CI's time budget), ``make test-long`` / ``STATESNAP_LONG=1`` / ``--long``
runs them too, as does ``-m`` naming ``long`` or a node id naming the test."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from statesnap.devstack import ApacheKafkaBroker, EmbeddedBroker, EmbeddedS3
from statesnap.devstack.apache import apache_kafka_missing
from statesnap.devstack.security import SaslSslListener

#: Seconds per test file and directory, printed after the run (:mod:`suite_time`).
pytest_plugins = ["suite_time"]

LONG_ENV = "STATESNAP_LONG"
BROKER_ENV = "STATESNAP_TEST_BROKER"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--long",
        action="store_true",
        default=False,
        help=f"also run tests marked long (same as {LONG_ENV}=1)",
    )


def _long_wanted(config: pytest.Config) -> bool:
    """Read once at the test run's boundary: the option, the variable, or a -m expression that names
    ``long`` (then -m alone decides)."""
    env = os.environ.get(LONG_ENV, "").strip().lower()
    if env not in {"", "0", "1", "true", "false", "yes", "no"}:
        raise pytest.UsageError(f"{LONG_ENV} must be 1 or 0, not {env!r}")
    markexpr = str(config.getoption("markexpr", default="") or "")
    return bool(config.getoption("long", default=False)) or env in {"1", "true", "yes"} or "long" in markexpr


def _named(config: pytest.Config) -> list[str]:
    """Node ids given on the command line (``path::test``), relative to the rootdir as items name them."""
    out = []
    for arg in config.args:
        path, sep, rest = arg.partition("::")
        if sep:
            try:
                rel = Path(path).resolve().relative_to(config.rootpath).as_posix()
            except ValueError:
                continue
            out.append(f"{rel}::{rest}")
    return out


def pytest_configure(config: pytest.Config) -> None:
    """Spark drivers the tests launch map the class archive setup made, also those given a HOME
    of their own (``statesnap.spark.class_archive``; read once, at the run's boundary)."""
    try:
        from statesnap.spark.class_archive import ARCHIVE_ENV, archive_path
    except ImportError:  # no Spark extra: no Spark tests
        return
    archive = archive_path()
    if archive is not None and archive.is_file():
        os.environ.setdefault(ARCHIVE_ENV, str(archive))


def pytest_report_header(config: pytest.Config) -> list[str]:
    broker = f"integration suite broker: {suite_broker_impl()} ({BROKER_ENV})"
    if _long_wanted(config):
        return ["long tests: included", broker]
    return [f"long tests: deselected ({LONG_ENV}=1 or make test-long runs them)", broker]


#: Variants marked ``long`` here because their parameters come from a shared fixture (S3 through
#: ``checkpoint_location``): each is proven on file:// by default, and S3 by the fault suite's
#: S3 cases and the blob-store contract tests (suite budget).
LONG_VARIANTS = frozenset(
    {
        "tests/integration/test_snapshot_clone.py::test_clone_survives_gc_of_its_source_and_vice_versa[s3]",
        "tests/integration/test_sql.py::test_sql_counts_equal_dump_on_every_generation[s3]",
        "tests/integration/test_incremental_checkpoints.py::"
        "test_deltas_pile_up_into_a_new_base_and_gc_keeps_shared_files[s3]",
    }
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect ``long`` tests unless asked for; a test named by its node id always runs."""
    for item in items:
        if item.nodeid in LONG_VARIANTS:
            item.add_marker(pytest.mark.long)
    if _long_wanted(config):
        return
    named = _named(config)
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        explicit = any(item.nodeid == n or item.nodeid.startswith((f"{n}[", f"{n}::")) for n in named)
        (dropped if item.get_closest_marker("long") and not explicit else keep).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker]:
    """A real Kafka-protocol broker (Tansu, in-memory storage) on loopback."""
    b = EmbeddedBroker()
    b.start()
    yield b
    b.stop()


@pytest.fixture(scope="session")
def sasl_ssl_listener(tmp_path_factory: pytest.TempPathFactory) -> SaslSslListener:
    """The suite broker's second listener, ``SASL_SSL`` (SCRAM-SHA-512; a private CA and the
    broker's keystore made now, in this run's temporary directory)."""
    return SaslSslListener.create(tmp_path_factory.mktemp("sasl-ssl"))


@pytest.fixture(scope="session")
def apache_kafka(sasl_ssl_listener: SaslSslListener) -> Iterator[ApacheKafkaBroker]:
    """A real Apache Kafka broker (single-node KRaft on loopback; settings that let compaction and,
    on topics that set ``retention.ms``, retention act within seconds; records of any timestamp
    are kept otherwise). Skipped, with what to install, only where Java or the jars ``bash
    scripts/setup.sh`` fetches are missing.

    Besides its PLAINTEXT listener (``bootstrap_servers``: every test, inter-broker traffic) it
    has a ``SASL_SSL`` one (see :func:`sasl_ssl`): one broker serves both, so the secure tests
    cost one more port, not a second broker."""
    missing = apache_kafka_missing()
    if missing is not None:
        pytest.skip(missing)
    b = ApacheKafkaBroker()
    b.settings.update(sasl_ssl_listener.broker_settings(b.host, b.port, b.controller_port))
    b.start()
    yield b
    b.stop()


@pytest.fixture(scope="session")
def sasl_ssl(apache_kafka: ApacheKafkaBroker, sasl_ssl_listener: SaslSslListener) -> SaslSslListener:
    """The suite Apache Kafka broker's ``SASL_SSL`` listener with its SCRAM user created (through
    the PLAINTEXT listener): ``bootstrap_servers``, ``ca_location``, ``user``, ``password`` and
    ``client_config()`` (librdkafka properties that reach it)."""
    sasl_ssl_listener.create_user(apache_kafka.bootstrap_servers)
    return sasl_ssl_listener


@pytest.fixture(scope="session")
def s3_server() -> Iterator[EmbeddedS3]:
    """A real S3 HTTP endpoint (moto server) on loopback."""
    s = EmbeddedS3()
    s.start()
    yield s
    s.stop()


def suite_broker_impl() -> str:
    """``apache`` or ``tansu``: the broker the integration suite's ``kafka``/``bootstrap`` are bound
    to. Apache Kafka — the broker users run — wherever Java and the jars ``scripts/setup.sh``
    fetches are there; else (a machine with only pip) the embedded Tansu broker, said in the run's
    header. ``STATESNAP_TEST_BROKER=tansu|apache`` chooses. The quick-start tests run on Tansu
    always (the zero-Java default users meet first), the fault suite and tests/integration/apache
    on Apache Kafka always."""
    value = os.environ.get(BROKER_ENV, "").strip().lower()
    if value not in {"", "tansu", "apache"}:
        raise pytest.UsageError(f"{BROKER_ENV} must be tansu or apache, not {value!r}")
    return value or ("apache" if apache_kafka_missing() is None else "tansu")


@pytest.fixture(scope="session")
def kafka_broker(request: pytest.FixtureRequest) -> EmbeddedBroker | ApacheKafkaBroker:
    """The integration suite's broker (see :func:`suite_broker_impl`)."""
    name = "apache_kafka" if suite_broker_impl() == "apache" else "broker"
    found: EmbeddedBroker | ApacheKafkaBroker = request.getfixturevalue(name)
    return found


@pytest.fixture
def bootstrap(kafka_broker: EmbeddedBroker | ApacheKafkaBroker) -> str:
    return kafka_broker.bootstrap_servers


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
