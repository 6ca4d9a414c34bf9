"""A Spark user's first job: ``format("kafka")`` → ``format("statesnap-kafka")`` and nothing else.

Each job runs as a user runs it — a fresh ``python job.py`` (or ``spark-submit job.py``) with its own
SparkSession, never inside pytest — against the session's broker (Apache Kafka; Tansu without Java). The rows
are checked against a plain confluent-kafka consumer loop (``kafka.read_all``, read to partition EOF), not
against anything statesnap reads. Proven on Tansu: produce, ``assign`` and partition EOF, which is all the
source needs here.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from docsite.blocks import by_test
from statesnap.devstack.process import free_port

pytestmark = [pytest.mark.integration, pytest.mark.spark]

#: The venv the tests run in: the one a user would have activated.
VENV = Path(sys.prefix)
DOCS = Path(__file__).resolve().parents[3] / "docs"

#: A job as written for Spark's own Kafka source. The test swaps the format name and nothing else:
#: no statesnap import, no register() call.
KAFKA_JOB = """
import json, sys
from pyspark.sql import SparkSession

spark = SparkSession.builder.appName("orders-report").getOrCreate()
df = (
    spark.read.format("kafka")
    .option("kafka.bootstrap.servers", sys.argv[1])
    .option("subscribe", sys.argv[2])
    .option("startingOffsets", "earliest")
    .load()
)
for r in df.select("partition", "offset", "key", "value").collect():
    key = None if r.key is None else bytes(r.key).hex()
    value = None if r.value is None else bytes(r.value).hex()
    print("ROW", json.dumps([r.partition, r.offset, key, value]))
spark.stop()
"""

#: docs/spark-cluster.md's spark-submit line for a venv that is not activated.
SUBMIT_LINE = 'PYSPARK_PYTHON="$PWD/.venv/bin/python" .venv/bin/spark-submit job.py'


def _swapped_job(path: Path, extra: str = "") -> Path:
    text = KAFKA_JOB.replace('format("kafka")', 'format("statesnap-kafka")')
    assert text.count("statesnap") == 1  # only the format name changed
    if extra:
        text = text.replace("df = (", f"{extra}\ndf = (", 1)
    path.write_text(text)
    return path


def _plain_env() -> dict[str, str]:
    """A shell where the venv is NOT activated: no venv on PATH, no PySpark/Spark settings."""
    bin_dir = str(VENV / "bin")
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != bin_dir)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYSPARK_", "SPARK_", "VIRTUAL_ENV", "PYTHON"))
    }
    env["PATH"] = path
    return env


def _activated_env() -> dict[str, str]:
    """What ``source .venv/bin/activate`` does: the venv's bin first on PATH, VIRTUAL_ENV set."""
    env = _plain_env()
    env["PATH"] = f"{VENV / 'bin'}{os.pathsep}{env['PATH']}"
    env["VIRTUAL_ENV"] = str(VENV)
    return env


def _needs_java_and_venv() -> None:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs a Java runtime")
    if not (VENV / "pyvenv.cfg").exists():
        pytest.skip("the tests must run in a venv (a user's activated venv is the case proven)")


def _rows(stdout: str) -> list[tuple[int, int, bytes | None, bytes | None]]:
    out = []
    for line in stdout.splitlines():
        if line.startswith("ROW "):
            p, o, k, v = json.loads(line[4:])
            out.append(
                (p, o, None if k is None else bytes.fromhex(k), None if v is None else bytes.fromhex(v))
            )
    return sorted(out)


def _truth(kafka: Any, topic: str, partitions: int) -> list[tuple[int, int, bytes | None, bytes | None]]:
    return sorted((r.partition, r.offset, r.key, r.value) for r in kafka.read_all(topic, range(partitions)))


def _produce(kafka: Any, topic: str) -> None:
    kafka.create_topic(topic, 3)
    records: list[tuple[int, bytes | None, bytes | None]] = [
        (i % 3, f"k{i % 17}".encode(), f"v{i}".encode()) for i in range(300)
    ]
    records += [(1, b"k1", None), (2, None, b"no-key")]  # a tombstone and a keyless record
    kafka.produce(topic, records)


