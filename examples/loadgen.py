"""Load generator for the voice gateway: N sessions talking at once, each listened to by a
virtual speaker that plays the audio in real time.

    python examples/loadgen.py --url ws://127.0.0.1:8780/v1/voice --sessions 8 --turns 5 \\
        [--transcripts FILE] [--arrival 2.0] [--seed 1] [--json OUT] [--plot OUT.png]

Each session connects, then for each turn sends a transcript (from ``--transcripts``: JSONL
with a ``transcript`` field, or plain text one per line; default the replay set
engines/data/replies.jsonl), reads the reply, and *listens* to it: a virtual playback clock
starts when the first frame of the turn arrives (plus ``--prebuffer-ms``) and consumes audio
at 24,000 samples per second, like a phone speaker. While audio plays the session sends a
``playback`` mark every 250 ms, as a real client must. Each message goes named
(``event_id``: ``l1``, ``l2``, ... in each session), and an ``error`` without a turn is the
transcript's refusal when it names that transcript (protocol.md, Errors), not because it
came while the transcript waited: one naming a mark is counted, and the turn goes on; one
naming nothing (a frame the gateway could not read) is still the transcript's. The next
transcript goes out once the reply has finished playing plus a think time drawn from an
exponential distribution with mean ``--arrival`` seconds (seeded; 0 means right away); the
sessions' first connects are spread uniformly over ``--arrival`` seconds too. A gateway
with tokens takes one in the URL: ``--url 'ws://HOST:8780/v1/voice?token=...'``. A turn
whose ``turn.done`` has not come after ``--turn-timeout`` seconds (default 90, beyond the
gateway's own 60 s LLM stall timeout, so a stalled LLM shows as the gateway's
``llm_unavailable``) is counted ``lost``, and so is the session's socket; the turns it then
never sends are ``unsent``.

Measured per turn (client side, from the moment the transcript was sent):

* TTFA: first audio frame arrived (the first ``sentence`` event comes with it: the gateway
  sends each one just before its sentence's first frame); beside it, the gateway's own
  figures from ``turn.done``: its TTFA, the LLM's first token and the first segment ready
  to speak (``ttft_ms``, ``first_sentence_ms``), which split the time between LLM, segmenter
  and voice;
* lateness of every audio frame: arrival minus when the player needed it (negative = it
  came early, which is normal: the server keeps up to ``max_lead_ms`` ahead);
* underruns: the player ran dry in the middle of a sentence (a gap the listener hears as a
  stutter); sentence gaps: it ran dry between two sentences (a longer pause). The gateway's
  ``underruns`` (``turn.done``, protocol.md) count both, on its model of this player: the
  table sets their sum beside it;
* ``seq`` gaps or repeats, frames after their ``turn.done``, ``error`` events, failed turns.

A progress line goes to stderr while it runs, a p50/p90/p99 table to stdout at the end;
``--json`` writes the summary and every turn, each with its own figures and ``error``: the
gateway's ``error`` object for it (``code``, ``message``, ``event_id``) when it failed or
its transcript was refused (the summary counts codes only). The exit status is 1 when any
turn failed, any error arrived or ``seq`` broke. Ctrl-C stops the run: the sessions close
their sockets, the turns being heard count as ``interrupted`` (those never sent as
``unsent``), and the table (and ``--json``, ``--plot``) has what was measured until then;
the exit status is 130 (a second Ctrl-C stops at once).

The accounting is ``SessionAccount``: pure (times are passed in), unit-tested in
tests/test_loadgen.py. Needs ``websockets``; ``--plot`` needs matplotlib.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import itertools
import json
import math
import random
import signal
import struct
import sys
import time
import urllib.parse
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SAMPLE_RATE = 24_000
HEADER = struct.Struct("<BBHII")  # version, flags, sentence index, turn_id, seq
FLAG_SENTENCE_END, FLAG_TURN_END = 0x01, 0x02
SEQ_MOD = 2**32
MARK_INTERVAL_S = 0.25
DEFAULT_TRANSCRIPTS = Path(__file__).resolve().parent.parent / "engines/data/replies.jsonl"


# ---- accounting (pure) -------------------------------------------------------------------


@dataclass
class TurnStats:
    """One turn as the listener experienced it. Times are seconds on the caller's clock."""

    sent_at: float
    turn_id: int | None = None
    status: str | None = None
    """``completed``, ``cancelled``, ``failed`` (from ``turn.done``), ``lost`` when the
    socket closed or the turn timed out before its ``turn.done``, or ``interrupted`` when the
    run was stopped (Ctrl-C) first."""
    ttfa_s: float | None = None
    done_s: float | None = None
    frames: int = 0
    audio_s: float = 0.0
    lateness_s: list[float] = field(default_factory=list)
    """Per audio frame: arrival minus the moment the player needed it."""
    arrivals: list[float] = field(default_factory=list)
    """Arrival time of each frame in ``lateness_s`` (same order)."""
    underruns: int = 0
    sentence_gaps: int = 0
    starved_s: float = 0.0
    """Total time the player sat with nothing to play after playback began."""
    server_metrics: dict[str, Any] = field(default_factory=dict)
    error: dict[str, Any] | None = None
    """The gateway's ``error`` object for this turn, as sent (``code``, ``message``, and
    ``event_id``: its transcript's, when that had one): the turn's failure (an ``error``
    with its ``turn_id``; a turn has at most one) or its transcript's refusal (``status``
    ``rejected: <code>``); None when the gateway sent none (a ``lost`` turn's reason is in
    the summary's ``errors``)."""


