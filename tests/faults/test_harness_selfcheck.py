"""The suite's own checks can fail: a wrong table, lost rows, a leaked secret, a hang and left-over
debris are each detected and recorded. They write to a private ledger, not the session's."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from faults.harness import FAKE_SECRET, check_secrets, debris, file_location, judge, run_cli
from faults.ledger import CaseLedger, FaultLedger


@pytest.fixture
def private() -> tuple[FaultLedger, CaseLedger]:
    ledger = FaultLedger()
    return ledger, CaseLedger(ledger, "selfcheck")


def test_wrong_and_lost_rows_are_findings(private: tuple[FaultLedger, CaseLedger]) -> None:
    ledger, case = private
    expected = {b"a": b"1", b"b": b"2"}
    judge(case, "equal", dict(expected), expected)
    with pytest.raises(pytest.fail.Exception, match="data_lost"):
        judge(case, "lost", {b"a": b"1"}, expected)
    with pytest.raises(pytest.fail.Exception, match="wrong_tables"):
        judge(case, "wrong", {b"a": b"1", b"b": b"3"}, expected)
    assert [f.kind for f in ledger.open_findings()] == ["data_lost", "wrong_tables"]


def test_a_secret_in_output_is_a_finding(private: tuple[FaultLedger, CaseLedger]) -> None:
    ledger, case = private
    check_secrets(case, "Error: nothing to see", "clean")
    with pytest.raises(pytest.fail.Exception, match="secret_leaks"):
        check_secrets(case, f"Error: password={FAKE_SECRET}", "leaky")
    assert FAKE_SECRET not in ledger.findings[0].detail


def test_a_command_past_its_deadline_is_a_hang(private: tuple[FaultLedger, CaseLedger]) -> None:
    """A "broker" that accepts connections and never answers: statesnap waits out its 15 s
    deadline, far past this test's 3 s one."""
    ledger, case = private
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(pytest.fail.Exception, match="hangs"):
            run_cli(case, ["dump", "-b", address, "-t", "t", "--digest"], timeout=3)
    assert [f.kind for f in ledger.findings] == ["hangs"]


def test_debris_is_seen(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    (root / "c_t" / "data" / f"{1:020d}").mkdir(parents=True)
    (root / "c_t" / "data" / f"{1:020d}" / "p00000-base-0.parquet").write_bytes(b"orphan")
    assert debris(file_location(root)) == [f"data/{1:020d}/p00000-base-0.parquet"]
