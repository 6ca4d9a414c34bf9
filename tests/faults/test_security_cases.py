"""Security faults (issue 34): what an operator gets wrong when connecting to a secured cluster,
walked through ``statesnap dump`` as a user runs it (a fresh process each) against the suite
broker's SASL_SSL listener (Apache Kafka, SCRAM-SHA-512 over TLS with a private CA made for this
run). Each case must end within ``--timeout`` (plus start-up) in one ``Error:`` line naming its
cause, and no password — the right one or the wrong one tried — may reach stdout or stderr. Each
case counts once in the fault summary's "security cases tried"; a leaked secret or a hang is a
finding.

Broker behaviour relied on: Apache Kafka refuses a wrong SCRAM password (SASL authentication
failed) and presents a certificate the wrong CA does not sign; librdkafka refuses the SCRAM
exchange without ``sasl.mechanism`` (the CLI says to set it before any connection)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from faults.harness import KafkaTool, judge_cli, run_cli_raw
from faults.ledger import CaseLedger
from statesnap.devstack.security import CertificateAuthority, SaslSslListener

TIMEOUT = 3.0
#: A fresh interpreter's imports on a busy two-core machine, on top of --timeout.
START_UP = 12.0


@dataclass(frozen=True)
class Case:
    name: str
    #: The --kafka-config entries, given the listener and a wrong CA.
    config: Callable[[SaslSslListener, Path, str], dict[str, str]]
    #: What the one error line must say.
    cause: str
    #: Arguments as the shell split them, when the case is a mistyped command line.
    split: bool = False


def _without(config: dict[str, str], key: str) -> dict[str, str]:
    return {k: v for k, v in config.items() if k != key}


CASES = (
    Case("wrong password", lambda s, ca, wrong: s.client_config(password=wrong), r"authentication failed"),
    Case("wrong CA", lambda s, ca, wrong: s.client_config(ca_location=str(ca)), r"certificate verify failed"),
    Case(
        "no sasl.mechanism",
        lambda s, ca, wrong: _without(s.client_config(), "sasl.mechanism"),
        r"set sasl\.mechanism",
    ),
    Case(
        "plaintext against the TLS listener",
        lambda s, ca, wrong: {},
        r"no Kafka broker answered|TLS|SSL|closed|timed out",
    ),
    Case(
        "KEY VALUE without '='",
        lambda s, ca, wrong: {"sasl.password": wrong},
        r"--kafka-config takes KEY=VALUE",
        split=True,
    ),
)


@pytest.fixture(scope="module")
def secured(kafka: KafkaTool, sasl_ssl: SaslSslListener) -> tuple[SaslSslListener, str]:
    """The listener with its user, and a topic holding a few records (written in plaintext)."""
    topic = kafka.create_topic(f"sec-{uuid.uuid4().hex[:8]}", 1)
    kafka.produce(topic, [(0, b"k", b"v")])
    return sasl_ssl, topic


@pytest.fixture(scope="module")
def wrong_ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return CertificateAuthority.create(tmp_path_factory.mktemp("wrong-ca"), "not-the-brokers-ca").certificate


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_security_mistake_is_one_line_naming_it_and_shows_no_secret(
    ledger: CaseLedger, secured: tuple[SaslSslListener, str], wrong_ca: Path, case: Case
) -> None:
    listener, topic = secured
    wrong = f"wrong-{uuid.uuid4().hex[:10]}"
    config = case.config(listener, wrong_ca, wrong)
    pairs: list[str] = []
    for key, value in sorted(config.items()):
        pairs += [
            "--kafka-config",
            *((key, value) if case.split and key == "sasl.password" else (f"{key}={value}",)),
        ]
    args = [
        "dump",
        "-b",
        listener.bootstrap_servers,
        "-t",
        topic,
        "--no-checkpoint",
        "--timeout",
        f"{TIMEOUT:g}s",
    ]
    ledger.tried("security_cases")
    result = judge_cli(ledger, run_cli_raw([*args, *pairs], timeout=TIMEOUT + START_UP + 30))
    for secret in (listener.password, listener.keystore_password, wrong):
        if secret in result.output:
            ledger.fail("secret_leaks", f"{case.name}: a password reached the output")
    assert result.returncode != 0, result.stdout[-500:]
    errors = result.error_lines()
    assert len(errors) == 1, result.stderr[-2000:]
    assert re.search(case.cause, errors[0]), errors[0]
    if result.seconds > TIMEOUT + START_UP:
        ledger.fail("hangs", f"{case.name}: {result.seconds:.1f}s with --timeout {TIMEOUT:g}s")


def test_the_right_settings_work(ledger: CaseLedger, secured: tuple[SaslSslListener, str]) -> None:
    """The control: the same command with the right settings reads the topic."""
    listener, topic = secured
    pairs = [a for k, v in sorted(listener.client_config().items()) for a in ("--kafka-config", f"{k}={v}")]
    result = judge_cli(
        ledger,
        run_cli_raw(
            [
                "dump",
                "-b",
                listener.bootstrap_servers,
                "-t",
                topic,
                "--no-checkpoint",
                "--digest",
                "--json",
                *pairs,
            ],
            timeout=90,
        ),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.json()["keys"] == 1
    assert listener.password not in result.output
