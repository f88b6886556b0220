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
should be 0 is not (connect failures included), or if the gateway printed a leak (it runs
with ResourceWarnings shown; ``gateway.leaks``: an unclosed socket, a task destroyed
pending). Ctrl-C stops the load: the sessions close
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
back (``recover``), the gateway's log each failing spell once each way. Each error is tied
to the fault that caused it and each fault to its error (``match_faults``: the transcripts
carry a tag the LLM server prints with what it did to that turn's request, the engine's
failures are numbered in their messages). ``--engine-lanes``: a second engine on a lane of
its own (``[tts] also``), failing with ``--also-fail-rate``; its breaker is watched open and
closed, and no turn may be placed on it while it is open (``breaker_spells``).
``--heap-dumps DIR``: the gateway's live objects by type and RSS at each sample
(bench/heap_diff.py). bench/SOAK.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any, NamedTuple

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

SETTLE_S = 60.0
"""How long the end of a run waits for the gateway to settle (no session, descriptors and
tasks back at the start, each line counted) and for a /health answer: a deadline, not a
count of polls, so a starved machine is slow to settle rather than counted as leaking; a
gateway that settles returns at once."""
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
                 replies: str | None = None, faults: Sequence[str] = ()) -> None:
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

        return httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=SETTLE_S).json()

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
        self.outcomes: dict[str, list[str]] = {}
        """Each tagged turn's requests (``reply`` or ``cut``), in the order they began."""
        self._counters: list[threading.Thread] = []
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
            self.proc.wait()
            self.proc.stdout.close()
            raise RuntimeError(f"the LLM server did not start: {line!r}")
        self.port = int(line.split()[1])
        counter = threading.Thread(target=self._count, args=(self.proc.stdout,), daemon=True)
        counter.start()
        self._counters.append(counter)

    def _count(self, out: Any) -> None:
        """Count the process's lines, then close its pipe (left to the garbage collector,
        each process killed or stopped was an unclosed-file ResourceWarning)."""
        with out:
            for line in out:  # (until the process exits)
                outcome, _, tag = line.strip().partition(" ")
                self.begun += 1
                self.cut += outcome == "cut"
                if tag not in ("", "-"):
                    self.outcomes.setdefault(tag, []).append(outcome)

    def counted(self) -> None:
        """Wait until every line of the processes that exited was counted."""
        for counter in self._counters:
            counter.join(timeout=SETTLE_S)

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

LANES_VOICE = "mid"
"""``--engine-lanes``: the voice the sessions set, which both synthetic engines have (a turn
without a voice stays on the primary lane: README, "Placement")."""

BREAKER_POLL_S = 0.25
"""``--engine-lanes``: how often ``/health`` is asked whether the second lane is tripped."""

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
    llm_hung: list[bool] = field(default_factory=list)
    """``--faults``: for each of ``llm_down``, whether it was a hang."""
    ended: list[TurnEnd] = field(default_factory=list)
    """``--faults``: every turn that ended, what ``match_faults`` ties to the faults."""


