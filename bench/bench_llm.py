"""LLM client figures: cost of OpenAiLlm per streamed reply, and the replay backend unpaced.

Run: ``python -m bench.bench_llm [--streams 200]`` from the repository root.

Baseline in the same run: the same bytes read from the same local server with a bare
``httpx-sse`` loop plus ``orjson.loads`` (no error mapping, no event objects, no yielding
to the loop). The reply is oMLX-shaped: 300 tokens in 45 chunks, usage after finish.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

# run as a script, bench/ comes first on the path and would shadow engines/
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
import orjson
from httpx_sse import aconnect_sse

from engines.base import LlmRequest
from engines.llm_openai import DEFAULT_STALL_S, DEFAULT_TIMEOUT, OpenAiLlm
from engines.llm_replay import ReplayLlm
from tests.servers import Burst, ScriptedLlmServer, reply_script

REQUEST = LlmRequest(messages=[{"role": "user", "content": "Tell me a story."}])

TIMEOUT = httpx.Timeout(DEFAULT_TIMEOUT.connect, read=DEFAULT_STALL_S,
                        write=DEFAULT_TIMEOUT.write, pool=DEFAULT_TIMEOUT.pool)
"""Both clients' timeouts, OpenAiLlm's defaults written out: connect 5 s; read (the wait for
the first token, and between two chunks) its ``stall_s``, 60 s. The baseline had httpx's
default, 5 s for each: a server slow to its first token (a loaded machine) failed the run in
the baseline, where the client it is compared with waits on."""


def omlx_script() -> list:
    words = [f" w{i}" for i in range(300)]
    pieces = ["".join(words[i : i + 7]) for i in range(0, 300, 7)][:45]
    usage = {"completion_tokens": 300, "generation_tokens_per_second": 51.5}
    return [Burst(tuple(reply_script(pieces, usage=usage)))]


async def baseline(client: httpx.AsyncClient, url: str) -> int:
    body = {"messages": REQUEST.messages, "stream": True}
    n = 0
    async with aconnect_sse(client, "POST", f"{url}/chat/completions", json=body) as source:
        async for sse in source.aiter_sse():
            if sse.data and sse.data != "[DONE]":
                orjson.loads(sse.data)
                n += 1
    return n


async def timed(n: int, once) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        await once()
        times.append(time.perf_counter() - start)
    return times


def show(name: str, times: list[float]) -> float:
    med = statistics.median(times) * 1000
    p90 = statistics.quantiles(times, n=10)[-1] * 1000 if len(times) > 1 else med
    print(f"{name:<34} median {med:7.3f} ms   p90 {p90:7.3f} ms")
    return med


async def main(streams: int) -> None:
    server = ScriptedLlmServer()
    server.default_script = omlx_script()
    await server.start()
    llm = OpenAiLlm(server.url, timeout=TIMEOUT)
    client = httpx.AsyncClient(timeout=TIMEOUT)
    try:

        async def ours() -> None:
            async for _ in llm.stream(REQUEST):
                pass

        for _ in range(10):  # warm connections and code paths
            await ours()
            await baseline(client, server.url)
        base = show(
            "baseline httpx-sse + orjson",
            await timed(streams, lambda: baseline(client, server.url)),
        )
        mine = show("OpenAiLlm.stream (45 chunks)", await timed(streams, ours))
        print(f"{'OpenAiLlm overhead':<34} {mine - base:+7.3f} ms per reply ({mine / base:.2f}x)")
    finally:
        await client.aclose()
        await llm.aclose()
        await server.stop()

    replay = ReplayLlm(tokens_per_s=0)

    async def replay_once() -> None:
        async for _ in replay.stream(REQUEST):
            pass

    med = show("ReplayLlm unpaced (long reply)", await timed(streams, replay_once))
    print(f"{'ReplayLlm unpaced replies/s':<34} {1000 / med:9.0f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--streams", type=int, default=200,
                        help="replies each client streams, timed one after another "
                             "(default 200)")
    asyncio.run(main(parser.parse_args().streams))
