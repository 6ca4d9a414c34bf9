"""Where the suite's time goes: seconds per test file and per directory (set-up, call and
tear-down), printed after the run — the figures a change to the default tier is judged by
(``--durations`` names single tests; a slow suite is usually a slow file's many tests)."""

from __future__ import annotations

from collections import defaultdict

import pytest

__all__ = ["pytest_runtest_logreport", "pytest_terminal_summary"]

_seconds: defaultdict[str, float] = defaultdict(float)
_SHOWN = 15


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _seconds[report.nodeid.split("::", 1)[0]] += report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _seconds:
        return
    folders: defaultdict[str, float] = defaultdict(float)
    for path, seconds in _seconds.items():
        folders[path.rsplit("/", 1)[0]] += seconds
    terminalreporter.section("suite time")
    total = sum(_seconds.values())
    terminalreporter.write_line(f"{total:8.0f} s  in all (test set-up, call and tear-down)")
    for folder, seconds in _most(folders):
        terminalreporter.write_line(f"{seconds:8.0f} s  {folder}/")
    for path, seconds in _most(_seconds):
        terminalreporter.write_line(f"{seconds:8.1f} s  {path}")


def _most(seconds: dict[str, float]) -> list[tuple[str, float]]:
    return sorted(seconds.items(), key=lambda item: -item[1])[:_SHOWN]
