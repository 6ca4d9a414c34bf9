"""Every code block of the README and of docs/ runs, as a reader runs it: one page at a time, in
document order, each block in a fresh process of the venv's interpreter, in a working directory of
its own, against the test stack (the session's broker — Apache Kafka where Java is there — or the
page's own ``statesnap broker``, which is Tansu; the moto S3 server). tests/docsite/blocks.py gives
the rules a page follows."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from docsite.blocks import ROOT, RUNNABLE, Block, Kind, blocks, page_name, pages
from statesnap.devstack import ApacheKafkaBroker, EmbeddedBroker
from statesnap.devstack.orphans import guarded
from statesnap.devstack.process import free_port
from statesnap.devstack.s3 import EmbeddedS3

PLACEHOLDER = "127.0.0.1:9092"
BLOCK_TIMEOUT = 300.0
BIN = Path(sys.executable).parent
ALL = {page_name(p): blocks(p) for p in pages()}
RUN_PAGES = [name for name, found in ALL.items() if any(b.kind is Kind.RUN for b in found)]


def test_every_block_is_run_shown_or_skipped_with_a_reason() -> None:
    """A block in a language the runner cannot run is a block nobody checks; a skip says why."""
    for found in ALL.values():
        for block in found:
            if block.kind in (Kind.RUN, Kind.BACKGROUND):
                assert block.language in RUNNABLE, f"{block.where}: ```{block.language} cannot run"
            if block.kind is Kind.FILE:
                assert block.title, block.where
                assert "/" not in block.title, f"{block.where}: a file block's title is its name"
            if block.kind is Kind.BY_TEST:
                test_file, _, name = block.reason.partition(" ")
                assert (ROOT / test_file).is_file(), f"{block.where}: no test {test_file}"
                assert name, f"{block.where}: a dedicated test's directive names the block"
                assert name in (ROOT / test_file).read_text(), f"{block.where}: {test_file} names no {name!r}"
            if block.kind is Kind.SKIPPED:
                assert block.reason, f"{block.where}: a skipped block says why"


def test_skipped_blocks_are_setup_commands() -> None:
    """Only the commands CI runs itself may be left out: setup and installation."""
    skipped = [b for found in ALL.values() for b in found if b.kind is Kind.SKIPPED]
    for block in skipped:
        assert re.search(r"setup\.sh|pip install|spark-submit|--master spark://", block.body), block.where
    assert len(skipped) <= 12, [b.where for b in skipped]


def test_the_readme_leads_in_at_most_250_lines() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


class _Background:
    """A page's background block (its own broker): started, waited for, stopped with the page."""

    def __init__(self) -> None:
        self.processes: list[subprocess.Popen[str]] = []

    def start(self, script: str, cwd: Path, env: dict[str, str], where: str) -> str:
        process = subprocess.Popen(
            guarded(["bash", "-euo", "pipefail", "-c", f"exec {script.strip()}"], signal.SIGTERM),
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.processes.append(process)
        assert process.stdout is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            ready, _, _ = select.select([process.stdout], [], [], 1.0)
            if ready:
                return process.stdout.readline()
            if process.poll() is not None:
                break
        raise AssertionError(f"{where}: the background block printed nothing in 120 s")

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(10)


@pytest.fixture
def background() -> Iterator[_Background]:
    b = _Background()
    yield b
    b.stop()


def _run(block: Block, source: str, cwd: Path, env: dict[str, str]) -> None:
    if block.language == "python":
        script = cwd / f".block-{block.line}.py"
        script.write_text(source)
        command = [sys.executable, script.name]
    else:
        command = ["bash", "-euo", "pipefail", "-c", source]
    try:
        result = subprocess.run(
            guarded(command, signal.SIGTERM),
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{block.where}: still running after {BLOCK_TIMEOUT:.0f} s") from e
    print(f"--- {block.where}\n{result.stdout}")  # shown with -s, and on a later block's failure
    assert result.returncode == 0, (
        f"{block.where} exited {result.returncode}\n--- block\n{source}\n--- stdout\n"
        f"{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}"
    )


@pytest.mark.parametrize("page", RUN_PAGES)
def test_the_page_runs(
    page: str,
    tmp_path: Path,
    kafka_broker: EmbeddedBroker | ApacheKafkaBroker,
    s3_server: EmbeddedS3,
    background: _Background,
) -> None:
    """The page's blocks, in order, exit 0. Proven on the session's broker (Apache Kafka where
    Java is there, else Tansu) or, on a page that starts ``statesnap broker``, on Tansu."""
    env = {
        **os.environ,
        **s3_server.env,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYSPARK_PYTHON": sys.executable,
        "STATESNAP_DOCS_TEST": "1",
    }
    env.pop("STATESNAP_BOOTSTRAP_SERVERS", None)
    address = kafka_broker.bootstrap_servers
    if "my-bucket" not in _buckets(s3_server):  # the bucket the pages' S3 examples name
        s3_server.create_bucket("my-bucket")
    for block in ALL[page]:
        if block.kind is Kind.FILE:
            assert block.title is not None
            (tmp_path / block.title).write_text(block.body.replace(PLACEHOLDER, address))
        elif block.kind is Kind.BACKGROUND:
            port = free_port()
            source = block.body.replace("--port 9092", f"--port {port}")
            background.start(source, tmp_path, env, block.where)
            address = f"127.0.0.1:{port}"
        elif block.kind is Kind.RUN:
            _run(block, block.body.replace(PLACEHOLDER, address), tmp_path, env)


def _buckets(s3: EmbeddedS3) -> set[str]:
    return {b["Name"] for b in s3.client().list_buckets().get("Buckets", [])}
