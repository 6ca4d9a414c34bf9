"""The CLI's log lines when stderr is a pipe (a log shipper, a CI log, ``2> file``): one record
per line, never wrapped. Run as a user runs the CLI: a fresh process of the venv's interpreter."""

from __future__ import annotations

import logging
import subprocess
import sys

from statesnap.cli import OneLineFormatter

STATESNAP = [sys.executable, "-m", "statesnap.cli"]


def test_log_records_are_not_wrapped_when_stderr_is_a_pipe() -> None:
    """librdkafka's connection failures (about 150 characters each) at DEBUG, against a port
    nothing listens on: every record is whole on its own line, and the typed error follows. Before
    the fix rich wrapped them at 80 columns (``Connection refused`` on a line of its own)."""
    result = subprocess.run(
        [*STATESNAP, "--log-level", "DEBUG", "dump", "-b", "127.0.0.1:1", "-t", "t", "--timeout", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    refused = [line for line in lines if "Connection refused" in line]
    assert refused, result.stderr[-2000:]
    for line in refused:
        assert " statesnap.librdkafka: FAIL " in line, line
        assert line.rstrip().endswith("(after 0ms in state CONNECT)") or "state CONNECT" in line, line
    assert max(len(line) for line in refused) > 80  # so a wrap at 80 columns would have shown
    assert lines[-1].startswith("Error: BrokerUnavailableError: no Kafka broker answered at 127.0.0.1:1")


def test_a_multi_line_record_stays_on_one_line() -> None:
    """A traceback or a message with newlines is one line, its newlines escaped."""
    try:
        raise ValueError("first\nsecond")
    except ValueError:
        record = logging.LogRecord(
            "x", logging.ERROR, __file__, 1, "failed:\n%s", ("detail",), sys.exc_info()
        )
    line = OneLineFormatter("%(levelname)s %(name)s: %(message)s").format(record)
    assert "\n" not in line
    assert line.startswith("ERROR x: failed:\\ndetail\\nTraceback")
    assert "ValueError: first\\nsecond" in line
