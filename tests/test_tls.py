"""``--tls-cert``/``--tls-key``: the voice socket serves wss:// and the HTTP API https://,
with the same certificate, so a bearer token never crosses the network in clear on either
port. A throwaway CA (trustme) issues the certificate; nothing is fetched."""

from __future__ import annotations

import asyncio
import logging
import ssl

import httpx
import pytest
import trustme
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidMessage

from gateway.io.listen import note_plain_http
from tests.hang_guard import HANG_S
from tests.wsclient import read_turn, recv_event, send

TOKEN = "s3cret"


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def client_ssl(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


@pytest.fixture
async def gateway(start_gateway, tmp_path, ca):
    leaf = ca.issue_cert("127.0.0.1")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    leaf.private_key_pem.write_to_path(str(key))
    return await start_gateway([{"transcript": "Hello", "reply": "Hi there."}],
                               server={"tls_cert": str(cert), "tls_key": str(key),
                                       "tokens": (TOKEN,)})


async def test_the_voice_socket_speaks_wss(gateway, client_ssl):
    async with connect(f"wss://127.0.0.1:{gateway.port}/v1/voice", ssl=client_ssl,
                       additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
        assert (await recv_event(ws))["type"] == "session.created"
        await send(ws, type="transcript", text="Hello")
        turn = await read_turn(ws)
        assert turn.done["status"] == "completed" and turn.audio_ms > 0


async def test_the_http_api_speaks_https_with_the_same_certificate(gateway, client_ssl):
    async with httpx.AsyncClient(timeout=HANG_S, verify=client_ssl) as http:
        models = await http.get(f"https://127.0.0.1:{gateway.http_port}/v1/models",
                                headers={"Authorization": f"Bearer {TOKEN}"})
        assert models.status_code == 200 and models.json()["data"]
        refused = await http.get(f"https://127.0.0.1:{gateway.http_port}/v1/models")
        assert refused.status_code == 401


async def test_plain_connections_get_nothing_on_either_port_and_are_logged(gateway, caplog):
    """The client sees the connection close ("did not receive a valid HTTP response"; curl:
    "Empty reply from server"); the operator's log said nothing of it."""
    caplog.set_level(logging.INFO, logger="gateway")
    async with httpx.AsyncClient(timeout=HANG_S) as http:
        with pytest.raises(httpx.HTTPError):
            await http.get(f"http://127.0.0.1:{gateway.http_port}/v1/models",
                           headers={"Authorization": f"Bearer {TOKEN}"})
    with pytest.raises(InvalidMessage):  # the server answered the HTTP upgrade with TLS
        async with connect(f"ws://127.0.0.1:{gateway.port}/v1/voice", open_timeout=5,
                           additional_headers={"Authorization": f"Bearer {TOKEN}"}):
            pass
    # (the server closed each connection after noting it: nothing left to wait for)
    assert [r.getMessage() for r in caplog.records if "plain HTTP" in r.getMessage()] == [
        f"a plain HTTP request (ws:// or http://) reached the {port}, which serves TLS: "
        f"closed unanswered; its client must dial {scheme}"
        for port, scheme in (("HTTP API port", "https://"), ("voice port", "wss://"))]
    assert gateway.metrics.errors["plain_http"] == 2


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_plain_http_is_noted_on_either_loop(ca, loop):
    """The gateway serves under uvloop (``run``), the other tests under asyncio: both loops'
    TLS make their SSLObjects with the context's ``sslobject_class``."""
    noted: list[None] = []
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    note_plain_http(context, lambda: noted.append(None))

    async def plain_request() -> bytes:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0, ssl=context)
        async with server:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", server.sockets[0].getsockname()[1])
            writer.write(b"GET /v1/voice HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            answer = await reader.read()  # (the server noted it, then closed)
            writer.close()
            return answer

    if loop == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        assert uvloop.run(plain_request()) == b""
    else:
        assert asyncio.run(plain_request()) == b""
    assert noted == [None]
