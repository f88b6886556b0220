"""The gateway's own added latency per turn, at 1, 10 and 100 concurrent sessions.

    python bench/turn_latency.py [--sessions 1 10 100] [--turns 5] [--json OUT]

The gateway (replay LLM, espeak) runs in this process with its tracer on; the clients run
in a child process so they do not share the gateway's event loop. Each session sends
transcripts from the shipped replay set one after another and reads every frame.

Measured inside the gateway:
* ``transcript_to_llm_request``: WebSocket message received → LLM request issued;
* ``chunk_to_frame_written``: engine step returned a chunk (lane thread) → the first frame
  cut from it handed to the socket (``send`` returned).

By default sessions use ``max_lead_ms`` 30000 so pacing never holds a frame back on
purpose: what is left is the gateway's own cost, under the burstiest load (a whole reply's
frames at once). ``--max-lead-ms 1000`` measures with the gateway's real pacing (only
chunks whose first frame may go out at once are counted for chunk → frame).

Baseline, same run: ``loop_hop``, the cost of a bare round trip from the event loop to a
worker thread and back (``run_in_executor`` of a no-op): a lane submits each engine step to
its thread and awaits the result, so every chunk pays one before the gateway can touch it.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import random
import statistics
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.config import load_config  # noqa: E402
from gateway.io.server import Gateway, Tracer  # noqa: E402


def _transcripts() -> list[str]:
    from importlib import resources

    text = resources.files("engines").joinpath("data/replies.jsonl").read_text()
    return [orjson.loads(line)["transcript"] for line in text.splitlines() if line.strip()]


async def _client(url: str, transcripts: list[str], turns: int, offset: int,
                  max_lead_ms: int, start_delay: float) -> int:
    from websockets.asyncio.client import connect

    frames = 0
    await asyncio.sleep(start_delay)  # sessions start apart, as people do (see --stagger-s)
    async with connect(url, compression=None, max_size=None) as ws:
        await ws.recv()  # session.created
        await ws.send(orjson.dumps({"type": "session.update",
                                    "session": {"max_lead_ms": max_lead_ms}}).decode())
        await ws.recv()
        for i in range(turns):
            text = transcripts[(offset + i) % len(transcripts)]
            await ws.send(orjson.dumps({"type": "transcript", "text": text}).decode())
            while True:
                message = await ws.recv()
                if isinstance(message, bytes):
                    frames += 1
                    continue
                if orjson.loads(message)["type"] == "turn.done":
                    break
    return frames


def _clients_main(url: str, sessions: int, turns: int, max_lead_ms: int, stagger_s: float,
                  result: multiprocessing.Queue) -> None:
    async def main() -> int:
        transcripts = _transcripts()
        rng = random.Random(7)
        counts = await asyncio.gather(*(
            _client(url, transcripts, turns, i, max_lead_ms, rng.uniform(0, stagger_s))
            for i in range(sessions)))
        return sum(counts)

    result.put(asyncio.run(main()))


def _pct(samples: list[float], p: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))] * 1000


async def _loop_hop(n: int = 2000) -> list[float]:
    loop = asyncio.get_running_loop()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await loop.run_in_executor(None, time.perf_counter)
        out.append(time.perf_counter() - t0)
    return out


async def run_level(sessions: int, turns: int, tokens_per_s: float, max_lead_ms: int,
                    stagger_s: float) -> dict:
    config = load_config(server={"port": 0, "max_sessions": 100_000},
                         llm={"tokens_per_s": tokens_per_s})
    gateway = Gateway(config)
    gateway.tracer = Tracer()
    await gateway.start()
    url = f"ws://127.0.0.1:{gateway.port}/v1/voice"
    ctx = multiprocessing.get_context("spawn")
    queue: multiprocessing.Queue = ctx.Queue()
    proc = ctx.Process(target=_clients_main,
                       args=(url, sessions, turns, max_lead_ms, stagger_s, queue))
    started = time.perf_counter()
    proc.start()
    frames = await asyncio.get_running_loop().run_in_executor(None, queue.get)
    wall = time.perf_counter() - started
    await asyncio.get_running_loop().run_in_executor(None, proc.join)
    await gateway.aclose()
    row = {"sessions": sessions, "turns": sessions * turns, "frames": frames,
           "wall_s": round(wall, 2)}
    for name, samples in sorted(gateway.tracer.samples.items()):
        row[name] = {"n": len(samples), "p50_ms": round(_pct(samples, 50), 3),
                     "p99_ms": round(_pct(samples, 99), 3),
                     "mean_ms": round(statistics.fmean(samples) * 1000, 3)}
    return row


async def main(args: argparse.Namespace) -> dict:
    hop = await _loop_hop()
    baseline = {"loop_hop": {"n": len(hop), "p50_ms": round(_pct(hop, 50), 3),
                             "p99_ms": round(_pct(hop, 99), 3)}}
    rows = [await run_level(n, args.turns, args.tokens_per_s, args.max_lead_ms, args.stagger_s)
            for n in args.sessions]
    return {"baseline": baseline, "levels": rows, "goal": "p99 <= 1 ms at 100 sessions"}


def _table(report: dict) -> str:
    lines = [f"baseline loop_hop (loop → thread → loop, no-op): p50 "
             f"{report['baseline']['loop_hop']['p50_ms']:.3f} ms, p99 "
             f"{report['baseline']['loop_hop']['p99_ms']:.3f} ms", "",
             f"{'sessions':>8} {'turns':>6} {'frames':>7} | {'transcript→LLM p50':>19} "
             f"{'p99':>8} | {'chunk→frame p50':>16} {'p99':>8}"]
    for row in report["levels"]:
        nan = float("nan")
        a = row.get("transcript_to_llm_request", {})
        b = row.get("chunk_to_frame_written", {})
        lines.append(f"{row['sessions']:>8} {row['turns']:>6} {row['frames']:>7} | "
                     f"{a.get('p50_ms', nan):>16.3f} ms {a.get('p99_ms', nan):>5.3f} ms | "
                     f"{b.get('p50_ms', nan):>13.3f} ms {b.get('p99_ms', nan):>5.3f} ms")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--tokens-per-s", type=float, default=51.5,
                        help="replay LLM pace (oMLX's measured 51.5 by default)")
    parser.add_argument("--max-lead-ms", type=int, default=30000,
                        help="pacing lead of the sessions: 30000 (default) sends audio as "
                        "soon as it is made, in bursts; 1000 is the gateway's real pacing, "
                        "where a frame held by the pacer is not counted as latency")
    parser.add_argument("--stagger-s", type=float, default=0.0,
                        help="start each session after a random 0..S s (default 0: every "
                        "session sends its first transcript at the same instant, the worst "
                        "case: the last of 100 simultaneous transcripts queues behind 99)")
    parser.add_argument("--json", help="write the report here too")
    args = parser.parse_args()
    try:
        import uvloop
        report = uvloop.run(main(args))
    except ImportError:
        report = asyncio.run(main(args))
    print(_table(report))
    print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
