"""Bytes per second of audio on the watch link: Opus 20 ms vs PCM16 16 kHz, against the
gateway's own PCM16 24 kHz measured in the same run.

    python bench/watch_bytes.py [--text "..."] [--repeat 3] [--opus-bitrate 24000]

Starts the real gateway (replay LLM, espeak) and the watch relay on 127.0.0.1:0, has each
client ``say`` the same text, and counts the binary frames (headers included) it receives.
"Audio seconds" is the gateway's ``turn.done.metrics.audio_ms`` (what the listener hears,
without the relay's sentence padding), so the figures are bytes per second of speech.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

import orjson
from websockets.asyncio.client import connect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.watch_relay import HEADER, WatchRelay  # noqa: E402
from gateway.config import load_config  # noqa: E402
from gateway.io.server import Gateway  # noqa: E402

TEXT = ("Your next meeting is with the design team at half past two. After that the afternoon "
        "is free, except for a call with Priya at five about the quarterly numbers.")


async def one(url: str, text: str, first: dict | None = None) -> tuple[int, int, int, float]:
    """(frames, header bytes, payload bytes, audio seconds) for one spoken turn."""
    frames = header = payload = 0
    async with connect(url, compression=None, max_size=2**20) as ws:
        if first is not None:
            await ws.send(orjson.dumps(first).decode())
        while orjson.loads(await ws.recv())["type"] != "session.created":
            pass
        await ws.send(orjson.dumps({"type": "say", "text": text}).decode())
        while True:
            message = await ws.recv()
            if isinstance(message, bytes):
                frames += 1
                header += HEADER.size
                payload += len(message) - HEADER.size
                continue
            event = orjson.loads(message)
            if event["type"] == "turn.done":
                assert event["status"] == "completed", event
                return frames, header, payload, event["metrics"]["audio_ms"] / 1000


async def main(text: str, repeat: int, bitrate: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        replies = Path(tmp) / "replies.jsonl"
        replies.write_text('{"transcript": "x", "reply": "y"}\n')
        gateway = Gateway(load_config(server={"port": 0}, tts={"engine": "espeak"},
                                      llm={"replies": str(replies)}))
        await gateway.start()
        relay = WatchRelay(f"ws://127.0.0.1:{gateway.port}/v1/voice", opus_bitrate=bitrate)
        await relay.start()
        try:
            rows = {
                "pcm16 24 kHz (gateway, baseline)": f"ws://127.0.0.1:{gateway.port}/v1/voice",
                "pcm16 16 kHz (relay)": f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k",
                f"opus {bitrate // 1000} kbit/s 20 ms (relay)":
                    f"ws://127.0.0.1:{relay.port}/?format=opus",
            }
            results = {}
            for name, url in rows.items():
                totals = [0, 0, 0, 0.0]
                for _ in range(repeat):
                    for i, value in enumerate(await one(url, text)):
                        totals[i] += value
                results[name] = totals
        finally:
            await relay.aclose()
            await gateway.aclose()
    base = None
    print(f"{'format':38} {'frames/s':>9} {'payload B/s':>12} {'total B/s':>10} {'vs base':>8}")
    for name, (frames, header, payload, seconds) in results.items():
        total = (header + payload) / seconds
        base = base or total
        print(f"{name:38} {frames / seconds:9.1f} {payload / seconds:12.0f} {total:10.0f} "
              f"{total / base:8.3f}")
    print(f"(audio: {seconds:.1f} s per format over {repeat} turn(s); headers 12 B/frame; "
          "WebSocket framing not counted)")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--text", default=TEXT)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--opus-bitrate", type=int, default=24_000)
    a = p.parse_args()
    asyncio.run(main(a.text, a.repeat, a.opus_bitrate))
