"""Soak: N sessions talk for M minutes while sockets drop and resume, turns are cancelled and
some listeners stop reading for a while; the gateway's RSS and file descriptors are sampled.

    python bench/soak.py --sessions 200 --minutes 10 [--seed 1] [--replies FILE] [--json OUT]

The gateway runs as its own process (bench/capacity_server.py: the real server, the
synthetic engine at zero cost, the replay LLM), so its memory and descriptors are read from
/proc/<pid> (psutil on macOS: bench/process_stats.py). Each session (built on
examples/loadgen.py: ``SessionAccount`` does the seq and frame accounting) loops over turns
until the time is up, saying a transcript of the replay set (``--replies``: JSONL of
``{"transcript", "reply"}``, which the gateway's replay LLM answers from; default
engines/data/replies.jsonl); each turn, by a seeded draw:

* ``normal`` (60 %): listen to the reply to its end, sending playback marks;
* ``abort`` (15 %): after a few frames, abort the TCP connection (no close handshake),
  reconnect and ``session.resume`` with the last seq received; the turn must then finish;
* ``cancel`` (15 %): after a few frames, send ``cancel``: the turn ends ``cancelled``;
* ``slow`` (10 %): stop reading for 1-4 s mid-reply (TCP backpressure), then go on.

Every ``--renew-every`` turns a session closes cleanly and a new one opens (session churn:
what a leak per session would show up in).

Reported: RSS, descriptors and the gateway's asyncio tasks (``/health`` → ``loop.tasks``)
over time (start, after warm-up, peak, end, and after every session closed), the gateway's
CPU per 1,000 turns and per 1,000 frames (``cpu``, from /proc), frames lost
(seq gaps) and duplicated (seq repeats) across resumes (goal 0), turns completed /
cancelled / failed (goal 0) / lost (no ``turn.done``, or a resume refused: goal 0) /
refused (``rejected: <code>``, e.g. ``rate_limited``: goal 0), resumes and resume failures,
protocol violations, and how long the gateway took to exit on SIGTERM. A socket the gateway
closes (or a reconnect it refuses) loses that session and its turn at once, the others go
on; a gateway that dies under the load is reported as such. Exit status 1 if anything that
should be 0 is not (connect failures included). Ctrl-C stops the load: the sessions close
their sockets, the turns being heard count as ``interrupted``, the gateway is probed as
after a full run, and the table (and ``--json``) has what was measured until then; the
exit status is 130 (a second Ctrl-C stops at once). The gateway runs in a session of its
own, so that the terminal's Ctrl-C reaches the soak only.

``--faults``: the server side fails too. The gateway's LLM is an HTTP server of its own
(bench/fault_llm.py), which the soak kills (SIGKILL) at random and starts again on the same
port, or hangs a while (SIGSTOP, ``--llm-hang-share``), and which cuts some replies
mid-stream; the engine fails at random steps
(``--engine-fail-rate``; with ``--engine-fallback`` a second engine takes over behind a
breaker). Every failed turn must then have exactly one ``error`` of its cause
(``FAULT_CODES``), every other turn none; a resume's replayed events are skipped and
compared; after the load the faults stop and ``/health`` must say the LLM and the engine
back (``recover``), the gateway's log each failing spell once each way. bench/SOAK.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import process_stats  # noqa: E402
from bench.capacity import Server  # noqa: E402
from bench.process_stats import cpu_seconds, rss_bytes  # noqa: E402
from examples.loadgen import (  # noqa: E402
    MARK_INTERVAL_S,
    SessionAccount,
    load_transcripts,
)

ACTIONS = (("normal", 0.60), ("abort", 0.15), ("cancel", 0.15), ("slow", 0.10))


# ---- the gateway process ---------------------------------------------------------------


def rss_mb(pid: int) -> float:
    rss = rss_bytes(pid)
    return rss / 2**20 if rss else float("nan")  # (0: a zombie's, dead and not reaped)


def fd_count(pid: int, llm_port: int | None = None) -> int:
    """``pid``'s open descriptors; with ``llm_port``, not counting its TCP connections to
    that port (``--faults``: the LLM's HTTP clients keep connections alive between turns,
    as they should; they are not the sessions' and their number depends on the last
    spike of turns)."""
    return process_stats.fd_count(pid, llm_port)


class GatewayProcess(Server):
    """bench/capacity_server.py (the zero-cost synthetic engine), its logs on our stderr."""

    def __init__(self, max_lead_ms: int, outbox_bytes: int | None = None,
                 replies: str | None = None, faults: list[str] = ()) -> None:
        extra = ["--outbox-bytes", str(outbox_bytes)] if outbox_bytes else []
        # (absolute: the gateway runs in the repository, not in our working directory)
        extra += ["--replies", os.path.abspath(replies)] if replies else []
        super().__init__("gateway", "--max-lead-ms", str(max_lead_ms), *extra, *faults,
                         log=False)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/voice"

    def health(self) -> dict[str, Any]:
        import httpx

        return httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=10).json()

    def stop(self) -> int:
        return self.close(timeout=30)


class LlmProcess:
    """bench/fault_llm.py: an OpenAI-compatible LLM server as its own process, which the
    soak kills (SIGKILL: no goodbye on its sockets) and starts again on the same port."""

    def __init__(self, replies: str | None, cut_rate: float, seed: int) -> None:
        self.args = [sys.executable, str(ROOT / "bench" / "fault_llm.py"),
                     "--cut-rate", str(cut_rate), "--seed", str(seed),
                     *(["--replies", os.path.abspath(replies)] if replies else [])]
        self.port = 0
        self.cut = self.begun = 0
        """Replies cut and begun (each process says so as they begin)."""
        self.proc: subprocess.Popen[str] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        seed = self.args.index("--seed") + 1  # (each process cuts other replies)
        self.args[seed] = str(int(self.args[seed]) + 1)
        self.proc = subprocess.Popen([*self.args, "--port", str(self.port)],
                                     stdout=subprocess.PIPE, text=True, cwd=ROOT,
                                     start_new_session=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.proc.kill()
            raise RuntimeError(f"the LLM server did not start: {line!r}")
        self.port = int(line.split()[1])
        threading.Thread(target=self._count, args=(self.proc.stdout,), daemon=True).start()

    def _count(self, out: Any) -> None:
        for line in out:  # (until the process exits)
            self.begun += 1
            self.cut += line.startswith("cut")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        self.proc = None

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def calm(self) -> None:
        """No more cut replies (SIGUSR1)."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGUSR1)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGCONT)  # (stopped by a hang: Ctrl-C came meanwhile)
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.proc = None


