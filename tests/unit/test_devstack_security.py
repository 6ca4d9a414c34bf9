"""The SASL_SSL dev listener's material, without a broker: the keystore the broker reads holds a
certificate for the listener's address signed by the CA clients trust, and its settings keep
PLAINTEXT the inter-broker listener. (The listener itself is proven on Apache Kafka by
tests/integration/security.)"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12

from statesnap.devstack.security import SCRAM_MECHANISM, CertificateAuthority, SaslSslListener


def test_the_keystore_holds_a_certificate_for_the_address_signed_by_the_ca(tmp_path: Path) -> None:
    listener = SaslSslListener.create(tmp_path, port=19093)
    key, cert, chain = pkcs12.load_key_and_certificates(
        listener.keystore.read_bytes(), listener.keystore_password.encode()
    )
    assert key is not None
    assert cert is not None
    ca = x509.load_pem_x509_certificate(listener.ca_location.read_bytes())
    assert [c.subject for c in chain] == [ca.subject]
    assert cert.issuer == ca.subject
    ca_key = ca.public_key()
    assert isinstance(ca_key, ec.EllipticCurvePublicKey)
    assert cert.signature_hash_algorithm is not None
    ca_key.verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm))
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in names.get_values_for_type(x509.IPAddress)
    other = CertificateAuthority.create(tmp_path, "other")
    assert other.cert.subject != cert.issuer  # the "wrong CA" signed nothing the broker has


def test_broker_settings_add_the_listener_beside_plaintext(tmp_path: Path) -> None:
    listener = SaslSslListener.create(tmp_path, port=19093)
    settings = listener.broker_settings("127.0.0.1", 9092, 9093)
    assert settings["listeners"] == (
        "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093,SASL_SSL://127.0.0.1:19093"
    )
    assert settings["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9092,SASL_SSL://127.0.0.1:19093"
    assert "inter.broker.listener.name" not in settings  # the broker's PLAINTEXT stays
    assert settings["listener.name.sasl_ssl.sasl.enabled.mechanisms"] == SCRAM_MECHANISM
    client = listener.client_config(password="other")
    assert client["sasl.password"] == "other"
    assert client["sasl.mechanism"] == SCRAM_MECHANISM
    for secret in (listener.password, listener.keystore_password):
        assert secret not in repr(listener)
    assert listener.password != SaslSslListener.create(tmp_path / "again").password
