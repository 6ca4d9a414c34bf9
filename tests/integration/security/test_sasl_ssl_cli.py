"""``statesnap materialize`` and ``dump`` over SASL_SSL (SCRAM-SHA-512, a private CA), as fresh
subprocesses of the venv's interpreter, on Apache Kafka 4.1 (the suite broker's secure listener).

What Kafka behaviour this proves: the broker authenticates the CLI's clients with SCRAM over TLS
whichever way the settings arrive — ``--kafka-config KEY=VALUE``, a properties file,
``STATESNAP_KAFKA_*`` variables — and refuses a wrong password (SASL authentication fails) and a
client that trusts another CA (the client refuses the broker's certificate). Each refusal is one
line naming its cause, within ``--timeout``. No password reaches stdout, stderr (at DEBUG too),
a manifest or a data file.
"""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path

import pytest

from integration.cli_runner import digest, ok, statesnap
from integration.conftest import KafkaTool
from integration.security.conftest import assert_no_secret
from statesnap.devstack.security import SaslSslListener

pytestmark = pytest.mark.integration

#: ``--timeout`` of the failure cases; the default (15 s) would be far past the bound below.
TIMEOUT = 2.0
#: What a CLI subprocess may take beyond ``--timeout``: its start-up (imports) on a busy machine.
START_UP = 10.0


def _pairs(config: dict[str, str]) -> list[str]:
    return [arg for key, value in config.items() for arg in ("--kafka-config", f"{key}={value}")]


def _topic(kafka: KafkaTool) -> tuple[str, dict[bytes, bytes]]:
    topic = kafka.create_topic(f"sec-cli-{uuid.uuid4().hex[:10]}", 2)
    records = kafka.produce(topic, [(i % 2, b"k%d-%d" % (i % 2, i % 9), b"v%d" % i) for i in range(50)])
    return topic, kafka.truth(records)


def test_materialize_and_dump_over_sasl_ssl_with_each_way_of_passing_settings(
    kafka: KafkaTool, sasl_ssl: SaslSslListener, tmp_path: Path
) -> None:
    """``materialize`` with ``--kafka-config`` pairs writes a checkpoint; ``dump`` restores it
    and tails the topic with the settings in a properties file, then in ``STATESNAP_KAFKA_*``
    variables: every digest is the plaintext ground truth's."""
    topic, truth = _topic(kafka)
    url = (tmp_path / "cp").as_uri()
    secure = sasl_ssl.bootstrap_servers
    config = sasl_ssl.client_config()
    outputs: list[str] = []

    made = statesnap(
        "--log-level", "debug", "materialize", "-b", secure, "-t", topic, "-c", url,
        "--engine", "python", "--json", *_pairs(config),
    )  # fmt: skip
    outputs += [made.stdout, made.stderr]
    assert ok(made)["checkpoint"] == 1

    properties = tmp_path / "client.properties"
    properties.write_text("".join(f"{key}={value}\n" for key, value in config.items()))
    dump = ["dump", "-b", secure, "-t", topic, "-c", url, "--digest", "--json"]
    from_file = statesnap(*dump, "--kafka-config-file", str(properties))
    outputs += [from_file.stdout, from_file.stderr]
    env = {f"STATESNAP_KAFKA_{key.upper().replace('.', '_')}": value for key, value in config.items()}
    from_env = statesnap(*dump, env=env)
    outputs += [from_env.stdout, from_env.stderr]

    for result in (ok(from_file), ok(from_env)):
        assert result["checkpoint"] == 1  # booted from materialize's checkpoint
        assert result["digest"] == digest(truth)
        assert result["keys"] == len(truth)
    properties.unlink()  # the operator's file holds the password; nothing statesnap wrote may
    assert assert_no_secret(sasl_ssl, *outputs, files_under=[tmp_path]) > 0


#: The cause each case's line must name: librdkafka's words, in the CLI's framing.
CAUSES = {
    "wrong-password": r"; authentication failed: SASL authentication error: Authentication failed",
    "wrong-ca": r"; TLS handshake failed: .*certificate verify failed",
}


@pytest.mark.parametrize("case", sorted(CAUSES))
def test_a_wrong_password_or_ca_is_one_line_naming_the_cause_within_the_timeout(
    kafka: KafkaTool, sasl_ssl: SaslSslListener, wrong_ca: Path, tmp_path: Path, case: str
) -> None:
    """The broker refuses the SCRAM exchange (wrong password), or the client refuses the broker's
    certificate (it trusts another CA): ``materialize`` and ``dump`` exit non-zero within
    ``--timeout`` with one error line that names the cause; the wrong password is not shown
    either."""
    topic, _truth = _topic(kafka)
    wrong = f"not-it-{uuid.uuid4().hex[:8]}"
    config = (
        sasl_ssl.client_config(password=wrong)
        if case == "wrong-password"
        else sasl_ssl.client_config(ca_location=wrong_ca)
    )
    url = (tmp_path / "cp").as_uri()
    common = ["-b", sasl_ssl.bootstrap_servers, "-t", topic, "-c", url, "--timeout", f"{TIMEOUT:g}s"]
    for command in (["materialize", "--engine", "python"], ["dump", "--digest"]):
        started = time.monotonic()
        result = statesnap(*command, *common, *_pairs(config))
        seconds = time.monotonic() - started
        assert result.returncode != 0, result.stdout
        errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1, result.stderr
        (line,) = errors
        assert re.search(CAUSES[case], line), line
        assert f"within {TIMEOUT:g}s" in line
        assert [ln for ln in result.stderr.splitlines() if re.search(CAUSES[case], ln)] == [line]  # once
        assert seconds < TIMEOUT + START_UP, f"{command[0]} took {seconds:.1f}s"
        assert_no_secret(sasl_ssl, result.stdout, result.stderr, files_under=[tmp_path], also=[wrong])
