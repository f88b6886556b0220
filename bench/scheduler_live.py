"""Lane policies on the real gateway: a hub voice session beside a background app.

    python -m bench.scheduler_live [--duration 90] [--policies idle,fifo,sched-320ms,scheduler]
                                   [--seed 1] [--json PATH]

For each policy the gateway runs in its own process (``--serve``) with the ``synthetic``
engine on a ``gpu`` lane at the hub's calibrated timing (``SyntheticEngine(rtf=0.44,
ttfa_ms=107, step_ms=320, step_overhead_ms=5)``; the overhead is the simulator's assumed
cost per step, paid by the background requests' 80 ms steps. It sleeps in the lane
thread, so it occupies the lane like Qwen3-TTS on an idle GPU; it does not model the LLM
sharing the GPU. Two clients, in this process, over the real sockets:

* **hub**: one voice session taking ``say`` turns over the WebSocket, like scenario 2 of
  bench/scheduler.py: 1-2 sentences of 2-6 s of audio each, the next turn 1 s + exp(mean
  3 s) after the reply finished playing. The listener is examples/loadgen.py's
  ``SessionAccount``: playback starts at the first frame and runs in real time; ``playback``
  marks every 250 ms. Measured: TTFA (``say`` sent → first frame), underruns (the player
  ran dry inside a sentence), sentence gaps (between sentences), starved time.
* **background**: an app sending 20-40 s utterances back to back to ``POST
  /v1/audio/speech`` with SSE, reading the deltas as fast as they come. Measured: audio
  seconds received per wall second (partial requests at the end count).

Policies: ``fifo`` (the old sidecar: whole generations, first come first served),
``scheduler`` (the real LaneScheduler: one step at a time, interactive first, just in
time, background requests in 80 ms steps and flat out when alone), ``sched-320ms`` (the
same with background in the engine's 320 ms steps: the step-size rule off), ``sched-bg-rt``
(background held to real time + max_lead even when alone), ``idle`` (``scheduler`` with no
background app: the hub's idle TTFA, the goal's reference, measured in the same run).
Same seed, same scripts, same run.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHARS_PER_S = 14.0  # the synthetic engine's speech rate
WORDS = ("the harbour boats came in late under a grey sky while market stalls opened slowly "
         "and people walked along quiet streets toward bright windows near old stone bridges "
         "where gulls circled above fishing nets drying beside painted doors").split()


def sentence(rng: random.Random, seconds: float) -> str:
    """A sentence the synthetic engine speaks for about ``seconds`` (no clause marks, so the
    segmenter keeps it whole)."""
    words: list[str] = []
    while len(" ".join(words)) + 1 < seconds * CHARS_PER_S:
        words.append(rng.choice(WORDS))
    text = " ".join(words)
    return text[0].upper() + text[1:] + "."


# ---- the gateway process ----------------------------------------------------------------


async def serve(policy: str) -> None:
    from engines.synthetic import SyntheticEngine
    from gateway.config import load_config
    from gateway.core import scheduler
    from gateway.io.aio import stop_signal
    from gateway.io.server import Gateway

    if policy == "sched-320ms":  # the step-size rule off: background in the engine's steps
        scheduler.STEP_MS[scheduler.Priority.BACKGROUND] = None
    lane_policy = "fifo" if policy == "fifo" else "scheduler"
    config = load_config(server={"port": 0, "http_port": 0, "lane_policy": lane_policy})
    gateway = Gateway(config, engine=SyntheticEngine(rtf=0.44, ttfa_ms=107, step_ms=320,
                                                     step_overhead_ms=5, lane="gpu"))
    if policy == "sched-bg-rt":  # background held to real time even when alone
        gateway.lane.scheduler.pace_background_always = True
    stop = stop_signal()
    await gateway.start()
    print(f"PORT {gateway.port} {gateway.http_port}", flush=True)
    await stop.wait()
    await gateway.aclose()


# ---- the clients ------------------------------------------------------------------------


async def hub(url: str, until: float, rng: random.Random, account: Any) -> None:
    from websockets.asyncio.client import connect

    from examples.loadgen import MARK_INTERVAL_S

    loop = asyncio.get_running_loop()
    done = asyncio.Queue[dict[str, Any]]()

    async with connect(url, compression=None, max_size=2**20) as ws:
        await ws.recv()  # session.created

        async def reader() -> None:
            async for message in ws:
                now = loop.time()
                if isinstance(message, bytes):
                    account.frame(message, now)
                    continue
                event = json.loads(message)
                account.event(event, now)
                if event["type"] == "turn.done" and event["turn_id"] == account.current_turn_id:
                    done.put_nowait(event)

        async def marks() -> None:
            while True:
                await asyncio.sleep(MARK_INTERVAL_S)
                turn_id = account.current_turn_id
                if turn_id is not None and account.playback_end is not None:
                    await ws.send(json.dumps({"type": "playback", "turn_id": turn_id,
                                              "played_ms": round(account.played_ms(
                                                  loop.time()))}))

        async with asyncio.TaskGroup() as tasks:
            read = tasks.create_task(reader())
            mark = tasks.create_task(marks())
            await asyncio.sleep(rng.uniform(0.0, 4.0))
            while loop.time() < until:
                text = " ".join(sentence(rng, rng.uniform(2.0, 6.0))
                                for _ in range(1 if rng.random() < 0.5 else 2))
                account.sent(loop.time())
                await ws.send(json.dumps({"type": "say", "text": text}))
                await done.get()
                end = account.playback_end or loop.time()
                await asyncio.sleep(max(0.0, end - loop.time()) + 1.0 + rng.expovariate(1 / 3))
            mark.cancel()
            await ws.close()
            await read


async def background(base: str, until: float, rng: random.Random, got: dict[str, float]
                     ) -> None:
    import httpx

    loop = asyncio.get_running_loop()
    async with httpx.AsyncClient(base_url=base, timeout=120) as client:
        while loop.time() < until:
            seconds = rng.uniform(20.0, 40.0)
            parts: list[str] = []
            while sum(len(p) for p in parts) < seconds * CHARS_PER_S:
                parts.append(sentence(rng, rng.uniform(5.0, 10.0)))
            body = {"input": " ".join(parts), "stream_format": "sse"}
            try:
                async with asyncio.timeout_at(until), \
                        client.stream("POST", "/v1/audio/speech", json=body) as response:
                    async for line in response.aiter_lines():
                        if line.startswith("data: "):
                            event = json.loads(line[6:])
                            if event["type"] == "speech.audio.delta":
                                got["audio_s"] += len(base64.b64decode(event["audio"])) / 48_000
                            elif event["type"] == "speech.audio.done":
                                got["requests"] += 1
            except TimeoutError:
                return


def run_policy(policy: str, duration: float, seed: int) -> dict[str, Any]:
    from examples.loadgen import SessionAccount, percentile

    proc = subprocess.Popen([sys.executable, "-m", "bench.scheduler_live", "--serve", policy],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        if not line or line[0] != "PORT":
            raise RuntimeError(f"the gateway did not start: {line}")
        ws_port, http_port = int(line[1]), int(line[2])
        account = SessionAccount()
        got = {"audio_s": 0.0, "requests": 0}

        async def both() -> float:
            loop = asyncio.get_running_loop()
            started = loop.time()
            until = started + duration
            async with asyncio.TaskGroup() as tasks:
                if policy != "idle":
                    tasks.create_task(background(f"http://127.0.0.1:{http_port}", until,
                                                 random.Random(seed + 1), got))
                tasks.create_task(hub(f"ws://127.0.0.1:{ws_port}/v1/voice", until,
                                      random.Random(seed), account))
            return loop.time() - started

        wall = asyncio.run(both())
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    turns = [t for t in account.turns if t.ttfa_s is not None]
    ttfa = [ttfa_s * 1e3 for t in turns if (ttfa_s := t.ttfa_s) is not None]
    return {"policy": policy, "turns": len(turns), "wall_s": wall,
            "ttfa_p50_ms": percentile(ttfa, 50), "ttfa_p90_ms": percentile(ttfa, 90),
            "ttfa_max_ms": max(ttfa, default=None),
            "underruns": sum(t.underruns for t in turns),
            "sentence_gaps": sum(t.sentence_gaps for t in turns),
            "starved_s": sum(t.starved_s for t in turns),
            "turns_failed": sum(1 for t in account.turns if t.status not in (None, "completed")),
            # the background app streams until ``until`` (``duration``); the wall time also
            # holds the hub's last turn and think time after it, with no request running
            "background_audio_s_per_s": got["audio_s"] / min(wall, duration),
            "background_requests": got["requests"]}


def _ms(value: float | None) -> str:
    """A TTFA cell: "-" when no turn reached audio (not a TTFA of 0)."""
    return f"{'-':>9}" if value is None else f"{value:9.0f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--serve", metavar="POLICY", help=argparse.SUPPRESS)
    ap.add_argument("--duration", type=float, default=90.0, help="seconds per policy")
    ap.add_argument("--policies", default="idle,fifo,sched-320ms,scheduler",
                    help="comma-separated, run in this order: idle, fifo, sched-320ms, "
                         "sched-bg-rt, scheduler (default idle,fifo,sched-320ms,scheduler)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.serve:
        import uvloop

        uvloop.run(serve(args.serve))
        return 0
    print(f"hub voice session + background 20-40 s SSE requests, {args.duration:.0f} s per "
          "policy, synthetic engine rtf 0.44 / ttfa 107 ms / 320 ms steps")
    print(f"{'policy':10} {'turns':>5} {'ttfa p50':>9} {'ttfa p90':>9} {'ttfa max':>9} "
          f"{'underruns':>9} {'gaps':>5} {'starved s':>9} {'failed':>6} {'bg audio/s':>10}")
    rows = []
    for policy in args.policies.split(","):
        r = run_policy(policy, args.duration, args.seed)
        rows.append(r)
        print(f"{policy:10} {r['turns']:5d} {_ms(r['ttfa_p50_ms'])} "
              f"{_ms(r['ttfa_p90_ms'])} {_ms(r['ttfa_max_ms'])} {r['underruns']:9d} "
              f"{r['sentence_gaps']:5d} {r['starved_s']:9.2f} {r['turns_failed']:6d} "
              f"{r['background_audio_s_per_s']:10.2f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"duration_s": args.duration, "seed": args.seed,
                                         "rows": rows, "at": time.strftime("%F %T")},
                                        indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
