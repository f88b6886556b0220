"""The benches' reads of a process's figures (bench/process_stats.py) and of the open-files
limit, on Linux and on macOS (the hub), where there is no /proc and the limits differ."""

from __future__ import annotations

import os
import re
import resource
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import capacity, peers, process_stats

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import socket, sys
held = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
ballast = bytearray(8 * 2**20)  # (resident: the bytes are written)
print("ready", flush=True)
sys.stdin.readline()
held.close()  # (at exit instead: a ResourceWarning under PYTHONWARNINGS=default)
"""


@pytest.fixture
def child() -> Iterator[tuple[int, int]]:
    """A process that holds one TCP connection to a port of ours and then waits, idle (its
    figures stay put): its pid and that port."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        with subprocess.Popen(
            [sys.executable, "-c", CHILD, str(port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        ) as proc:
            assert proc.stdout is not None and proc.stdin is not None
            try:
                assert proc.stdout.readline() == "ready\n"
                yield proc.pid, port
            finally:
                proc.stdin.close()
                proc.wait()


def without_proc(monkeypatch: pytest.MonkeyPatch) -> None:
    """Read as on macOS: through psutil, not /proc (psutil here reads /proc itself, by
    its own code; there it asks the kernel through libproc)."""
    monkeypatch.setattr(process_stats, "_proc", lambda: False)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="compares with /proc")
def test_psutil_gives_the_figures_proc_gives(child, monkeypatch):
    """The hub is a Mac: the benches read a process's figures there with psutil. They are
    the figures /proc gives here (the ones bench/*.md were measured with), in the same
    units, a TCP connection to a port left out of the descriptors as on Linux."""
    pid, port = child
    on_linux = (
        process_stats.cpu_seconds(pid),
        process_stats.rss_bytes(pid),
        process_stats.fd_count(pid),
        process_stats.fd_count(pid, port),
    )
    without_proc(monkeypatch)
    cpu, rss, fds, fds_not_to_port = (
        process_stats.cpu_seconds(pid),
        process_stats.rss_bytes(pid),
        process_stats.fd_count(pid),
        process_stats.fd_count(pid, port),
    )
    assert cpu == pytest.approx(on_linux[0], abs=2 / process_stats.HZ)
    assert rss == on_linux[1] > 8 * 2**20
    assert (fds, fds_not_to_port) == on_linux[2:]
    assert fds_not_to_port == fds - 1
    assert process_stats.fd_count(pid, port + 1 if port < 65535 else port - 1) == fds


@pytest.mark.parametrize("proc", [True, False], ids=["/proc", "psutil"])
def test_a_process_gone_is_an_oserror_on_either_path(proc, monkeypatch):
    """The soak tells a gateway that died under the load by the OSError of its next sample
    (a /proc read of a pid gone). psutil raises its own NoSuchProcess, which no ``except
    OSError`` caught: on the Mac a dead gateway ended the soak in a traceback."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # (reaped: not even a zombie)
    if not proc:
        without_proc(monkeypatch)
    elif not sys.platform.startswith("linux"):
        pytest.skip("no /proc here")
    for read in (process_stats.cpu_seconds, process_stats.rss_bytes, process_stats.fd_count):
        with pytest.raises(OSError):
            read(gone.pid)


@pytest.mark.parametrize("proc", [True, False], ids=["/proc", "psutil"])
def test_a_process_s_children_are_listed_on_either_path(child, proc, monkeypatch):
    """bench/espeak_worker.py weighs a gateway's espeak worker by finding it among the
    gateway's children; it read /proc/<pid>/task itself, which the hub has not."""
    pid, _ = child
    if not proc:
        without_proc(monkeypatch)
    elif not sys.platform.startswith("linux"):
        pytest.skip("no /proc here")
    assert process_stats.children(os.getpid()).count(pid) == 1
    assert process_stats.children(pid) == []


def test_without_psutil_the_bench_says_what_to_install(monkeypatch):
    without_proc(monkeypatch)
    monkeypatch.setitem(sys.modules, "psutil", None)  # (not installed)
    with pytest.raises(process_stats.ProcessStatsError, match=r"pip install psutil"):
        process_stats.rss_bytes(os.getpid())