class SessionAccount:
    """What one session's listener saw: feed it every message with its arrival time.

    ``sent(now)`` when a transcript goes out, ``event(obj, now)`` for each JSON event,
    ``frame(data, now)`` for each binary frame. ``played_ms(now)`` is what to report in a
    ``playback`` mark; ``playback_end`` is when the last audio received will have played.

    The player: playback of a turn starts ``prebuffer_s`` after its first frame arrives and
    runs at real time. A frame is needed when everything before it has played; if it
    arrives later than that the player was starved (an underrun when the frame continues a
    sentence, a sentence gap when it starts a new one) and resumes on arrival.
    """

    def __init__(self, *, prebuffer_s: float = 0.0, sample_rate: int = SAMPLE_RATE) -> None:
        self.prebuffer_s = prebuffer_s
        self.rate = sample_rate
        self.turns: list[TurnStats] = []
        self.errors: list[str] = []
        """``error`` event codes (and ``closed``/``timeout`` from the runner)."""
        self.violations: list[str] = []
        """Broken protocol promises: frames after ``turn.done``, of an unknown turn, bad header."""
        self.seq_gaps = 0
        """Frames missing from the ``seq`` sequence."""
        self.unsent = 0
        """Turns never sent: the session was lost (closed, timed out, refused) before them."""
        self.seq_repeats = 0
        """Frames whose ``seq`` repeated or went backwards."""
        self._next_seq: int | None = None
        self._turn: TurnStats | None = None
        self._asked: str | None = None  # the event_id of the current turn's transcript
        self._ended: set[int] = set()
        self._play_end: float | None = None  # when the buffered audio runs out
        self._received_s = 0.0  # audio received in the current turn
        self._last_sentence: int | None = None

    # -- inputs --

    def sent(self, now: float, event_id: str | None = None) -> TurnStats:
        """A transcript went out (named ``event_id``): a new turn begins (the previous one is
        no longer heard)."""
        self._turn = TurnStats(sent_at=now)
        self._asked = event_id
        self.turns.append(self._turn)
        self._play_end = None
        self._received_s = 0.0
        self._last_sentence = None
        return self._turn

    def event(self, event: dict[str, Any], now: float) -> None:
        kind = event.get("type")
        turn = self._turn
        if kind == "turn.started" and turn is not None and turn.turn_id is None:
            turn.turn_id = event["turn_id"]
        elif kind == "turn.done":
            self._ended.add(event["turn_id"])
            if turn is not None and self._is_current(event):
                turn.status = event["status"]
                turn.done_s = now - turn.sent_at
                turn.server_metrics = dict(event.get("metrics") or {})
        elif kind == "error":
            error = event.get("error", {})
            code = error.get("code", "unknown")
            self.errors.append(code)
            named = error.get("event_id")
            if turn is not None and turn.turn_id is None and "turn_id" not in event and \
                    (named is None or named == self._asked):
                # refused at once: no turn started. By the name it gives (protocol.md,
                # Errors): one naming another message (a playback mark) is not the
                # transcript's; one naming nothing (a frame the gateway could not read) is
                # taken, as before, for the refusal of the transcript waiting
                turn.status = f"rejected: {code}"
                turn.error = dict(error)
            elif turn is not None and "turn_id" in event and self._is_current(event) and \
                    turn.error is None:
                turn.error = dict(error)  # the turn's failure (its first error: the one)

    @property
    def rejected(self) -> bool:
        """The transcript just sent was refused (``text_too_long``, ``rate_limited``...)."""
        return self._turn is not None and (self._turn.status or "").startswith("rejected")

    def frame(self, data: bytes, now: float) -> None:
        if len(data) < HEADER.size or data[0] != 1:
            self.violations.append(f"bad frame header {bytes(data[:HEADER.size]).hex()}")
            return
        _, flags, sentence, turn_id, seq = HEADER.unpack_from(data)
        self._check_seq(seq)
        turn = self._turn
        if turn_id in self._ended:
            self.violations.append(f"frame seq {seq} of turn {turn_id} after its turn.done")
            return
        if turn is None or turn.turn_id != turn_id:
            self.violations.append(f"frame seq {seq} of turn {turn_id}, not the current turn")
            return
        samples = (len(data) - HEADER.size) // 2
        turn.frames += 1
        if samples == 0:
            return  # an empty end-of-turn marker: nothing to play
        duration = samples / self.rate
        if self._play_end is None:  # first audio of the turn: playback starts
            turn.ttfa_s = now - turn.sent_at
            self._play_end = now + self.prebuffer_s
            lateness = -self.prebuffer_s
        else:
            lateness = now - self._play_end
            if lateness > 0:  # the player ran dry before this frame came
                turn.starved_s += lateness
                if sentence == self._last_sentence:
                    turn.underruns += 1
                else:
                    turn.sentence_gaps += 1
                self._play_end = now
        turn.lateness_s.append(lateness)
        turn.arrivals.append(now)
        self._play_end += duration
        self._received_s += duration
        turn.audio_s += duration
        self._last_sentence = sentence
        del flags  # sentence/turn ends need no accounting: turn.done is the authority

    def withdraw(self) -> None:
        """The transcript ``sent()`` announced never went out (its socket had closed): the
        turn is unsent, not lost."""
        if self._turn is not None and self._turn.turn_id is None and self._turn.status is None:
            self.turns.pop()
            self._turn = self.turns[-1] if self.turns else None

    def interrupted(self) -> None:
        """The run was stopped (Ctrl-C) while the current turn was being heard."""
        if self._turn is not None and self._turn.status is None:
            self._turn.status = "interrupted"

    def lost(self, reason: str) -> None:
        """The current turn will never finish (socket closed, timeout)."""
        self.errors.append(reason)
        if self._turn is not None and self._turn.status is None:
            self._turn.status = "lost"

    # -- outputs --

    def played_ms(self, now: float) -> float:
        """Audio of the current turn played by ``now`` (what a ``playback`` mark reports)."""
        if self._play_end is None:
            return 0.0
        buffered = max(0.0, self._play_end - now)
        return max(0.0, self._received_s - buffered) * 1000

    @property
    def playback_end(self) -> float | None:
        return self._play_end

    @property
    def current_turn_id(self) -> int | None:
        return self._turn.turn_id if self._turn is not None else None

    def _is_current(self, event: dict[str, Any]) -> bool:
        return self._turn is not None and event.get("turn_id") == self._turn.turn_id

    def _check_seq(self, seq: int) -> None:
        expected = 0 if self._next_seq is None else self._next_seq
        ahead = (seq - expected) % SEQ_MOD
        if ahead == 0:
            pass
        elif ahead < SEQ_MOD // 2:
            self.seq_gaps += ahead
        else:
            self.seq_repeats += 1
        if ahead < SEQ_MOD // 2:  # a repeat does not move the expectation back
            self._next_seq = (seq + 1) % SEQ_MOD


