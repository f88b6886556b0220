"""Time to first audio through the HTTP API versus the WebSocket ``say`` path, and what the
compressed ``response_format``s cost, same run.

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

* ``<fmt>_first_byte`` (mp3, opus, aac, flac): the first body chunk of a streamed
  ``response_format`` (``pcm_first_chunk`` is its baseline).

Every path runs the same text on the same engine and lane, one request at a time.

Then the cost of encoding, pcm and wav as the baseline:

* **encoder alone** (in this process, before the server runs): each sentence's PCM fed to
  ``gateway.core.audio_formats.Encoder`` in 80 ms chunks (HTTP speech's step) and in one
  chunk (an engine that gives a sentence per step: chatterbox, an ``http`` upstream): CPU
  ms per second of audio (``thread_time``) and wall ms per ``encode`` call, p50/p99. That
  call is what would hold the event loop if it ran there;
* **in the gateway**: a probe in the gateway's event loop sleeps 1 ms at a time and records
  how late it wakes, and the process's CPU, while the client streams each format: how much
  the loop is held, p50/p99/max, and the gateway's CPU ms per second of audio (synthesis,
  HTTP and encoding together: pcm's figure is the rest). In 80 ms chunks and in one chunk
  per sentence, each as shipped (compressed formats encoded on the HTTP server's encoder
  thread) and with the encoding moved onto the loop (``--no-inline`` skips those runs).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engines.base import SynthesisRequest  # noqa: E402
from gateway.config import load_config  # noqa: E402
from gateway.core.audio_formats import FORMATS, Encoder  # noqa: E402
from gateway.io.server import Gateway  # noqa: E402

ENCODED = ("mp3", "opus", "aac", "flac")
STEP_SAMPLES = 1920
"""HTTP speech's engine step: 80 ms at 24 kHz (``step_ms(Priority.BACKGROUND)``)."""

SENTENCES = [
    "The build finished at nine and two tests failed.",
    "Your next meeting is at half past three with the design team.",
    "It will rain tomorrow morning, so take an umbrella.",
]


def _took(t0: float, first: float | None, what: str) -> float:
    """Seconds from ``t0`` to the first audio (``first``); an answer without audio fails the
    run, as it has no time to first audio."""
    if first is None:
        raise RuntimeError(f"{what}: the answer brought no audio")
    return first - t0


async def _client(ws_port: int, http_port: int, rounds: int) -> dict[str, list[float]]:
    import httpx
    from httpx_sse import aconnect_sse
    from websockets.asyncio.client import connect

    out: dict[str, list[float]] = {k: [] for k in
                                   ("ws_say_first_frame", "sse_first_delta", "pcm_first_chunk",
                                    "wav_whole", *(f"{f}_first_byte" for f in ENCODED))}
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
                out["ws_say_first_frame"].append(_took(t0, first, "say"))

                t0 = time.perf_counter()
                first = None
                async with aconnect_sse(http, "POST", "/v1/audio/speech",
                                        json={"input": text, "stream_format": "sse"}) as source:
                    async for _event in source.aiter_sse():
                        first = first or time.perf_counter()
                out["sse_first_delta"].append(_took(t0, first, "sse"))

                t0 = time.perf_counter()
                first = None
                async with http.stream("POST", "/v1/audio/speech",
                                       json={"input": text, "response_format": "pcm",
                                             "stream": True}) as response:
                    response.raise_for_status()  # (an error's body is no first chunk)
                    async for _chunk in response.aiter_raw():
                        first = first or time.perf_counter()
                out["pcm_first_chunk"].append(_took(t0, first, "pcm"))

                t0 = time.perf_counter()
                response = await http.post("/v1/audio/speech",
                                           json={"input": text, "response_format": "wav",
                                                 "stream": False})
                response.raise_for_status()
                out["wav_whole"].append(time.perf_counter() - t0)

                for fmt in ENCODED:
                    t0 = time.perf_counter()
                    first = None
                    async with http.stream("POST", "/v1/audio/speech",
                                           json={"input": text, "response_format": fmt}) as r:
                        r.raise_for_status()
                        async for _chunk in r.aiter_raw():
                            first = first or time.perf_counter()
                    out[f"{fmt}_first_byte"].append(_took(t0, first, fmt))
    return out


