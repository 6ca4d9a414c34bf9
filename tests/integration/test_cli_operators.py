"""What an operator meets on first contact, run as an operator runs it (a fresh ``statesnap``
process): ``--timeout`` on every command that talks to Kafka and a hint when the client's TLS or
SASL settings do not fit the listener, summaries that count and time what they say, and
``snapshot diff`` naming a missing generation as ``show`` and ``delete`` do.

Broker behaviour proved on the session's broker (Apache Kafka; before it Tansu), a plaintext listener without
SASL.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from integration.cli_runner import STATESNAP, ok, statesnap
from statesnap.materialize import spark_available

pytestmark = pytest.mark.integration

SECRET = "hunter2-not-for-logs"
SASL_SSL = [
    *("--kafka-config", "security.protocol=SASL_SSL"),
    *("--kafka-config", "sasl.mechanism=PLAIN"),
    *("--kafka-config", "sasl.username=ops"),
    *("--kafka-config", f"sasl.password={SECRET}"),
]


def _timed(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    result = statesnap(*args, timeout=90, env=env)
    return result, time.monotonic() - started


@pytest.mark.parametrize(
    "command",
    [
        ["materialize", "--checkpoints", "{tmp}/c"],
        ["dump"],
        ["serve", "--checkpoints", "{tmp}/c", "--port", "0"],
        ["produce-sample", "--updates", "10"],
    ],
    ids=lambda c: c[0],
)
def test_every_kafka_command_takes_timeout_and_hints_at_a_tls_mismatch(
    bootstrap: str, tmp_path: Path, command: list[str]
) -> None:
    """SASL_SSL against Tansu's plaintext listener: the client's TLS hello is never answered and
    librdkafka reports nothing. Each command gives up after its --timeout (not a fixed 15 s) with
    one typed line that names the address, the deadline and the likely cause, never the password.
    Before: only `snapshot create` had --timeout (exit 2 here), and the error had no hint."""
    args = [a.replace("{tmp}", str(tmp_path)) for a in command]
    result, seconds = _timed(*args, "-b", bootstrap, "-t", "ops-tls", "--timeout", "2s", *SASL_SSL)
    assert result.returncode == 1, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"Error: BrokerUnavailableError: no Kafka broker answered at {bootstrap} within 2s"
    )
    assert "is security.protocol right for this listener? (it is SASL_SSL)" in last, last
    assert "Traceback" not in result.stderr
    assert SECRET not in result.stderr + result.stdout
    assert seconds < 12, f"{seconds:.1f}s with --timeout 2s"


def test_timeout_comes_from_the_environment_too(kafka: Any, tmp_path: Path) -> None:
    """STATESNAP_TIMEOUT sets the same deadline, also for a snapshot command on a topic store
    (whose own --timeout is the snapshot's deadline). An SSL client on a plaintext listener: Tansu
    never answers the TLS hello, Apache Kafka closes the connection; both are named as TLS."""
    bootstrap, url = kafka.bootstrap, str(tmp_path / "c")
    topic = kafka.create_topic(f"ops-env-{uuid.uuid4().hex[:8]}", 1)
    kafka.produce(topic, [(0, b"k", b"v")])
    store = f"topic:{topic}-snapshots"
    ok(
        statesnap(
            "materialize", "-b", bootstrap, "-t", topic, "--checkpoints", url, "--snapshot-store", store
        )
    )
    env = {"STATESNAP_TIMEOUT": "2s"}
    dump, seconds = _timed(
        "dump", "-b", bootstrap, "-t", "ops-env", "--kafka-config", "security.protocol=SSL", env=env
    )
    assert dump.returncode == 1
    assert "within 2s" in dump.stderr, dump.stderr[-2000:]
    assert "TLS handshake" in dump.stderr, dump.stderr[-2000:]
    assert "is security.protocol right" in dump.stderr, dump.stderr[-2000:]
    assert seconds < 12
    listed, seconds = _timed(
        *("snapshot", "list", url, "--table", topic, "--snapshot-store", store),
        *("-b", bootstrap, "--kafka-config", "security.protocol=SSL"),
        env=env,
    )
    assert listed.returncode == 1
    assert "within 2s" in listed.stderr, listed.stderr[-2000:]
    assert seconds < 12


def test_a_sasl_mismatch_names_what_librdkafka_saw(bootstrap: str) -> None:
    """SASL_PLAINTEXT with a mechanism the listener does not offer: Tansu answers the handshake
    with "Unsupported SASL mechanism", and the error says so with the hint, not only "no broker
    answered"."""
    result, _ = _timed(
        *("dump", "-b", bootstrap, "-t", "ops-sasl", "--timeout", "2s"),
        *("--kafka-config", "security.protocol=SASL_PLAINTEXT"),
        *("--kafka-config", "sasl.mechanism=SCRAM-SHA-512"),
        *("--kafka-config", "sasl.username=ops", "--kafka-config", f"sasl.password={SECRET}"),
    )
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert "authentication failed: SASL SCRAM-SHA-512 mechanism handshake failed" in last, last
    assert "is security.protocol right for this listener? (it is SASL_PLAINTEXT)" in last
    assert SECRET not in result.stderr


def _self_signed(tmp: Path) -> ssl.SSLContext:
    """A server-side TLS context with a throwaway certificate for 127.0.0.1."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=1))
        .not_valid_after(now + timedelta(hours=1))
        .sign(key, hashes.SHA256())
    )
    (tmp / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp / "cert.pem", tmp / "key.pem")
    return context


def test_a_plaintext_client_on_a_tls_listener_gets_the_hint(tmp_path: Path) -> None:
    """The reverse mismatch: the default PLAINTEXT client against a TLS listener (a loopback TLS
    endpoint here, standing in for a broker's SSL listener: the handshake fails before any Kafka
    byte is read). librdkafka only logs "Disconnected … in state APIVERSION_QUERY"; the error
    says the broker hung up on the first request and asks about security.protocol."""
    context = _self_signed(tmp_path)
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with contextlib.suppress(OSError, ssl.SSLError), conn:
                context.wrap_socket(conn, server_side=True).recv(1)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        address = f"127.0.0.1:{server.getsockname()[1]}"
        result, seconds = _timed("dump", "-b", address, "-t", "ops-plain", "--timeout", "2s")
    finally:
        stop.set()
        thread.join(5)
        server.close()
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"Error: BrokerUnavailableError: no Kafka broker answered at {address} within 2s")
    assert "the broker hung up on the first request — is security.protocol right for this listener? " in last
    assert "(it is PLAINTEXT)" in last
    assert seconds < 12


class _Lines:
    """A background reader of a pipe, so a test can wait for a line with a deadline."""

    def __init__(self, pipe: Any) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe: Any) -> None:
        for line in pipe:
            self.lines.append(line)

    def wait_for(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            assert time.monotonic() < deadline, (
                f"no {text!r} within {timeout}s: {''.join(self.lines)[-2000:]}"
            )
            time.sleep(0.1)


def test_summaries_count_and_time_what_they_say(kafka: Any, tmp_path: Path) -> None:
    """A first run reads "from the start of the topic" (it said "after checkpoint None"); auto's
    reason is a sentence (it said "crossover ≈ inf records"); a --follow run counts the records
    it read while following (it said 0) and times following and its final checkpoint apart (it
    gave the whole run's time). Tansu."""
    topic = kafka.create_topic(f"ops-follow-{uuid.uuid4().hex[:8]}", 2)
    kafka.produce(topic, [(i % 2, b"k%d" % (i % 50), b"v%d" % i) for i in range(300)])
    url = str(tmp_path / "ckpt")
    base = ["materialize", "-b", kafka.bootstrap, "-t", topic, "--checkpoints", url]
    first = statesnap(*base, "--engine", "auto")
    text = ok(first)
    assert re.fullmatch(
        rf"checkpoint 1 of {topic} by python: 50 keys, [\d,]+ bytes in \d+\.\d\ds "
        rf"\(read 300 records from the start of the topic\) → \S+\n",
        text,
    ), text
    engine_line = next(line for line in first.stderr.splitlines() if line.startswith("engine: "))
    assert "inf" not in engine_line, engine_line
    assert "None" not in engine_line, engine_line
    if spark_available():  # the number is Tansu's under-reported watermark: an estimate, as labelled
        assert re.search(
            r"the estimated backlog is [\d,]+ records: python ≈ \d+\.\ds, spark ≈ \d+\.\ds on \d+ cores; "
            r"Spark is (not expected to be faster at any backlog on \d+ cores|expected to be faster "
            r"above about [\d,]+ records)\)$",
            engine_line,
        ), engine_line

    proc = subprocess.Popen(
        [*STATESNAP, *base, "--engine", "python", "--follow", "--commit-interval", "1s"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    try:
        err = _Lines(proc.stderr)
        err.wait_for("following", 60)
        kafka.produce(topic, [(i % 2, b"k%d" % (i % 80), b"w%d" % i) for i in range(120)])
        time.sleep(4)  # the follower reads them within a poll or two (fetch.wait.max.ms is short)
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, "".join(err.lines)[-2000:]
    m = re.fullmatch(
        rf"checkpoint 2 of {topic} by python: 80 keys, [\d,]+ bytes, written in (\d+\.\d\d)s after "
        rf"following for (\d+\.\d\d)s \(read 120 records after checkpoint 1\) → \S+\n",
        out,
    )
    assert m, out
    written_s, followed_s = float(m[1]), float(m[2])
    assert followed_s >= 4
    assert written_s < followed_s


def test_diff_of_a_deleted_generation_is_snapshot_not_found(kafka: Any, tmp_path: Path) -> None:
    """`snapshot diff` names a deleted generation as `show` does (it raised BlobNotFoundError),
    on either engine, before any Spark starts. Tansu."""
    topic = kafka.create_topic(f"ops-diff-{uuid.uuid4().hex[:8]}", 1)
    url = str(tmp_path / "ckpt")
    for n in range(2):
        kafka.produce(topic, [(0, b"k%d" % i, b"v%d-%d" % (n, i)) for i in range(20)])
        ok(statesnap("materialize", "-b", kafka.bootstrap, "-t", topic, "--checkpoints", url, "-q"))
    snap = ["snapshot"]
    table = [url, "--table", topic]
    ok(statesnap(*snap, "delete", *table, "1"))
    shown = statesnap(*snap, "show", *table, "1")
    assert shown.returncode == 1
    assert "SnapshotNotFoundError" in shown.stderr
    for engine in ("python", "spark"):
        diffed = statesnap(*snap, "diff", *table, "1", "2", "--engine", engine, "--json")
        assert diffed.returncode == 1, diffed.stdout
        last = diffed.stderr.strip().splitlines()[-1]
        assert last.startswith("Error: SnapshotNotFoundError: no snapshot generation 1 "), last
        assert diffed.stdout == ""
    changed = ok(statesnap(*snap, "diff", *table, "2", "2", "--json"))
    assert (changed["changed"], changed["unchanged"], changed["examples"]) == (
        0,
        20,
        {"added": [], "removed": [], "changed": []},
    )


# Long: the same JSON from both engines' diff is proven by default (with per-store counts) by
# test_spark_diff_of_a_processor_answers_the_same_json (tests/integration/snapshot/).
@pytest.mark.long
@pytest.mark.spark
def test_diff_gives_the_same_counts_and_examples_on_both_engines(kafka: Any, tmp_path: Path) -> None:
    """`snapshot diff --engine spark --json` gave `"examples": {}`; both engines now name the same
    keys (fewer than the sample of each kind, so the examples are the whole sets). Tansu."""
    topic = kafka.create_topic(f"ops-diff2-{uuid.uuid4().hex[:8]}", 1)
    url = str(tmp_path / "ckpt")
    kafka.produce(topic, [(0, b"k%d" % i, b"v%d" % i) for i in range(10)])
    ok(statesnap("materialize", "-b", kafka.bootstrap, "-t", topic, "--checkpoints", url, "-q"))
    kafka.produce(topic, [(0, b"k1", b"changed"), (0, b"k2", None), (0, b"k3", None), (0, b"new", b"x")])
    ok(statesnap("materialize", "-b", kafka.bootstrap, "-t", topic, "--checkpoints", url, "-q"))
    expected = {"added": ["new"], "removed": ["k2", "k3"], "changed": ["k1"]}
    for engine in ("python", "spark"):
        args = ["snapshot", "diff", url, "--table", topic, "1", "2", "--engine", engine, "--json"]
        diff = ok(statesnap(*args))
        assert (diff["added"], diff["removed"], diff["changed"], diff["unchanged"]) == (1, 2, 1, 7), engine
        assert {k: sorted(v) for k, v in diff["examples"].items()} == expected, engine


_SERVICES_TEST = """
import json, os, time
from pathlib import Path


def test_hold_services(broker, s3_server, tmp_path):
    pids = [broker.pid, s3_server.pid]
    if os.environ.get("WITH_SPARK_CLUSTER"):
        from standalone import StandaloneCluster

        cluster = StandaloneCluster(tmp_path / "spark", workers=1, cores=1, memory="512m")
        cluster.start()
        pids += cluster.pids
    Path(os.environ["PIDS_FILE"]).write_text(json.dumps(pids))
    time.sleep(600)
"""


def _alive(pid: int) -> bool:
    """Running, not merely a zombie waiting for its new parent to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.parametrize(
    # Spark is long (suite budget): the same orphan guard (devstack/orphans.py) is proven by default
    # for the broker and moto processes.
    "spark",
    [False, pytest.param(True, marks=[pytest.mark.spark, pytest.mark.long])],
    ids=["tansu+moto", "spark"],
)
def test_services_die_with_a_killed_test_run(tmp_path: Path, spark: bool) -> None:
    """A test run killed by a timeout (SIGKILL: no fixture teardown, no atexit) takes its broker,
    its moto server (the venv's own) and its Spark standalone daemons with it. Before, they lived
    on as orphans. Linux (PR_SET_PDEATHSIG); Tansu, moto and Spark's master and worker JVMs."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the parent-death signal is Linux's")
    if spark and not spark_available():
        pytest.skip("a Spark standalone cluster needs pyspark and Java")
    tests = Path(__file__).resolve().parents[1]
    (tmp_path / "test_hold.py").write_text(_SERVICES_TEST)
    pids_file = tmp_path / "pids.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tests), str(tests / "integration" / "spark_cluster")]),
        "PIDS_FILE": str(pids_file),
        "WITH_SPARK_CLUSTER": "1" if spark else "",
    }
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider", "test_hold.py"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 180
        while not pids_file.exists():
            assert run.poll() is None, f"the inner pytest exited with {run.returncode}"
            assert time.monotonic() < deadline, "the inner pytest did not start its services in time"
            time.sleep(0.2)
        time.sleep(0.2)  # the file is written in one call; let it land
        pids = json.loads(pids_file.read_text())
        assert len(pids) == (4 if spark else 2)
        assert all(_alive(p) for p in pids)
        moto = Path(f"/proc/{pids[1]}/cmdline").read_bytes().split(b"\0")
        assert Path(sys.executable).with_name("moto_server") in {Path(a.decode()) for a in moto}
    finally:
        run.kill()  # SIGKILL, as a timeout does
        run.wait(30)
    deadline = time.monotonic() + 20
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in pids if _alive(p)], "services outlived the killed test run"
