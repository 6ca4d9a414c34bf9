"""The Apache Kafka dev broker itself: it is real Kafka (topic IDs, exact configs), and it fails
with one typed line when it cannot start."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from statesnap.devstack import ApacheKafkaBroker, ApacheKafkaUnavailableError
from statesnap.devstack.apache import APACHE_KAFKA_VERSION, apache_kafka_missing
from statesnap.devstack.process import DevServiceError
from statesnap.kafka.admin import KafkaAdmin
from statesnap.kafka.config import KafkaSettings
from statesnap.kafka.identity import topic_id

pytestmark = pytest.mark.integration


def test_the_pom_and_the_code_pin_the_same_version() -> None:
    pom = Path(__file__).parents[3] / "scripts" / "apache-kafka" / "pom.xml"
    assert f"<kafka.version>{APACHE_KAFKA_VERSION}</kafka.version>" in pom.read_text()


def test_it_reports_what_tansu_does_not(kafka: object, bootstrap: str) -> None:
    """Apache Kafka proved it: describe_configs lists defaults (not only explicit settings), and
    a topic has a topic ID."""
    name = f"cfg-{uuid.uuid4().hex[:10]}"
    kafka.create_topic(name, 2, {"cleanup.policy": "compact"})  # type: ignore[attr-defined]
    settings = KafkaSettings(bootstrap)
    info = KafkaAdmin(settings).describe_topic(name)
    assert info.compacted
    assert info.configs["delete.retention.ms"] == "86400000"  # a default, reported
    assert topic_id(settings, name)


def test_missing_jars_are_one_typed_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(ApacheKafkaUnavailableError, match=r"run bash scripts/setup\.sh") as e:
        ApacheKafkaBroker().start()
    assert "\n" not in str(e.value)


def test_missing_java_is_one_typed_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(ApacheKafkaUnavailableError, match="needs Java 17"):
        ApacheKafkaBroker().start()


def test_a_broker_that_cannot_start_says_why_in_one_line() -> None:
    """Apache Kafka proved it: a setting Kafka refuses (segments under 1 MiB) stops it at start;
    the error is one typed line with Kafka's own reason, and nothing is left running."""
    if (missing := apache_kafka_missing()) is not None:
        pytest.skip(missing)
    b = ApacheKafkaBroker(settings={"log.segment.bytes": "1024"})
    with pytest.raises(DevServiceError) as e:
        b.start(timeout=60)
    print(e.value)
    assert "\n" not in str(e.value)
    assert "log.segment.bytes" in str(e.value)
    assert not b.running


def test_a_broker_that_dies_at_start_says_why_in_one_line(apache_kafka: ApacheKafkaBroker) -> None:
    """Apache Kafka proved it: a controller port already taken (the session broker's) makes the
    JVM exit after formatting; the error names the address and Kafka's reason in one line."""
    b = ApacheKafkaBroker()
    b.controller_port = apache_kafka.controller_port
    with pytest.raises(DevServiceError) as e:
        b.start(timeout=60)
    print(e.value)
    assert "\n" not in str(e.value)
    assert b.bootstrap_servers in str(e.value)
    assert not b.running


def test_the_start_up_deadline_names_what_it_waited_for() -> None:
    """Half a second is over before the JVM formats the log dir or before Kafka listens (~5 s in
    all): one line naming the step it waited for."""
    if (missing := apache_kafka_missing()) is not None:
        pytest.skip(missing)
    with pytest.raises(
        DevServiceError,
        match=r"(formatting the KRaft log directory did not finish|did not answer on port \d+)",
    ) as e:
        ApacheKafkaBroker().start(timeout=0.5)
    assert "\n" not in str(e.value)


def test_a_killed_owner_s_log_dir_is_swept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The log dir of a broker whose starting process was SIGKILLed is removed by the next
    start; a live owner's is kept."""
    import subprocess
    import sys
    import tempfile

    from statesnap.devstack import apache

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    orphan, alive = tmp_path / "statesnap-apache-kafka-orphan", tmp_path / "statesnap-apache-kafka-alive"
    for d, pid in ((orphan, dead.stdout.strip()), (alive, str(os.getpid()))):
        d.mkdir()
        (d / "owner.pid").write_text(pid)
    apache._sweep_orphaned_dirs()
    assert not orphan.exists()
    assert alive.exists()
