"""The fault suite's ledger: what was tried, what was found, and the summary printed at the end.

Every test takes the ``ledger`` fixture and counts what it injects (``ledger.tried("kills")``);
checks that find a defect record it (``ledger.found("wrong_tables", ...)``) and fail the test.
At the end of the session the summary lists both; a finding in a test that ends ``xfail`` is a
*known* defect (listed, not counted against the suite). Any other finding fails the session even
if its test somehow passed, so the printed "0" is a checked claim, not a decoration.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Generator
from dataclasses import dataclass, field

import pytest

#: What the suite injects.
TRIED = (
    "kills",
    "corruptions",
    "bad_inputs",
    "races",
    "infrastructure_faults",
    "url_forms",
    "parser_fuzz_cases",
    "security_cases",
    "cluster_faults",
)
#: ``security_cases``: a mistake connecting to the SASL_SSL listener (wrong password or CA, no
#: mechanism, plaintext against TLS, a split KEY VALUE), each through a fresh statesnap process.
#: ``cluster_faults``: a node of the three-node cluster killed or stopped, a quorum lost, a static
#: member fenced (tests/integration/cluster, whose conftest shares this ledger and its summary).
#: What must never happen.
#: ``parser_crashes``: a stored document made a parser raise anything but CorruptCheckpointError.
FINDINGS = ("wrong_tables", "data_lost", "hangs", "secret_leaks", "parser_crashes")


@dataclass
class Finding:
    kind: str
    nodeid: str
    detail: str
    known: bool = False


@dataclass
class FaultLedger:
    """Counters shared by the whole session (thread-safe: races count from threads)."""

    tried_counts: Counter[str] = field(default_factory=Counter)
    findings: list[Finding] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def tried(self, kind: str, n: int = 1) -> None:
        assert kind in TRIED, kind
        with self._lock:
            self.tried_counts[kind] += n

    def found(self, kind: str, nodeid: str, detail: str) -> None:
        assert kind in FINDINGS, kind
        with self._lock:
            self.findings.append(Finding(kind, nodeid, detail[:500]))

    def mark_known(self, nodeid: str) -> None:
        with self._lock:
            for f in self.findings:
                if f.nodeid == nodeid:
                    f.known = True

    def open_findings(self) -> list[Finding]:
        return [f for f in self.findings if not f.known]

    def summary_lines(self, mode: str) -> list[str]:
        found = Counter(f.kind for f in self.open_findings())
        known = Counter(f.kind for f in self.findings if f.known)
        lines = [f"fault injection summary (mode: {mode})"]
        lines += [f"  {k.replace('_', ' ')} tried: {self.tried_counts[k]}" for k in TRIED]
        for k in FINDINGS:
            extra = f"  (+{known[k]} in xfail tests: known defects)" if known[k] else ""
            lines.append(f"  {k.replace('_', ' ')} found: {found[k]}{extra}")
        for f in self.findings:
            tag = "known" if f.known else "FOUND"
            first = (f.detail.splitlines() or [""])[0]
            lines.append(f"  [{tag}] {f.kind}: {f.nodeid}: {first}")
        return lines


LEDGER_KEY = pytest.StashKey[FaultLedger]()


def session_ledger(config: pytest.Config) -> FaultLedger:
    if LEDGER_KEY not in config.stash:
        config.stash[LEDGER_KEY] = FaultLedger()
    return config.stash[LEDGER_KEY]


class CaseLedger:
    """The ledger as one test sees it: findings carry the test's node id."""

    def __init__(self, ledger: FaultLedger, nodeid: str) -> None:
        self._ledger = ledger
        self.nodeid = nodeid

    def tried(self, kind: str, n: int = 1) -> None:
        self._ledger.tried(kind, n)

    def found(self, kind: str, detail: str) -> None:
        self._ledger.found(kind, self.nodeid, detail)

    def fail(self, kind: str, detail: str) -> None:
        """Record a finding and fail the test with it."""
        self.found(kind, detail)
        pytest.fail(f"{kind}: {detail}", pytrace=False)

    def check(self, ok: bool, kind: str, detail: str) -> None:
        if not ok:
            self.fail(kind, detail)


# --- hooks, imported into tests/faults/conftest.py ----------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if hasattr(report, "wasxfail") and report.skipped:  # an expected failure: a known defect
        session_ledger(item.config).mark_known(item.nodeid)
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """The summary, once a session: tests/faults and tests/integration/cluster both register it."""
    if LEDGER_KEY not in config.stash or config.stash.get(_PRINTED_KEY, False):
        return  # no fault test ran, or the other conftest printed it
    config.stash[_PRINTED_KEY] = True
    terminalreporter.section("statesnap faults")
    for line in session_ledger(config).summary_lines(str(config.stash.get(MODE_KEY, "default"))):
        terminalreporter.write_line(line)


MODE_KEY = pytest.StashKey[str]()
_PRINTED_KEY = pytest.StashKey[bool]()


def is_long(config: pytest.Config) -> bool:
    """Long mode (``STATESNAP_FAULTS=long`` or ``--faults=long``), as tests/faults/conftest.py set it."""
    return config.stash.get(MODE_KEY, "default") == "long"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if LEDGER_KEY in config.stash and session_ledger(config).open_findings() and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