# Long: the same job (only the format name changed, no register) reading every record through
# PySpark's lookup of pyspark_statesnap is proven by default by
# test_docs_spark_submit_line_runs_from_a_venv_that_is_not_activated; only the launcher differs.
@pytest.mark.long
def test_users_own_job_reads_with_only_the_format_name_changed(
    kafka: Any, topic_name: str, tmp_path: Path
) -> None:
    """In an activated venv, ``python job.py`` with its own SparkSession finds ``statesnap-kafka``
    without ``register`` (PySpark's lookup of ``pyspark_*`` modules finds ``pyspark_statesnap``)
    and reads every record a plain consumer reads, nulls included."""
    _needs_java_and_venv()
    _produce(kafka, topic_name)
    job = _swapped_job(tmp_path / "job.py")
    done = subprocess.run(
        ["python", str(job), kafka.bootstrap, topic_name],  # `python` as the activated shell finds it
        cwd=tmp_path,
        env=_activated_env(),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert _rows(done.stdout) == _truth(kafka, topic_name, 3)


def _other_minor_python() -> str | None:
    """An interpreter of another minor version than this one (PATH, then pyenv's versions)."""
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    for minor in ("3.12", "3.13", "3.10", "3.9"):
        if minor == here:
            continue
        on_path = shutil.which(f"python{minor}", path=_plain_env()["PATH"])
        for found in [
            *([on_path] if on_path else []),
            *map(str, sorted(pyenv.glob(f"{minor}.*/bin/python{minor}"))),
        ]:
            # a pyenv shim of a version not selected does not run
            if subprocess.run([found, "-c", ""], capture_output=True, check=False).returncode == 0:
                return found
    return None


def test_workers_without_statesnap_are_one_line_at_register(tmp_path: Path) -> None:
    """``.venv/bin/python job.py`` from a shell where the venv is not activated: Spark's workers
    are ``python3`` from PATH, which cannot import statesnap. ``register(spark)`` says so in one
    line naming the fix (before: every read failed with Spark's 17-line
    ``PYTHON_DATA_SOURCE_ERROR``). No broker is contacted: the check fails first."""
    _needs_java_and_venv()
    env = {**_plain_env(), "HOME": str(tmp_path)}
    python3 = shutil.which("python3", path=env["PATH"])
    probe = [python3 or "python3", "-c", "import statesnap"]
    if python3 is None or subprocess.run(probe, capture_output=True, check=False).returncode == 0:
        pytest.skip("needs a python3 on PATH without statesnap (the un-activated case)")
    register = "from statesnap.spark import register\nregister(spark)"
    job = _swapped_job(tmp_path / "job.py", extra=register)
    done = subprocess.run(
        [str(VENV / "bin" / "python"), str(job), "127.0.0.1:9", "t"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 1
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("statesnap.errors.ConfigError")]
    assert len(errors) == 1, done.stderr[-4000:]
    (line,) = errors
    assert line.startswith("statesnap.errors.ConfigError: Spark's Python workers (python3 = "), line
    assert "cannot run statesnap (No module named" in line
    assert f"PYSPARK_PYTHON={VENV / 'bin' / 'python'}" in line
    assert "PYTHON_DATA_SOURCE_ERROR" not in done.stderr


#: One driver, one session per workers' Python (sessions restart cheaply; the JVM does not).
SESSIONS_JOB = """
import json, os, sys
from pyspark.sql import SparkSession
from statesnap.errors import ConfigError
from statesnap.spark import register

for case, python in json.loads(sys.argv[1]):
    os.environ["PYSPARK_PYTHON"] = python
    spark = SparkSession.builder.master("local[1]").getOrCreate()
    try:
        register(spark)
        print("CASE", case, "no error")
    except ConfigError as e:
        print("CASE", case, json.dumps(str(e)))
    spark.stop()
"""


# Long: the same register-time check and one-line refusal are proven by default by
# test_workers_without_statesnap_are_one_line_at_register (each case starts its own Spark).
@pytest.mark.long
def test_workers_whose_python_is_wrong_are_one_line_at_register(tmp_path: Path) -> None:
    """``PYSPARK_PYTHON`` naming a Python of another minor version, one that exits at once (a
    pyenv shim of a version not selected) or no program at all: ``register(spark)`` says which
    and how to fix it in one line (before: Spark's raw Java trace, dozens of lines)."""
    _needs_java_and_venv()
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\necho 'pyenv: python3.99: command not found' >&2\nexit 127\n")
    script.chmod(0o755)
    expected = {
        "exits-at-start": (str(script), "exited at start (pyenv: python3.99: command not found)"),
        "no-such-program": (str(tmp_path / "no-python"), "cannot be started (No such file or directory)"),
    }
    other = _other_minor_python()
    if other is not None:
        expected["other-version"] = (other, "(PySpark needs the same minor version)")
    (tmp_path / "job.py").write_text(SESSIONS_JOB)
    cases = json.dumps([(case, python) for case, (python, _problem) in expected.items()])
    done = subprocess.run(
        [str(VENV / "bin" / "python"), "job.py", cases],
        cwd=tmp_path,
        env={**_plain_env(), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    answers = dict(line[5:].split(" ", 1) for line in done.stdout.splitlines() if line.startswith("CASE "))
    assert set(answers) == set(expected), done.stdout
    for case, (python, problem) in expected.items():
        message = json.loads(answers[case])
        assert message.startswith(f"Spark's Python workers ({python}) "), message
        assert problem in message
        assert f"PYSPARK_PYTHON={VENV / 'bin' / 'python'}" in message
        assert "\n" not in message


def test_docs_spark_submit_line_runs_from_a_venv_that_is_not_activated(
    kafka: Any, topic_name: str, tmp_path: Path
) -> None:
    """docs/spark-cluster.md's ``spark-submit`` line, run by bash in a shell where the venv is not
    activated (``.venv/bin/spark-submit`` alone exits 127: "Could not find valid SPARK_HOME"),
    submits the swapped job and reads what a plain consumer reads."""
    _needs_java_and_venv()
    assert by_test(DOCS / "spark-cluster.md", "submit-line") == [f"{SUBMIT_LINE}\n"]
    _produce(kafka, topic_name)
    _swapped_job(tmp_path / "job.py")
    (tmp_path / ".venv").symlink_to(VENV, target_is_directory=True)
    done = subprocess.run(
        ["bash", "-c", f"{SUBMIT_LINE} {kafka.bootstrap} {topic_name}"],
        cwd=tmp_path,
        env=_plain_env(),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert _rows(done.stdout) == _truth(kafka, topic_name, 3)


def _docs_cluster_block() -> list[str]:
    """The block docs/spark-cluster.md marks ``<!-- docs-test: by … standalone-cluster -->``."""
    (block,) = by_test(DOCS / "spark-cluster.md", "standalone-cluster")
    return block.strip().splitlines()


def _alive_workers(ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as r:
            status = json.loads(r.read())
    except (OSError, ValueError):  # not up yet, or still serving HTML at /json/ while starting
        return 0
    return sum(1 for w in status.get("workers", []) if w.get("state") == "ALIVE")


def _python_without_statesnap(env: dict[str, str]) -> str | None:
    python3 = shutil.which("python3", path=env["PATH"])
    probe = [python3 or "python3", "-c", "import statesnap"]
    if python3 is None or subprocess.run(probe, capture_output=True, check=False).returncode == 0:
        return None
    return python3


def _bad_workers_get_the_cluster_wording(
    tmp_path: Path, env: dict[str, str], export: str, submit: str
) -> None:
    """The same submit with executors on a Python without statesnap: ``register`` answers in one
    line with the fix for a cluster (ship statesnap), not the local-mode one."""
    python3 = _python_without_statesnap(env)
    if python3 is None:
        return
    job = _swapped_job(tmp_path / "bad_job.py", extra="from statesnap.spark import register\nregister(spark)")
    confs = (
        f'--conf spark.pyspark.python={python3} --conf spark.pyspark.driver.python="$PWD/.venv/bin/python"'
    )
    line = submit.replace(" job.py", f" {confs} {job.name}")
    done = subprocess.run(
        ["bash", "-c", f"{export}\n{line} 127.0.0.1:9 t"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    out = done.stdout + done.stderr  # spark-submit merges the driver's stderr into its stdout
    errors = [ln for ln in out.splitlines() if ln.startswith("statesnap.errors.ConfigError")]
    assert done.returncode != 0
    assert len(errors) == 1, out[-4000:]
    (message,) = errors
    assert f"Spark's Python workers ({python3})" in message
    assert "ship statesnap and its dependencies to the executors" in message
    assert "local" not in message
    assert "activated" not in message


def test_bad_workers_on_a_cluster_are_told_to_ship_statesnap() -> None:
    """The one line ``register`` answers for workers without statesnap names the fix for where they
    run: on a cluster, ship statesnap to the executors, not the local-mode "activate the venv".
    The default-run check of the wording (no Spark needed); the long docs test below gets this
    line from a real standalone cluster."""
    from statesnap.spark.workers import _workers_problem

    message = _workers_problem("ModuleNotFoundError: No module named 'statesnap'", "python3", local=False)
    assert message.startswith("Spark's Python workers (python3) cannot run statesnap (No module"), message
    assert "ship statesnap and its dependencies to the executors" in message
    assert "local" not in message
    assert "activated" not in message


# Long (a minute of JVMs): a job submitted to a standalone cluster whose workers run the venv's
# Python is proven by default in spark_cluster/test_cluster.py, the docs' submit line from a venv
# that is not activated by test_docs_spark_submit_line_runs_from_a_venv_that_is_not_activated, the
# cluster wording by test_bad_workers_on_a_cluster_are_told_to_ship_statesnap.
@pytest.mark.long
def test_docs_standalone_cluster_block_runs_from_a_venv_that_is_not_activated(
    kafka: Any, topic_name: str, tmp_path: Path
) -> None:
    """docs/spark-cluster.md's block — a master and a worker started with the venv's
    ``spark-class`` (pip's pyspark has no ``sbin/``), then the job submitted to them with the
    venv's ``spark-submit`` — run by bash as written (ports changed) in a shell where the venv is
    not activated. The swapped job runs on the cluster's executor and reads what a plain
    consumer reads."""
    _needs_java_and_venv()
    export, master, worker, submit = _docs_cluster_block()
    mp, ui, wui = free_port(), free_port(), free_port()

    def ports(line: str) -> str:
        return line.replace("7077", str(mp)).replace("8080", str(ui)).replace("8081", str(wui))

    _produce(kafka, topic_name)
    _swapped_job(tmp_path / "job.py")
    (tmp_path / ".venv").symlink_to(VENV, target_is_directory=True)
    env = {**_plain_env(), "SPARK_LOG_DIR": str(tmp_path / "logs")}
    with (tmp_path / "daemons.log").open("wb") as log:
        daemons = subprocess.Popen(
            ["bash", "-c", "\n".join([export, ports(master), ports(worker), "wait"])],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # one process group: master, worker and its executors
        )
    try:
        deadline = time.monotonic() + 120
        while _alive_workers(ui) < 1:
            assert daemons.poll() is None, (tmp_path / "daemons.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp_path / "daemons.log").read_text()[-3000:]
            time.sleep(0.5)
        _bad_workers_get_the_cluster_wording(tmp_path, env, export, ports(submit))
        done = subprocess.run(
            ["bash", "-c", f"{export}\n{ports(submit)} {kafka.bootstrap} {topic_name}"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-4000:]
        assert f"spark://127.0.0.1:{mp}" in ports(submit)
        assert _rows(done.stdout) == _truth(kafka, topic_name, 3)
        assert any((tmp_path / "spark-work").iterdir())  # an executor of the worker ran the tasks
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(daemons.pid, signal.SIGTERM)
        try:
            daemons.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(daemons.pid, signal.SIGKILL)
            daemons.wait(5)


def test_register_keeps_the_source_pyspark_found(spark: Any) -> None:
    """In a session where PySpark's own lookup found ``statesnap-kafka`` (``pyspark_statesnap``),
    ``register`` leaves it in place — registering over it made Spark log a WARN line ("replaced a
    statically registered data source") at every call — and still adds the sources PySpark cannot
    find (one ``DefaultSource`` per module)."""
    from statesnap.spark import register

    manager = spark._jsparkSession.sessionState().dataSourceManager()
    identity = spark._jvm.System.identityHashCode

    before = identity(manager.lookupDataSource("statesnap-kafka"))
    register(spark)
    register(spark)
    assert identity(manager.lookupDataSource("statesnap-kafka")) == before
    assert manager.dataSourceExists("statesnap-checkpoint")
    assert manager.dataSourceExists("statesnap-kafka-ranges")