@dataclass
class TurnEnd:
    """A turn that ended (``--faults``), as ``match_faults`` needs it."""

    tag: str
    status: str
    action: str
    sent_at: float
    errors: list[tuple[str, float, str]]
    """Its errors: code, arrival time, message."""
    engines: list[str]
    """The engines that spoke it (``turn.done`` → ``metrics.engines``)."""
    frames: int = 0
    """Frames of it received."""


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
        self.voice: str | None = None
        """``--engine-lanes``: the voice each new session is set to (a voice both lanes'
        engines have: a turn without one stays on the primary lane)."""
        self.tagged = False
        """``--faults``: each transcript ends with `` #s<index>t<n>``, the turn's tag, which
        bench/fault_llm.py takes off and prints with what it did to that turn's request."""
        self.turns_sent = 0
        self.fault_codes: frozenset[str] = frozenset()
        """``--faults``: a turn may fail, with one error of these (``FAULT_CODES``, less
        ``engine_failed`` with ``--engine-fallback``)."""
        self.turn_errors: dict[int, list[tuple[str, float, str]]] = {}
        """The current session's errors by turn id: code, arrival time and message."""
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
                await self._set_voice(ws)
        else:
            self.session_id, self.resume_token = created["session_id"], created["resume_token"]
            await self._set_voice(ws)
        self.ws = ws
        self.loop.create_task(self._read(ws))

    async def _set_voice(self, ws: Any) -> None:
        """A new session speaks ``voice`` (``--engine-lanes``), before its first turn."""
        if self.voice is None:
            return
        await ws.send(json.dumps({"type": "session.update", "session": {"voice": self.voice}}))
        answer = json.loads(await ws.recv())
        assert answer["type"] == "session.updated", answer

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
                        (event["error"]["code"], now, event["error"].get("message", "")))
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
        text = self.rng.choice(self.transcripts)
        self.turns_sent += 1
        tag = f"s{self.index}t{self.turns_sent}"
        try:
            await self.ws.send(json.dumps({"type": "transcript", "text": f"{text} #{tag}"
                                           if self.tagged else text}))
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
            self._check_errors(turn, tag, action)

    def _check_errors(self, turn: Any, tag: str, action: str) -> None:
        """A turn that ended says why, once: ``failed`` with exactly one error, a turn's
        error of ``FAULT_CODES`` (under ``--faults``; none without), an ``llm_unavailable``
        only while the LLM server was down; ``completed`` and ``cancelled`` with none."""
        if turn.turn_id is None or turn.status not in ("completed", "cancelled", "failed"):
            return
        errors = self.turn_errors.pop(turn.turn_id, [])
        codes = [code for code, _, _ in errors]
        if self.tagged:
            self.stats.ended.append(TurnEnd(tag, turn.status, action, turn.sent_at, errors,
                                            list(turn.server_metrics.get("engines") or []),
                                            turn.frames))
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
              *(["--engine-fallback"] if args.engine_fallback else []),
              *(["--engine-lanes", "--also-fail-rate", str(args.also_fail_rate)]
                if args.engine_lanes else [])] \
        if llm is not None else []
    if args.heap_dumps:
        faults += ["--heap-dumps", args.heap_dumps,
                   *(["--heap-trace"] if args.heap_trace else []),
                   *(["--heap-no-trim"] if args.heap_no_trim else [])]
    try:
        gateway = GatewayProcess(args.max_lead_ms, args.outbox_bytes, args.replies, faults)
    except BaseException:
        if llm is not None:
            llm.stop()
        raise
    loop = asyncio.get_running_loop()
    samples: list[dict[str, Any]] = []
    stats = SoakStats()
    breaker: list[BreakerPoll] = []
    t0 = loop.time()
    stop = asyncio.Event()

    def interrupt() -> None:
        stop.set()
        loop.remove_signal_handler(signal.SIGINT)  # a second Ctrl-C stops at once

    with contextlib.suppress(NotImplementedError):  # (Windows: Ctrl-C ends it at once)
        loop.add_signal_handler(signal.SIGINT, interrupt)

    def sample(label: str = "") -> dict[str, Any]:
        s = {"t_s": round(loop.time() - t0, 1), "rss_mb": round(rss_mb(gateway.pid), 1),
             "fds": fd_count(gateway.pid, None if llm is None else llm.port), "label": label,
             "cpu_s": round(cpu_seconds(gateway.pid), 2),
             "turns": sum(stats.statuses.values())}
        samples.append(s)
        return s

    dumps = iter(range(1_000_000))

    def dump(s: dict[str, Any], last: bool = False) -> None:
        """``--heap-dumps``: the gateway writes ``heap-<n>`` now (it counts the signals),
        ``n`` kept in ``s["heap"]``; after ``/health`` answered, not before (the dump holds
        the gateway's loop a few seconds). The ``last`` (idle) trims even with
        ``--heap-no-trim`` (SIGHUP): what the allocator kept, given back; with
        ``--heap-last-only`` it is the only one (no collection forced under the load)."""
        if args.heap_dumps and (last or not args.heap_last_only):
            s["heap"] = next(dumps)
            os.kill(gateway.pid, signal.SIGHUP if last else signal.SIGUSR2)

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
            at = loop.time() + rng.expovariate(1 / args.llm_kill_every)
            # (not past the deadline: the soak waits for this task once the load ended, and
            # waited until the next fault's time, for ever with --llm-kill-every 100000)
            await asyncio.sleep(max(0.0, min(at, deadline) - loop.time()))
            if loop.time() >= deadline:
                return
            hang = rng.random() < args.llm_hang_share
            down = [loop.time(), math.inf]
            stats.llm_down.append(down)
            stats.llm_hung.append(hang)
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
            except httpx.TimeoutException:  # (a loaded machine: the next one may answer)
                print(f"[{loop.time() - t0:7.1f}s] /health did not answer in time",
                      file=sys.stderr, flush=True)
                continue
            except (OSError, httpx.HTTPError):  # (/proc/<pid> gone, /health refused)
                if gateway.proc.poll() is None:
                    raise
                print(f"gateway exited with {gateway.proc.returncode} under the load",
                      file=sys.stderr, flush=True)
                return
            dump(s)
            turns = sum(stats.statuses.values())
            print(f"[{s['t_s']:7.1f}s] rss {s['rss_mb']:.1f} MB fds {s['fds']} "
                  f"tasks {s['tasks']} turns {turns} "
                  f"resumes {stats.resumes} {dict(stats.statuses)}", file=sys.stderr,
                  flush=True)

    try:
        dump(await tasks(sample("start")))
        deadline = loop.time() + args.minutes * 60
        sessions = [SoakSession(gateway.url, i, args.seed, transcripts, stats,
                                args.turn_timeout, args.renew_every)
                    for i in range(args.sessions)]
        for s in sessions:
            s.fault_codes = frozenset() if llm is None else FAULT_CODES - {
                "engine_failed"} if args.engine_fallback else FAULT_CODES
            s.tagged = llm is not None
            s.voice = LANES_VOICE if args.engine_lanes else None
        tick = loop.create_task(sampler())
        watching = threading.Event()
        watcher = threading.Thread(target=watch_breaker, args=(gateway, watching, breaker),
                                   daemon=True)
        if args.engine_lanes:
            watcher.start()
        chaotic = loop.create_task(chaos(deadline)) if llm is not None else None
        talking = asyncio.gather(*(s.run(deadline) for s in sessions))
        interrupting = loop.create_task(stop.wait())
        await asyncio.wait((talking, interrupting), return_when=asyncio.FIRST_COMPLETED)
        interrupting.cancel()
        interrupted = not talking.done()
        if interrupted:  # each session closes its socket on the way out
            talking.cancel()
            await asyncio.wait((talking,))
            if not talking.cancelled():
                talking.exception()  # (the sessions' cancellation: retrieved, not an error)
        else:
            await talking  # (a bug in a session: its traceback)
        tick.cancel()
        watching.set()
        if watcher.is_alive():
            await asyncio.to_thread(watcher.join)
        if chaotic is not None:
            if interrupted:
                chaotic.cancel()  # (a start in progress goes on in its thread: see stop)
            await asyncio.wait((chaotic,))
        died = gateway.proc.poll() is not None  # (under the load: nothing left to probe)
        recovery: dict[str, Any] | None = None
        if llm is not None and not died and not interrupted:
            recovery = await recover(gateway, llm, transcripts, stats,
                                     LANES_VOICE if args.engine_lanes else None)
        health: dict[str, Any] = dict.fromkeys(("sessions", "lanes", "errors", "turns"))
        after: dict[str, Any] = dict.fromkeys(("rss_mb", "fds", "tasks"))
        if not died:
            sample("clients closed")
            # the gateway forgets every session once its socket closed cleanly
            settled = time.monotonic() + SETTLE_S
            while time.monotonic() < settled:
                health = gateway.health()
                if health["sessions"] == 0:
                    break
                await asyncio.sleep(0.1)
            health = gateway.health()
            # sockets close asynchronously (the last health probe's too)
            while time.monotonic() < settled:  # (another process's: no event to wait on)
                if fd_count(gateway.pid, None if llm is None else llm.port) <= samples[0]["fds"]:
                    break
                await asyncio.sleep(0.1)
            after = await tasks(sample("sessions gone"))
            # (--faults: /health may start a probe of the LLM: 1 task)
            while after["tasks"] > samples[0]["tasks"] and time.monotonic() < settled:
                await asyncio.sleep(0.1)
                after = await tasks(sample("sessions gone"))
            dump(after, last=True)  # (before the SIGTERM: it takes its signals in order)
    finally:
        stopping = time.monotonic()
        code = gateway.stop()
        stop_s = time.monotonic() - stopping
        if llm is not None:
            llm.stop()
            llm.counted()
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
                    "exit_code": code, "stop_s": round(stop_s, 2), "died": died,
                    "leaks": gateway.leaks},
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
        result["faults"]["matched"] = match_faults(
            stats, llm.outcomes, spells["injected"] if spells else {}, health)
        if args.engine_lanes:
            result["faults"]["breaker"] = breaker_spells(breaker, t0)
    # (a soak with no completed turn measured nothing: "--minutes 0" passed)
    # (under --faults a turn may fail: with one error of FAULT_CODES, or it is a violation)
    ended = {"completed", "cancelled"} | ({"failed"} if llm is not None else set())
    result["ok"] = (stats.statuses.get("completed", 0) > 0 and
                    not died and not gateway.leaks and
                    result["seq_gaps"] == 0 and result["seq_repeats"] == 0 and
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
                  stats: SoakStats, voice: str | None = None) -> dict[str, Any]:
    """After the load: the LLM server up and no more faults (SIGUSR1 to both processes);
    one session's turns until three in a row complete and ``/health`` says ok, with neither
    the LLM nor the engine failing (nor a fallback's breaker open), as protocol.md, README
    and engines/fallback.py say they come back; with ``voice`` (``--engine-lanes``) the
    session speaks it, and no lane's breaker may be tripped either (README, "Failures": it
    lets a turn try the lane again after 30 s)."""
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
            (fallback is None or fallback["breaker_state"] == "closed") and \
            not any(lane.get("tripped") for lane in health["lanes"].values())

    health: dict[str, Any] = {}
    async with connect(gateway.url, compression=None, max_size=2**20) as ws:
        json.loads(await ws.recv())  # session.created
        if voice is not None:
            await ws.send(json.dumps({"type": "session.update", "session": {"voice": voice}}))
            json.loads(await ws.recv())  # session.updated
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


