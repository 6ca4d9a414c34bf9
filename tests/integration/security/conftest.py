"""Tests in this directory talk to the suite's Apache Kafka broker through its ``SASL_SSL``
listener (SCRAM-SHA-512 over TLS, a private CA made for the run: ``sasl_ssl`` in
tests/conftest.py), as production clusters are reached.

``kafka`` is the plaintext :class:`KafkaTool` on the same broker: it writes the input and reads
the ground truth, so what the secure path shows is compared with what the broker holds, not with
what it read itself. :func:`assert_no_secret` greps outputs and files for the listener's secrets.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from integration.conftest import KafkaTool
from statesnap.devstack import ApacheKafkaBroker
from statesnap.devstack.security import CertificateAuthority, SaslSslListener

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def kafka(apache_kafka: ApacheKafkaBroker) -> Iterator[KafkaTool]:
    tool = KafkaTool(apache_kafka.bootstrap_servers)
    yield tool
    tool.close()


@pytest.fixture
def bootstrap(apache_kafka: ApacheKafkaBroker) -> str:
    """The plaintext address (the secure one is ``sasl_ssl.bootstrap_servers``)."""
    return apache_kafka.bootstrap_servers


@pytest.fixture(scope="session")
def wrong_ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA certificate that signed nothing the broker presents: a client trusting only it must
    refuse the broker's certificate."""
    return CertificateAuthority.create(tmp_path_factory.mktemp("wrong-ca"), "not-the-brokers-ca").certificate


def secrets_of(listener: SaslSslListener) -> tuple[str, ...]:
    """What no output, log line or file may show: the user's and the keystore's passwords."""
    return (listener.password, listener.keystore_password)


def assert_no_secret(
    listener: SaslSslListener, *texts: str, files_under: Iterable[Path] = (), also: Iterable[str] = ()
) -> int:
    """No secret of *listener* (nor any of *also*) in *texts* or in any file below *files_under*;
    returns the number of files read, so a test can say it looked at some."""
    wanted = [s for s in (*secrets_of(listener), *also) if s]
    for text in texts:
        for secret in wanted:
            assert secret not in text, f"a secret reached an output: …{_around(text, secret)}…"
    read = 0
    for root in files_under:
        for path in sorted(p for p in Path(root).rglob("*") if p.is_file()):
            data = path.read_bytes()
            read += 1
            for secret in wanted:
                assert secret.encode() not in data, f"a secret reached {path}"
    return read


def _around(text: str, secret: str) -> str:
    at = text.index(secret)
    return text[max(0, at - 60) : at].replace(secret, "<secret>")
