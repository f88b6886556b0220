"""A protocol-exact test client: reads a turn's events and frames off a real WebSocket."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from gateway.core.codec import BYTES_PER_MS, AudioFrame, decode_frame
from tests.hang_guard import hang_guard


@dataclass
class TurnResult:
    turn_id: int | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    frames: list[AudioFrame] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    """Loop time at which each frame arrived."""

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]

    @property
    def done(self) -> dict[str, Any]:
        (done,) = self.of("turn.done")
        return done

    @property
    def audio(self) -> np.ndarray:
        return np.frombuffer(b"".join(f.pcm for f in self.frames), dtype="<i2")

    @property
    def audio_ms(self) -> float:
        return sum(len(f.pcm) for f in self.frames) / BYTES_PER_MS

    @property
    def reply(self) -> str:
        return "".join(e["delta"] for e in self.of("text.delta"))


def gapless(result: TurnResult) -> None:
    """The turn's frames carry consecutive ``seq`` and the last one ends the turn."""
    seqs = [f.seq for f in result.frames]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert result.frames[-1].turn_end


async def send(ws: ClientConnection, **message: Any) -> None:
    await ws.send(orjson.dumps(message).decode())


async def recv_event(ws: ClientConnection, kind: str | None = None) -> dict[str, Any]:
    """Next JSON event (skipping frames), or the next of ``kind``."""
    while True:
        message = await ws.recv()
        if isinstance(message, bytes):
            continue
        event = orjson.loads(message)
        if kind is None or event["type"] == kind:
            return event


async def read_until_closed(ws: ClientConnection) -> None:
    """Read (and drop) whatever still comes until the server closes the socket; its
    ``close_code`` and ``close_reason`` are then set."""
    try:
        while True:
            await ws.recv()
    except ConnectionClosed:
        return


async def round_trip(ws: ClientConnection, ping_id: Any) -> list[AudioFrame]:
    """Ping and wait for the pong: the server has handled everything sent before. Returns
    the audio frames that arrived meanwhile (other events are skipped)."""
    await send(ws, type="ping", id=ping_id)
    frames = []
    while True:
        message = await ws.recv()
        if isinstance(message, bytes):
            frames.append(decode_frame(message))
        elif orjson.loads(message) == {"type": "pong", "id": ping_id}:
            return frames


async def read_turn(ws: ClientConnection, turn_id: int | None = None,
                    *, until: str = "turn.done") -> TurnResult:
    """Collect everything up to and including the ``turn.done`` of ``turn_id`` (the first
    turn started when None). Frames and events of other turns are kept in order too."""
    result = TurnResult(turn_id=turn_id)
    loop = asyncio.get_running_loop()
    while True:
        message = await ws.recv()
        if isinstance(message, bytes):
            result.frames.append(decode_frame(message))
            result.arrivals.append(loop.time())
            continue
        event = orjson.loads(message)
        result.events.append(event)
        if event["type"] == "turn.started" and result.turn_id is None:
            result.turn_id = event["turn_id"]
        if event["type"] == until and event.get("turn_id") == result.turn_id:
            return result


async def one_turn(port: int, **message: Any) -> TurnResult:
    """A voice session of one turn on ``port``: ``message`` (a ``transcript`` or a ``say``)
    sent once the session is created, its turn read to its ``turn.done``."""
    async with connect(f"ws://127.0.0.1:{port}/v1/voice") as ws:
        await recv_event(ws, "session.created")
        await send(ws, **message)
        return await read_turn(ws)


class LineSeen(logging.Handler):
    """Sets ``seen`` when a record holding ``text`` is logged (on the loop's own thread)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text, self.seen = text, asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()


def frames_written(gateway: Any, n: int) -> asyncio.Event:
    """Set once the gateway has written ``n`` more audio frames to its only session."""
    (runner,) = gateway.runners.values()
    written, count = asyncio.Event(), 0
    original = runner.written

    def counting(batch: list[str | bytes]) -> None:
        nonlocal count
        count += sum(isinstance(m, bytes) for m in batch)
        if count >= n:
            written.set()
        original(batch)

    runner.written = counting
    return written


async def raw_exchange(port: int, request: bytes) -> tuple[bytes, int]:
    """The whole answer of the server on 127.0.0.1 ``port`` to the bytes ``request``, read
    until it closes the connection (either port closes it after any answer but a 101), and
    the client's own port (as the server's log names the peer)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        async with hang_guard("the answer and the close"):
            return await reader.read(), writer.get_extra_info("sockname")[1]
    finally:
        writer.close()


async def raw_answer(port: int, request: bytes) -> bytes:
    """``raw_exchange``'s answer alone."""
    return (await raw_exchange(port, request))[0]