def fault_spells(log: Path, keep: bool) -> dict[str, Any]:
    """How often the gateway's log said the LLM, and the engine, started failing and came
    back (README, Logs: once each way, not a line per turn). The log is removed unless
    ``keep`` (the gateway did not exit as told) or it has an ERROR line (which fails the
    soak: before, it was removed all the same, and the error with it): its path is said."""
    lines = log.read_text().splitlines() if log.exists() else []
    if keep or any(" ERROR " in x for x in lines):
        print(f"gateway log: {log}", file=sys.stderr)
    else:
        log.unlink(missing_ok=True)
    return {"llm_failing": sum("the LLM fails turns" in x for x in lines),
            "llm_back": sum("the LLM answers again" in x for x in lines),
            "engine_failing": sum(": synthetic fails (" in x for x in lines),
            "engine_back": sum("synthetic spoke a whole job again" in x for x in lines),
            "errors_logged": sum(" ERROR " in x for x in lines),
            "injected": {name: int(n) for x in lines if "injected failures: " in x
                         for name, n in [x.split("injected failures: ")[1].split()]}}


class BreakerPoll(NamedTuple):
    """``--engine-lanes``: one look at the second lane (``/health`` → ``lanes.ane``)."""

    asked: float
    answered: float
    """When the request went and when its answer came (``time.monotonic``, the sessions'
    loop clock): the gateway read the lane in between."""
    tripped: bool
    rerouted: int
    """Turns it moved to the primary so far."""
    placed: int
    """Turns placed on it so far."""
    trips: int
    """Times its breaker opened so far."""


