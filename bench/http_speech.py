"""Time to first audio through the HTTP API versus the WebSocket ``say`` path, same run.

    python bench/http_speech.py [--rounds 30] [--engine espeak]

The gateway runs in this process; the client runs in a child process (so it does not share
the gateway's event loop) and, for each round and each sentence, measures from sending the
request to:

* ``ws_say_first_frame``: the first binary frame of a ``say`` turn on an open WebSocket
  (the baseline: the voice path, no HTTP);
* ``sse_first_delta``: the first ``speech.audio.delta`` of ``POST /v1/audio/speech`` with
  ``stream_format: "sse"`` on a kept-alive HTTP connection;
* ``pcm_first_chunk``: the first body chunk of ``"stream": true`` raw PCM;
* ``wav_whole``: the whole ``wav`` file received.

Every path runs the same text on the same engine and lane, one request at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.config import load_config  # noqa: E402
from gateway.io.server import Gateway  # noqa: E402

SENTENCES = [
    "The build finished at nine and two tests failed.",
    "Your next meeting is at half past three with the design team.",
    "It will rain tomorrow morning, so take an umbrella.",
]


async def _client(ws_port: int, http_port: int, rounds: int) -> dict[str, list[float]]:
    import httpx
    from httpx_sse import aconnect_sse
    from websockets.asyncio.client import connect

    out: dict[str, list[float]] = {k: [] for k in
                                   ("ws_say_first_frame", "sse_first_delta", "pcm_first_chunk",
                                    "wav_whole")}
    async with connect(f"ws://127.0.0.1:{ws_port}/v1/voice", compression=None) as ws, \
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}", timeout=30) as http:
        await ws.recv()  # session.created
        await ws.send(orjson.dumps({"type": "session.update",
                                    "session": {"max_lead_ms": 30000}}).decode())
        await ws.recv()
        for _ in range(rounds):
            for text in SENTENCES:
                t0 = time.perf_counter()
                await ws.send(orjson.dumps({"type": "say", "text": text}).decode())
                first = None
                while True:
                    message = await ws.recv()
                    if isinstance(message, bytes):
                        first = first or time.perf_counter()
                    elif orjson.loads(message)["type"] == "turn.done":
                        break
                out["ws_say_first_frame"].append(first - t0)

                t0 = time.perf_counter()
                first = None
                async with aconnect_sse(http, "POST", "/v1/audio/speech",
                                        json={"input": text, "stream_format": "sse"}) as source:
                    async for _event in source.aiter_sse():
                        first = first or time.perf_counter()
                out["sse_first_delta"].append(first - t0)

                t0 = time.perf_counter()
                first = None
                async with http.stream("POST", "/v1/audio/speech",
                                       json={"input": text, "response_format": "pcm",
                                             "stream": True}) as response:
                    async for _chunk in response.aiter_raw():
                        first = first or time.perf_counter()
                out["pcm_first_chunk"].append(first - t0)

                t0 = time.perf_counter()
                response = await http.post("/v1/audio/speech",
                                           json={"input": text, "response_format": "wav",
                                                 "stream": False})
                response.raise_for_status()
                out["wav_whole"].append(time.perf_counter() - t0)
    return out


def _child(ws_port: int, http_port: int, rounds: int, queue: multiprocessing.Queue) -> None:
    queue.put(asyncio.run(_client(ws_port, http_port, rounds)))


async def _main(args: argparse.Namespace) -> None:
    gw = Gateway(load_config(server={"port": 0, "http_port": 0}, tts={"engine": args.engine}))
    await gw.start()
    try:
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        proc = ctx.Process(target=_child, args=(gw.port, gw.http_port, args.rounds, queue))
        proc.start()
        results = await asyncio.to_thread(queue.get)
        await asyncio.to_thread(proc.join)
        steps = gw.lane.stats.steps
        compute = gw.lane.stats.busy_s
    finally:
        await gw.aclose()
    n = args.rounds * len(SENTENCES)
    print(f"engine {args.engine}, {n} requests per path, one at a time; ms")
    print(f"{'path':<22}{'median':>9}{'p90':>9}{'min':>9}")
    base = statistics.median(results["ws_say_first_frame"])
    for name, values in results.items():
        ms = sorted(v * 1000 for v in values)
        p90 = ms[min(len(ms) - 1, int(0.9 * len(ms)))]
        med = statistics.median(ms)
        ratio = "" if name == "ws_say_first_frame" else f"   x{med / (base * 1000):.2f} of ws"
        print(f"{name:<22}{med:9.2f}{p90:9.2f}{ms[0]:9.2f}{ratio}")
    print(f"lane: {steps} steps, {compute * 1000:.1f} ms compute in all")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--engine", default="espeak")
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
