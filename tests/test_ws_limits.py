"""What a socket that breaks the WebSocket limits costs the gateway: messages over 1 MiB or
4,096 fragments (websockets fails the connection, 1009), and unfinished messages held in
memory. Raw sockets, so the client can misbehave as no library would."""

from __future__ import annotations

import asyncio
import base64
import os
import struct

import pytest

from gateway.io.server import Gateway


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
                                                                                sent):
    """websockets fails the connection (close 1009, then the end of its side of the TCP
    connection) and waits for the client to close its side. A client that did not kept the
    socket, and its session attached to it, until websockets' close timeout (10 s) or the
    next keepalive ping: now the TCP connection is aborted a second after."""
    gw = await start_gateway()
    reader, writer = await upgraded(gw)
    writer.write(sent)
    await writer.drain()
    received = await reader.read()  # to the server's end of the stream: the close frame came
    assert b"\x88" in received and struct.pack("!H", 1009) in received
    try:
        async with asyncio.timeout(5):  # (was 10 s)
            await no_connections(gw)
    finally:
        writer.close()
    (runner,) = gw.runners.values()
    assert runner.connection is None and runner.session.held  # waits for a resume