def watch_breaker(gateway: GatewayProcess, stop: threading.Event,
                  out: list[BreakerPoll]) -> None:
    """``--engine-lanes``: every ``BREAKER_POLL_S`` until ``stop``, the second lane
    (``ane``) as ``/health`` says it: tripped or not, the turns it moved to the primary,
    the turns placed on it and its breaker's openings, so far."""
    import httpx

    while not stop.wait(BREAKER_POLL_S):
        asked = time.monotonic()
        try:
            lane = gateway.health()["lanes"]["ane"]
        except httpx.TimeoutException:
            continue  # (a loaded machine: the next poll may be answered)
        except (OSError, httpx.HTTPError):
            return  # (the gateway died: said by the sampler)
        out.append(BreakerPoll(asked, time.monotonic(), bool(lane["tripped"]),
                               lane["rerouted"], lane["placed"], lane["trips"]))


def breaker_spells(polls: list[BreakerPoll], t0: float) -> dict[str, Any]:
    """The second lane's breaker as the polls saw it: each time it was tripped, from the
    first answer that said so to the first that did not (``open_s``; a spell shorter than
    a poll may be missed). ``closed_early``: spells that surely closed before the reset,
    the longest they could have lasted (from the request before the first that said open
    to the answer that said closed) shorter than it.

    ``placed_while_open``: turns placed on the lane between two polls that both found it
    tripped with the same count of openings (``TurnPlacer.trips``: it was open all the
    time between, a close and a new trip would have counted one more); the goal is none
    (README, "Failures": no new turn goes to a tripped lane while another lane has the
    voice, as both have the sessions'). ``open_s_checked``: the time those pairs surely
    covered (from the first's answer to the second's request); ``placed_while_closed``: the
    turns placed between two polls that found it closed (the lane does take turns)."""
    from bench.capacity_server import FALLBACK_RESET_S  # (the lane's breaker_reset_s)

    spells: list[tuple[float, float, float | None, float | None]] = []
    """Each spell: the request before it opened, its first answer open, its first answer
    closed, and that answer's end (None while open)."""
    before = -math.inf  # (open at the first poll: it may have opened long before)
    for poll in polls:
        if poll.tripped and (not spells or spells[-1][3] is not None):
            spells.append((before, poll.answered, None, None))
        elif not poll.tripped and spells and spells[-1][3] is None:
            spells[-1] = (spells[-1][0], spells[-1][1], poll.answered, poll.answered)
        if not poll.tripped:
            before = poll.asked
    closed = [(b, o, c, e) for b, o, c, e in spells if c is not None and e is not None]
    placed_open = placed_closed = 0
    checked_s = 0.0
    for a, b in pairwise(polls):
        if a.tripped and b.tripped and a.trips == b.trips:
            placed_open += b.placed - a.placed
            checked_s += max(0.0, b.asked - a.answered)
        elif not a.tripped and not b.tripped:
            placed_closed += b.placed - a.placed
    return {"polls": len(polls), "opens": len(spells),
            "open_s": [round(c - o, 2) for _, o, c, _ in closed],
            "closed_early": sum(e - b < FALLBACK_RESET_S for b, _, _, e in closed),
            "still_open": len(spells) - len(closed),
            "spells": [[round(o - t0, 2), None if c is None else round(c - t0, 2)]
                       for _, o, c, _ in spells],
            "rerouted": polls[-1].rerouted if polls else 0,
            "placed": polls[-1].placed if polls else 0,
            "trips": polls[-1].trips if polls else 0,
            "placed_while_open": placed_open, "open_s_checked": round(checked_s, 2),
            "placed_while_closed": placed_closed}


