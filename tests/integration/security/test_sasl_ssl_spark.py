"""The ``statesnap-kafka`` Spark source over SASL_SSL (SCRAM-SHA-512, a private CA), with the
settings a Spark job written for Spark's own Kafka source carries (``kafka.sasl.jaas.config``, a
PEM truststore), on Apache Kafka 4.1 (the suite broker's secure listener) and the suite's one
SparkSession.

What Kafka behaviour this proves: the broker serves the source's driver-side admin client and
end probe and its tasks' consumers over SCRAM and TLS, the rows equal to what it holds; it
refuses a wrong password (SASL authentication fails), and a client trusting another CA refuses
the broker's certificate. Each refusal reaches Spark as the one line that names its cause (as the
CLI says it) within ``metadataTimeoutMs``, not as "Local: Broker transport failure" under a trace
of the source's frames; SASL without a mechanism says to set ``kafka.sasl.mechanism``.
"""

from __future__ import annotations

import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

# The Spark tests' session fixture; its conftest imports its testkit as a top-level module.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "spark"))

from integration.conftest import KafkaTool
from integration.security.conftest import assert_no_secret
from integration.spark.conftest import spark
from statesnap.devstack.security import SaslSslListener

pytestmark = [pytest.mark.spark, pytest.mark.integration]

__all__ = ["spark"]

#: ``metadataTimeoutMs`` of the failure cases, in seconds (the default is 15).
TIMEOUT = 3.0
#: What planning a Python source's read may take beyond the timeout on a busy machine.
PLANNING = 10.0
#: The cause each case's line must name, in the CLI's words.
CAUSES = {
    "wrong-password": r"; authentication failed: SASL authentication error: Authentication failed",
    "wrong-ca": r"; TLS handshake failed: .*certificate verify failed",
}


def _secure_read(spark: Any, listener: SaslSslListener, topic: str, *, password: str, ca: Path) -> Any:
    """A batch read configured as a job written for Spark's ``kafka`` source would be."""
    jaas = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{listener.user}" password="{password}";'
    )
    return (
        spark.read.format("statesnap-kafka")
        .option("kafka.bootstrap.servers", listener.bootstrap_servers)
        .option("subscribe", topic)
        .option("kafka.security.protocol", "SASL_SSL")
        .option("kafka.sasl.mechanism", "SCRAM-SHA-512")
        .option("kafka.sasl.jaas.config", jaas)
        .option("kafka.ssl.truststore.type", "PEM")
        .option("kafka.ssl.truststore.location", str(ca))
        .option("metadataTimeoutMs", str(int(TIMEOUT * 1000)))
    )


def test_the_spark_source_reads_over_sasl_ssl(
    spark: Any, kafka: KafkaTool, sasl_ssl: SaslSslListener
) -> None:
    """Every record, with its partition and offset, as the broker stored it (read over
    PLAINTEXT by a plain consumer)."""
    topic = kafka.create_topic(f"sec-spark-{uuid.uuid4().hex[:10]}", 2)
    sent = kafka.produce(topic, [(i % 2, b"k%d" % i, b"v%d" % i) for i in range(120)])
    rows = (
        _secure_read(spark, sasl_ssl, topic, password=sasl_ssl.password, ca=sasl_ssl.ca_location)
        .load()
        .select("partition", "offset", "key", "value")
        .collect()
    )
    got = sorted((r["partition"], r["offset"], bytes(r["key"]), bytes(r["value"])) for r in rows)
    assert got == [(r.partition, r.offset, r.key, r.value) for r in sent]


@pytest.mark.parametrize("case", sorted(CAUSES))
def test_a_wrong_password_or_ca_fails_the_read_in_one_line_naming_the_cause(
    spark: Any, kafka: KafkaTool, sasl_ssl: SaslSslListener, wrong_ca: Path, case: str
) -> None:
    """The read fails within ``metadataTimeoutMs`` (plus Spark's planning), and the error Spark
    raises has one line naming the cause: the typed error's, with no source frames above it and
    neither librdkafka's "Broker transport failure" nor the password in it."""
    topic = kafka.create_topic(f"sec-spark-bad-{uuid.uuid4().hex[:10]}", 1)
    kafka.produce(topic, [(0, b"k", b"v")])
    wrong = f"not-it-{uuid.uuid4().hex[:8]}"
    right = sasl_ssl.password
    password, ca = (wrong, sasl_ssl.ca_location) if case == "wrong-password" else (right, wrong_ca)
    # The same read with the right settings first: the time measured below is then the failure's,
    # not a cold session's first Python source (its workers start, ~20 s on a busy machine).
    good = _secure_read(spark, sasl_ssl, topic, password=right, ca=sasl_ssl.ca_location)
    assert good.load().count() == 1
    started = time.monotonic()
    with pytest.raises(Exception, match="BrokerUnavailableError") as info:
        _secure_read(spark, sasl_ssl, topic, password=password, ca=ca).load().count()
    seconds = time.monotonic() - started
    text = str(info.value)
    naming = [line for line in text.splitlines() if re.search(CAUSES[case], line)]
    assert len(naming) == 1, text
    typed = "statesnap.errors.BrokerUnavailableError: option kafka.bootstrap.servers: cannot list topics"
    assert naming[0].startswith(typed), text
    assert f"within {TIMEOUT:g}s" in naming[0]
    assert "Broker transport failure" not in text
    assert "KafkaError{" not in text
    # Spark's frame of the source's call, not the stack under it (kafka_io, planning, …).
    assert len(re.findall(r'^\s*File "', text, re.MULTILINE)) <= 1, text
    assert seconds < TIMEOUT + PLANNING, f"the read failed after {seconds:.1f}s"
    assert_no_secret(sasl_ssl, text, also=[wrong])


def test_sasl_without_a_mechanism_says_to_set_kafka_sasl_mechanism(
    spark: Any, sasl_ssl: SaslSslListener, topic_name: str
) -> None:
    """At ``load()``, before any broker is asked: not librdkafka's "No provider for SASL mechanism
    GSSAPI: recompile librdkafka…"."""
    loader = (
        spark.read.format("statesnap-kafka")
        .option("kafka.bootstrap.servers", sasl_ssl.bootstrap_servers)
        .option("subscribe", topic_name)
        .option("kafka.security.protocol", "SASL_SSL")
        .option("kafka.sasl.username", sasl_ssl.user)
        .option("kafka.sasl.password", sasl_ssl.password)
    )
    hint = r"security\.protocol=SASL_SSL without kafka\.sasl\.mechanism: set kafka\.sasl\.mechanism \(e\.g\."
    with pytest.raises(Exception, match=hint) as info:
        loader.load()
    assert "recompile" not in str(info.value)
    assert_no_secret(sasl_ssl, str(info.value))
