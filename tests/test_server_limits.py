"""What the server refuses before a session starts, on real sockets: more sessions than
``max_sessions``, a browser Origin outside the ``--origin`` allowlist, and a bind beyond
loopback without a token (protocol.md, Auth; README, Security and limits)."""

from __future__ import annotations

import json

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from gateway.config import load_config
from gateway.io.server import Gateway
from tests.wsclient import recv_event


async def created(ws) -> None:
    """The server's first message is ``session.created``."""
    assert (await recv_event(ws))["type"] == "session.created"


async def test_sessions_beyond_max_sessions_get_503_server_full_until_one_ends(start_gateway):
    gw = await start_gateway(server={"max_sessions": 2})
    url = f"ws://127.0.0.1:{gw.port}/v1/voice"
    async with connect(url) as a, connect(url) as b:
        await created(a)
        await created(b)
        with pytest.raises(InvalidStatus) as refused:
            async with connect(url):
                pass
        response = refused.value.response
        assert response.status_code == 503
        assert json.loads(response.body)["error"]["code"] == "server_full"
    await gw.wait_no_sessions()  # both closed cleanly: nothing kept for a resume
    async with connect(url) as c:
        await created(c)
    assert gw.metrics.sessions_opened == 3


async def test_a_browser_origin_outside_the_allowlist_is_refused(start_gateway):
    gw = await start_gateway(server={"origins": ("https://console.example",)})
    url = f"ws://127.0.0.1:{gw.port}/v1/voice"
    with pytest.raises(InvalidStatus) as refused:
        async with connect(url, origin="https://elsewhere.example"):
            pass
    assert refused.value.response.status_code == 403
    assert json.loads(refused.value.response.body) == {"error": {  # JSON, like 401 and 503
        "code": "forbidden_origin", "message": "Origin 'https://elsewhere.example' is not "
        "allowed (--origin, [server] origins)"}}
    async with connect(url, origin="https://console.example") as ws:
        await created(ws)
    async with connect(url) as ws:  # no Origin header: not a browser, allowed
        await created(ws)


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.1"])
async def test_no_bind_beyond_loopback_without_a_token(host):
    gw = Gateway(load_config(server={"host": host, "port": 0}, tts={"engine": "espeak"}))
    try:
        with pytest.raises(ValueError, match="without a token"):
            await gw.start()
        assert gw._server is None and not gw.ready  # nothing was bound
    finally:
        await gw.aclose()


async def test_a_token_or_insecure_bind_allows_it():
    for server in ({"tokens": ("s3cret",)}, {"insecure_bind": True}):
        gw = Gateway(load_config(server={"host": "0.0.0.0", "port": 0, **server},
                                 tts={"engine": "espeak"}))
        try:
            await gw.start()
            assert gw.ready and gw.port > 0
        finally:
            await gw.aclose()