LLM_STALL_S = 4.0
"""``--faults``: the gateway's ``[llm] stall_timeout_s`` (60 s by default): a hung LLM
server fails its turns with ``llm_unavailable`` after this long without data."""

FAULT_CODES = frozenset({"llm_unavailable", "llm_failed", "engine_failed"})
"""The error codes a turn may end ``failed`` with under ``--faults`` (protocol.md, Errors):
the LLM server out of reach (killed, not back yet), its stream broken (killed mid-reply,
or cut), the engine failing a step."""


# ---- one session -----------------------------------------------------------------------


@dataclass
class SoakStats:
    actions: Counter[str] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)
    resumes: int = 0
    resume_failed: int = 0
    connects: int = 0
    connect_failures: int = 0
    renewals: int = 0
    turn_errors: Counter[str] = field(default_factory=Counter)
    """``--faults``: the codes of the errors that failed turns."""
    replayed_skipped: int = 0
    """Events received a second time in a resume's replay (sent after the last frame
    received before the drop), skipped as protocol.md says."""
    llm_down: list[list[float]] = field(default_factory=list)
    """``--faults``: from when the LLM server was killed (or hung) to when it served again
    (``inf`` while it is down), in the loop's time."""
    llm_hangs: int = 0
    """``--faults``: how many of those were a hang (SIGSTOP), not a kill."""


