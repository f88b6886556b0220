"""What concurrent whole-file speech answers (``"stream": false``) cost the gateway in
memory, and how long their last byte takes, this tree against a baseline revision, same run.

    python bench/whole_speech_memory.py [--n 1 8 32] [--formats wav mp3] [--baseline main]

For each tree (this one, then the baseline's code checked out in a temporary ``git
worktree``), each format and each N, a fresh gateway runs as a child process, as the
README's first command runs it (``voice-gateway serve``: espeak, the replay LLM), on free
ports. N clients then ask at once for the same long answer: the 4 KB input ``"a\\n" *
2000`` at speed 0.25 (espeak clamps it to 0.46; each line a
sentence of its own: 3,096 s of audio, a 149 MB WAV, a 25 MB MP3), and read it
as fast as they can (the bytes are counted, not kept). The gateway's resident memory is
sampled every 5 ms meanwhile; the figures:

* ``rss0``: its RSS after a warm-up answer of the same format (PyAV imported, the engine
  warm), before the N requests (what the warm-up answer left behind is in it: the
  baseline's in-memory answer leaves tens of MB the allocator keeps);
* ``peak``: the highest RSS sampled while they ran, and its growth over ``rss0``;
* ``last byte``: seconds from sending the requests to the last byte of the last answer
  (and the median answer's);
* every answer's length is checked against its ``Content-Length``.

The temporary files of this tree's answers go where ``tempfile`` puts them (``TMPDIR``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.process_stats import rss_bytes  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
INPUT = "a\n" * 2000
SPEED = 0.25
SAMPLE_S = 0.005


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Sampler:
    """A thread sampling ``pid``'s RSS every ``SAMPLE_S`` until stopped; ``peak``."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes(self.pid))
            self._stop.wait(SAMPLE_S)


async def _one(client: httpx.AsyncClient, fmt: str) -> tuple[float, int]:
    """Seconds to the last byte, and the answer's length (checked against its header)."""
    t0 = time.perf_counter()
    got = 0
    body = {"input": INPUT, "response_format": fmt, "speed": SPEED, "stream": False}
    async with client.stream("POST", "/v1/audio/speech", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{fmt}: {response.status_code} {await response.aread()!r}")
        async for chunk in response.aiter_raw(1 << 16):
            got += len(chunk)
        length = int(response.headers["content-length"])
    if got != length:
        raise RuntimeError(f"{fmt}: {got} bytes of a Content-Length of {length}")
    return time.perf_counter() - t0, got


async def _round(http_port: int, pid: int, fmt: str, n: int) -> dict[str, float]:
    limits = httpx.Limits(max_connections=n + 1)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{http_port}", timeout=3600, limits=limits
    ) as client:
        await _one(client, fmt)  # warm-up: PyAV, the engine, the allocator's first arenas
        rss0 = rss_bytes(pid)
        with Sampler(pid) as sampler:
            t0 = time.perf_counter()
            results = await asyncio.gather(*(_one(client, fmt) for _ in range(n)))
            wall = time.perf_counter() - t0
    return {
        "rss0": rss0 / 2**20,
        "peak": sampler.peak / 2**20,
        "growth": (sampler.peak - rss0) / 2**20,
        "last": wall,
        "median": statistics.median(r[0] for r in results),
        "mb": results[0][1] / 1e6,
    }


def _gateway(tree: Path, log: IO[bytes]) -> tuple[subprocess.Popen[bytes], int]:
    """A gateway of ``tree`` started, its log to ``log``; its process and HTTP port."""
    port, http_port = _free_port(), _free_port()
    env = {**os.environ, "PYTHONPATH": str(tree)}
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from gateway.cli import entry; entry()",
            "serve",
            "--port",
            str(port),
            "--http-port",
            str(http_port),
        ],
        cwd=tree,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log,  # (a file: a pipe nobody reads would stop the gateway once full)
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # (a bench: polling its child's start is fine)
        if process.poll() is not None:
            raise RuntimeError(
                f"the gateway of {tree} exited: {Path(log.name).read_text()[-2000:]}"
            )
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{http_port}/health", timeout=1).status_code == 200:
                return process, http_port
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"the gateway of {tree} did not start")


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def run(label: str, tree: Path, formats: list[str], ns: list[int]) -> list[tuple[str, int, str]]:
    """Each format and N's line, printed, and as (format, N, line)."""
    lines = []
    for fmt in formats:
        for n in ns:
            with tempfile.NamedTemporaryFile(prefix="gateway-log-") as log:
                process, http_port = _gateway(tree, log)
                try:
                    r = asyncio.run(_round(http_port, process.pid, fmt, n))
                finally:
                    _stop(process)
            line = (
                f"{label:<10} {fmt:<4} N={n:<3} answer {r['mb']:5.1f} MB  rss0 "
                f"{r['rss0']:5.0f} MiB  peak {r['peak']:5.0f} MiB (+{r['growth']:.0f})  last byte "
                f"{r['last']:6.1f} s (median answer {r['median']:6.1f} s)"
            )
            print(line, flush=True)
            lines.append((fmt, n, line))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--formats", nargs="+", default=["wav", "mp3"])
    parser.add_argument(
        "--baseline", default="main", help="the revision to compare with (none: this tree alone)"
    )
    args = parser.parse_args()
    print(
        f"input {len(INPUT)} characters at speed {SPEED}; temporary files in "
        f"{tempfile.gettempdir()}",
        flush=True,
    )
    lines = run("this tree", ROOT, args.formats, args.n)
    if args.baseline != "none":
        with tempfile.TemporaryDirectory() as scratch:
            base = Path(scratch) / "baseline"
            subprocess.run(
                ["git", "worktree", "add", "-q", "--detach", str(base), args.baseline],
                cwd=ROOT,
                check=True,
            )
            try:
                lines += run(args.baseline[:10], base, args.formats, args.n)
            finally:
                subprocess.run(
                    ["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=False
                )
    print("\n".join(["", *(line for *_, line in sorted(lines, key=lambda x: x[:2]))]))


if __name__ == "__main__":
    main()
