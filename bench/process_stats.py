"""A process's CPU time, resident memory and open descriptors, as the benches read them.

On Linux from ``/proc/<pid>`` (as every figure in bench/*.md was measured); elsewhere from
psutil (the dev extra's), as the hub is a Mac and macOS has no ``/proc``: the benches
failed there at their first sample (``FileNotFoundError: '/proc/<pid>/stat'``). Where
psutil is missing too, ``ProcessStatsError`` says what to install. A process that is gone
is a ``ProcessLookupError`` (an ``OSError``, as a ``/proc`` read of it raises one) on
either path, so the benches' "the server died under the load" handling holds on both.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
from pathlib import Path
from typing import Any

HZ = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


class ProcessStatsError(RuntimeError):
    """Neither ``/proc`` nor psutil: the bench cannot read a process's figures here."""


def _proc() -> bool:
    """Whether to read ``/proc`` (Linux) rather than ask psutil."""
    return sys.platform.startswith("linux")


def _process(pid: int) -> Any:
    """psutil's ``Process(pid)``; its errors mapped to ``OSError`` (``_mapped``)."""
    try:
        import psutil
    except ImportError:
        raise ProcessStatsError(
            f"the benches read a process's CPU, memory and descriptors from /proc, which "
            f"{sys.platform} lacks, or with psutil, which is not installed: "
            f"pip install psutil (the dev extra has it: pip install -e '.[dev]')"
        ) from None
    with _mapped(pid):
        return psutil.Process(pid)


@contextlib.contextmanager
def _mapped(pid: int) -> Any:
    """psutil's errors as the ``OSError`` a ``/proc`` read raises: a process gone (or a
    zombie, dead and not yet reaped) ``ProcessLookupError``, one not ours
    ``PermissionError``."""
    import psutil

    try:
        yield
    except psutil.NoSuchProcess as exc:  # (ZombieProcess included)
        raise ProcessLookupError(f"process {pid} is gone: {exc}") from None
    except psutil.AccessDenied as exc:
        raise PermissionError(f"process {pid}: {exc}") from None


def cpu_seconds(pid: int) -> float:
    """``pid``'s CPU time in user and system mode, its children's not included."""
    if _proc():
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / HZ  # utime, stime
    process = _process(pid)
    with _mapped(pid):
        times = process.cpu_times()
    return float(times.user + times.system)


def rss_bytes(pid: int) -> int:
    """``pid``'s resident memory now."""
    if _proc():
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE
    process = _process(pid)
    with _mapped(pid):
        return int(process.memory_info().rss)


def children(pid: int) -> list[int]:
    """The pids of ``pid``'s children (its own, not theirs): on Linux listed under the
    thread that started each (``/proc/<pid>/task/<tid>/children``)."""
    if _proc():
        return [int(child) for task in Path(f"/proc/{pid}/task").iterdir()
                for child in (task / "children").read_text().split()]
    process = _process(pid)
    with _mapped(pid):
        return [child.pid for child in process.children()]


def fd_count(pid: int, not_to_port: int | None = None) -> int:
    """``pid``'s open descriptors; with ``not_to_port``, not counting its TCP connections to
    that remote port."""
    if _proc():
        fds = os.listdir(f"/proc/{pid}/fd")
        if not_to_port is None:
            return len(fds)
        inodes = set()
        for table in ("tcp", "tcp6"):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                if int(fields[2].rsplit(":", 1)[1], 16) == not_to_port:  # (rem_address)
                    inodes.add(fields[9])
        kept = 0
        for fd in fds:
            with contextlib.suppress(OSError):  # (closed meanwhile)
                kept += (
                    os.readlink(f"/proc/{pid}/fd/{fd}").removeprefix("socket:[")[:-1] not in inodes
                )
        return kept
    process = _process(pid)
    with _mapped(pid):
        fds = process.num_fds()
        if not_to_port is None:
            return int(fds)
        to_port = {
            c.fd for c in process.net_connections("tcp") if c.raddr and c.raddr.port == not_to_port
        }
    return int(fds) - len(to_port)


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far. ``getrusage``'s ``ru_maxrss`` is in
    KiB on Linux and in bytes on macOS (getrusage(2) on each)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024
