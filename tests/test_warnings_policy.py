"""pyproject's filterwarnings: a deprecation raised from our code fails the test that reaches
it; one raised inside a dependency stays a warning. A leak (a ResourceWarning, wherever it is
raised) fails the test in which it shows."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from tests.hang_guard import HANG_S


def test_a_deprecated_api_our_code_calls_fails_the_test():
    with pytest.raises(DeprecationWarning, match="gone next release"):
        warnings.warn("gone next release", DeprecationWarning, stacklevel=1)
    with pytest.raises(PendingDeprecationWarning, match="going"):
        warnings.warn_explicit("going", PendingDeprecationWarning, "connection.py", 1,
                               module="gateway.io.connection")


@pytest.mark.parametrize("module", ["websockets.asyncio.server", "gateways", "testsuite"])
def test_a_deprecation_inside_a_dependency_stays_a_warning(module):
    with pytest.warns(DeprecationWarning, match="their own"):
        warnings.warn_explicit("their own", DeprecationWarning, "x.py", 1, module=module)


# ---- leaks: a ResourceWarning, or any exception Python could only print, fails the test ----

ROOT = Path(__file__).resolve().parents[1]

LEAKS = {
    # a socket dropped open: its __del__ warns (an "unraisable" exception)
    "socket": "import socket\n\n\ndef test_it():\n    socket.socket()\n",
    # an asyncio connection a test left to the garbage collector
    "connection": (
        "import asyncio\nimport socket\n\n\nasync def test_it():\n"
        "    with socket.create_server(('127.0.0.1', 0)) as listener:\n"
        "        await asyncio.open_connection(*listener.getsockname())\n"),
}

CLOSED = (
    "import asyncio\nimport socket\n\n\nasync def test_it():\n"
    "    with socket.create_server(('127.0.0.1', 0)) as listener:\n"
    "        _, writer = await asyncio.open_connection(*listener.getsockname())\n"
    "        writer.close()\n"
    "        await writer.wait_closed()\n")


def pytest_in(tmp_path: Path, *args: str, timeout: float = HANG_S
              ) -> subprocess.CompletedProcess[str]:
    """pytest in ``tmp_path`` with this project's pytest settings (pyproject) but not its
    conftest: ``args`` name the plugins of tests/ it loads (``-p tests.…``) and the files."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"),
         "--rootdir", str(tmp_path), "-p", "no:cacheprovider", "-q", *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT)})


