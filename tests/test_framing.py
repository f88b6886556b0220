"""Audio messages are framed with headers websockets serialized once per length
(``gateway.io.connection.binary_header``): the bytes must be the library's own, and the
server must never negotiate an extension that would change them."""

from __future__ import annotations

import pytest
from websockets.asyncio.client import connect
from websockets.frames import Frame, Opcode

from gateway.io.connection import binary_header
from tests.wsclient import gapless, read_turn, recv_event, send


@pytest.mark.parametrize("length", [0, 1, 125, 126, 127, 1932, 65535, 65536, 70000])
def test_header_and_payload_are_the_frame_websockets_would_write(length):
    payload = bytes(range(256)) * (length // 256) + bytes(length % 256)
    expected = Frame(Opcode.BINARY, payload).serialize(mask=False, extensions=[])
    assert binary_header(length) + payload == expected


async def test_a_client_offering_deflate_gets_no_extension_and_well_framed_audio(
        start_gateway):
    gw = await start_gateway([{"transcript": "Hello", "reply": "Hi there. How are you?"}])
    # websockets' client offers permessage-deflate by default
    async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws:
        assert ws.protocol.extensions == []
        assert (await recv_event(ws))["type"] == "session.created"
        await send(ws, type="transcript", text="Hello")
        turn = await read_turn(ws)  # the client's parser checks every header it reads
        assert turn.done["status"] == "completed"
        gapless(turn)
        assert turn.audio_ms > 500
        assert [e["type"] for e in turn.events].count("sentence") == 2
