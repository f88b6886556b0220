"""Capacity of one gateway process (issue 9): idle sessions, streaming sessions, and peers.

    python bench/capacity.py --setup-peers  # once: the peers' venvs (PyPI, pinned versions)
    python bench/capacity.py idle   [--sessions 10000] [--json OUT]
    python bench/capacity.py stream [--targets gateway fastapi pipecat] [--ramp 50 100 200 ...]
                                    [--seconds 15] [--clients 1] [--marks-ms 0] [--json OUT]

Every server runs in its own process (the gateway: bench/capacity_server.py with this
interpreter, the synthetic engine at zero cost; the peers: bench/peers/*.py in their own
venvs under ``$PEER_VENVS``, default /work/peer-venvs, made by ``--setup-peers`` with the
versions in ``PEER_PACKAGES``); its CPU time
(utime+stime) and resident memory are read from /proc/<pid> (psutil on macOS:
bench/process_stats.py). The load comes from
``--clients`` separate client processes: a lean raw-socket WebSocket client (asyncio
protocol under uvloop, no library per message) so that the client costs less than the
servers it measures; on this 2-core machine the client still competes for CPU, so its CPU
is reported too.

``idle``: open N sessions that do nothing (the gateway: wait for ``session.created``);
report accept time and the server's RSS per session.

``stream``: N sessions each in one continuous turn (a long ``say``; pipecat: a
``TTSSpeakFrame`` on connect), 40 ms frames. One ``say`` holds at most 4,000 characters
(~286 s of speech) for connecting, ``--warmup`` and the window: a longer step is refused.
Each client plays its audio on a model playback clock: lateness of a frame = arrival −
(first frame arrival + audio before it + every stall before it; a stall — an underrun —
pushes the listener's schedule back by its length);
underrun = a frame arrives after the listener, who started playing ``--jitter-ms`` after the
first frame, has played everything before it (playback then restarts at arrival). Lateness
and underruns are judged over the measuring window (after every session has connected and
``--warmup`` has passed); underruns while the others were still connecting are reported
apart as ``startup_underruns`` (the "start" column). A step passes when p99 lateness
≤ 40 ms, no underruns in the window, every session streamed and none had its turn end
before the window did (``ended``), no ``error`` event came (``err``), and the clients
received at least 99 % of real time (``realtime_share``): a server with a lead can fall
behind for a whole window before anyone underruns. Each session's audio counts between the
frames that left it the most audio unplayed near the window's start and near its end
(``Listener.delivered``): the gateway sends 300-400 ms of audio at a time, and the frames
inside a window that cut through those refills read 98.4 % of real time (4 s, 5 sessions;
115 % at 1.5 s) from a gateway keeping up. The ramp stops at the first failing step.
``--marks-ms 250``: the gateway's clients also report playback every 250 ms, as real
clients do (the server then frees its resume buffer as they go: resident memory per
streaming session); off by default, since the peers get none. CPU seconds per 1,000
frames = the server's CPU in the measuring window / frames the clients received in it.
The gateway's own probes, read from its /metrics over the window: ``lag99``/``lagmax``,
how late its event loop woke a 100 ms timer (bucket bounds), and ``gc2``/``gc2max``, how
many full garbage collections ran and the bound of the longest (``--no-freeze``: without
``gc.freeze()`` after start-up, the baseline).

The exit status is 1 when a ramp's target passed no step, or a step failed with errors or
turns ended early (broken rather than loaded), or the profile run failed; a ramp whose last
step fails on underruns or pace has found the limit it was run for (the summary says the
largest N that passed) and exits 0. A server that dies during a step, or a client process
that ends before it said it was ready or sent its figures (an import error, killed, out of
memory: noticed within half a second, not when the 600 s or 120 s wait for them runs out),
stops the run there with status 1, naming the process and its exit code (no summary, no
``--json``). A gateway that printed a leak (it runs with ResourceWarnings shown: an
unclosed socket, a task destroyed pending) fails the run too, the leak said on stderr and
its log kept. Each server's stderr goes to
/tmp/capacity-<target>-<pid>.log, kept (and its path said on stderr) only for the step that
failed the run, or a server that died or did not stop as told; removed otherwise.
Ctrl-C stops the run: the steps measured until then keep their rows, the summary and
``--json`` (its ``meta`` says ``interrupted``); the exit status is 130. The client processes
of the step it stops (or of a step that failed with an error) get SIGTERM; one still
running 10 s later is killed, and stderr says so (``client process <pid> had not ended``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import multiprocessing as mp
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from array import array
from pathlib import Path
from queue import Empty
from typing import Any, cast

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import peers  # noqa: E402
from bench.process_stats import cpu_seconds, rss_bytes  # noqa: E402
from gateway.core.codec import MAX_TEXT_CHARS  # noqa: E402

MAX_LATENESS_MS = 40.0
MIN_REALTIME_SHARE = 0.99

PEER_VENVS = Path(os.environ.get("PEER_VENVS", "/work/peer-venvs"))
PYTHONS = {
    "gateway": sys.executable,  # the gateway runs in this project's own environment
    "fastapi": str(PEER_VENVS / "fastapi" / "bin" / "python"),
    "pipecat": str(PEER_VENVS / "pipecat" / "bin" / "python"),
}
PEER_PACKAGES = {
    # the versions the figures in bench/CAPACITY.md were measured with
    "fastapi": ["fastapi==0.165.0", "uvicorn==0.54.0", "uvloop==0.23.0", "httptools==0.9.0",
                "websockets==17.4", "numpy==2.4.6"],
    "pipecat": ["pipecat-ai==1.14.0", "fastapi==0.165.0", "uvicorn==0.54.0", "uvloop==0.23.0",
                "httptools==0.9.0", "websockets==17.4", "numpy==2.4.6"],
}
PY_SPY = Path(sys.executable).parent / "py-spy"
"""The profiler of ``profile`` (the dev extra's). On macOS it must run as root (it reads
another process's memory): without sudo it exits at once, and the bench said only
"FileNotFoundError" on the missing profile, or read an earlier run's as this one's."""
SCRIPTS = {
    "gateway": ROOT / "bench" / "capacity_server.py",
    "fastapi": ROOT / "bench" / "peers" / "fastapi_server.py",
    "pipecat": ROOT / "bench" / "peers" / "pipecat_server.py",
}


MAX_SAY_CHARS = MAX_TEXT_CHARS
"""The gateway's limit on a ``say`` (protocol.md: ``text_too_long`` past it)."""
CHARS_PER_S = 14  # the synthetic engine's speech rate


def long_text(seconds: float) -> str:
    """Plain sentences lasting about ``seconds`` of synthetic speech (14 chars/s)."""
    out: list[str] = []
    k = 0
    while sum(len(s) + 1 for s in out) < seconds * CHARS_PER_S:
        k += 1
        out.append(f"This is sentence number {k} of a long reply, spoken to keep the audio "
                   f"flowing for the listener.")
    return " ".join(out)[:MAX_SAY_CHARS]


def say_needed_s(n: int, seconds: float, warmup: float) -> float:
    """Audio one session's ``say`` must hold: connecting ``n`` sessions, the warm-up and the
    window, with margin."""
    return seconds + warmup + 20 + n / 200


def raise_nofile() -> int:
    """Raise this process's soft limit of open files as ``voice-gateway serve`` does (to
    the hard one; on macOS, whose hard one is unlimited and which refuses an unlimited soft
    one, to 10,240: ``peers.raise_nofile``) and return it. Raised to the hard one as such,
    every bench run on macOS stopped at its start ("ValueError: current limit exceeds
    maximum limit")."""
    peers.raise_nofile()
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


LEAKED: list[str] = []
"""What the gateway processes of this run printed of a leak (``Server.leaks``): the run
fails."""


class Server:
    """One server process; ``PORT <n>`` on its stdout says it is serving. Its stderr goes
    to /tmp/capacity-<target>-<our pid>.log (one run's own: runs side by side each wrote
    over the other's log, a failing step's included), or to ours with ``log=False``. The
    log is kept only when the server's run failed (``close``): every run left one behind.
    It runs in a session of its own: a Ctrl-C in the terminal is the bench's to handle
    (the soak's: stop the load, then probe the server), not a signal that stops the
    server under the load.

    As a context manager it closes on the way out, the run failed when ``failed`` was set
    or an exception other than Ctrl-C ended the block (a server that died, a bench bug).

    The gateway runs with ResourceWarnings shown (``leak_checked_env``), and what it printed
    of a leak (an unclosed socket, a task destroyed pending: tests/servers.py
    ``leaks_said``) is in ``leaks`` once it is closed, said on stderr and in ``LEAKED``: the
    run fails (its log kept). Its log went to a file nobody read once the run passed, or
    by ``log=False`` to ours, passed on line by line (and read)."""

    def __init__(self, target: str, *extra: str, log: bool = True) -> None:
        self.target = target
        if not Path(PYTHONS[target]).exists():
            raise SystemExit(f"{target}: no venv at {Path(PYTHONS[target]).parents[1]}; "
                             "run `python bench/capacity.py --setup-peers` once")
        self.logfile = logfile = f"/tmp/capacity-{target}-{os.getpid()}.log" if log else None
        self.failed = False
        """The run failed: ``close`` keeps the log."""
        self.leaks: list[str] = []
        """What the gateway printed of a leak, once closed."""
        checked = target == "gateway"  # (the peers' leaks are not ours to fix)
        # (here, not at the top: each client process, spawned, imports this module)
        from tests.servers import leak_checked_env
        self._said: list[str] = []
        with open(logfile, "w") if logfile else contextlib.nullcontext(
                subprocess.PIPE if checked else None) as stderr:
            self.proc = subprocess.Popen(
                [PYTHONS[target], str(SCRIPTS[target]), "--port", "0", *extra],
                stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=ROOT,
                start_new_session=True, env=leak_checked_env() if checked else None)
        self._passing_on = None
        if self.proc.stderr is not None:
            self._passing_on = threading.Thread(target=self._pass_on, args=(self.proc.stderr,),
                                                daemon=True, name=f"{target} log")
            self._passing_on.start()
        assert self.proc.stdout is not None
        try:
            line = self.proc.stdout.readline()
        except KeyboardInterrupt:  # (in a session of its own, nothing else would stop it)
            self._kill()
            self._drop_log()  # (stopped, not failed)
            raise
        if not line.startswith("PORT "):
            self._kill()
            raise RuntimeError(f"{target} server did not start: {line!r}"
                               + (f"; see {logfile}" if logfile else ""))
        self.port = int(line.split()[1])
        self.pid = self.proc.pid

    def _pass_on(self, log: Any) -> None:
        """``log=False``: the server's stderr on ours, as it comes, and kept for ``leaks``."""
        for line in log:
            self._said.append(line)
            sys.stderr.write(line)
            sys.stderr.flush()

    def _find_leaks(self) -> None:
        from tests.servers import leaks_said

        if self.target != "gateway":
            return
        if self._passing_on is not None:
            self._passing_on.join(10)
            said = "".join(self._said)
        else:
            said = Path(self.logfile).read_text() if self.logfile else ""
        self.leaks = leaks_said(said)
        if self.leaks:
            LEAKED.extend(self.leaks)
            self.failed = True
            print(f"the {self.target} server leaked ({len(self.leaks)}):\n"
                  + "\n".join(self.leaks), file=sys.stderr, flush=True)

    def check_alive(self) -> None:
        """A server that printed its port and then died (a missing module, a crash) would
        otherwise show as a row of zero sessions."""
        code = self.proc.poll()
        if code is not None:
            raise SystemExit(f"{self.target} server exited with {code} during the run"
                             + (f"; see {self.logfile}" if self.logfile else ""))

    def close(self, timeout: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout`` seconds; the exit code. The log is kept,
        its path said on stderr, when the run ``failed`` or the server did not stop as
        told (exited otherwise than 0 or by the SIGTERM, or killed); else it is removed."""
        self.proc.terminate()
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            code = self._kill()
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        self._find_leaks()
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        if self.logfile is not None:
            if self.failed or code not in (0, -signal.SIGTERM):
                print(f"{self.target} server log: {self.logfile}", file=sys.stderr,
                      flush=True)
            else:
                self._drop_log()
        return code

    def _kill(self) -> int:
        """SIGKILL, reaped, its stdout pipe closed; the exit code. A server left unreaped
        stayed a zombie, and its pipe open (a ResourceWarning), until the bench exited."""
        self.proc.kill()
        code = self.proc.wait()
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        if self._passing_on is not None:
            self._passing_on.join(10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return code

    def _drop_log(self) -> None:
        if self.logfile is not None:
            Path(self.logfile).unlink(missing_ok=True)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is not None and not issubclass(kind, KeyboardInterrupt):
            self.failed = True
        self.close()


# ---- a lean WebSocket client ---------------------------------------------------------------

def _masked(opcode: int, payload: bytes) -> bytes:
    mask = os.urandom(4)
    n = len(payload)
    head = bytes([0x80 | opcode])
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65536:
        head += bytes([0x80 | 126]) + n.to_bytes(2, "big")
    else:
        head += bytes([0x80 | 127]) + n.to_bytes(8, "big")
    key = int.from_bytes((mask * (n // 4 + 1))[:n], "little")
    body = (int.from_bytes(payload, "little") ^ key).to_bytes(n, "little")
    return head + mask + body


class Listener(asyncio.Protocol):
    """One session: handshake, then parse server frames; audio goes to the playback model."""

    def __init__(self, target: str, say: str, stats: Stats, jitter_s: float,
                 idle: bool = False, marks_s: float = 0.0) -> None:
        self.target, self.say, self.stats, self.jitter = target, say, stats, jitter_s
        self.idle = idle
        self.marks_s = marks_s if target == "gateway" else 0.0
        """Report playback every ``marks_s`` seconds, as protocol.md asks of clients (0: no
        marks; only the gateway understands them)."""
        self.turn_id: int | None = None
        self.next_mark = 0.0
        self.buf = bytearray()
        self.upgraded = False
        self.ready = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport  # (connection_made: before anything else)
        self.t0: float | None = None  # first frame arrival
        self.audio_s = 0.0  # audio received before the current frame
        self.play_end = 0.0
        self.done = False
        self.closed = False
        self.at_start: tuple[float, float] | None = None
        """(arrival, audio received before it) of this session's first frame in the window."""
        self.head: tuple[float, float, float] | None = None
        """(lead, arrival, audio received) after the frame that left the most audio unplayed
        in the window's first ``Stats.edge_s``; ``tail``: in its last (``delivered``)."""
        self.tail: tuple[float, float, float] | None = None

    def peak(self, now: float) -> None:
        """Keep this frame as ``head`` or ``tail`` if it left the most audio unplayed yet."""
        s, mark = self.stats, (self.play_end - now, now, self.audio_s)
        if now <= s.t_start + s.edge_s and (self.head is None or mark[0] > self.head[0]):
            self.head = mark
        if now >= s.t_end - s.edge_s and (self.tail is None or mark[0] >= self.tail[0]):
            self.tail = mark

    def delivered(self) -> tuple[float, float]:
        """Audio received over time taken, between the window's two peaks of buffered audio
        (``head``, ``tail``): real time keeps the peak where it was, and a server that falls
        behind lowers it. (Every frame of the window over its length read 98.4 % of real
        time from a gateway keeping up, whose 300-400 ms refills a window's edges cut.) An
        edge without a frame counts from the window's first one or to its end."""
        s = self.stats
        if self.at_start is None:  # nothing in the window
            return 0.0, s.t_end - s.t_start
        start = self.head[1:] if self.head is not None else self.at_start
        end = self.tail[1:] if self.tail is not None else (s.t_end, self.audio_s)
        if end[0] <= start[0]:  # (one frame in a short window)
            return 0.0, 0.0
        return end[1] - start[1], end[0] - start[0]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # (create_connection: a stream)
        key = base64.b64encode(os.urandom(16)).decode()
        self.transport.write((f"GET /v1/voice HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                              f"Upgrade: websocket\r\nConnection: Upgrade\r\n"
                              f"Sec-WebSocket-Key: {key}\r\n"
                              f"Sec-WebSocket-Version: 13\r\n\r\n").encode())

    def connection_lost(self, exc) -> None:
        self.closed = True
        if not self.ready.done():
            self.ready.set_exception(ConnectionError("closed before ready"))

    def send_text(self, text: str) -> None:
        self.transport.write(_masked(1, text.encode()))

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        if not self.upgraded:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            status = bytes(buf[:12])
            del buf[:end + 4]
            if b" 101" not in status:
                self.transport.close()
                return
            self.upgraded = True
            if self.target == "pipecat" or (self.idle and self.target == "fastapi"):
                self.ready.set_result(None)
            elif self.target == "fastapi":
                self.send_text(json.dumps({"type": "say", "text": self.say}))
                self.ready.set_result(None)
        pos, n = 0, len(buf)
        while n - pos >= 2:
            b0, b1 = buf[pos], buf[pos + 1]
            length, head = b1 & 0x7F, 2
            if length == 126:
                if n - pos < 4:
                    break
                length, head = int.from_bytes(buf[pos + 2:pos + 4], "big"), 4
            elif length == 127:
                if n - pos < 10:
                    break
                length, head = int.from_bytes(buf[pos + 2:pos + 10], "big"), 10
            if n - pos < head + length:
                break
            start = pos + head
            pos = start + length
            self.message(b0 & 0x0F, buf, start, length)
        del buf[:pos]

    def message(self, opcode: int, buf: bytearray, start: int, length: int) -> None:
        if opcode == 2:  # binary: gateway frame (12-byte header) or pipecat protobuf
            if self.target == "gateway":
                if self.turn_id is None:  # header: u8 version, u8 flags, u16, u32 turn_id
                    self.turn_id = int.from_bytes(buf[start + 4:start + 8], "little")
                self.audio(length - 12)
            else:  # protobuf overhead is a few dozen bytes: round to 10 ms
                self.audio(round(length / 480) * 480)
        elif opcode == 1:
            if self.target == "fastapi":
                if buf.find(b'"audio"', start, start + 20) >= 0:
                    # {"type": "audio", "audio": "<base64>"}: 30 bytes around the base64
                    self.audio((length - 30) * 3 // 4)
                else:
                    self.done = True
                return
            event = json.loads(bytes(buf[start:start + length]))
            kind = event.get("type")
            if kind == "session.created":
                if not self.idle:
                    self.send_text(json.dumps({"type": "say", "text": self.say}))
                if not self.ready.done():
                    self.ready.set_result(None)
            elif kind == "turn.done":
                self.done = True
            elif kind == "error":
                self.stats.errors += 1
        elif opcode == 9:  # ping
            self.transport.write(_masked(10, bytes(buf[start:start + length])))
        elif opcode == 8:
            self.transport.close()

    def audio(self, nbytes: int) -> None:
        now = time.monotonic()
        s = self.stats
        d = nbytes / 48000
        if now > s.t_end:
            return
        if self.at_start is None and now >= s.t_start:
            self.at_start = (now, self.audio_s)
        if self.t0 is None:
            self.t0 = now
            self.play_end = now + self.jitter
            s.started += 1
        else:
            # against the schedule as it stood before this frame: a frame that stalls the
            # player is as late as it came (after the shift below it would read as exactly
            # the jitter buffer, and no lateness could exceed --jitter-ms)
            lateness_ms = (now - (self.t0 + self.audio_s)) * 1000.0
            # Steady state is measured in the window; what happens while the other
            # sessions are still connecting is counted apart (startup_underruns).
            if now > self.play_end:
                if now >= s.t_start:
                    s.underruns += 1
                else:
                    s.startup_underruns += 1
                # playback stalled and restarts now: the whole schedule moves back with it
                self.t0 += now - self.play_end
                self.play_end = now
            if now >= s.t_start:
                s.lateness.append(lateness_ms)
        self.play_end += d
        self.audio_s += d
        if now >= s.t_start:
            s.frames += 1
            if now <= s.t_start + s.edge_s or now >= s.t_end - s.edge_s:
                self.peak(now)
        if self.marks_s and now >= self.next_mark:
            self.next_mark = now + self.marks_s
            played = self.audio_s - max(0.0, self.play_end - now)  # what the model has played
            self.send_text(json.dumps({"type": "playback", "turn_id": self.turn_id,
                                       "played_ms": round(max(0.0, played) * 1000, 1)}))


class Stats:
    def __init__(self) -> None:
        self.t_start = float("inf")
        self.t_end = float("inf")
        self.lateness = array("f")
        self.underruns = 0
        self.startup_underruns = 0
        self.frames = 0
        self.started = 0
        self.errors = 0
        self.edge_s = 0.0
        """How far into the window, and from its end, a session's peak of buffered audio is
        looked for (``Listener.delivered``): longer than the gateway's refills' spacing."""


async def _client(target: str, port: int, n: int, say: str, jitter_s: float, idle: bool,
                  window, queue, marks_s: float = 0.0) -> None:
    loop = asyncio.get_running_loop()
    stats = Stats()
    sem = asyncio.Semaphore(64)
    listeners: list[Listener] = []
    failed = 0

    async def connect() -> None:
        nonlocal failed
        async with sem:
            try:
                _, proto = await loop.create_connection(
                    lambda: Listener(target, say, stats, jitter_s, idle, marks_s), "127.0.0.1",
                    port)
                await asyncio.wait_for(proto.ready, 30)
                listeners.append(proto)
            except (TimeoutError, OSError, ConnectionError):
                failed += 1

    t = time.monotonic()
    await asyncio.gather(*(connect() for _ in range(n)))
    queue.put(("ready", len(listeners), failed, time.monotonic() - t))
    while window[1] == 0.0:  # noqa: ASYNC110 (set by another process)
        await asyncio.sleep(0.05)
    stats.t_start, stats.t_end = window[0], window[1]
    stats.edge_s = min(EDGE_S, (stats.t_end - stats.t_start) / 3)
    lags = array("f")  # this client's own loop lag over the window: late arrivals may be ours

    async def probe() -> None:
        while True:
            due = loop.time() + 0.1
            await asyncio.sleep(0.1)
            if stats.t_start <= time.monotonic() <= stats.t_end:
                lags.append(max(0.0, loop.time() - due) * 1000)

    prober = asyncio.ensure_future(probe())
    await asyncio.sleep(max(0.0, stats.t_end - time.monotonic()) + 0.2)
    prober.cancel()
    # the load goes on until the server's figures are read (window[2], run_load): a bench
    # late to read them got a window of a server whose clients had left
    while window[2] == 0.0 or time.monotonic() < window[2]:  # noqa: ASYNC110 (another process)
        await asyncio.sleep(0.05)
    ended = sum(1 for p in listeners if p.done or p.closed)
    for p in listeners:
        p.transport.close()
    delivered = spans = 0.0
    for p in listeners:
        d, s = p.delivered()
        delivered += d
        spans += s
    queue.put(("result", {"sessions": len(listeners), "failed": failed, "ended_early": ended,
                          "delivered_s": delivered, "span_s": spans,
                          "started": stats.started, "frames": stats.frames,
                          "underruns": stats.underruns,
                          "startup_underruns": stats.startup_underruns, "errors": stats.errors,
                          "lateness": stats.lateness.tobytes(),
                          "client_lag_max_ms": round(max(lags, default=0.0), 1)}))


def client_main(target, port, n, say, jitter_s, idle, window, queue, marks_s=0.0) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the bench's: it ends us
    raise_nofile()
    import uvloop

    uvloop.run(_client(target, port, n, say, jitter_s, idle, window, queue, marks_s))


EDGE_S = 1.0
"""``Stats.edge_s`` at most (the gateway refills a session every 300-400 ms)."""

CLIENT_GRACE_S = 10.0
"""How long the client processes still running when a step ends (a Ctrl-C, an error) have
after SIGTERM before they are killed (``end_clients``)."""


def end_clients(procs: list) -> None:
    """End the client processes still running, each reaped: SIGTERM, then SIGKILL (said on
    stderr) for those still running ``CLIENT_GRACE_S`` later, or at a second Ctrl-C. Left
    to multiprocessing's exit hook, which SIGTERMs daemon processes and then joins them
    without a bound, a client that did not end on SIGTERM (a handler that never returns or
    swallows it: coverage's ``sigterm = true`` puts a Python one in every process it
    measures) kept the bench from exiting after a Ctrl-C, for ever."""
    grace = CLIENT_GRACE_S  # (read when called: a test lowers it)
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.terminate()
    deadline = time.monotonic() + grace
    interrupted = False
    try:
        for p in alive:
            p.join(max(0.0, deadline - time.monotonic()))
    except KeyboardInterrupt:  # a second Ctrl-C: no more grace
        interrupted = True
    for p in alive:
        if p.exitcode is None:
            print(f"client process {p.pid} had not ended {grace:g} s after SIGTERM: "
                  "killed (SIGKILL)", file=sys.stderr, flush=True)
            p.kill()
            p.join()
    if interrupted:
        raise KeyboardInterrupt


LATE_WINDOW_SHARE = 0.25
"""How late (a share of the window) this process may read the server's figures and still
end them with the clients' window (``run_load``)."""


CLIENT_CHECK_S = 0.5
"""While waiting for the clients' messages (``from_clients``), how often the bench looks
for a client process that has ended without sending its own."""


_SAID = {"ready": ("said it was ready", "say they were ready"),
         "figures": ("sent its figures", "send their figures")}
"""What ``from_clients`` waits for, as its refusals say it (of one client, of several)."""


def from_clients(queue, procs: list, what: str, timeout: float) -> list:
    """One message from each client process in ``procs``: ``what`` they send (``"ready"``,
    ``"figures"``), within ``timeout`` seconds. A client that ended without sending it (an
    import error, killed, out of memory) stops the run within ``CLIENT_CHECK_S``, naming it
    and its exit code, as a server that died does (``Server.check_alive``): waiting on the
    queue alone, the bench noticed nothing and waited out the whole ``timeout`` (600 s for
    the clients' ready)."""
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < len(procs):
        left = deadline - time.monotonic()
        if left <= 0:
            raise SystemExit(f"{len(procs) - len(got)} of {len(procs)} client processes "
                             f"did not {_SAID[what][1]} in {timeout:g} s")
        try:
            got.append(queue.get(timeout=min(CLIENT_CHECK_S, left)))
            continue
        except Empty:
            pass
        ended = [p for p in procs if p.exitcode is not None]
        # what they sent before they ended is whole in the pipe by now (a process's queue
        # is flushed before it exits): read it, then each one still running owes one more
        with contextlib.suppress(Empty):
            while len(got) < len(procs):
                got.append(queue.get_nowait())
        if len(got) + len(procs) - len(ended) < len(procs):
            dead = [p for p in ended if p.exitcode != 0] or ended
            raise SystemExit("; ".join(f"client process {p.pid} exited with {p.exitcode} "
                                       f"before it {_SAID[what][0]}" for p in dead))
    return got


def run_load(server: Server, n: int, *, clients: int, say: str, jitter_s: float, idle: bool,
             warmup_s: float, seconds: float, profile: str | None = None,
             marks_s: float = 0.0) -> dict:
    """Connect ``n`` sessions from ``clients`` processes, measure a window, return figures."""
    ctx = mp.get_context("spawn")
    window = ctx.RawArray("d", 3)  # the clients' window; when the server's is read (0: not yet)
    queue = ctx.Queue()
    rss0 = rss_bytes(server.pid)
    shares = [n // clients + (1 if i < n % clients else 0) for i in range(clients)]
    # (daemons too: multiprocessing's exit hook ends any left, but waits for them unbounded)
    procs = [ctx.Process(target=client_main, args=(server.target, server.port, k, say,
                                                   jitter_s, idle, window, queue, marks_s),
                         daemon=True)
             for k in shares if k]
    try:
        return _run_load(server, procs, window, queue, n, seconds=seconds, idle=idle,
                         warmup_s=warmup_s, profile=profile, rss0=rss0)
    finally:  # (every way out, a Ctrl-C's included: no client left to the exit hook)
        end_clients(procs)


def _run_load(server: Server, procs: list, window, queue, n: int, *, seconds: float,
              idle: bool, warmup_s: float, profile: str | None, rss0: int) -> dict:
    t_connect = time.monotonic()
    # (SIGINT blocked while they start, a mask they keep: a Ctrl-C to the terminal's group
    # met a client still importing, before client_main could ignore it, in a traceback)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        for p in procs:
            p.start()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    ready = from_clients(queue, procs, "ready", 600)
    accept_s = time.monotonic() - t_connect
    connected = sum(r[1] for r in ready)
    t_start = time.monotonic() + warmup_s
    t_end = t_start + seconds
    window[0], window[1] = t_start, t_end
    time.sleep(max(0.0, t_start - time.monotonic()))
    lag0 = gateway_buckets(server)
    cpu0 = cpu_seconds(server.pid)
    ccpu0 = sum(cpu_seconds(p.pid) for p in procs)
    # This process stalled past the window's start (a loaded machine) read the server's
    # figures late; ending at t_end, the second read came right after the first, with no
    # loop wake-up between them and no figures at all. A late start gets a window as long
    # from its own read, and the row says how late it was; the clients stream on until it
    # ends (they left at t_end: the server's CPU read 0-5 % of a core instead of 12-15 %).
    late_s = time.monotonic() - t_start
    server_end = t_end if late_s < LATE_WINDOW_SHARE * seconds else t_start + late_s + seconds
    window[2] = server_end + 0.2
    spy = None
    if profile:  # py-spy competes for the CPU: a profiled run's figures are not the bench's
        Path(profile).unlink(missing_ok=True)  # (an earlier run's, read as this one's)
        with open(f"{profile}.log", "w") as spy_log:  # (what it says when it cannot profile)
            spy = subprocess.Popen([str(PY_SPY), "record", "-p", str(server.pid), "-d",
                                    str(int(seconds)), "-r", "100", "-f", "raw", "-o",
                                    profile, "--nonblocking"], stdout=subprocess.DEVNULL,
                                   stderr=spy_log)
    time.sleep(max(0.0, server_end - time.monotonic()))
    cpu1 = cpu_seconds(server.pid)
    ccpu1 = sum(cpu_seconds(p.pid) for p in procs)
    rss1 = rss_bytes(server.pid)
    lag1 = gateway_buckets(server)
    lag = {**loop_lag_summary(lag0, lag1), **gc_summary(lag0, lag1)}
    results = [r[1] for r in from_clients(queue, procs, "figures", 120)]
    for p in procs:
        p.join(30)
    server.check_alive()  # every mode: a dead server must not read as a row of zeros
    if spy is not None:
        spy.wait(60)
        log = Path(f"{profile}.log")
        said = log.read_text().strip()
        log.unlink()
        if spy.returncode != 0 or not Path(str(profile)).exists():
            hint = ("; on macOS py-spy attaches to another process only as root: run the "
                    "bench with sudo") if sys.platform == "darwin" else ""
            raise SystemExit(f"py-spy could not profile the {server.target} server (exit "
                             f"{spy.returncode}): {said[-400:] or 'it said nothing'}{hint}")
    lateness = array("f")
    for r in results:
        lateness.frombytes(r["lateness"])
    late = sorted(lateness)

    def pct(q: float) -> float | None:
        return round(late[min(len(late) - 1, int(q * len(late)))], 1) if late else None

    frames = sum(r["frames"] for r in results)
    server_cpu = cpu1 - cpu0
    return {
        "sessions": n, "connected": connected,
        "failed": sum(r["failed"] for r in results),
        "accept_s": round(accept_s, 2),
        "rss_mib": round(rss1 / 2**20, 1),
        "rss_per_session_kib": round((rss1 - rss0) / max(1, connected) / 1024, 1),
        "streaming": sum(r["started"] for r in results),
        "ended_early": sum(r["ended_early"] for r in results),
        "frames": frames, "frames_per_s": round(frames / seconds),
        "realtime_share": round(sum(r["delivered_s"] for r in results)
                                / sum(r["span_s"] for r in results), 3)
        if not idle and sum(r["span_s"] for r in results) else None,
        "lateness_p50_ms": pct(0.50), "lateness_p99_ms": pct(0.99),
        "lateness_max_ms": round(late[-1], 1) if late else None,
        "underruns": sum(r["underruns"] for r in results),
        "startup_underruns": sum(r["startup_underruns"] for r in results),
        "errors": sum(r["errors"] for r in results),
        "server_window_late_s": round(max(0.0, late_s), 2),
        "server_cpu_s": round(server_cpu, 2),
        "server_cpu_pct": round(100 * server_cpu / seconds),
        "client_cpu_pct": round(100 * (ccpu1 - ccpu0) / seconds),
        "cpu_s_per_1000_frames": round(1000 * server_cpu / frames, 4) if frames else None,
        "client_lag_max_ms": max(r["client_lag_max_ms"] for r in results),
        **lag,
    }


Buckets = dict[str, dict[float, float]]


def gateway_buckets(server: Server) -> Buckets | None:
    """From the gateway's /metrics, the cumulative bucket counts (by upper bound) of its
    loop-lag probe (``loop``) and of its full garbage collections (``gc2``); None for the
    peers, which have neither."""
    if server.target != "gateway":
        return None
    from urllib.request import urlopen

    from prometheus_client.parser import text_string_to_metric_families

    with urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: Buckets = {"loop": {}, "gc2": {}}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.endswith("_bucket"):
                continue
            if family.name == "gateway_loop_lag_seconds":
                out["loop"][float(sample.labels["le"])] = sample.value
            elif family.name == "gateway_gc_pause_seconds" and \
                    sample.labels["generation"] == "2":
                out["gc2"][float(sample.labels["le"])] = sample.value
    return out


def _window(before: dict[float, float], after: dict[float, float]) -> list[tuple[float, float]]:
    """Cumulative counts over the window, by bound."""
    return sorted((bound, after[bound] - before.get(bound, 0.0)) for bound in after)


def _bound_ms(counts: list[tuple[float, float]], share: float) -> float:
    """The bucket bound (ms) under which ``share`` of the window's observations fell."""
    total = counts[-1][1]
    return next(b for b, c in counts if c >= share * total) * 1000


def gc_summary(before: Buckets | None, after: Buckets | None) -> dict:
    """Over the window: full collections and the bucket bound under which the longest
    fell (ms; 0 collections: no bound)."""
    if before is None or after is None or not after["gc2"]:
        return {}
    counts = _window(before["gc2"], after["gc2"])
    total = counts[-1][1]
    return {"gc_full": int(total),
            "gc_full_max_le_ms": _bound_ms(counts, 1.0) if total else None}


def loop_lag_summary(before: Buckets | None, after: Buckets | None) -> dict:
    """Over the window: wake-ups of the 100 ms probe, how many came > 40 ms late, and the
    bucket bound under which 99 % and all of them fell (ms)."""
    if before is None or after is None:
        return {}
    counts = _window(before["loop"], after["loop"])
    total = counts[-1][1]
    if not total:
        return {}
    late = total - next(c for b, c in counts if b >= 0.04)
    return {"loop_wakeups": int(total), "loop_late_40ms": int(late),
            "loop_lag_p99_le_ms": _bound_ms(counts, 0.99),
            "loop_lag_max_le_ms": _bound_ms(counts, 1.0)}


# ---- benchmarks ------------------------------------------------------------------------------

class Interrupted(Exception):
    """Ctrl-C: ``result`` holds what was measured until then (the step in progress is
    not)."""

    def __init__(self, result: dict) -> None:
        super().__init__("interrupted")
        self.result = result


def bench_idle(args) -> dict:
    out = {}
    for target in args.targets:
        extra = ["--idle"] if target == "pipecat" else []
        try:
            with Server(target, *extra) as server:
                time.sleep(1.0)
                base = rss_bytes(server.pid)
                r = run_load(server, args.sessions, clients=args.clients, say="",
                             jitter_s=0.2, idle=True, warmup_s=1.0, seconds=2.0)
                r["rss_base_mib"] = round(base / 2**20, 1)
                # per session: run_load's, from the RSS of its window with every session
                # open (it returns once the clients have gone: reading the RSS again here
                # counted memory they had freed)
                r["accepts_per_s"] = round(r["connected"] / r["accept_s"])
                out[target] = r
        except KeyboardInterrupt:
            raise Interrupted(out) from None
        print(f"{target:8} {r['connected']:>6}/{args.sessions} sessions  accept "
              f"{r['accept_s']:.1f} s ({r['accepts_per_s']}/s)  RSS {r['rss_base_mib']} → "
              f"{r['rss_mib']} MiB = {r['rss_per_session_kib']} KiB/session "
              f"(× 10,000 = {10_000 * r['rss_per_session_kib'] / 2**20:.2f} GiB)", flush=True)
    return out


HEADER = (f"{'target':8} {'N':>5} {'conn':>5} {'strm':>5} {'ended':>5} {'err':>4} "
          f"{'frames/s':>8} {'p50ms':>7} "
          f"{'p99ms':>7} {'maxms':>7} {'underr':>6} {'start':>5} {'srvCPU%':>7} {'cliCPU%':>7} "
          f"{'cpu s/1k fr':>11} {'RSS MiB':>8} {'lag99':>6} {'lagmax':>6} {'gc2':>3} "
          f"{'gc2max':>6} {'clilag':>6}  ok")


def row(target: str, r: dict) -> str:
    return (f"{target:8} {r['sessions']:>5} {r['connected']:>5} {r['streaming']:>5} "
            f"{r['ended_early']:>5} {r['errors']:>4} {r['frames_per_s']:>8} "
            f"{r['lateness_p50_ms']!s:>7} {r['lateness_p99_ms']!s:>7} "
            f"{r['lateness_max_ms']!s:>7} {r['underruns']:>6} {r.get('startup_underruns', 0):>5} "
            f"{r['server_cpu_pct']:>7} "
            f"{r['client_cpu_pct']:>7} {r['cpu_s_per_1000_frames']!s:>11} {r['rss_mib']:>8} "
            f"{_le(r.get('loop_lag_p99_le_ms')):>6} {_le(r.get('loop_lag_max_le_ms')):>6} "
            f"{r.get('gc_full', '-')!s:>3} {_le(r.get('gc_full_max_le_ms')):>6} "
            f"{r['client_lag_max_ms']:>6}  "
            f"{'yes' if r['pass'] else 'NO'}")


def _le(ms: float | None) -> str:
    """A bucket bound as the table prints it: "≤20" (ms), "inf" past the last bucket."""
    if ms is None:
        return "-"
    return "inf" if ms == float("inf") else f"≤{ms:g}"


def bench_stream(args) -> dict:
    out: dict[str, list[dict]] = {}
    print(HEADER, flush=True)
    interrupted = False
    for target in args.targets:
        out[target] = []
        for n in args.ramp:
            # audio for connecting, warm-up and the window, with margin
            say = long_text(say_needed_s(n, args.seconds, args.warmup))
            extra = ["--say", say] if target == "pipecat" else \
                ["--no-freeze"] if target == "gateway" and args.no_freeze else []
            try:
                with Server(target, *extra) as server:
                    r = run_load(server, n, clients=args.clients, say=say,
                                 jitter_s=args.jitter_ms / 1000, idle=False,
                                 warmup_s=args.warmup, seconds=args.seconds,
                                 marks_s=args.marks_ms / 1000)
                    # Keeping up: a server with a lead (the gateway's 1 s) can fall behind
                    # real time for a whole window without an underrun, so the delivered
                    # rate must be real time.
                    r["pass"] = (r["connected"] == n and r["streaming"] == n
                                 and r["ended_early"] == 0 and r["errors"] == 0
                                 and r["underruns"] == 0
                                 and r["lateness_p99_ms"] is not None
                                 and r["lateness_p99_ms"] <= MAX_LATENESS_MS
                                 and r["realtime_share"] is not None
                                 and r["realtime_share"] >= MIN_REALTIME_SHARE)
                    out[target].append(r)
                    # its log kept when this step fails the run (not at the limit it found)
                    server.failed = failed("stream", {target: out[target]})
                    print(row(target, r), flush=True)  # (before the log's path)
            except KeyboardInterrupt:  # the steps measured are still worth their summary
                print(f"{target:8} {n:>5}  interrupted (Ctrl-C): not measured", flush=True)
                interrupted = True
                break
            if not r["pass"]:
                break
        if interrupted:
            break
    print()
    for target, rows in out.items():
        passing = [r for r in rows if r["pass"]]
        best = passing[-1] if passing else None
        print(f"{target:8} max passing N = {best['sessions'] if best else 0}; "
              f"cpu s / 1,000 frames at that N = "
              f"{best['cpu_s_per_1000_frames'] if best else '-'}")
    if interrupted:
        raise Interrupted(out)
    return out


def hotspots(raw: str, top: int = 15) -> str:
    """Self and inclusive share of samples per function from py-spy's collapsed stacks."""
    self_n: dict[str, int] = {}
    incl: dict[str, int] = {}
    total = 0
    for line in Path(raw).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        k = int(count)
        total += k
        frames = stack.split(";")
        if frames and frames[0].startswith(("process ", "thread ")):
            frames = frames[1:]
        if not frames:
            continue
        self_n[frames[-1]] = self_n.get(frames[-1], 0) + k
        for f in set(frames):
            incl[f] = incl.get(f, 0) + k
    lines = [f"{total} samples; self time:"]
    for f, k in sorted(self_n.items(), key=lambda x: -x[1])[:top]:
        lines.append(f"  {100 * k / total:5.1f}%  {f}")
    lines.append("inclusive:")
    for f, k in sorted(incl.items(), key=lambda x: -x[1])[:top * 2]:
        lines.append(f"  {100 * k / total:5.1f}%  {f}")
    return "\n".join(lines)


def bench_profile(args) -> dict:
    target, n = args.targets[0], args.ramp[0]
    say = long_text(say_needed_s(n, args.seconds, args.warmup))
    raw = f"/tmp/capacity-profile-{target}-{n}.txt"
    with Server(target, *(["--say", say] if target == "pipecat" else [])) as server:
        r = run_load(server, n, clients=args.clients, say=say, jitter_s=args.jitter_ms / 1000,
                     idle=False, warmup_s=args.warmup, seconds=args.seconds, profile=raw,
                     marks_s=args.marks_ms / 1000)
        # (not judged on lateness: py-spy shares the CPU; a failed turn is a failed run
        # still)
        r["pass"] = r["underruns"] == r["ended_early"] == r["errors"] == 0
        server.failed = not r["pass"]
        print(HEADER)
        print(row(target, r), flush=True)  # (before the log's path)
    report = hotspots(raw)
    print(report)
    return {"run": r, "hotspots": report}


def setup_peers() -> None:
    for target, packages in PEER_PACKAGES.items():
        venv = Path(PYTHONS[target]).parents[1]
        print(f"{target}: creating {venv} with {' '.join(packages)}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *packages], check=True)


def failed(mode: str, result: dict) -> bool:
    """The run failed: in a ramp, a target none of whose steps passed, or a step that
    failed with errors or turns ended early (broken, not loaded: a ramp's last step failing
    on underruns or pace is the limit it was run to find); the profile's one run failing."""
    if mode == "stream":
        return any(not any(r["pass"] for r in rows) or any(
            not r["pass"] and (r["errors"] or r["ended_early"]) for r in rows)
            for rows in result.values())
    return mode == "profile" and not result["run"]["pass"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("mode", nargs="?", choices=["idle", "stream", "profile"])
    p.add_argument("--setup-peers", action="store_true",
                   help="create the peers' venvs (needs PyPI), then run MODE if given")
    p.add_argument("--targets", nargs="+", default=["gateway"], choices=list(PYTHONS))
    p.add_argument("--sessions", type=int, default=10_000, help="idle: sessions to open")
    p.add_argument("--ramp", type=int, nargs="+",
                   default=[50, 100, 200, 400, 800, 1200, 1600, 2000, 2500, 3000])
    p.add_argument("--seconds", type=float, default=15.0, help="measuring window per step")
    p.add_argument("--warmup", type=float, default=3.0, help="after all connected")
    p.add_argument("--jitter-ms", type=float, default=200.0)
    p.add_argument("--marks-ms", type=float, default=0.0,
                   help="stream: gateway clients report playback this often, as real clients "
                        "do (protocol.md: 200-500 ms); 0: never (the peers get none)")
    p.add_argument("--clients", type=int, default=1, help="client processes")
    p.add_argument("--no-freeze", action="store_true",
                   help="stream: the gateway leaves its start-up heap to the garbage "
                        "collector (the baseline of gc.freeze)")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()
    if args.setup_peers:
        setup_peers()
    if args.mode is None:
        if not args.setup_peers:
            p.error("a mode (idle, stream, profile) or --setup-peers")
        return 0
    most = max(args.ramp) if args.mode == "stream" else args.ramp[0]
    if args.mode != "idle" and say_needed_s(most, args.seconds, args.warmup) * CHARS_PER_S \
            > MAX_SAY_CHARS:  # (cut short, every session would end before its window)
        longest = MAX_SAY_CHARS / CHARS_PER_S
        p.error(f"--seconds {args.seconds} + --warmup {args.warmup} need more audio than one "
                f"say holds ({MAX_SAY_CHARS:,} characters, {longest:.0f} s): at {most} "
                f"sessions, --seconds {int(longest - say_needed_s(most, 0, args.warmup))} "
                f"at most")
    raise_nofile()
    meta = {"mode": args.mode, "argv": sys.argv[1:], "cpus": os.cpu_count(),
            "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
            "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    bench = {"idle": bench_idle, "stream": bench_stream, "profile": bench_profile}[args.mode]
    try:
        result = bench(args)
        # (CI and scripts read the status: a broken step exited 0, as a run that passed)
        code = 1 if failed(args.mode, result) or LEAKED else 0
    except Interrupted as stopped:  # (a traceback, and no --json, for a run of many steps)
        result, code = stopped.result, 130
    except KeyboardInterrupt:  # (profile: one step, nothing measured yet)
        result, code = {}, 130
    if code == 130:  # (not a run that failed: it said so in its rows)
        meta["interrupted"] = True
        print("interrupted (Ctrl-C)", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "results": result}, indent=1))
    return code


if __name__ == "__main__":
    sys.exit(main())
