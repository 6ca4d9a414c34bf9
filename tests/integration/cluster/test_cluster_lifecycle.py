"""The three-node cluster as a dev service: it dies with the process that started it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from statesnap.devstack.apache import apache_kafka_missing

pytestmark = pytest.mark.integration

_HOLD = """
import json, sys, time
from statesnap.devstack.cluster import ApacheKafkaCluster
c = ApacheKafkaCluster()
c.start()
print(json.dumps(c.pids), flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().split(")")[-1].split()[0] != "Z"


@pytest.mark.long
@pytest.mark.timeout(240)
def test_the_nodes_die_with_a_killed_owner() -> None:
    """Linux (PR_SET_PDEATHSIG, ``devstack.orphans``): SIGKILL of the process that started the
    three Apache Kafka 4.1.1 nodes (no stop(), no atexit) takes all three JVMs with it."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the parent-death signal is Linux's")
    if (missing := apache_kafka_missing()) is not None:
        pytest.skip(missing)
    owner = subprocess.Popen(
        [sys.executable, "-c", _HOLD], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert owner.stdout is not None
        pids = json.loads(owner.stdout.readline() or "[]")
        assert len(pids) == 3, pids
        assert all(_alive(p) for p in pids), pids
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait(30)
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in pids if _alive(p)], "cluster nodes outlived the process that started them"
