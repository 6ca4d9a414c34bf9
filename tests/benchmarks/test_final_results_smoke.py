"""benchmarks/final_results.py (issue #33's windowed count with final emission) stays runnable and
stays right: its smoke run, as a user runs it, on the suite's Apache Kafka broker.

The full run takes minutes and the peers' builds (Maven, Quix Streams' venv), so the suite runs
``--quick --skip-peers --no-exactly-once``: the plain loop and statesnap only, over a 20 k-record
backlog and a 5 s live phase. The script checks every contender's final results against the
plain loop's rule over the same input and exits 1 when statesnap's (or the plain loop's) differ;
this test also reads statesnap's row of the printed table, so a wrong result fails it either way.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from statesnap.devstack.apache import ApacheKafkaBroker

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "final_results.py"


def cells(line: str) -> list[str]:
    """The cells of one row of the rich table (header rows split on ┃, body rows on │)."""
    return [c.strip() for c in line.strip().strip("┃│").replace("┃", "│").split("│")]


COLUMNS = ("records/s", "vs plain loop", "backlog vs truth", "live p50 ms", "p99 ms", "live vs truth")


@pytest.mark.integration
@pytest.mark.long  # a benchmark smoke run (~20 s): not behaviour
def test_quick_run_checks_statesnap_final_results(apache_kafka: ApacheKafkaBroker) -> None:
    """On the suite's Apache Kafka 4.1.1 broker: the quick run ends 0, prints the table with the
    plain loop's and statesnap's rows, and statesnap's final results over the backlog and the
    live input equal the plain loop's (``ok`` in both check columns), every live one received."""
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            *("--quick", "--skip-peers", "--no-exactly-once"),
            *("--bootstrap", apache_kafka.bootstrap_servers),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = done.stdout
    for column in COLUMNS:
        assert column in table, f"column {column!r} missing from:\n{table}"
    lines = table.splitlines()
    header = next(cells(line) for line in lines if line.startswith("┃"))
    body = [cells(line) for line in lines if line.startswith("│")]
    rows = {row[0]: dict(zip(header, row, strict=True)) for row in body}
    assert {"plain loop", "statesnap"} <= rows.keys(), table
    statesnap = rows["statesnap"]
    assert statesnap["backlog vs truth"] == "ok", table
    assert statesnap["live vs truth"] == "ok", table
    received, expected = (int(x) for x in statesnap["live results"].split("/"))
    assert expected > 0, table
    assert received == expected, table
    assert "MISMATCH" not in table
