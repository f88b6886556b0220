"""Soak: N sessions talk for M minutes while sockets drop and resume, turns are cancelled and
some listeners stop reading for a while; the gateway's RSS and file descriptors are sampled.

    python bench/soak.py --sessions 200 --minutes 10 [--seed 1] [--replies FILE] [--json OUT]

The gateway runs as its own process (bench/capacity_server.py: the real server, the
synthetic engine at zero cost, the replay LLM), so its memory and descriptors are read from
/proc/<pid>. Each session (built on examples/loadgen.py: ``SessionAccount`` does the seq and
frame accounting) loops over turns until the time is up, saying a transcript of the replay
set (``--replies``: JSONL of ``{"transcript", "reply"}``, which the gateway's replay LLM
answers from; default engines/data/replies.jsonl); each turn, by a seeded draw:

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
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.capacity import Server, cpu_seconds  # noqa: E402
from examples.loadgen import (  # noqa: E402
    MARK_INTERVAL_S,
    SessionAccount,
    load_transcripts,
)

ACTIONS = (("normal", 0.60), ("abort", 0.15), ("cancel", 0.15), ("slow", 0.10))


# ---- the gateway process ---------------------------------------------------------------


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class GatewayProcess(Server):
    """bench/capacity_server.py (the zero-cost synthetic engine), its logs on our stderr."""

    def __init__(self, max_lead_ms: int, outbox_bytes: int | None = None,
                 replies: str | None = None) -> None:
        extra = ["--outbox-bytes", str(outbox_bytes)] if outbox_bytes else []
        # (absolute: the gateway runs in the repository, not in our working directory)
        extra += ["--replies", os.path.abspath(replies)] if replies else []
        super().__init__("gateway", "--max-lead-ms", str(max_lead_ms), *extra, log=False)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/voice"

    def health(self) -> dict[str, Any]:
        import httpx

        return httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=10).json()

    def stop(self) -> int:
        return self.close(timeout=30)


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
                    self.account.frame(message, now)
                    self.last_seq = int.from_bytes(message[8:12], "little")
                    self.frames_in_turn += 1
                    self.frame_arrived.set()
                    continue
                event = json.loads(message)
                if event["type"] == "turn.done" and event["turn_id"] in self.account._ended:
                    continue  # a replayed turn.done after a resume (idempotent)
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
    gateway = GatewayProcess(args.max_lead_ms, args.outbox_bytes, args.replies)
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

    def sample(label: str = "") -> dict[str, float]:
        s = {"t_s": round(loop.time() - t0, 1), "rss_mb": round(rss_mb(gateway.pid), 1),
             "fds": fd_count(gateway.pid), "label": label,
             "cpu_s": round(cpu_seconds(gateway.pid), 2),
             "turns": sum(stats.statuses.values())}
        samples.append(s)
        return s

    async def tasks(s: dict[str, float]) -> dict[str, float]:
        """The gateway's asyncio tasks (``/health`` → ``loop.tasks``, this probe's own
        included), asked from a thread: the sessions' loop goes on meanwhile."""
        s["tasks"] = (await asyncio.to_thread(gateway.health))["loop"]["tasks"]
        return s

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
        tick = loop.create_task(sampler())
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
        died = gateway.proc.poll() is not None  # (under the load: nothing left to probe)
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
                if fd_count(gateway.pid) <= samples[0]["fds"]:
                    break
                await asyncio.sleep(0.1)
            after = await tasks(sample("sessions gone"))
    finally:
        stopping = time.monotonic()
        code = gateway.stop()
        stop_s = time.monotonic() - stopping
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
    # (a soak with no completed turn measured nothing: "--minutes 0" passed)
    result["ok"] = (stats.statuses.get("completed", 0) > 0 and
                    not died and result["seq_gaps"] == 0 and result["seq_repeats"] == 0 and
                    result["violations"] == 0 and stats.connect_failures == 0 and
                    # (failed, lost, or refused by the gateway: "rejected: rate_limited")
                    set(stats.statuses) <= {"completed", "cancelled"} and
                    health["sessions"] == 0 and
                    after["tasks"] <= samples[0]["tasks"])
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
        ("ok", str(r["ok"])),
    ]
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
