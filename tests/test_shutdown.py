"""The gateway's stop (SIGTERM, ^C: ``Gateway.aclose``) with real servers, espeak and the
replay LLM: what clients see, and what may hold the stop up."""

from __future__ import annotations

import asyncio
import json
import socket

import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from gateway.config import load_config
from gateway.io import http_api, server
from gateway.io.server import Gateway
from tests.hang_guard import unless_hung
from tests.wsclient import recv_event, send

LONG = "Here is a longer reply, said slowly enough to still be going on. " * 10


@pytest.fixture
async def gw(tmp_path):
    path = tmp_path / "replies.jsonl"
    path.write_text(orjson.dumps({"transcript": "Hi?", "reply": "Hello."}).decode() + "\n")
    gateway = Gateway(load_config(server={"port": 0}, tts={"engine": "espeak"},
                                  llm={"replies": str(path), "tokens_per_s": 400.0}))
    await gateway.start()
    yield gateway
    if not gateway.closing:
        await gateway.aclose()


async def events_until_closed(ws) -> tuple[list[dict], int | None]:
    events = []
    with pytest.raises(ConnectionClosed) as info:
        while True:
            message = await ws.recv()
            if isinstance(message, str):
                events.append(json.loads(message))
    return events, info.value.rcvd.code if info.value.rcvd else None


def ends_shutting_down(events: list[dict], turn_id: int) -> bool:
    return [(e["type"], e.get("error", {}).get("code"), e.get("status"))
            for e in events[-2:]] == [("error", "shutting_down", None),
                                      ("turn.done", None, "failed")] \
        and all(e["turn_id"] == turn_id for e in events[-2:])


async def test_a_voice_client_that_reads_nothing_does_not_hold_the_stop(gw, monkeypatch):
    """The stop waited for such a client's close handshake: websockets' close timeout
    (10 s) per socket, well past the shutdown's 2 s grace (SIGTERM to exit: 10.2 s with 200
    such sessions). Now its socket is aborted when the grace ends; what the kernel already
    holds for it (the turn's end, the close frame) still reaches it. (Here the grace is 0
    and websockets would wait for ever: the stop must not need the client.)"""
    monkeypatch.setattr(server, "SHUTDOWN_GRACE_S", 0)
    async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws:
        await recv_event(ws, "session.created")
        await send(ws, type="say", text=LONG)
        turn_id = (await recv_event(ws, "sentence"))["turn_id"]
        for connection in gw.connections:
            connection.ws.close_timeout = None
        ws.transport.pause_reading()
        await asyncio.wait_for(gw.aclose(), 60)  # the client has read nothing meanwhile
        ws.transport.resume_reading()
        events, code = await events_until_closed(ws)
    assert code == 1001 and ends_shutting_down(events, turn_id)
    assert gw.connections == set() and gw.runners == {}


async def test_a_turn_ends_at_the_stop_while_an_http_client_holds_its_grace(gw, monkeypatch):
    """The HTTP API closed first, then the voice sessions: while a speech client took its
    answer slowly (2 s of grace), every voice turn went on speaking, and the stop took
    both graces one after the other (12.2 s with a stalled client on each port). Now both
    ports close at once: the voice turn ends ``shutting_down`` while the HTTP client still
    has its grace (made long here)."""
    monkeypatch.setattr(http_api, "SHUTDOWN_GRACE_S", 60)
    paused, full = http_api._H11.pause_writing, asyncio.Event()

    def pause_writing(self) -> None:
        paused(self)
        full.set()

    monkeypatch.setattr(http_api._H11, "pause_writing", pause_writing)
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    closing = None
    try:
        await loop.sock_connect(sock, ("127.0.0.1", gw.http_port))
        body = orjson.dumps({"input": LONG * 6, "response_format": "pcm"})
        await loop.sock_sendall(sock, b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        await unless_hung(full.wait())  # its socket is full: it holds the grace
        async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws:
            await recv_event(ws, "session.created")
            await send(ws, type="say", text=LONG)
            turn_id = (await recv_event(ws, "sentence"))["turn_id"]
            closing = asyncio.create_task(gw.aclose())
            await gw.http.stopping.wait()
            events, code = await unless_hung(events_until_closed(ws))
        assert not closing.done()  # the HTTP client's grace goes on
        assert code == 1001 and ends_shutting_down(events, turn_id)
        while await loop.sock_recv(sock, 1 << 20):
            pass
        await closing
    finally:
        sock.close()
        if closing is not None:
            await closing