def run_under_our_policy(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    """pytest on a test file of ``source`` with this project's pytest settings (pyproject)."""
    (tmp_path / "test_leak.py").write_text(source)
    return pytest_in(tmp_path, "test_leak.py")


@pytest.mark.parametrize("leak", list(LEAKS))
def test_a_test_that_leaks_fails(tmp_path, leak):
    """pyproject's filterwarnings make a ResourceWarning an error, and so an exception Python
    could only print (``PytestUnraisableExceptionWarning``: a warning in a ``__del__`` or at
    a loop's close is one): left a warning, a leak passed unseen, as ResourceWarnings are
    ignored by default."""
    run = run_under_our_policy(tmp_path, LEAKS[leak])
    assert run.returncode == 1, run.stdout + run.stderr
    assert "ResourceWarning: unclosed" in run.stdout and "\n1 failed in " in run.stdout, run.stdout


def test_a_test_that_closes_what_it_opened_passes(tmp_path):
    run = run_under_our_policy(tmp_path, CLOSED)
    assert run.returncode == 0, run.stdout + run.stderr


def test_a_resource_warning_is_an_error_wherever_it_is_raised():
    """Unlike a deprecation, not scoped to our modules: a leak's warning names the module
    of the ``__del__`` that found it (``socket``, ``asyncio.sslproto``), never ours."""
    with pytest.raises(ResourceWarning, match="unclosed"):
        warnings.warn_explicit("unclosed <socket.socket>", ResourceWarning, "socket.py", 1,
                               module="socket")


# ---- uvloop: a handle open at its loop's close fails the test, at once (tests/uvloop_leaks) ----

UVLOOP_TEST = (
    "import asyncio\nimport socket\nimport warnings\n\nimport uvloop\n\n\n"
    "def test_it():\n"
    "    with socket.create_server(('127.0.0.1', 0)) as listener:\n"
    "        async def main():\n{body}\n"
    "        uvloop.run(main())\n")

UVLOOP_LEAKS = {
    "server": ("TCPServer", "            await asyncio.start_server(lambda r, w: None, "
                            "'127.0.0.1', 0)\n"),
    # (returned, so held at the loop's close: dropped, the StreamWriter's __del__ would
    # warn first, as under asyncio)
    "connection": ("TCPTransport", "            return await asyncio.open_connection("
                                   "*listener.getsockname())\n"),
}

UVLOOP_CLOSED = (
    "            async def serve(reader, writer):\n"
    "                writer.close()\n                await writer.wait_closed()\n\n"
    "            server = await asyncio.start_server(serve, '127.0.0.1', 0)\n"
    "            reader, writer = await asyncio.open_connection(\n"
    "                *server.sockets[0].getsockname())\n"
    "            assert await reader.read() == b''  # (the server closed its end)\n"
    "            writer.close()\n            await writer.wait_closed()\n"
    "            server.close()\n            await server.wait_closed()\n"
    # (another warning goes on to pytest's summary as before)
    "            warnings.warn('not a leak', UserWarning)\n")


def run_with_the_plugin(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    """``run_under_our_policy`` with conftest's uvloop_leaks plugin, and pytest-timeout at
    HANG_S, not the suite's 300 s, for a close that hangs."""
    (tmp_path / "test_leak.py").write_text(source)
    return pytest_in(tmp_path, "-p", "tests.uvloop_leaks", "-o", f"timeout={HANG_S:g}",
                     "test_leak.py", timeout=2 * HANG_S)


@pytest.mark.parametrize("leak", list(UVLOOP_LEAKS))
def test_a_handle_open_at_a_uvloop_loops_close_fails_the_test_naming_it(tmp_path, leak):
    """uvloop warns of a handle open at its loop's close before it closes it: as an error
    (pyproject), the warning skipped the close and ``loop.close()`` waited for ever, until
    pytest-timeout (300 s). The plugin keeps that warning a warning and fails the test."""
    pytest.importorskip("uvloop")
    handle, body = UVLOOP_LEAKS[leak]
    run = run_with_the_plugin(tmp_path, UVLOOP_TEST.format(body=body))
    assert run.returncode == 1, run.stdout + run.stderr
    assert "Timeout" not in run.stdout, run.stdout
    assert "\n1 failed in " in run.stdout, run.stdout
    assert (f"Leaked: a uvloop loop found 1 handle(s) open (closing them): unclosed resource "
            f"<{handle} closed=False") in run.stdout, run.stdout


def test_a_uvloop_test_that_closes_what_it_opened_passes(tmp_path):
    pytest.importorskip("uvloop")
    run = run_with_the_plugin(tmp_path, UVLOOP_TEST.format(body=UVLOOP_CLOSED))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed, 1 warning in " in run.stdout and "UserWarning: not a leak" in run.stdout, \
        run.stdout


def test_conftest_registers_the_uvloop_leaks_plugin(pytestconfig):
    assert pytestconfig.pluginmanager.has_plugin("tests.uvloop_leaks")


# ---- a leak in a reference cycle fails a test of its own module (tests/leaks_by_module) ----

CYCLE_LEAK = (
    "import gc\nimport socket\n\ngc.disable()  # (the collector runs when this run says)\n\n\n"
    "def test_leaks():\n"
    "    holder = {}\n    holder['self'], holder['socket'] = holder, socket.socket()\n\n\n"
    "def test_after_it():\n    pass\n")
LATER_MODULE = "import gc\n\n\ndef test_later():\n    gc.collect()\n    gc.enable()\n"


@pytest.mark.parametrize("plugin", [True, False])
def test_a_leak_in_a_cycle_fails_its_own_module_not_a_later_one(tmp_path, plugin):
    """A socket dropped open inside a reference cycle warns only when the collector frees
    it: without the plugin, in whatever later test the collector runs (here a later module's,
    which then fails for a leak it did not make); with it, at the end of the module that
    made it, in its last test's teardown."""
    (tmp_path / "test_a.py").write_text(CYCLE_LEAK)
    (tmp_path / "test_b.py").write_text(LATER_MODULE)
    run = pytest_in(tmp_path, *(["-p", "tests.leaks_by_module"] if plugin else []), "-rA",
                    "test_a.py", "test_b.py")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "ResourceWarning: unclosed <socket.socket" in run.stdout, run.stdout
    if plugin:
        assert "ERROR test_a.py::test_after_it" in run.stdout, run.stdout
        assert "PASSED test_b.py::test_later" in run.stdout, run.stdout
    else:
        assert "PASSED test_a.py::test_after_it" in run.stdout, run.stdout
        assert "FAILED test_b.py::test_later" in run.stdout, run.stdout


def test_conftest_registers_the_leaks_by_module_plugin(pytestconfig):
    assert pytestconfig.pluginmanager.has_plugin("tests.leaks_by_module")
