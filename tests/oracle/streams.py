"""Kafka Streams itself, as the oracle of statesnap's operators named after its own.

:func:`oracle_classpath` builds ``tests/oracle/kafka-streams`` with Maven once (``scripts/setup.sh``
builds it too, so a test run on a set-up machine starts at once) and :func:`run_oracle` runs it over
an input topic on a real broker: every operator's updates land on ``PREFIX-<operator>`` topics
(see ``StreamsOracle.java`` for the topology, written as a Kafka Streams user writes it).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

PROJECT = Path(__file__).resolve().parent / "kafka-streams"
CLASSES = PROJECT / "target" / "classes"
LIB = PROJECT / "target" / "lib"
MAIN = "dev.statesnap.oracle.StreamsOracle"
#: Seconds Maven may take to resolve Kafka Streams and compile the oracle on a machine without them.
BUILD_TIMEOUT = 600.0


class OracleUnavailableError(Exception):
    """Java or Maven is missing, or the build failed: the oracle tests skip with this reason."""


def _stale() -> bool:
    """Whether a Java source has no class file, or one older than itself (an edited oracle)."""
    sources = PROJECT / "src" / "main" / "java"
    for java in sources.rglob("*.java"):
        built = CLASSES / java.relative_to(sources).with_suffix(".class")
        if not built.is_file() or built.stat().st_mtime < java.stat().st_mtime:
            return True
    return False


def oracle_classpath() -> str:
    """The oracle's class path, built first if it is not there yet."""
    if _stale() or not LIB.is_dir():
        if shutil.which("java") is None or shutil.which("mvn") is None:
            raise OracleUnavailableError("Kafka Streams oracle needs java and mvn on PATH")
        try:
            built = subprocess.run(
                ["mvn", "-q", "-B", "-Dstyle.color=never", "package"],
                cwd=PROJECT, capture_output=True, text=True, timeout=BUILD_TIMEOUT, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired as e:
            raise OracleUnavailableError(
                f"building the Kafka Streams oracle took over {BUILD_TIMEOUT:.0f}s"
            ) from e
        if built.returncode != 0:
            said = (built.stdout + built.stderr).strip().splitlines()
            raise OracleUnavailableError(
                f"building the Kafka Streams oracle failed: {said[-1] if said else '?'}"
            )
    return f"{CLASSES}:{LIB}/*"


@dataclass(frozen=True)
class Windowing:
    """The windows both sides use (milliseconds)."""

    size_ms: int
    grace_ms: int
    advance_ms: int


def run_oracle(
    bootstrap: str, topic: str, prefix: str, state_dir: Path, windowing: Windowing, timeout: float = 120.0
) -> int:
    """Run Kafka Streams over *topic* until it has processed every record there now; returns how
    many. A failure raises AssertionError with the oracle's last lines."""
    app_id = f"oracle-{prefix}"
    args = [
        "java", "-cp", oracle_classpath(), MAIN, bootstrap, topic, prefix, app_id, str(state_dir),
        str(int(timeout)), str(windowing.size_ms), str(windowing.grace_ms), str(windowing.advance_ms),
    ]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout + 60, check=False)
    assert done.returncode == 0, f"Kafka Streams oracle failed ({done.returncode}): {done.stderr[-3000:]}"
    processed: int = json.loads(done.stdout.strip().splitlines()[-1])["processed"]
    return processed


JOIN_MAIN = "dev.statesnap.oracle.JoinOracle"


@dataclass(frozen=True)
class JoinTopics:
    """The co-partitioned inputs of the join oracle: two streams and a table."""

    left: str
    right: str
    table: str


def run_join_oracle(
    bootstrap: str,
    topics: JoinTopics,
    prefix: str,
    state_dir: Path,
    window: tuple[int, int, int],
    timeout: float = 120.0,
) -> int:
    """Run Kafka Streams' joins (``JoinOracle.java``) over *topics* until its committed offsets
    reach the ends there now; *window* is (before, after, grace) in ms. Results land on
    ``PREFIX-inner|left|outer|table-inner|table-left``; returns how many input records there were."""
    classpath = oracle_classpath()
    if not (CLASSES / "dev/statesnap/oracle/JoinOracle.class").is_file():  # built before it existed
        shutil.rmtree(CLASSES)
        classpath = oracle_classpath()
    before, after, grace = window
    args = [
        "java", "-cp", classpath, JOIN_MAIN, bootstrap, topics.left, topics.right, topics.table, prefix,
        f"oracle-{prefix}", str(state_dir), str(int(timeout)), str(before), str(after), str(grace),
    ]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout + 60, check=False)
    assert done.returncode == 0, (
        f"Kafka Streams join oracle failed ({done.returncode}): {done.stderr[-3000:]}"
    )
    processed: int = json.loads(done.stdout.strip().splitlines()[-1])["processed"]
    return processed
