"""A SASL_SSL listener (SCRAM-SHA-512 over TLS, a private CA made on the spot) for the dev Apache
Kafka broker.

Production clusters speak TLS and SASL; a client setting that works on a plaintext dev broker can
still fail there (a certificate not trusted, a password wrong, a mechanism not named). The tests
that prove statesnap's clients, CLI and Spark source work over SASL_SSL — and name the cause in one
line when they cannot — need such a listener, made from what a fresh machine has: the certificates
are made in Python (``cryptography``), the broker reads them as a PKCS#12 keystore, and the SCRAM
user is created after start through the plaintext listener with the admin API (KRaft keeps SCRAM
credentials in its metadata log), so the broker's format step stays as it is.

The listener is added to a broker that also keeps its PLAINTEXT listener, which everything else
(inter-broker, controller, the other tests) goes on using: one broker, one more port::

    listener = SaslSslListener.create(tmp_dir)
    broker = ApacheKafkaBroker()
    broker.settings.update(listener.broker_settings(broker.host, broker.port, broker.controller_port))
    broker.start()
    listener.create_user(broker.bootstrap_servers)
    Table(..., bootstrap_servers=listener.bootstrap_servers, kafka_config=listener.client_config())

The CA's key never leaves this process's memory; the keystore password and the user's password
are random per listener and appear in no ``repr``.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from statesnap.devstack.process import DevServiceError, free_port

log = logging.getLogger(__name__)

__all__ = ["SCRAM_MECHANISM", "CertificateAuthority", "SaslSslListener"]

#: The SASL mechanism of the listener (Kafka's strongest built-in password mechanism).
SCRAM_MECHANISM = "SCRAM-SHA-512"
#: The listener's name in ``listeners`` and the prefix of its per-listener broker settings.
_LISTENER = "SASL_SSL"
_PREFIX = f"listener.name.{_LISTENER.lower()}."
#: Certificates outlive any test run; they are made anew for each one.
_VALIDITY = datetime.timedelta(days=30)
_SCRAM_ITERATIONS = 4096


@dataclass(frozen=True, slots=True)
class CertificateAuthority:
    """A private CA: its certificate as a PEM file (what clients trust), and its key and
    certificate in memory only, to sign broker certificates. A second one is the "wrong CA" a
    client may be given."""

    name: str
    certificate: Path
    key: ec.EllipticCurvePrivateKey = field(repr=False)
    cert: x509.Certificate = field(repr=False)

    @classmethod
    def create(cls, directory: Path, name: str = "statesnap-test-ca") -> CertificateAuthority:
        """A self-signed CA certificate written to ``<directory>/<name>.pem``."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{name}.pem"
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return cls(name, path, key, cert)

    def issue_keystore(self, path: Path, host: str, password: str) -> Path:
        """A server certificate for *host* (an IP address or a DNS name; ``localhost`` too), signed
        by this CA, with its key and the CA's certificate, as a PKCS#12 keystore at *path*."""
        key = ec.generate_private_key(ec.SECP256R1())
        try:
            names: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(host))]
        except ValueError:
            names = [x509.DNSName(host)]
        if host != "localhost":
            names.append(x509.DNSName("localhost"))
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False
            )
            .sign(self.key, hashes.SHA256())
        )
        encryption = serialization.BestAvailableEncryption(password.encode())
        path.write_bytes(pkcs12.serialize_key_and_certificates(b"broker", key, cert, [self.cert], encryption))
        return path