# ---- report ------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class Report:
    sessions: int
    turns_requested: int
    wall_s: float
    accounts: list[SessionAccount]
    t0: float
    interrupted: bool = False
    """Stopped (Ctrl-C) before every session had ended."""

    def all_turns(self) -> list[TurnStats]:
        return [t for a in self.accounts for t in a.turns]

    def summary(self) -> dict[str, Any]:
        turns = self.all_turns()
        statuses: dict[str, int] = {}
        for t in turns:
            statuses[t.status or "lost"] = statuses.get(t.status or "lost", 0) + 1

        def dist(values: list[float], scale: float = 1000.0) -> dict[str, float | None]:
            out: dict[str, float | None] = {"n": len(values)}
            for q in (50, 90, 99):
                p = percentile(values, q)
                out[f"p{q}"] = None if p is None else round(p * scale, 1)
            out["max"] = None if not values else round(max(values) * scale, 1)
            return out

        lateness = [x for t in turns for x in t.lateness_s]
        def server(key: str) -> dict[str, Any]:
            values = [t.server_metrics.get(key) for t in turns]
            return dist([v / 1000 for v in values if v is not None])

        return {
            "sessions": self.sessions,
            **({"interrupted": True} if self.interrupted else {}),
            "turns": {"requested": self.sessions * self.turns_requested, **statuses,
                      **({"unsent": unsent} if (unsent := sum(a.unsent for a in self.accounts))
                         else {})},
            "wall_s": round(self.wall_s, 2),
            "ttfa_ms": dist([t.ttfa_s for t in turns if t.ttfa_s is not None]),
            "server_ttfa_ms": server("ttfa_ms"),
            "server_ttft_ms": server("ttft_ms"),
            "server_first_sentence_ms": server("first_sentence_ms"),
            "turn_ms": dist([t.done_s for t in turns if t.done_s is not None]),
            "lateness_ms": dist(lateness),
            "late_frames": sum(1 for x in lateness if x > 0),
            "frames": sum(t.frames for t in turns),
            "audio_s": round(sum(t.audio_s for t in turns), 2),
            "underruns": sum(t.underruns for t in turns),
            "sentence_gaps": sum(t.sentence_gaps for t in turns),
            "server_underruns": sum(t.server_metrics.get("underruns") or 0 for t in turns),
            "starved_ms": round(sum(t.starved_s for t in turns) * 1000, 1),
            "seq_gaps": sum(a.seq_gaps for a in self.accounts),
            "seq_repeats": sum(a.seq_repeats for a in self.accounts),
            "errors": [e for a in self.accounts for e in a.errors],
            "violations": [v for a in self.accounts for v in a.violations],
        }

    @property
    def ok(self) -> bool:
        s = self.summary()
        return not (s["errors"] or s["violations"] or s["seq_gaps"] or s["seq_repeats"]
                    or set(s["turns"]) - {"requested", "completed"})

    def table(self) -> str:
        s = self.summary()
        lines = [("interrupted: " if self.interrupted else "") +
                 f"{s['sessions']} sessions, turns {s['turns']}, {s['wall_s']} s wall, "
                 f"{s['frames']} frames, {s['audio_s']} s audio",
                 f"{'':22}{'n':>6}{'p50':>9}{'p90':>9}{'p99':>9}{'max':>9}"]
        for key, label in (("ttfa_ms", "TTFA (client) ms"), ("server_ttfa_ms", "TTFA (server) ms"),
                           ("server_ttft_ms", "LLM 1st token (srv) ms"),
                           ("server_first_sentence_ms", "1st segment (srv) ms"),
                           ("turn_ms", "turn.done ms"), ("lateness_ms", "frame lateness ms")):
            d = s[key]
            cells = "".join(f"{'-' if d[k] is None else d[k]:>9}"
                            for k in ("p50", "p90", "p99", "max"))
            lines.append(f"{label:22}{d['n']:>6}{cells}")
        lines.append(f"late frames {s['late_frames']}, underruns {s['underruns']} mid-sentence "
                     f"+ {s['sentence_gaps']} between sentences (the gateway's model: "
                     f"{s['server_underruns']}), starved {s['starved_ms']} ms, seq gaps "
                     f"{s['seq_gaps']}, seq repeats {s['seq_repeats']}, errors "
                     f"{len(s['errors'])}, violations {len(s['violations'])}")
        for e in sorted(set(s["errors"])):
            lines.append(f"  error {e} x{s['errors'].count(e)}")
        lines.extend(f"  violation: {v}" for v in s["violations"][:10])
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        turns = []
        for i, a in enumerate(self.accounts):
            for t in a.turns:
                d = asdict(t)
                d["session"] = i
                d["sent_at"] = round(t.sent_at - self.t0, 4)
                d["arrivals"] = [round(x - self.t0, 4) for x in t.arrivals]
                d["lateness_s"] = [round(x, 4) for x in t.lateness_s]
                turns.append(d)
        return {"summary": self.summary(), "turns": turns}