async def _streams(http_port: int, rounds: int) -> list[tuple[str, float, float, float]]:
    """Each format streamed (80 ms chunks), one request at a time: ``(format, start, end,
    audio seconds)``, times on the machine's monotonic clock (``perf_counter``, which the
    gateway's process reads too)."""
    import httpx

    audio_s: dict[str, float] = {}
    windows = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}", timeout=30) as http:
        for text in SENTENCES:  # the audio each sentence makes, from its PCM
            r = await http.post("/v1/audio/speech", json={"input": text,
                                                          "response_format": "pcm"})
            r.raise_for_status()
            audio_s[text] = len(r.content) / 48_000
        for _ in range(rounds):
            for fmt in ("pcm", "wav", *ENCODED):
                for text in SENTENCES:
                    t0 = time.perf_counter()
                    async with http.stream("POST", "/v1/audio/speech",
                                           json={"input": text, "response_format": fmt}) as r:
                        async for _chunk in r.aiter_raw():
                            pass
                    windows.append((fmt, t0, time.perf_counter(), audio_s[text]))
    return windows


def _child(ws_port: int, http_port: int, rounds: int, queue: multiprocessing.Queue) -> None:
    queue.put(asyncio.run(_client(ws_port, http_port, rounds)))


def _streams_child(http_port: int, rounds: int, queue: multiprocessing.Queue) -> None:
    queue.put(asyncio.run(_streams(http_port, rounds)))


# ---- encoding cost --------------------------------------------------------------------------


def _sentences_pcm(engine_name: str) -> list[bytes]:
    from engines.registry import create_engine

    engine = create_engine(engine_name)
    engine.load()
    out = []
    for text in SENTENCES:
        stream = engine.open(SynthesisRequest(text=text))
        pcm = b""
        while (chunk := stream.step()) is not None:
            pcm += chunk
        out.append(pcm)
    engine.close()
    return out


async def encoder_alone(pcms: list[bytes], rounds: int) -> None:
    """The encoder without a server: CPU per audio second, wall time per ``encode`` call
    (what it would hold the loop for), and the loop thread's CPU per call when the call
    runs on the encoder thread instead (``Encoding``, as the gateway does)."""
    audio_s = sum(len(p) for p in pcms) / 48_000 * rounds
    print(f"\nencoder alone: {audio_s:.1f} s of audio per format and chunking (3 sentences "
          "x rounds), streamed; ms")
    print(f"{'':<8}{'CPU per':>9}{'open':>7}{'encode call, on the loop':>28}"
          f"{'loop CPU per call, thread':>30}")
    print(f"{'format':<8}{'audio s':>9}{'p50':>7}{'80 ms p50/p99':>15}{'sentence p50/p99':>18}"
          f"{'80 ms p50/p99':>15}{'sentence p50/p99':>18}")
    for fmt in FORMATS:
        Encoder(fmt, streamed=True).close()  # imports PyAV, warms the codec
        cpu, opens = 0.0, []
        calls: dict[int, list[float]] = {STEP_SAMPLES: [], 0: []}
        for size in calls:
            for _ in range(rounds):
                for pcm in pcms:
                    step = 2 * (size or len(pcm))
                    c0, t0 = time.thread_time(), time.perf_counter()
                    encoder = Encoder(fmt, streamed=True)
                    opens.append(time.perf_counter() - t0)
                    for at in range(0, len(pcm), step):
                        t0 = time.perf_counter()
                        encoder.encode(pcm[at:at + step])
                        calls[size].append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    encoder.finish()
                    calls[size].append(time.perf_counter() - t0)
                    cpu += time.thread_time() - c0
        loop = await _loop_side(fmt, pcms, rounds)
        small, whole, small_t, whole_t = (_pct(v) for v in (calls[STEP_SAMPLES], calls[0],
                                                             loop[STEP_SAMPLES], loop[0]))
        print(f"{fmt:<8}{cpu * 1000 / (2 * audio_s):9.2f}{statistics.median(opens) * 1000:7.2f}"
              f"{small[0]:8.3f} /{small[1]:5.2f}{whole[0]:10.3f} /{whole[1]:6.2f}"
              f"{small_t[0]:8.3f} /{small_t[1]:5.2f}{whole_t[0]:10.3f} /{whole_t[1]:6.2f}")


async def _loop_side(fmt: str, pcms: list[bytes], rounds: int) -> dict[int, list[float]]:
    """The loop thread's CPU per ``Encoding.encode``/``finish`` call (``thread_time``: the
    hand-over to the encoder thread and back; nothing else runs on this loop)."""
    from gateway.io.http_api import Encoding
    from gateway.io.lanes import LaneThread

    thread = LaneThread("bench-encoder") if FORMATS[fmt].container else None
    out: dict[int, list[float]] = {STEP_SAMPLES: [], 0: []}
    try:
        for size in out:
            for _ in range(rounds):
                for pcm in pcms:
                    step = 2 * (size or len(pcm))
                    encoding = Encoding(fmt, streamed=True, thread=thread)
                    for at in range(0, len(pcm), step):
                        c0 = time.thread_time()
                        await encoding.encode(pcm[at:at + step])
                        out[size].append(time.thread_time() - c0)
                    c0 = time.thread_time()
                    await encoding.finish()
                    out[size].append(time.thread_time() - c0)
                    encoding.close()
    finally:
        if thread is not None:
            thread.shutdown()
    return out