LLM_CODES = frozenset({"llm_failed", "llm_unavailable"})

INJECTED = re.compile(r"^(\S+) engine: injected failure #(\d+) ")
"""An ``engine_failed`` message from ``SyntheticEngine(fail_rate=...)``: its engine and the
failure's number."""


def match_faults(stats: SoakStats, outcomes: dict[str, list[str]], injected: dict[str, int],
                 health: dict[str, Any]) -> dict[str, Any]:
    """Each error a turn failed with, tied to the fault that caused it, and each fault to
    the error it caused (or why it caused none):

    * ``llm_failed``: its turn's request was cut by the LLM server (its last request, as
      the server printed it with the turn's tag), else the server was killed between the
      transcript and the error, else it hung over that time;
    * ``llm_unavailable``: the server was down (killed) or hung over that time;
    * ``engine_failed``: the message names one injected failure (``#n`` of an engine),
      never named by another error;

    and the other way: every cut request's turn failed ``llm_failed`` (or was cancelled
    first, failed first by another error, or the gateway's retry of a request cut before
    its answer's headers was answered whole); every injected failure of an engine named
    by an error, or taken over (``--engine-fallback``: the fallback's switches and
    truncations; ``--engine-lanes``: the turns the second lane moved to the primary), or
    on a sentence an LLM error left to say (no second error for a turn: protocol.md; not
    tied one by one, but no more of them than turns an LLM error failed while they
    spoke).
    ``unexplained``: errors without a fault and faults without an error (goal: none)."""
    kills = [(d, u) for (d, u), h in zip(stats.llm_down, stats.llm_hung, strict=True) if not h]
    hangs = [(d, u) for (d, u), h in zip(stats.llm_down, stats.llm_hung, strict=True) if h]
    causes: Counter[str] = Counter()
    unexplained: list[str] = []
    named: dict[str, set[int]] = {}
    per_kill = Counter[int]()
    for t in stats.ended:
        for code, at, message in t.errors:
            cause = None
            if code == "llm_failed" and (outcomes.get(t.tag) or [""])[-1] == "cut":
                cause = "cut"
            elif code == "llm_failed" and (i := next((i for i, (d, _) in enumerate(kills)
                                                      if t.sent_at <= d <= at), None)) \
                    is not None:
                cause = "kill"
                per_kill[i] += 1
            elif code in ("llm_failed", "llm_unavailable") and (
                    i := next((i for i, (d, u) in enumerate(kills)
                               if d <= at and t.sent_at <= u), None)) is not None:
                cause = "down"
                per_kill[i] += 1
            elif code in ("llm_failed", "llm_unavailable") and any(
                    d <= at and t.sent_at <= u for d, u in hangs):
                cause = "hang"
            elif code == "engine_failed" and (found := INJECTED.match(message)):
                number = int(found.group(2))
                taken = named.setdefault(found.group(1), set())
                cause = "injected" if number not in taken else None
                taken.add(number)
            causes[f"{code} <- {cause or 'nothing'}"] += 1
            if cause is None:
                unexplained.append(f"{t.tag} {t.status}: {code} ({message}) without a fault")
    by_tag = {t.tag: t for t in stats.ended}
    cuts: Counter[str] = Counter()
    for tag, seq in outcomes.items():
        if "cut" not in seq:
            continue
        end = by_tag.get(tag)
        codes = [code for code, _, _ in end.errors] if end is not None else []
        if end is None:
            why = "turn not ended (lost)"
        elif seq[-1] != "cut":
            why = f"retried, answered whole: {end.status}"
        elif "llm_failed" in codes:
            why = "llm_failed"
        elif end.status == "failed" and codes:
            why = f"failed first: {codes[0]}"
        elif end.status == "cancelled":
            why = "cancelled first"
        else:
            why = f"no error: {end.status}"
            unexplained.append(f"{tag} {end.status}: its request was cut, no error")
        cuts[why] += 1
    lanes = health.get("lanes") or {}
    fallback = (health.get("engine") or {}).get("fallback") or {}
    # a failure on a sentence an LLM error left to say ends its turn without a second error
    # (protocol.md, Errors): at most one such per turn an LLM error failed while it spoke
    spoke_then_failed = sum(
        1 for t in stats.ended if t.frames and t.errors and t.errors[0][0] in LLM_CODES)
    engines: dict[str, dict[str, int]] = {}
    for name, n in injected.items():
        taken_over = (fallback.get("switches", 0) + fallback.get("truncations", 0)
                      if name == "synthetic" else 0) + \
            sum(lane.get("rerouted", 0) for lane in lanes.values()
                if lane.get("engine") == name)
        errors = len(named.get(name, ()))
        engines[name] = {"injected": n, "errors": errors, "taken_over": taken_over,
                         "after_an_llm_error": n - errors - taken_over}
        if not 0 <= n - errors - taken_over <= spoke_then_failed:
            unexplained.append(f"{name}: {n} failures injected, {errors} errors, "
                               f"{taken_over} taken over, {spoke_then_failed} turns an LLM "
                               "error failed while they spoke")
    return {"errors_by_cause": dict(causes), "cuts": dict(cuts), "engines": engines,
            "errors_per_kill": [per_kill[i] for i in range(len(kills))],
            "unexplained": len(unexplained), "unexplained_examples": unexplained[:10]}