class SoakSession:
    """One speaker that keeps talking until ``deadline``, with faults of its own making."""

    def __init__(self, url: str, index: int, seed: int, transcripts: list[str],
                 stats: SoakStats, turn_timeout_s: float, renew_every: int = 0) -> None:
        self.renew_every = renew_every
        self.url, self.index = url, index
        self.rng = random.Random(seed * 100_003 + index)
        self.transcripts = transcripts
        self.stats = stats
        self.account = SessionAccount()
        self.turn_timeout_s = turn_timeout_s
        self.loop = asyncio.get_running_loop()
        self.ws: Any = None
        self.session_id: str | None = None
        self.resume_token: str | None = None
        self.last_seq = -1
        self.frames_in_turn = 0
        self.turn_done = asyncio.Event()
        self.frame_arrived = asyncio.Event()
        self.reading = asyncio.Event()
        self.reading.set()
        self.fault_codes: frozenset[str] = frozenset()
        """``--faults``: a turn may fail, with one error of these (``FAULT_CODES``, less
        ``engine_failed`` with ``--engine-fallback``)."""
        self.turn_errors: dict[int, list[tuple[str, float]]] = {}
        """The current session's errors by turn id: code and arrival time."""
        self.since_frame: list[dict[str, Any]] = []
        """Events received since the last frame: a resume's replay sends them again."""
        self.replay: list[dict[str, Any]] = []
        """Events a resume's replay will send again first: skipped (protocol.md, Resume)."""

    async def run(self, deadline: float) -> None:
        from websockets.exceptions import ConnectionClosed, InvalidStatus

        await asyncio.sleep(self.rng.uniform(0, 5))  # stagger the start
        try:
            await self._connect(resume=False)
        except (OSError, InvalidStatus, TimeoutError, ConnectionClosed) as exc:
            self.stats.connect_failures += 1
            self.account.lost(f"connect failed: {exc}")
            return
        try:
            turns = 0
            while self.loop.time() < deadline and self.ws is not None:
                await self._turn()
                turns += 1
                await asyncio.sleep(self.rng.expovariate(1 / 1.0))
                if self.renew_every and turns % self.renew_every == 0 and self.ws is not None:
                    await self._renew()
        except (OSError, InvalidStatus, TimeoutError, ConnectionClosed) as exc:
            # a reconnect (resume, renewal) refused, or a send on a socket just closed: the
            # session is lost, the others go on (raised, it ended the soak in a traceback)
            self.stats.connect_failures += not isinstance(exc, ConnectionClosed)
            self.account.lost(f"closed {exc.rcvd.code if exc.rcvd else 1006}"
                              if isinstance(exc, ConnectionClosed) else
                              f"connect failed: {exc}")
        finally:
            self.reading.set()  # (a "slow" turn stopped by Ctrl-C: its close must be read)
            if self.ws is not None:
                ws, self.ws = self.ws, None  # (our own close: not a loss, see _read)
                await ws.close()

    async def _renew(self) -> None:
        """Close cleanly (the session ends) and open a new session."""
        old, self.ws = self.ws, None
        await old.close()
        self.stats.renewals += 1
        self.account = _carry(self.account)
        self.last_seq = -1
        self.since_frame, self.turn_errors = [], {}
        await self._connect(resume=False)

    async def _connect(self, *, resume: bool) -> None:
        from websockets.asyncio.client import connect

        ws = await connect(self.url, compression=None, max_size=2**20, open_timeout=30,
                           max_queue=4)
        created = json.loads(await ws.recv())
        assert created["type"] == "session.created", created
        self.stats.connects += 1
        if resume:
            await ws.send(json.dumps({"type": "session.resume", "session_id": self.session_id,
                                      "resume_token": self.resume_token,
                                      "last_seq": self.last_seq}))
            answer = json.loads(await ws.recv())
            if answer["type"] == "session.resumed":
                self.stats.resumes += 1
                self.replay = self.since_frame
                self.since_frame = []
            else:
                # the reply being heard went with the old session: its turn is lost now
                # (waiting for its turn.done took the whole turn timeout), and the fresh
                # session numbers its frames from seq 0 again, as after a renewal
                self.stats.resume_failed += 1
                code = answer.get("error", {}).get("code") if answer["type"] == "error" \
                    else None
                if code is None:
                    self.account.violations.append(f"resume answered {answer}")
                self.account.lost(code or "resume failed")
                self.account = _carry(self.account)
                self.last_seq = -1
                self.since_frame, self.turn_errors = [], {}
                self.turn_done.set()
                self.session_id, self.resume_token = created["session_id"], \
                    created["resume_token"]
        else:
            self.session_id, self.resume_token = created["session_id"], created["resume_token"]
        self.ws = ws
        self.loop.create_task(self._read(ws))

    async def _read(self, ws: Any) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            async for message in ws:
                await self.reading.wait()
                if ws is not self.ws:
                    return  # aborted: what it still held is replayed on the new socket
                now = self.loop.time()
                if isinstance(message, bytes):
                    if self.replay:
                        self.account.violations.append(
                            f"a resume's replay sent a frame before {len(self.replay)} "
                            f"event(s) received after the last frame: {self.replay[0]}")
                        self.replay = []
                    self.account.frame(message, now)
                    self.last_seq = int.from_bytes(message[8:12], "little")
                    self.since_frame = []
                    self.frames_in_turn += 1
                    self.frame_arrived.set()
                    continue
                event = json.loads(message)
                if self.replay:  # received before the drop, after the last frame: again
                    again = self.replay.pop(0)
                    self.stats.replayed_skipped += 1
                    if event != again:
                        self.account.violations.append(
                            f"a resume replayed {event}, not {again}")
                    continue
                self.since_frame.append(event)
                if event["type"] == "turn.done" and event["turn_id"] in self.account._ended:
                    continue  # a replayed turn.done after a resume (idempotent)
                if event["type"] == "error" and "turn_id" in event:
                    if event["turn_id"] in self.account._ended:
                        self.account.violations.append(f"an error after its turn.done: "
                                                       f"{event}")
                    self.turn_errors.setdefault(event["turn_id"], []).append(
                        (event["error"]["code"], now))
                self.account.event(event, now)
                if event["type"] == "turn.done" and event["turn_id"] == \
                        self.account.current_turn_id:
                    self.turn_done.set()
                elif event["type"] == "error" and self.account.rejected:
                    self.turn_done.set()  # refused (rate_limited): no turn.done will come
        except ConnectionClosed:
            pass
        if ws is self.ws:  # closed by the gateway (not an abort or close of ours): the
            self.ws = None  # session is lost, and its turn with it, at once rather than
            self.account.lost(f"closed {ws.close_code or 1006}")  # after the turn timeout
            self.turn_done.set()

    async def _frames(self, n: int) -> None:
        while self.frames_in_turn < n and not self.turn_done.is_set():
            self.frame_arrived.clear()
            done = asyncio.ensure_future(self.turn_done.wait())
            frame = asyncio.ensure_future(self.frame_arrived.wait())
            await asyncio.wait({done, frame}, return_when=asyncio.FIRST_COMPLETED)
            done.cancel()
            frame.cancel()

    async def _turn(self) -> None:
        action = self.rng.choices([a for a, _ in ACTIONS], [w for _, w in ACTIONS])[0]
        self.stats.actions[action] += 1
        self.turn_done.clear()
        self.frames_in_turn = 0
        turn = self.account.sent(self.loop.time())
        try:
            await self.ws.send(json.dumps({"type": "transcript",
                                           "text": self.rng.choice(self.transcripts)}))
        except BaseException:  # (closed since the last turn: never went out, not lost)
            self.account.withdraw()
            self.stats.actions[action] -= 1
            raise
        marks = self.loop.create_task(self._marks())
        try:
            async with asyncio.timeout(self.turn_timeout_s):
                await self._frames(self.rng.randint(2, 20))
                if action == "abort" and not self.turn_done.is_set():
                    old, self.ws = self.ws, None
                    old.transport.abort()
                    await old.wait_closed()
                    await self._connect(resume=True)
                elif action == "cancel" and not self.turn_done.is_set():
                    await self.ws.send(json.dumps({"type": "cancel"}))
                elif action == "slow":
                    self.reading.clear()
                    await asyncio.sleep(self.rng.uniform(1, 4))
                    self.reading.set()
                await self.turn_done.wait()
                end = self.account.playback_end
                if end is not None and turn.status == "completed":
                    await asyncio.sleep(max(0.0, end - self.loop.time()))
        except TimeoutError:
            self.account.lost("timeout")
        except asyncio.CancelledError:  # the soak was stopped (Ctrl-C): not a lost turn
            self.account.interrupted()
            raise
        finally:
            marks.cancel()
            self.stats.statuses[turn.status or "lost"] += 1  # (a reconnect failed: lost)
            self._check_errors(turn)

    def _check_errors(self, turn: Any) -> None:
        """A turn that ended says why, once: ``failed`` with exactly one error, a turn's
        error of ``FAULT_CODES`` (under ``--faults``; none without), an ``llm_unavailable``
        only while the LLM server was down; ``completed`` and ``cancelled`` with none."""
        if turn.turn_id is None or turn.status not in ("completed", "cancelled", "failed"):
            return
        errors = self.turn_errors.pop(turn.turn_id, [])
        codes = [code for code, _ in errors]
        if turn.status != "failed":
            if codes:
                self.account.violations.append(f"turn {turn.turn_id} {turn.status} with "
                                               f"errors {codes}")
            return
        if len(codes) != 1 or codes[0] not in self.fault_codes:
            self.account.violations.append(f"turn {turn.turn_id} failed with errors "
                                           f"{codes}")
            return
        self.stats.turn_errors[codes[0]] += 1
        at = errors[0][1]
        if codes[0] == "llm_unavailable" and not any(
                down <= at and turn.sent_at <= up for down, up in self.stats.llm_down):
            self.account.violations.append(
                f"turn {turn.turn_id}: llm_unavailable while the LLM server was up")

    async def _marks(self) -> None:
        from websockets.exceptions import ConnectionClosed

        while True:
            await asyncio.sleep(MARK_INTERVAL_S)
            turn_id = self.account.current_turn_id
            if turn_id is None or self.account.playback_end is None or self.ws is None:
                continue
            try:
                await self.ws.send(json.dumps({
                    "type": "playback", "turn_id": turn_id,
                    "played_ms": round(self.account.played_ms(self.loop.time()))}))
            except ConnectionClosed:
                pass  # an abort in progress: the next mark goes to the new socket


