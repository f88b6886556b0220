"""Peer servers for bench/capacity.py, each run in its own venv (see their docstrings)."""

from __future__ import annotations

import resource
import socket
from typing import Any


def serve_uvicorn(app: Any, port: int) -> None:
    """Serve ``app`` the same way for every peer: uvicorn on uvloop + httptools, the
    websockets implementation without compression, a deep backlog and the process's file
    limit raised for thousands of sockets. Prints ``PORT <n>`` once bound (what
    ``capacity.Server`` waits for)."""
    import uvicorn

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(app, loop="uvloop", http="httptools", ws="websockets",
                            log_level="warning", backlog=4096, ws_ping_interval=20,
                            ws_ping_timeout=20, ws_per_message_deflate=False)
    uvicorn.Server(config).run(sockets=[sock])
