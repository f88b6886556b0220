"""pyproject's filterwarnings: a deprecation raised from our code fails the test that reaches
it; one raised inside a dependency stays a warning. A leak (a ResourceWarning, wherever it is
raised) fails the test in which it shows."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest


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


def run_under_our_policy(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    """pytest on a test file of ``source`` with this project's pytest settings (pyproject)."""
    (tmp_path / "test_leak.py").write_text(source)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"),
         "--rootdir", str(tmp_path), "-p", "no:cacheprovider", "-q", "test_leak.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)


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