def test_the_benches_read_process_figures_only_through_process_stats():
    """Every read of /proc and of ``ru_maxrss`` (KiB on Linux, bytes on macOS) is in
    bench/process_stats.py, which has a way for each platform. capacity, soak and gc_pause
    read /proc/<pid> themselves and failed on the hub at their first sample;
    engines_offline took ru_maxrss for KiB and reported bytes / 1024 as MiB there."""
    read = re.compile(r"""(open|Path|listdir|readlink)\(f?["']/proc/|\.ru_maxrss""")
    found = [
        f"{path.relative_to(ROOT)}: {line.strip()}"
        for path in sorted((ROOT / "bench").rglob("*.py"))
        if path.name != "process_stats.py"
        for line in path.read_text().splitlines()
        if read.search(line)
    ]
    assert found == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="compares with /proc")
def test_the_peak_rss_is_in_bytes():
    """``ru_maxrss`` is KiB on Linux (getrusage(2)): the peak in bytes is about /proc's
    VmHWM (each moves as the process does; a unit taken wrong is 1,024 times off)."""
    status = Path("/proc/self/status").read_text()
    hwm = int(re.search(r"^VmHWM:\s+(\d+) kB", status, re.M).group(1)) * 1024
    assert hwm / 2 < process_stats.peak_rss_bytes() < hwm * 2


class MacosOpenFilesLimit:
    """A FAKE of the kernel's open-files limits as macOS sets and enforces them (its
    setrlimit(2): the hard limit is unlimited by default, and a soft one above
    ``kern.maxfilesperproc``, 10,240 by default, unlimited included, is refused with
    EINVAL, which Python raises as ValueError). Nothing real is changed."""

    MAXFILESPERPROC = 10_240

    def __init__(self) -> None:
        self.limits = (256, resource.RLIM_INFINITY)

    def getrlimit(self, which: int) -> tuple[int, int]:
        assert which == resource.RLIMIT_NOFILE
        return self.limits

    def setrlimit(self, which: int, limits: tuple[int, int]) -> None:
        assert which == resource.RLIMIT_NOFILE
        soft, hard = limits
        if soft == resource.RLIM_INFINITY or soft > self.MAXFILESPERPROC:
            raise ValueError("current limit exceeds maximum limit")
        self.limits = (soft, hard)


@pytest.mark.parametrize(
    "raise_nofile", [capacity.raise_nofile, peers.raise_nofile], ids=["capacity", "peers"]
)
def test_the_benches_raise_the_open_files_limit_as_macos_allows(raise_nofile, monkeypatch):
    """The benches raised the soft limit to the hard one as such: on macOS, unlimited,
    which setrlimit refuses, so every capacity run (its clients, its servers) and every
    soak stopped at start. They now raise it as ``voice-gateway serve`` does."""
    mac = MacosOpenFilesLimit()
    monkeypatch.setattr(resource, "getrlimit", mac.getrlimit)
    monkeypatch.setattr(resource, "setrlimit", mac.setrlimit)
    raise_nofile()
    assert mac.limits == (MacosOpenFilesLimit.MAXFILESPERPROC, resource.RLIM_INFINITY)


def test_the_benches_raise_the_open_files_limit_to_the_hard_one():
    """Where the hard limit can be had (Linux), the soft one is raised to it, as before
    (here in a child: this process's limit must stay)."""
    code = (
        "import resource, sys; sys.path.insert(0, sys.argv[1])\n"
        "from bench import capacity, peers\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
        "got = capacity.raise_nofile()\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
        "peers.raise_nofile()\n"
        "print(got, resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)"
    )
    got, peers_got, hard = subprocess.run(
        [sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True, check=True
    ).stdout.split()
    if int(hard) == resource.RLIM_INFINITY:  # (macOS)
        assert int(got) == int(peers_got) == 10_240
    else:
        assert int(got) == int(peers_got) == int(hard) > 256
