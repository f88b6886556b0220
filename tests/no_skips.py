"""A pytest plugin: with ``VOICE_GATEWAY_TESTS_NO_SKIPS`` set (.ci/run sets it), a skipped
test fails the run, its reason listed. In CI a skip is a test that did not run where it
must: mlx or mlx-audio that no longer imports (a dependency missing) skipped every model
test (fixtures_mlx), a Chromium that could not be installed the browser tests, and the run
was green. Without the variable nothing changes (the model tests skip without the mlx
extra). Registered in ``tests/conftest.py`` (``pytest_plugins``)."""

from __future__ import annotations

import os

import pytest

NO_SKIPS = "VOICE_GATEWAY_TESTS_NO_SKIPS"

_skipped: list[str] = []


def _note_skip(report: pytest.CollectReport | pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        _skipped.append(f"{report.nodeid}: {reason}")


pytest_collectreport = pytest_runtest_logreport = _note_skip


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _skipped and os.environ.get(NO_SKIPS) and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter) -> None:
    if _skipped and os.environ.get(NO_SKIPS):
        terminalreporter.section(f"skipped tests fail this run ({NO_SKIPS} is set)", red=True)
        for line in _skipped:
            terminalreporter.write_line(line)
