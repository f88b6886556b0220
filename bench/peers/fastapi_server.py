"""Peer for bench/capacity.py: the common hand-rolled voice WebSocket server.

FastAPI + uvicorn (uvloop, httptools, websockets), one task per connection: on a
``{"type": "say", "text": ...}`` message it renders the text with the same synthetic
engine as the gateway (``SyntheticEngine(rtf=0, ttfa_ms=0)``, 320 ms steps), cuts 40 ms
frames and sends each as ``{"type": "audio", "audio": <base64 PCM16>}`` JSON, paced in real
time on a clock (no drift), then ``{"type": "done"}``. Runs in its own venv
(/work/peer-venvs/fastapi: fastapi, uvicorn[standard], numpy).

    /work/peer-venvs/fastapi/bin/python bench/peers/fastapi_server.py --port 0
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fastapi import FastAPI, WebSocket, WebSocketDisconnect  # noqa: E402

from bench.peers import serve_uvicorn  # noqa: E402
from engines.base import SynthesisRequest  # noqa: E402
from engines.synthetic import SyntheticEngine  # noqa: E402

FRAME_BYTES = 40 * 24 * 2
engine = SyntheticEngine(rtf=0, ttfa_ms=0, lane="cpu")
engine.prerender()  # as the gateway's bench server does: no rendering while measured
app = FastAPI()


async def speak(ws: WebSocket, text: str) -> None:
    stream = engine.open(SynthesisRequest(text=text))
    next_send = time.monotonic()
    try:
        while True:
            chunk = stream.step()
            if chunk is None:
                break
            for i in range(0, len(chunk), FRAME_BYTES):
                frame = chunk[i:i + FRAME_BYTES]
                await ws.send_text(json.dumps(
                    {"type": "audio", "audio": base64.b64encode(frame).decode()}))
                next_send += len(frame) / 48000
                delay = next_send - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
        await ws.send_text(json.dumps({"type": "done"}))
    finally:
        stream.close()


@app.websocket("/v1/voice")
async def voice(ws: WebSocket) -> None:
    await ws.accept()
    task: asyncio.Task[None] | None = None
    try:
        while True:
            msg = json.loads(await ws.receive_text())
            if msg.get("type") == "say":
                if task is not None:
                    task.cancel()
                task = asyncio.create_task(speak(ws, msg["text"]))
    except WebSocketDisconnect:
        pass
    finally:
        if task is not None:
            task.cancel()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    a = p.parse_args()
    serve_uvicorn(app, a.port)