def _pct(values: list[float]) -> tuple[float, float]:
    ms = sorted(v * 1000 for v in values)
    return statistics.median(ms), ms[min(len(ms) - 1, int(0.99 * len(ms)))]


@dataclass
class LoopProbe:
    """In the gateway's loop: how late each 1 ms sleep wakes, and the process's CPU."""

    samples: list[tuple[float, float, float]] = field(default_factory=list)
    """(woke at, late by, process CPU) per wake-up."""
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            due = time.perf_counter() + 0.001
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            self.samples.append((now, now - due, time.process_time()))

    async def aclose(self) -> None:
        assert self._task is not None
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass

    def during(self, windows: list[tuple[str, float, float, float]]) -> dict[str, Any]:
        """Per format: lateness p50/p99/max (ms) while its requests ran; CPU ms per audio s."""
        out: dict[str, Any] = {}
        times = [s[0] for s in self.samples]
        import bisect

        for fmt in dict.fromkeys(w[0] for w in windows):
            late, cpu, audio = [], 0.0, 0.0
            for _, t0, t1, seconds in (w for w in windows if w[0] == fmt):
                i, j = bisect.bisect_left(times, t0), bisect.bisect_right(times, t1)
                late += [s[1] for s in self.samples[i:j]]
                if j > i:
                    cpu += self.samples[j - 1][2] - self.samples[max(i - 1, 0)][2]
                audio += seconds
            ms = sorted(v * 1000 for v in late)
            out[fmt] = (statistics.median(ms), ms[int(0.99 * (len(ms) - 1))], ms[-1],
                        cpu * 1000 / audio)
        return out


class _InlineEncoding:
    """The encoding on the event loop instead of the encoder thread (the comparison)."""

    def __init__(self, fmt: str, *, streamed: bool) -> None:
        self.encoder = Encoder(fmt, streamed=streamed)
        self.media_type = FORMATS[fmt].media_type

    async def encode(self, pcm: bytes) -> bytes:
        return self.encoder.encode(pcm)

    async def finish(self) -> bytes | memoryview:
        return self.encoder.finish()

    def close(self) -> None:
        self.encoder.close()


async def in_the_gateway(gw: Gateway, rounds: int, inline_too: bool) -> list[str]:
    """Each format streamed while the loop probe runs, in 80 ms chunks (HTTP speech's step)
    and in one chunk per sentence (the step of chatterbox or an ``http`` upstream: here
    espeak asked for 60 s steps); encoded on the encoder thread, and on the loop."""
    from gateway.io import http_api

    ctx = multiprocessing.get_context("spawn")
    lines = [f"\nin the gateway: each format streamed {rounds} x {len(SENTENCES)} times, one "
             "at a time; the loop's 1 ms probe, how late it woke (ms), and the gateway's CPU"]
    step_ms = http_api.step_ms
    for chunks in ("80 ms", "sentence"):
        for inline in (False, True) if inline_too else (False,):
            if inline:
                gw.http.encoding = _InlineEncoding  # type: ignore[assignment,method-assign]
            if chunks == "sentence":
                http_api.step_ms = lambda _priority: 60_000.0  # type: ignore[assignment]
            probe = LoopProbe()
            probe.start()
            queue = ctx.Queue()
            proc = ctx.Process(target=_streams_child, args=(gw.http_port, rounds, queue))
            proc.start()
            windows = await asyncio.to_thread(queue.get)
            await asyncio.to_thread(proc.join)
            await probe.aclose()
            http_api.step_ms = step_ms
            if inline:
                del gw.http.encoding
            where = "on the loop (comparison)" if inline else "on the encoder thread (shipped)"
            lines += [f"{chunks} chunks, encoded {where}:",
                      f"  {'format':<8}{'loop late p50':>14}{'p99':>8}{'max':>8}"
                      f"{'CPU ms/audio s':>16}"]
            for fmt, (p50, p99, top, cpu) in probe.during(windows).items():
                lines.append(f"  {fmt:<8}{p50:14.3f}{p99:8.3f}{top:8.2f}{cpu:16.1f}")
    return lines


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
        gateway_lines = await in_the_gateway(gw, args.rounds, args.inline)
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
    await encoder_alone(_sentences_pcm(args.engine), args.rounds)  # (the gateway is gone)
    print("\n".join(gateway_lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--engine", default="espeak")
    parser.add_argument("--no-inline", dest="inline", action="store_false",
                        help="skip the run with the encoding on the event loop")
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