def faults_ok(f: dict[str, Any]) -> bool:
    """The faults happened (errors, or failures another engine took over) and were each
    said as such, and everything came back."""
    spells, errors = f["spells"], f["turn_errors"]
    happened = sum(errors.values()) > 0 or any(
        e["taken_over"] for e in f["matched"]["engines"].values())
    return (f["recovery"] is not None and f["recovery"]["ok"] and happened
            and spells["llm_failing"] == spells["llm_back"] and
            (f["fallback"] is None or f["fallback"]["breaker_opens"] > 0) and
            spells["engine_failing"] == spells["engine_back"] and
            spells["errors_logged"] == 0 and f["matched"]["unexplained"] == 0 and
            ("breaker" not in f or f["breaker"]["opens"] > 0 and
             f["breaker"]["closed_early"] == 0 and f["breaker"]["placed_while_open"] == 0))


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
        m = f["matched"]
        rows += [
            ("errors tied to faults", json.dumps(m["errors_by_cause"])),
            ("cut requests became", json.dumps(m["cuts"])),
            ("engine failures (injected, errors, taken over, after an LLM error)", ", ".join(
                f"{k} {v['injected']}/{v['errors']}/{v['taken_over']}/"
                f"{v['after_an_llm_error']}"
                for k, v in m["engines"].items())),
            ("errors per kill", str(m["errors_per_kill"])),
            ("unexplained", f"{m['unexplained']} {m['unexplained_examples'][:3]}"),
        ]
        if "breaker" in f:
            b = f["breaker"]
            rows.append(("lane ane breaker (opens, s open, rerouted)",
                         f"{b['opens']}, {b['open_s']}, {b['rerouted']}"))
            rows.append(("lane ane turns placed (all, while open, s open checked, "
                         "while closed)", f"{b['placed']}, {b['placed_while_open']}, "
                         f"{b['open_s_checked']}, {b['placed_while_closed']}"))
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
    p.add_argument("--heap-dumps", metavar="DIR",
                   help="the gateway writes its live objects by type and its RSS before "
                        "and after malloc_trim here at each sample (heap-<n>, n in the "
                        "sample's 'heap'; bench/heap_diff.py compares two)")
    p.add_argument("--heap-trace", action="store_true",
                   help="--heap-dumps: the gateway traces its allocations too (tracemalloc: "
                        "slower), a snapshot with each dump")
    p.add_argument("--heap-no-trim", action="store_true",
                   help="--heap-dumps: no malloc_trim but at the last dump (once idle), so "
                        "the RSS steps as without dumps")
    p.add_argument("--heap-last-only", action="store_true",
                   help="--heap-dumps: only the last dump (once idle, trimmed): no garbage "
                        "collection forced at each sample either")
    p.add_argument("--engine-lanes", action="store_true",
                   help="--faults: a second synthetic engine on a lane of its own ([tts] "
                        "also), failing with --also-fail-rate; the sessions set a voice both "
                        "have, so turns are placed between the lanes (see SOAK.md)")
    p.add_argument("--also-fail-rate", type=float, default=0.03,
                   help="--engine-lanes: the chance a step of the second engine fails")
    p.add_argument("--json", help="write the result (with every sample) here")
    args = p.parse_args(argv)
    if args.heap_dumps:  # (the gateway runs in the repository, not in our directory)
        args.heap_dumps = os.path.abspath(args.heap_dumps)
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
