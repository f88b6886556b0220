"""What a socket that breaks the WebSocket limits costs the gateway: messages over 1 MiB or
4,096 fragments (websockets fails the connection, 1009), and unfinished messages held in
memory. Raw sockets, so the client can misbehave as no library would."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import struct

import pytest

from gateway.io.server import Gateway
from tests.hang_guard import hang_guard


def client_frame(opcode: int, payload: bytes, *, fin: bool, length: int | None = None) -> bytes:
    """A masked client frame (the mask is zero: the payload goes as is); ``length``: the
    length its header announces, when not the payload's."""
    n = len(payload) if length is None else length
    first = (0x80 if fin else 0) | opcode
    if n < 126:
        header = struct.pack("!BB", first, 0x80 | n)
    elif n < 65536:
        header = struct.pack("!BBH", first, 0x80 | 126, n)
    else:
        header = struct.pack("!BBQ", first, 0x80 | 127, n)
    return header + bytes(4) + payload


async def upgraded(gw: Gateway) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(f"GET /v1/voice HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                 f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                 "Sec-WebSocket-Version: 13\r\n\r\n".encode())
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101 ")
    return reader, writer


async def no_connections(gw: Gateway) -> None:
    while gw.connections:
        gw._live_changed.clear()
        await gw._live_changed.wait()


@pytest.mark.parametrize("sent", [
    client_frame(0x1, b"", fin=True, length=2**20 + 1),  # over max_size: the parser fails
    client_frame(0x1, b"", fin=False) + client_frame(0x0, b"", fin=False) * 4200,  # recv fails
], ids=["over-1-MiB", "too-many-fragments"])
async def test_a_socket_websockets_fails_goes_at_once_though_its_client_stays(start_gateway,
                                                                                monkeypatch,
                                                                                sent):
    """websockets fails the connection (close 1009, then the end of its side of the TCP
    connection) and waits for the client to close its side. A client that did not kept the
    socket, and its session attached to it, until websockets' close timeout (10 s) or the
    next keepalive ping: now the TCP connection is aborted a second after
    (CLOSED_TCP_GRACE_S)."""
    # websockets' two bounds set to an hour, so that the bound of the wait below tells the
    # gateway's 1 s from them and from nothing else: it was 5 s against their 10 s, a margin
    # a starved machine can eat (4 s), and no wider without waiting past the close timeout
    monkeypatch.setattr("gateway.io.server.KEEPALIVE_PING_S", 3600.0)
    gw = await start_gateway()
    reader, writer = await upgraded(gw)
    (ws,) = gw._server.connections
    ws.close_timeout = 3600.0
    writer.write(sent)
    await writer.drain()
    received = await reader.read()  # to the server's end of the stream: the close frame came
    assert b"\x88" in received and struct.pack("!H", 1009) in received
    try:
        async with asyncio.timeout(60):  # (was an hour here, 10 s with websockets' defaults)
            await no_connections(gw)
    finally:
        writer.close()
    (runner,) = gw.runners.values()
    assert runner.connection is None and runner.session.held  # waits for a resume


async def server_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """The next frame the server sent (unmasked): its opcode and payload."""
    first, second = await reader.readexactly(2)
    n = second & 0x7F
    if n == 126:
        (n,) = struct.unpack("!H", await reader.readexactly(2))
    elif n == 127:
        (n,) = struct.unpack("!Q", await reader.readexactly(8))
    return first & 0x0F, await reader.readexactly(n)


async def until(reader: asyncio.StreamReader, opcode: int) -> bytes:
    """The payload of the next frame of ``opcode`` (the frames before it are skipped)."""
    while True:
        got, payload = await server_frame(reader)
        if got == opcode:
            return payload


async def unfinished(writer: asyncio.StreamWriter, reader: asyncio.StreamReader,
                     size: int, *, first: bool = True) -> None:
    """Send ``size`` more bytes of a fragmented text message, and wait until the gateway
    has read them: a ping after them is answered (data is read in order)."""
    for start in range(0, size, 65536):
        chunk = b"x" * min(65536, size - start)
        writer.write(client_frame(0x1 if first else 0x0, chunk, fin=False))
        first = False
    writer.write(client_frame(0x9, b"seen?", fin=True))
    await writer.drain()
    assert await until(reader, 0xA) == b"seen?"


async def test_unfinished_messages_draw_on_a_gateway_wide_budget(start_gateway):
    """websockets keeps every message until its last byte, up to 1 MiB: a client that
    never finished one held 1.1 MiB per socket (1,000 sockets: +1.1 GiB RSS). Beyond the
    largest message the gateway acts on, what sockets hold now draws on one budget; the
    socket that would pass it is closed with 1009, the others are answered as before."""
    from gateway.io.connection import FRAGMENT_COST, UNFINISHED_FREE_BYTES

    gw = await start_gateway()
    gw.unfinished.limit = 256 * 1024
    r1, w1 = await upgraded(gw)
    await unfinished(w1, r1, UNFINISHED_FREE_BYTES + 200 * 1024)  # in 5 fragments
    drawn = 200 * 1024 + 5 * FRAGMENT_COST
    assert gw.unfinished.used == drawn
    r2, w2 = await upgraded(gw)
    await unfinished(w2, r2, UNFINISHED_FREE_BYTES - 1024)  # free: nothing drawn
    assert gw.unfinished.used == drawn
    w2.write(client_frame(0x0, bytes(100 * 1024), fin=False))  # 300 KiB drawn: too many
    received = await r2.read()  # the close frame, then the end of the stream
    assert struct.pack("!H", 1009) + b"message too big" in received
    w2.close()
    async with hang_guard("the refused socket's end"):
        await no_connections_but(gw, 1)
    assert gw.unfinished.used == drawn  # the refused socket's share is back
    assert gw.metrics.errors["unfinished_messages"] == 1
    # the first socket goes on: its message, over 64 KiB, is answered as it always was
    w1.write(client_frame(0x0, b"", fin=True))
    error = json.loads(await until(r1, 0x1))
    assert error["type"] == "error" and error["error"]["code"] == "message_too_large"
    assert gw.unfinished.used == 0
    w1.close()


async def test_a_message_the_gateway_acts_on_never_draws_on_the_budget(start_gateway):
    gw = await start_gateway()
    gw.unfinished.limit = 0  # spent
    reader, writer = await upgraded(gw)
    ping = json.dumps({"type": "ping", "id": "x" * 64000}).encode()
    writer.write(b"".join(client_frame(0x1 if i == 0 else 0x0, ping[i:i + 1000],
                                       fin=i + 1000 >= len(ping))
                          for i in range(0, len(ping), 1000)))  # 64 fragments
    await writer.drain()
    while (event := json.loads(await until(reader, 0x1)))["type"] != "pong":
        pass
    assert len(event["id"]) == 64000 and gw.unfinished.used == 0
    writer.close()


async def no_connections_but(gw: Gateway, n: int) -> None:
    while len(gw.connections) > n:
        gw._live_changed.clear()
        await gw._live_changed.wait()


@pytest.mark.parametrize("opcode", [0x9, 0xA], ids=["pings", "pongs"])
async def test_websocket_pings_and_pongs_count_as_messages_and_a_flood_is_closed(start_gateway,
                                                                                  monkeypatch,
                                                                                  opcode):
    """websockets answers a ping frame itself, below the gateway's allowance of messages: a
    client flooding them had every one answered, and one that read none of the pongs had
    them all queued for it in the gateway's memory (524 MB sent in 15 s took the gateway
    from 62 MB to 912 MB) until the keepalive ended it 40 s later; a flood of pongs nobody
    asked for went on for ever, the loop's time taken from every other session (20
    underruns in another's turn). Both count as messages now: past the allowance the socket
    closes with 1008, as for any message flood, the gateway reads no more of it, and
    another session goes on."""
    from gateway.io import connection

    monkeypatch.setattr(connection, "MESSAGE_BURST", 50)
    monkeypatch.setattr(connection, "MESSAGES_PER_S", 0.0)  # (no refill: no clock matters)
    monkeypatch.setattr("gateway.io.server.KEEPALIVE_PING_S", 3600.0)
    gw = await start_gateway()
    other_reader, other_writer = await upgraded(gw)
    reader, writer = await upgraded(gw)
    writer.write(client_frame(opcode, b"p" * 125, fin=True) * 2000)
    writer.write(client_frame(0x1, b'{"type": "ping", "id": "last"}', fin=True))
    await writer.drain()
    pongs = 0
    while (frame := await server_frame(reader))[0] != 0x8:
        opcode, payload = frame
        assert (opcode, json.loads(payload).get("id") if opcode == 0x1 else None) != \
            (0x1, "last"), f"the flood was answered: {pongs} pongs, then the last ping"
        pongs += opcode == 0xA
    assert frame[1] == struct.pack("!H", 1008) + b"too many messages"
    assert pongs < 2000  # (those read with the 50th may all be answered)
    assert gw.metrics.errors["too_many_messages"] == 1
    writer.close()
    async with hang_guard("the flooding socket's end"):
        await no_connections_but(gw, 1)
    # the other session was untouched: it is answered as before
    other_writer.write(client_frame(0x1, b'{"type": "ping", "id": 1}', fin=True))
    await other_writer.drain()
    while (event := json.loads(await until(other_reader, 0x1)))["type"] != "pong":
        pass
    assert event == {"type": "pong", "id": 1}
    other_writer.close()