@dataclass(frozen=True, slots=True)
class SaslSslListener:
    """A ``SASL_SSL`` listener's address, trust material and SCRAM user.

    :meth:`broker_settings` are the broker properties that add it; :meth:`create_user` makes its
    user once the broker runs; :meth:`client_config` is what a librdkafka client sets to use it.
    """

    host: str
    port: int
    ca: CertificateAuthority
    keystore: Path
    user: str
    password: str = field(repr=False)
    keystore_password: str = field(repr=False)

    @classmethod
    def create(
        cls, directory: Path, *, host: str = "127.0.0.1", port: int | None = None, user: str = "statesnap"
    ) -> SaslSslListener:
        """A fresh CA, a broker keystore signed by it and a random password, in *directory*."""
        directory.mkdir(parents=True, exist_ok=True)
        ca = CertificateAuthority.create(directory)
        keystore_password = secrets.token_urlsafe(18)
        keystore = ca.issue_keystore(directory / "broker.p12", host, keystore_password)
        return cls(
            host,
            port or free_port(),
            ca,
            keystore,
            user,
            password=secrets.token_urlsafe(18),
            keystore_password=keystore_password,
        )

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def ca_location(self) -> Path:
        """The CA certificate (PEM) a client trusts: librdkafka's ``ssl.ca.location``."""
        return self.ca.certificate

    def broker_settings(self, host: str, plaintext_port: int, controller_port: int) -> dict[str, str]:
        """Broker properties that add this listener beside ``PLAINTEXT`` (still the inter-broker
        listener) and ``CONTROLLER``; they replace the broker's ``listeners``,
        ``advertised.listeners`` and ``listener.security.protocol.map``, naming all three."""
        plain = f"PLAINTEXT://{host}:{plaintext_port}"
        secure = f"{_LISTENER}://{self.host}:{self.port}"
        return {
            "listeners": f"{plain},CONTROLLER://{host}:{controller_port},{secure}",
            "advertised.listeners": f"{plain},{secure}",
            "listener.security.protocol.map": (
                f"PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,{_LISTENER}:SASL_SSL"
            ),
            "sasl.enabled.mechanisms": SCRAM_MECHANISM,
            f"{_PREFIX}sasl.enabled.mechanisms": SCRAM_MECHANISM,
            f"{_PREFIX}{SCRAM_MECHANISM.lower()}.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
            f"{_PREFIX}ssl.keystore.type": "PKCS12",
            f"{_PREFIX}ssl.keystore.location": str(self.keystore),
            f"{_PREFIX}ssl.keystore.password": self.keystore_password,
            f"{_PREFIX}ssl.key.password": self.keystore_password,
            f"{_PREFIX}ssl.client.auth": "none",
        }

    def client_config(
        self, *, password: str | None = None, ca_location: Path | str | None = None
    ) -> dict[str, str]:
        """librdkafka properties for this listener (a wrong *password* or CA for the failure
        cases)."""
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": SCRAM_MECHANISM,
            "sasl.username": self.user,
            "sasl.password": self.password if password is None else password,
            "ssl.ca.location": str(self.ca_location if ca_location is None else ca_location),
        }

    def create_user(self, plaintext_bootstrap: str, timeout: float = 30.0) -> None:
        """Create (or reset) the SCRAM user through the broker's plaintext listener, then wait
        until the secure listener accepts it: KRaft applies a credential once its metadata record
        is committed. :class:`DevServiceError` (one line) if that does not happen in *timeout*."""
        from confluent_kafka.admin import (  # type: ignore[attr-defined]
            AdminClient,
            ScramCredentialInfo,
            ScramMechanism,
            UserScramCredentialUpsertion,
        )

        deadline = time.monotonic() + timeout
        admin = AdminClient({"bootstrap.servers": plaintext_bootstrap})
        upsert = UserScramCredentialUpsertion(
            self.user,
            ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, _SCRAM_ITERATIONS),
            self.password.encode(),
        )
        try:
            futures = admin.alter_user_scram_credentials([upsert], request_timeout=timeout)
            futures[self.user].result(timeout=timeout)
        except Exception as e:
            raise DevServiceError(
                f"SASL_SSL listener: creating SCRAM user {self.user!r} at {plaintext_bootstrap} failed: "
                f"{type(e).__name__}"
            ) from None
        self.wait_ready(deadline)

    def wait_ready(self, deadline: float) -> None:
        """Until a client with :meth:`client_config` gets a metadata answer on the listener."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, **self.client_config()})
        while True:
            try:
                if admin.list_topics(timeout=1).brokers:
                    return
            except Exception as e:  # the credential is not applied yet: ask again
                log.debug("SASL_SSL listener not ready: %s", e)
            if time.monotonic() > deadline:
                raise DevServiceError(
                    f"SASL_SSL listener at {self.bootstrap_servers}: user {self.user!r} was not "
                    "accepted before the deadline"
                )
            time.sleep(0.2)