def plot(report: Report, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("--plot needs matplotlib: pip install matplotlib")
    turns = report.all_turns()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    ttfa = [t.ttfa_s * 1000 for t in turns if t.ttfa_s is not None]
    ax1.hist(ttfa, bins=min(30, max(5, len(ttfa) // 2)), color="#3572b0")
    ax1.set_title(f"TTFA, {len(ttfa)} turns")
    ax1.set_xlabel("ms from transcript sent to first audio frame")
    ax1.set_ylabel("turns")
    for i, a in enumerate(report.accounts):
        xs = [x - report.t0 for t in a.turns for x in t.arrivals]
        ys = [y * 1000 for t in a.turns for y in t.lateness_s]
        ax2.plot(xs, ys, ".", markersize=2, label=f"session {i}" if i < 8 else None)
    ax2.axhline(0, color="red", linewidth=0.8)
    ax2.set_title("frame lateness (above 0: the player was starved)")
    ax2.set_xlabel("s since start")
    ax2.set_ylabel("ms")
    if len(report.accounts) <= 8:
        ax2.legend(fontsize=7, markerscale=4)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---- the sessions ------------------------------------------------------------------------


def load_transcripts(path: str | Path | None) -> list[str]:
    """JSONL with a ``transcript`` field per line, or plain text (one per line). A byte
    order mark (a file saved by Windows Notepad) is not part of the first line: with it,
    the first JSON line was sent as a transcript, braces and all."""
    lines = Path(path or DEFAULT_TRANSCRIPTS).read_text(encoding="utf-8-sig").splitlines()
    out = []
    for line in (x.strip() for x in lines):
        if not line:
            continue
        out.append(json.loads(line)["transcript"] if line.startswith("{") else line)
    if not out:
        raise ValueError(f"no transcripts in {path}")
    return out


@dataclass
class Progress:
    connected: int = 0
    turns_done: int = 0
    frames: int = 0


async def run_session(url: str, index: int, account: SessionAccount, *, turns: int,
                      transcripts: list[str], arrival_s: float, seed: int,
                      progress: Progress, turn_timeout_s: float = 90.0) -> None:
    """One speaker: connect, talk ``turns`` times, listen to every reply to its end."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    rng = random.Random(seed * 100_003 + index)
    loop = asyncio.get_running_loop()
    done: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    names = itertools.count(1)

    def name() -> str:
        """A new ``event_id`` for a message this session sends: ``l1``, ``l2``, ..."""
        return f"l{next(names)}"

    async def reader(ws: Any) -> None:
        try:
            async for message in ws:
                now = loop.time()
                if isinstance(message, bytes):
                    account.frame(message, now)
                    progress.frames += 1
                    continue
                event = json.loads(message)
                waiting = not account.rejected
                account.event(event, now)
                if event["type"] == "turn.done" and event["turn_id"] == account.current_turn_id:
                    await done.put(event)
                elif event["type"] == "error" and waiting and account.rejected:
                    # the transcript's refusal: no turn.done will come, do not wait for one
                    # (only this error: another, a mark's, would end the next turn's wait)
                    await done.put(event)
        except ConnectionClosed:
            pass
        finally:
            await done.put(None)  # wakes a turn waiting on a closed socket

    async def marks(ws: Any) -> None:
        # what a real player does: report progress every 250 ms while audio is playing
        last = None
        while True:
            await asyncio.sleep(MARK_INTERVAL_S)
            if ws.close_code is not None:
                return
            turn_id, now = account.current_turn_id, loop.time()
            end = account.playback_end
            if turn_id is None or end is None:
                continue
            played = round(account.played_ms(now))
            if (turn_id, played) != last:
                last = (turn_id, played)
                try:
                    await ws.send(json.dumps({"type": "playback", "event_id": name(),
                                              "turn_id": turn_id, "played_ms": played}))
                except ConnectionClosed:
                    return

    sent = 0  # transcripts sent (talk counts them)

    async def talk(ws: Any) -> None:
        nonlocal sent
        created = json.loads(await ws.recv())
        if created.get("type") != "session.created":
            account.violations.append(f"first message was {created.get('type')}")
        progress.connected += 1
        async with asyncio.TaskGroup() as tasks:
            read = tasks.create_task(reader(ws))
            mark = tasks.create_task(marks(ws))
            for k in range(turns):
                if k:
                    await asyncio.sleep(rng.expovariate(1 / arrival_s) if arrival_s else 0)
                asked = name()
                account.sent(loop.time(), asked)
                sent += 1
                try:
                    await ws.send(json.dumps({"type": "transcript", "event_id": asked,
                                              "text": rng.choice(transcripts)}))
                except ConnectionClosed:  # (closed since the last turn: never went out)
                    account.withdraw()
                    sent -= 1
                    raise
                try:
                    # (asyncio.timeout: wait_for on Python 3.11 drops a cancellation, Ctrl-C's,
                    # that comes in the step the turn ends, and the session went on)
                    async with asyncio.timeout(turn_timeout_s):
                        event = await done.get()
                except TimeoutError:
                    account.lost("timeout")
                    break
                if event is None:
                    account.lost(f"closed {ws.close_code}")
                    break
                if event["type"] == "error":
                    continue  # refused: counted as an error, on to the next turn
                progress.turns_done += 1
                end = account.playback_end
                if end is not None:  # the speaker listens to the end of the reply
                    await asyncio.sleep(max(0.0, end - loop.time()))
            mark.cancel()
            await ws.close()
            await read

    try:
        await asyncio.sleep(rng.uniform(0, arrival_s))  # stagger the sessions' first turns
        try:
            async with connect(url, compression=None, max_size=2**20, open_timeout=30) as ws:
                try:
                    await talk(ws)
                except asyncio.CancelledError:  # the run was stopped (Ctrl-C): end the
                    await ws.close()  # session (on the way out it would be 1011, which
                    raise  # leaves it waiting for a resume)
        except* ConnectionClosed as group:  # closed under a send or the first recv
            closed = group.exceptions[0]
            assert isinstance(closed, ConnectionClosed)
            account.lost(f"closed {closed.rcvd.code if closed.rcvd else 1006}")
        except* (OSError, InvalidStatus, TimeoutError) as group:
            account.lost(f"connect failed: {group.exceptions[0]}")
    finally:  # (cancelled too: the run was stopped, and its turns not sent are unsent)
        account.unsent += turns - sent


async def run_load(url: str, *, sessions: int, turns: int, transcripts: list[str],
                   arrival_s: float = 0.0, seed: int = 1, prebuffer_s: float = 0.0,
                   show_progress: bool = False, turn_timeout_s: float = 90.0,
                   stop: asyncio.Event | None = None) -> Report:
    """Run the sessions to their end, or until ``stop`` is set (Ctrl-C): the sessions then
    close their sockets, and the report has what was measured until then."""
    loop = asyncio.get_running_loop()
    accounts = [SessionAccount(prebuffer_s=prebuffer_s) for _ in range(sessions)]
    progress = Progress()
    t0 = loop.time()

    async def ticker() -> None:
        tty = sys.stderr.isatty()
        while True:
            await asyncio.sleep(1.0)
            errors = sum(len(a.errors) for a in accounts)
            under = sum(t.underruns + t.sentence_gaps for a in accounts for t in a.turns)
            gaps = sum(a.seq_gaps for a in accounts)
            line = (f"[{loop.time() - t0:6.1f}s] connected {progress.connected}/{sessions} "
                    f"turns {progress.turns_done}/{sessions * turns} frames {progress.frames} "
                    f"underruns (with sentence gaps) {under} seq-gaps {gaps} errors {errors}")
            print(("\r" + line) if tty else line, end="" if tty else "\n", file=sys.stderr,
                  flush=True)

    async def speak() -> None:
        async with asyncio.TaskGroup() as speakers:
            for i in range(sessions):
                speakers.create_task(run_session(
                    url, i, accounts[i], turns=turns, transcripts=transcripts,
                    arrival_s=arrival_s, seed=seed, progress=progress,
                    turn_timeout_s=turn_timeout_s))

    interrupted = False
    async with asyncio.TaskGroup() as tasks:
        tick = tasks.create_task(ticker()) if show_progress else None
        speaking = tasks.create_task(speak())
        if stop is not None:
            stopping = tasks.create_task(stop.wait())
            await asyncio.wait((speaking, stopping), return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if not speaking.done():
                interrupted = True
                speaking.cancel()  # each session closes its socket on the way out
        await asyncio.wait((speaking,))
        if tick is not None:
            tick.cancel()
    if interrupted:
        for account in accounts:
            account.interrupted()
    if show_progress:
        print(file=sys.stderr)
    return Report(sessions, turns, loop.time() - t0, accounts, t0, interrupted)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="ws://127.0.0.1:8780/v1/voice",
                   help="the gateway's voice socket (default %(default)s; with tokens, "
                   "add ?token=T)")
    p.add_argument("--sessions", type=int, default=4,
                   help="sessions talking at once (default %(default)s)")
    p.add_argument("--turns", type=int, default=3,
                   help="turns each session takes (default %(default)s)")
    p.add_argument("--transcripts", help=f"JSONL or text file (default {DEFAULT_TRANSCRIPTS})")
    p.add_argument("--arrival", type=float, default=0.0,
                   help="mean seconds of think time between a reply's end and the next turn "
                   "(exponential; default 0: at once)")
    p.add_argument("--prebuffer-ms", type=float, default=0.0,
                   help="audio the player waits for before starting (default 0)")
    p.add_argument("--seed", type=int, default=1, help="for the transcripts each session "
                   "picks and its think times (default %(default)s)")
    p.add_argument("--turn-timeout", type=float, default=90.0,
                   help="seconds to wait for a turn.done before the turn counts as lost "
                   "(default %(default)g)")
    p.add_argument("--json", help="write the summary and every turn as JSON here")
    p.add_argument("--plot", help="write a PNG: TTFA histogram and lateness over time "
                   "(needs matplotlib: pip install matplotlib)")
    args = p.parse_args(argv)
    if urllib.parse.urlsplit(args.url).scheme not in ("ws", "wss"):  # (http: a traceback)
        p.error(f"--url must be the gateway's ws:// or wss:// URL, not {args.url!r}")
    if args.sessions < 1 or args.turns < 1:
        p.error("--sessions and --turns must be at least 1")
    if not args.arrival >= 0:  # (NaN too)
        p.error(f"--arrival must be 0 or more seconds, not {args.arrival:g}")
    if not args.prebuffer_ms >= 0:
        p.error(f"--prebuffer-ms must be 0 or more, not {args.prebuffer_ms:g}")
    if not args.turn_timeout > 0:
        p.error(f"--turn-timeout must be more than 0 seconds, not {args.turn_timeout:g}")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        p.error("--plot needs matplotlib: pip install matplotlib")  # before the load, not after
    for flag, out in (("--json", args.json), ("--plot", args.plot)):
        if out and Path(out).is_dir():  # (``--json results``: after the load, a traceback)
            p.error(f"{flag}: {out!r} is a directory: name the file to write in it")
        if out and not Path(out).absolute().parent.is_dir():  # (after the load: a traceback)
            p.error(f"{flag}: there is no directory {str(Path(out).parent)!r} to write it in")
    try:
        transcripts = load_transcripts(args.transcripts)
    except (OSError, ValueError, KeyError) as exc:  # (KeyError: a line without "transcript")
        p.error(f"--transcripts: {exc!r}" if isinstance(exc, KeyError) else
                f"--transcripts: {exc}")
    started = time.strftime("%Y-%m-%d %H:%M:%S")

    async def run() -> Report:
        # Ctrl-C stops the run and keeps what it measured (a second one: at once)
        loop, stop = asyncio.get_running_loop(), asyncio.Event()

        def interrupt() -> None:
            stop.set()
            loop.remove_signal_handler(signal.SIGINT)

        with contextlib.suppress(NotImplementedError):  # (Windows: Ctrl-C ends it at once)
            loop.add_signal_handler(signal.SIGINT, interrupt)
        return await run_load(args.url, sessions=args.sessions, turns=args.turns,
                              transcripts=transcripts, arrival_s=args.arrival,
                              seed=args.seed, prebuffer_s=args.prebuffer_ms / 1000,
                              show_progress=True, turn_timeout_s=args.turn_timeout, stop=stop)

    report = asyncio.run(run())
    print(f"loadgen {started} {args.url}")
    print(report.table())
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_json(), indent=1))
    if args.plot:
        plot(report, args.plot)
    return 130 if report.interrupted else 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
