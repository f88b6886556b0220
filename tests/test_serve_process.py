"""``ServeProcess`` (tests/servers.py) ends a gateway still running at a test's end as an
operator does: SIGTERM, so it shuts down cleanly (and writes its coverage data); it kills
only a process that did not stop, and then fails the test, which shows a shutdown defect."""

from __future__ import annotations

import signal
import sys

import pytest

from tests import servers
from tests.servers import ServeProcess


def test_a_gateway_left_running_is_stopped_with_sigterm_and_shuts_down_cleanly():
    # (it was killed: exit -9, and its shutdown never ran)
    with ServeProcess("--port", "0", "--http-port", "0", "--tts", "synthetic") as gw:
        gw.serving()
    assert gw.finish() == (0, "".join(gw.output))
    assert "shutting down" in "".join(gw.output)


# A process that takes SIGTERM and says so only once its handler is set: the test orders
# by that line, never by time.
IGNORES_SIGTERM = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                   "print('ignoring SIGTERM', flush=True); time.sleep(3600)")


def test_a_process_that_outlives_sigterm_is_killed_and_fails_the_test(monkeypatch):
    # (the bound is short here, and cannot be too short: the process never exits by itself)
    monkeypatch.setattr(servers, "STOP_BOUND_S", 0.5)
    process = ServeProcess(command=[sys.executable, "-c", IGNORES_SIGTERM])
    with pytest.raises(AssertionError, match="the process hung: still running 0.5 s after "
                                             "SIGTERM, so it was killed"):
        with process:
            process.wait_for(lambda line: line == "ignoring SIGTERM\n")
    assert process.finish()[0] == -9


def test_a_test_already_failing_keeps_its_own_error_when_the_process_hangs(monkeypatch):
    monkeypatch.setattr(servers, "STOP_BOUND_S", 0.5)
    process = ServeProcess(command=[sys.executable, "-c", IGNORES_SIGTERM])
    with pytest.raises(KeyError, match="the test's own"):
        with process:
            process.wait_for(lambda line: line == "ignoring SIGTERM\n")
            raise KeyError("the test's own")
    assert process.finish()[0] == -9


# ---- a leak in the process fails the test that started it (tests/leaky_gateway.py) ----

LEAKED = {
    "socket": r"ResourceWarning: unclosed <socket\.socket",
    # uvloop's, at its loop's close, which it then closes (the process exits 0, not hung)
    "transport": r"ResourceWarning: unclosed resource <TCPTransport",
    "task": r"ERROR asyncio: Task was destroyed but it is pending!\ntask: <Task pending "
            r"name='[^']+' coro=<_task\.<locals>\.forever\(\)",
    "coroutine": r"RuntimeWarning: coroutine 'sleep' was never awaited",
    "ignored": r"Exception ignored in: <function _ignored\.<locals>\.Broken\.__del__",
    # dropped in a cycle once the loop has closed: found by the collection before os._exit
    "cycle": r"ResourceWarning: unclosed <socket\.socket",
}


def leaky_gateway(kind: str) -> ServeProcess:
    return ServeProcess(command=[sys.executable, "-m", "tests.leaky_gateway", kind, "serve",
                                 "--port", "0", "--http-port", "0", "--tts", "synthetic"])


@pytest.mark.parametrize("kind", list(LEAKED))
def test_a_leak_in_the_gateway_process_fails_the_test_naming_it(kind):
    """A leak in a gateway process only went to its output, which no test read: the test
    passed. ``ServeProcess`` runs it with ResourceWarnings shown (Python ignores them) and
    fails the test with what the process printed of the leak."""
    gw = leaky_gateway(kind)
    with pytest.raises(AssertionError, match=r"the process leaked \(1\):\n[^\n]*"
                                             + LEAKED[kind]):
        with gw:
            gw.serving()
            gw.wait_for(lambda line: line == "leaked\n")
            gw.signal(signal.SIGTERM)
            assert gw.finish()[0] == 0


def test_the_same_gateway_leaking_nothing_passes():
    with leaky_gateway("none") as gw:
        gw.serving()
        gw.wait_for(lambda line: line == "leaked\n")
    assert gw.finish()[0] == 0


def test_a_test_already_failing_keeps_its_own_error_and_is_told_of_the_leak():
    gw = leaky_gateway("socket")
    with pytest.raises(KeyError, match="the test's own") as failed:
        with gw:
            gw.wait_for(lambda line: line == "leaked\n")
            raise KeyError("the test's own")
    assert "and the process leaked:\n" in failed.value.__notes__[0]
    assert "unclosed <socket.socket" in failed.value.__notes__[0]
