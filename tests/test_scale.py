"""What each live session costs at scale, with a real gateway (espeak, the replay LLM)."""

from __future__ import annotations

from websockets.asyncio.client import connect

from tests.wsclient import read_turn, recv_event, send


async def test_a_live_socket_keeps_none_of_its_handshake_headers(start_gateway):
    """websockets keeps the handshake's request and response for the life of the socket:
    their headers, a list per name, were ~20 of a session's ~127 objects (a sixth of what
    each full collection walks per session: bench/gc_pause.py) that nothing reads after the
    handshake. The session works as before without them."""
    gw = await start_gateway([{"transcript": "Hi?", "reply": "Hello there."}])
    async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice",
                       user_agent_header="test-client/1.0") as ws:
        await recv_event(ws, "session.created")
        (connection,) = gw.connections
        assert connection.ws.request is not None and not connection.ws.request.headers
        assert connection.ws.response is None
        await send(ws, type="transcript", text="Hi?")
        assert (await read_turn(ws)).done["status"] == "completed"
