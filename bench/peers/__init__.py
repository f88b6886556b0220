"""Peer servers for bench/capacity.py, each run in its own venv (see their docstrings)."""

from __future__ import annotations

import resource
import socket
from typing import Any

MACOS_OPEN_MAX = 10_240
"""The most setrlimit takes for the soft limit of open files on macOS when the hard one is
unlimited, as there by default (gateway.cli's ``_MACOS_OPEN_MAX``)."""


def raise_nofile() -> None:
    """Raise the soft limit of open files to the hard one, or to ``MACOS_OPEN_MAX`` where
    the hard one is refused (macOS: "unlimited"), as ``voice-gateway serve`` does
    (``gateway.cli.raise_open_files_limit``, not imported: the peers run in venvs of their
    own, without the gateway's dependencies, and the bench's client processes would each
    import the gateway's configuration for it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for target in (hard, MACOS_OPEN_MAX):
        if target != resource.RLIM_INFINITY and soft >= target:
            return
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return
        except (ValueError, OSError):  # macOS refuses "unlimited" for the soft limit
            continue


def serve_uvicorn(app: Any, port: int) -> None:
    """Serve ``app`` the same way for every peer: uvicorn on uvloop + httptools, the
    websockets implementation without compression, a deep backlog and the process's file
    limit raised for thousands of sockets. Prints ``PORT <n>`` once bound (what
    ``capacity.Server`` waits for)."""
    import uvicorn

    raise_nofile()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(app, loop="uvloop", http="httptools", ws="websockets",
                            log_level="warning", backlog=4096, ws_ping_interval=20,
                            ws_ping_timeout=20, ws_per_message_deflate=False)
    uvicorn.Server(config).run(sockets=[sock])
