"""Test double: a scripted OpenAI-style ``/v1/audio/speech`` SSE server (Starlette + uvicorn).

Not a TTS: it answers with the events a test scripts, to check the client side of the
``speech.audio.*`` protocol (deltas, done, error, a server that hangs up, HTTP errors).
Runs in a thread on 127.0.0.1 port 0; the socket listens before ``start`` returns.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import threading
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route


def delta(pcm: bytes) -> dict[str, Any]:
    return {"type": "speech.audio.delta", "audio": base64.b64encode(pcm).decode()}


DONE = {
    "type": "speech.audio.done",
    "usage": {"input_tokens": 3, "output_tokens": 9, "total_tokens": 12},
}


class ScriptedSseServer:
    """Serves ``script`` (a list of events; ``"hangup"`` ends the body abruptly, ``"stall"``
    sends nothing more until the client goes away, ``"pings"`` nothing but an SSE comment
    every 0.1 s (a keep-alive, as sse-starlette sends) until then; ``bytes`` are sent as
    they are, for
    events a test writes itself). ``script`` may also be a function of the request's body
    returning such a list.

    ``status`` other than 200 answers a JSON error instead. ``requests`` records bodies;
    ``stalled`` is set when an answer reaches ``"stall"``; ``disconnected`` when a client
    goes away mid-stream.
    """

    def __init__(self) -> None:
        self.script: Any = [DONE]
        self.status = 200
        self.hold = False  # True: after the first event, wait until the client goes away
        self.requests: list[dict[str, Any]] = []
        self.stalled = threading.Event()
        self.disconnected = threading.Event()
        self.port = 0
        app = Starlette(routes=[Route("/v1/audio/speech", self._speech, methods=["POST"])])
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self._thread: threading.Thread | None = None

    async def _speech(self, request: Request):
        body = await request.json()
        self.requests.append(body)
        if self.status != 200:
            return JSONResponse({"error": {"message": "scripted failure"}}, status_code=self.status)
        script = self.script(body) if callable(self.script) else list(self.script)
        hold = self.hold

        async def events():
            try:
                for i, item in enumerate(script):
                    if item == "hangup":
                        raise RuntimeError("scripted hang-up")
                    if item == "stall":
                        self.stalled.set()
                        await asyncio.Future()  # Starlette cancels us when the client leaves
                    if item == "pings":
                        self.stalled.set()
                        while True:  # (until Starlette cancels us: the client left)
                            yield b": ping\n\n"
                            await asyncio.sleep(0.1)
                    yield item if isinstance(item, bytes) else \
                        f"data: {json.dumps(item)}\n\n".encode()
                    if hold and i == 0:
                        await asyncio.Future()  # Starlette cancels us when the client leaves
            except asyncio.CancelledError:
                self.disconnected.set()
                raise

        return StreamingResponse(events(), media_type="text/event-stream")

    def start(self) -> str:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        self.port = sock.getsockname()[1]
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self._thread.start()
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