def _carry(account: SessionAccount) -> SessionAccount:
    """A fresh account for a new session (seq starts again at 0), keeping what was counted."""
    fresh = SessionAccount()
    fresh.turns, fresh.errors, fresh.violations = account.turns, account.errors, \
        account.violations
    fresh.seq_gaps, fresh.seq_repeats = account.seq_gaps, account.seq_repeats
    return fresh


# ---- the run ---------------------------------------------------------------------------


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    transcripts = load_transcripts(args.replies)
    llm = LlmProcess(args.replies, args.llm_cut_rate, args.seed) if args.faults else None
    log = Path(f"/tmp/soak-gateway-{os.getpid()}.log")
    faults = ["--llm-url", llm.url, "--llm-stall-s", str(LLM_STALL_S),
              "--engine-fail-rate", str(args.engine_fail_rate),
              "--seed", str(args.seed), "--log", str(log),
              *(["--engine-fallback"] if args.engine_fallback else [])] \
        if llm is not None else []
    try:
        gateway = GatewayProcess(args.max_lead_ms, args.outbox_bytes, args.replies, faults)
    except BaseException:
        if llm is not None:
            llm.stop()
        raise
    loop = asyncio.get_running_loop()
    samples: list[dict[str, float]] = []
    stats = SoakStats()
    t0 = loop.time()
    stop = asyncio.Event()

    def interrupt() -> None:
        stop.set()
        loop.remove_signal_handler(signal.SIGINT)  # a second Ctrl-C stops at once

    with contextlib.suppress(NotImplementedError):  # (Windows: Ctrl-C ends it at once)
        loop.add_signal_handler(signal.SIGINT, interrupt)

    def sample(label: str = "") -> dict[str, Any]:
        s = {"t_s": round(loop.time() - t0, 1), "rss_mb": round(rss_mb(gateway.pid), 1),
             "fds": fd_count(gateway.pid, llm and llm.port), "label": label,
             "cpu_s": round(cpu_seconds(gateway.pid), 2),
             "turns": sum(stats.statuses.values())}
        samples.append(s)
        return s

    async def tasks(s: dict[str, Any]) -> dict[str, Any]:
        """The gateway's asyncio tasks (``/health`` → ``loop.tasks``, this probe's own
        included), asked from a thread: the sessions' loop goes on meanwhile; and its
        health (``--faults``: ok, or degraded while the LLM or the engine fails)."""
        health = await asyncio.to_thread(gateway.health)
        s["tasks"] = health["loop"]["tasks"]
        s.update(status=health["status"], llm_failing=bool(health["llm"]["failing"]),
                 engine_failing=health["engine"]["failing"])
        return s

    async def chaos(deadline: float) -> None:
        """``--faults``: kill the LLM server now and then, start it again a while later,
        or (``--llm-hang-share`` of the times) stop it (SIGSTOP: it takes connections and
        answers nothing, a hung server) and let it go on a while later (SIGCONT); no fault
        after ``deadline``."""
        assert llm is not None
        rng = random.Random(args.seed)
        while True:
            await asyncio.sleep(rng.expovariate(1 / args.llm_kill_every))
            if loop.time() >= deadline:
                return
            hang = rng.random() < args.llm_hang_share
            down = [loop.time(), math.inf]
            stats.llm_down.append(down)
            if hang:
                llm.pause()
                stats.llm_hangs += 1
                await asyncio.sleep(rng.uniform(0.5, 2 * LLM_STALL_S))
                llm.resume()
            else:
                llm.kill()
                await asyncio.sleep(rng.uniform(0.5, args.llm_down_max))
                await asyncio.to_thread(llm.start)
            down[1] = loop.time()
            print(f"[{loop.time() - t0:7.1f}s] LLM server {'hung' if hang else 'down'} for "
                  f"{down[1] - down[0]:.1f} s", file=sys.stderr, flush=True)

    async def sampler() -> None:
        import httpx

        while True:
            await asyncio.sleep(args.sample_s)
            try:
                s = await tasks(sample())
            except (OSError, httpx.HTTPError):  # (/proc/<pid> gone, /health refused)
                if gateway.proc.poll() is None:
                    raise
                print(f"gateway exited with {gateway.proc.returncode} under the load",
                      file=sys.stderr, flush=True)
                return
            turns = sum(stats.statuses.values())
            print(f"[{s['t_s']:7.1f}s] rss {s['rss_mb']:.1f} MB fds {s['fds']} "
                  f"tasks {s['tasks']} turns {turns} "
                  f"resumes {stats.resumes} {dict(stats.statuses)}", file=sys.stderr,
                  flush=True)

    try:
        await tasks(sample("start"))
        deadline = loop.time() + args.minutes * 60
        sessions = [SoakSession(gateway.url, i, args.seed, transcripts, stats,
                                args.turn_timeout, args.renew_every)
                    for i in range(args.sessions)]
        for s in sessions:
            s.fault_codes = frozenset() if llm is None else FAULT_CODES - {
                "engine_failed"} if args.engine_fallback else FAULT_CODES
        tick = loop.create_task(sampler())
        chaotic = loop.create_task(chaos(deadline)) if llm is not None else None
        running = asyncio.gather(*(s.run(deadline) for s in sessions))
        stopping = loop.create_task(stop.wait())
        await asyncio.wait((running, stopping), return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        interrupted = not running.done()
        if interrupted:  # each session closes its socket on the way out
            running.cancel()
            await asyncio.wait((running,))
            if not running.cancelled():
                running.exception()  # (the sessions' cancellation: retrieved, not an error)
        else:
            await running  # (a bug in a session: its traceback)
        tick.cancel()
        if chaotic is not None:
            if interrupted:
                chaotic.cancel()  # (a start in progress goes on in its thread: see stop)
            await asyncio.wait((chaotic,))
        died = gateway.proc.poll() is not None  # (under the load: nothing left to probe)
        recovery: dict[str, Any] | None = None
        if llm is not None and not died and not interrupted:
            recovery = await recover(gateway, llm, transcripts, stats)
        health: dict[str, Any] = dict.fromkeys(("sessions", "lanes", "errors", "turns"))
        after: dict[str, Any] = dict.fromkeys(("rss_mb", "fds", "tasks"))
        if not died:
            sample("clients closed")
            # the gateway forgets every session once its socket closed cleanly
            for _ in range(100):
                health = gateway.health()
                if health["sessions"] == 0:
                    break
                await asyncio.sleep(0.1)
            health = gateway.health()
            # sockets close asynchronously (the last health probe's too): give them 5 s
            for _ in range(50):
                if fd_count(gateway.pid, llm and llm.port) <= samples[0]["fds"]:
                    break
                await asyncio.sleep(0.1)
            after = await tasks(sample("sessions gone"))
            for _ in range(50):  # (--faults: /health may start a probe of the LLM: 1 task)
                if after["tasks"] <= samples[0]["tasks"]:
                    break
                await asyncio.sleep(0.1)
                after = await tasks(sample("sessions gone"))
    finally:
        stopping = time.monotonic()
        code = gateway.stop()
        stop_s = time.monotonic() - stopping
        if llm is not None:
            llm.stop()
    spells = fault_spells(log, keep=code not in (0, -signal.SIGTERM)) \
        if llm is not None else None
    accounts = [s.account for s in sessions]
    warm = next((s for s in samples if s["t_s"] >= min(60.0, args.minutes * 30)), samples[0])
    running = [s for s in samples if not s["label"]]
    frames = sum(t.frames for a in accounts for t in a.turns)
    result = {
        "sessions": args.sessions, "minutes": args.minutes, "seed": args.seed,
        "interrupted": interrupted,
        "outbox_bytes": args.outbox_bytes,
        "actions": dict(stats.actions), "turns": dict(stats.statuses),
        "resumes": stats.resumes, "resume_failed": stats.resume_failed,
        "connects": stats.connects, "renewals": stats.renewals,
        "connect_failures": stats.connect_failures,
        "frames": frames,
        "seq_gaps": sum(a.seq_gaps for a in accounts),
        "seq_repeats": sum(a.seq_repeats for a in accounts),
        "violations": sum(len(a.violations) for a in accounts),
        "violation_examples": [v for a in accounts for v in a.violations][:5],
        "errors": dict(Counter(e for a in accounts for e in a.errors)),
        "rss_mb": {"start": samples[0]["rss_mb"], "warm": warm["rss_mb"],
                   "peak": max(s["rss_mb"] for s in samples),
                   "end_of_load": running[-1]["rss_mb"] if running else None,
                   "idle_after": after["rss_mb"]},
        "fds": {"start": samples[0]["fds"], "peak": max(s["fds"] for s in samples),
                "idle_after": after["fds"]},
        "tasks": {"start": samples[0]["tasks"],
                  "peak": max(s.get("tasks", 0) for s in samples),
                  "idle_after": after["tasks"]},
        "gateway": {"sessions_after": health["sessions"], "queue_after":
                    health["lanes"], "errors": health["errors"], "turns": health["turns"],
                    "exit_code": code, "stop_s": round(stop_s, 2), "died": died},
        "cpu": cpu_per_turn(samples, warm, running, frames),
        "samples": samples,
    }
    if llm is not None:
        result["faults"] = {
            "llm_kills": len(stats.llm_down) - stats.llm_hangs, "llm_hangs": stats.llm_hangs,
            "llm_cut": llm.cut, "llm_replies": llm.begun,
            "engine_fail_rate": args.engine_fail_rate, "llm_cut_rate": args.llm_cut_rate,
            "turn_errors": dict(stats.turn_errors),
            "replayed_skipped": stats.replayed_skipped,
            "samples_degraded": sum(s.get("status") == "degraded" for s in samples),
            "samples_llm_failing": sum(bool(s.get("llm_failing")) for s in samples),
            "spells": spells, "recovery": recovery,
            "fallback": (health.get("engine") or {}).get("fallback")}
    # (a soak with no completed turn measured nothing: "--minutes 0" passed)
    # (under --faults a turn may fail: with one error of FAULT_CODES, or it is a violation)
    ended = {"completed", "cancelled"} | ({"failed"} if llm is not None else set())
    result["ok"] = (stats.statuses.get("completed", 0) > 0 and
                    not died and result["seq_gaps"] == 0 and result["seq_repeats"] == 0 and
                    result["violations"] == 0 and stats.connect_failures == 0 and
                    # (failed, lost, or refused by the gateway: "rejected: rate_limited")
                    set(stats.statuses) <= ended and
                    health["sessions"] == 0 and
                    after["tasks"] <= samples[0]["tasks"] and
                    (llm is None or faults_ok(result["faults"])))
    return result


def cpu_per_turn(samples: list[dict[str, Any]], warm: dict[str, Any],
                 running: list[dict[str, Any]], frames: int) -> dict[str, Any]:
    """The gateway's CPU (utime + stime from /proc) under the load: over all of it (the
    "start" sample to "clients closed", connecting included) per 1,000 turns (completed,
    cancelled or not) and per 1,000 frames the clients received, and in the steady part (the
    warm-up sample to the last one taken while the load ran) per 1,000 turns."""
    whole = {"load_s": None, "s_per_1k_turns": None, "s_per_1k_frames": None,
             "steady_s_per_1k_turns": None}
    closed = next((s for s in samples if s["label"] == "clients closed"), None)
    if closed is not None:
        used = closed["cpu_s"] - samples[0]["cpu_s"]
        whole["load_s"] = round(used, 2)
        if closed["turns"]:
            whole["s_per_1k_turns"] = round(1000 * used / closed["turns"], 2)
        if frames:
            whole["s_per_1k_frames"] = round(1000 * used / frames, 4)
    if running and running[-1]["turns"] > warm["turns"]:
        whole["steady_s_per_1k_turns"] = round(
            1000 * (running[-1]["cpu_s"] - warm["cpu_s"])
            / (running[-1]["turns"] - warm["turns"]), 2)
    return whole


# ---- --faults: the recovery, the spells -------------------------------------------------

RECOVERY_TURNS = 20
"""Turns the recovery check may take to see the LLM's failing spell end (3 whole replies in
a row: ``gateway.io.server.LLM_RECOVERED_AFTER``), the engine's (a whole job) and, with
``--engine-fallback``, the breaker close (a clean probe of the primary, 5 s after it last
opened: ``bench/capacity_server.py``)."""


async def recover(gateway: GatewayProcess, llm: LlmProcess, transcripts: list[str],
                  stats: SoakStats) -> dict[str, Any]:
    """After the load: the LLM server up and no more faults (SIGUSR1 to both processes);
    one session's turns until three in a row complete and ``/health`` says ok, with neither
    the LLM nor the engine failing (nor a fallback's breaker open), as protocol.md, README
    and engines/fallback.py say they come back."""
    from websockets.asyncio.client import connect

    loop = asyncio.get_running_loop()
    if llm.proc is None:  # (the load ended while it was down)
        await asyncio.to_thread(llm.start)
        stats.llm_down[-1][1] = loop.time()
    llm.calm()
    os.kill(gateway.pid, signal.SIGUSR1)
    statuses: list[str] = []
    rng = random.Random(0)

    def back(health: dict[str, Any]) -> bool:
        fallback = health["engine"].get("fallback")
        return statuses[-3:] == ["completed"] * 3 and health["status"] == "ok" and \
            health["llm"]["failing"] is None and health["engine"]["failing"] is None and \
            (fallback is None or fallback["breaker_state"] == "closed")

    health: dict[str, Any] = {}
    async with connect(gateway.url, compression=None, max_size=2**20) as ws:
        json.loads(await ws.recv())  # session.created
        turns = 0
        while turns < RECOVERY_TURNS:
            turns += 1
            await ws.send(json.dumps({"type": "transcript",
                                      "text": rng.choice(transcripts)}))
            async for message in ws:
                if not isinstance(message, str):
                    continue
                event = json.loads(message)
                if event["type"] == "error":
                    statuses.append(event["error"]["code"])
                elif event["type"] == "turn.done":
                    statuses.append(event["status"])
                    break
            health = await asyncio.to_thread(gateway.health)
            if back(health):
                break
    fallback = health["engine"].get("fallback")
    return {"turns": statuses, "status": health["status"],
            "llm_failing": health["llm"]["failing"],
            "engine_failing": health["engine"]["failing"],
            "breaker": fallback and fallback["breaker_state"], "ok": back(health)}


def fault_spells(log: Path, keep: bool) -> dict[str, int]:
    """How often the gateway's log said the LLM, and the engine, started failing and came
    back (README, Logs: once each way, not a line per turn). The log is removed unless
    ``keep`` (the gateway did not exit as told: its path is said)."""
    lines = log.read_text().splitlines() if log.exists() else []
    if keep:
        print(f"gateway log: {log}", file=sys.stderr)
    else:
        log.unlink(missing_ok=True)
    return {"llm_failing": sum("the LLM fails turns" in x for x in lines),
            "llm_back": sum("the LLM answers again" in x for x in lines),
            "engine_failing": sum(": synthetic fails (" in x for x in lines),
            "engine_back": sum("synthetic spoke a whole job again" in x for x in lines),
            "errors_logged": sum(" ERROR " in x for x in lines)}


def faults_ok(f: dict[str, Any]) -> bool:
    """The faults happened and were each said as such, and everything came back."""
    spells, errors = f["spells"], f["turn_errors"]
    return (f["recovery"] is not None and f["recovery"]["ok"] and sum(errors.values()) > 0
            and spells["llm_failing"] == spells["llm_back"] and
            (f["fallback"] is None or f["fallback"]["breaker_opens"] > 0) and
            spells["engine_failing"] == spells["engine_back"] and
            spells["errors_logged"] == 0)


def table(r: dict[str, Any]) -> str:
    rows = [
        ("sessions x minutes", f"{r['sessions']} x {r['minutes']}" +
         (" (interrupted: Ctrl-C)" if r["interrupted"] else "")),
        ("turns", ", ".join(f"{k} {v}" for k, v in sorted(r["turns"].items()))),
        ("actions", ", ".join(f"{k} {v}" for k, v in sorted(r["actions"].items()))),
        ("resumes (failed)", f"{r['resumes']} ({r['resume_failed']})"),
        ("sessions renewed", str(r["renewals"])),
        ("frames", str(r["frames"])),
        ("frames lost / duplicated", f"{r['seq_gaps']} / {r['seq_repeats']}"),
        ("protocol violations", str(r["violations"])),
        ("client-side errors", json.dumps(r["errors"])),
        ("RSS MB start/warm/peak/end/idle", "{start} / {warm} / {peak} / {end_of_load} / "
         "{idle_after}".format(**r["rss_mb"])),
        ("gateway CPU s (/1k turns, /1k frames; steady /1k turns)",
         "{load_s} ({s_per_1k_turns}, {s_per_1k_frames}; {steady_s_per_1k_turns})".format(
             **r["cpu"])),
        ("fds start/peak/idle", "{start} / {peak} / {idle_after}".format(**r["fds"])),
        ("asyncio tasks start/peak/idle", "{start} / {peak} / {idle_after}".format(
            **r["tasks"])),
        ("gateway sessions after", str(r["gateway"]["sessions_after"])),
        ("gateway errors", json.dumps(r["gateway"]["errors"])),
        ("gateway exit code (SIGTERM)", f"{r['gateway']['exit_code']}: died under the load"
         if r["gateway"]["died"] else f"{r['gateway']['exit_code']} after "
                                      f"{r['gateway']['stop_s']} s"),
    ]
    if "faults" in r:
        f = r["faults"]
        rows += [
            ("LLM killed / hung / replies cut (of)",
             f"{f['llm_kills']} / {f.get('llm_hangs', 0)} / {f['llm_cut']} "
             f"({f['llm_replies']})"),
            ("failed turns by error", json.dumps(f["turn_errors"])),
            ("replayed events skipped", str(f["replayed_skipped"])),
            ("health samples degraded", f"{f['samples_degraded']} (LLM failing: "
                                        f"{f['samples_llm_failing']})"),
            ("failing spells said (LLM, engine)",
             "{llm_failing}/{llm_back} back, {engine_failing}/{engine_back} back, "
             "{errors_logged} ERROR lines".format(**f["spells"])),
            ("recovery", "none" if f["recovery"] is None else
             "{ok}: turns {turns}, health {status}, breaker {breaker}".format(
                 **f["recovery"])),
        ]
        if f["fallback"] is not None:
            rows.append(("fallback (breaker opens, switches, truncations)",
                         "{breaker_opens}, {switches}, {truncations}".format(**f["fallback"])))
    rows.append(("ok", str(r["ok"])))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=50)
    p.add_argument("--minutes", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-lead-ms", type=int, default=1000)
    p.add_argument("--sample-s", type=float, default=10.0)
    p.add_argument("--turn-timeout", type=float, default=120.0)
    p.add_argument("--renew-every", type=int, default=10,
                   help="turns before a session closes and a new one opens (0: never)")
    p.add_argument("--outbox-bytes", type=int,
                   help="the gateway's per-session output buffer (default: the "
                        "gateway's server.outbox_bytes, 1 MiB)")
    p.add_argument("--replies", help="the replay set: JSONL of {transcript, reply}; the "
                                     "sessions say its transcripts, the gateway's replay LLM "
                                     "answers with its replies (default: the shipped set)")
    p.add_argument("--faults", action="store_true",
                   help="the server side fails too: the LLM is an HTTP server of its own "
                        "(bench/fault_llm.py), killed and started again, cutting replies; "
                        "the engine fails steps (see SOAK.md)")
    p.add_argument("--llm-kill-every", type=float, default=20.0,
                   help="--faults: mean seconds between two kills of the LLM server")
    p.add_argument("--llm-down-max", type=float, default=4.0,
                   help="--faults: the LLM server stays down 0.5 s to this long")
    p.add_argument("--llm-hang-share", type=float, default=0.0,
                   help="--faults: the share of the LLM's faults that are a hang (SIGSTOP "
                        "for 0.5-8 s) instead of a kill")
    p.add_argument("--llm-cut-rate", type=float, default=0.03,
                   help="--faults: the chance the LLM server cuts a reply")
    p.add_argument("--engine-fail-rate", type=float, default=0.003,
                   help="--faults: the chance an engine step fails (engine_failed)")
    p.add_argument("--engine-fallback", action="store_true",
                   help="--faults: a second synthetic engine takes over from the failing "
                        "one behind a breaker (engines/fallback.py): no engine_failed")
    p.add_argument("--json", help="write the result (with every sample) here")
    args = p.parse_args(argv)
    if args.replies:  # (a bad file: the gateway died before serving, in a traceback)
        from engines.llm_replay import load_replies

        try:
            load_replies(args.replies)
        except ValueError as exc:
            p.error(f"--replies: {exc}")
    import uvloop

    started = time.strftime("%Y-%m-%d %H:%M:%S")
    result = uvloop.run(soak(args))
    print(f"soak {started}")
    print(table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 130 if result["interrupted"] else 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
