"""Run mlx-audio's real HTTP server on 127.0.0.1, port 0; print the bound port on stdout.

Usage: ``python -m tests.tts_servers.mlx_audio_server``. The socket is bound and listening
before the port is printed, so a client may connect at once (the kernel queues it until
uvicorn accepts): no start-up polling.

On mlx[cpu] mlx-audio's inference worker crashes at start on ``mx.new_stream(mx.gpu)``;
``new_stream`` falls back to the CPU device when the GPU is unavailable (a shim for this
machine only, applied before ``mlx_audio.server`` is imported).
"""

from __future__ import annotations

import socket
import sys

import mlx.core as mx


def _cpu_fallback_new_stream(real):
    def new_stream(device):
        try:
            return real(device)
        except (RuntimeError, ValueError):
            return real(mx.cpu)

    return new_stream


def main() -> None:
    mx.new_stream = _cpu_fallback_new_stream(mx.new_stream)
    import uvicorn
    from mlx_audio.server import app

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    sys.exit(main())
