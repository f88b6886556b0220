"""What the server refuses before a session starts, on real sockets: more sessions than
``max_sessions``, a browser Origin outside the ``--origin`` allowlist, and a bind beyond
loopback without a token (protocol.md, Auth; README, Security and limits)."""

from __future__ import annotations

import asyncio
import errno
import json
import socket

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from engines.base import EngineError, SynthesisRequest
from gateway.config import load_config
from gateway.io.server import Gateway
from tests.wsclient import read_turn, recv_event, send


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
    assert (gw.metrics.connections_opened, gw.metrics.sessions_resumed) == (3, 0)


async def refused_503(url: str) -> None:
    with pytest.raises(InvalidStatus) as refused:
        async with connect(url):
            pass
    assert refused.value.response.status_code == 503
    assert json.loads(refused.value.response.body)["error"]["code"] == "server_full"


async def dropped(url: str) -> dict:
    """A phone's session whose socket died without a close (it waits for a resume)."""
    ws = await connect(url)
    created = await recv_event(ws, "session.created")
    ws.transport.abort()
    await ws.wait_closed()
    return created


async def test_a_full_gateway_lets_a_phone_back_in_to_resume_its_session(start_gateway):
    # max_sessions 1: the dropped session waiting for its resume fills the gateway. The
    # phone reconnecting for it names it (?resume=) and gets it back; anyone else gets 503.
    gw = await start_gateway(server={"max_sessions": 1, "resume_window_s": 30.0})
    url = f"ws://127.0.0.1:{gw.port}/v1/voice"
    created = await dropped(url)
    sid, token = created["session_id"], created["resume_token"]
    await refused_503(url)
    await refused_503(f"{url}?resume=sess_unknown")
    async with connect(f"{url}?resume={sid}") as quiet:
        await recv_event(quiet, "session.created")
        # one socket on its way to resume a session: a newer one (the client's retry after
        # this one went quiet) takes its place
        async with connect(f"{url}?resume={sid}") as ws:
            assert (await recv_event(quiet))["error"]["code"] == "server_full"
            with pytest.raises(ConnectionClosed):
                await quiet.recv()
            assert quiet.close_code == 1013
            await recv_event(ws, "session.created")  # its own, discarded by the resume
            await send(ws, type="session.resume", session_id=sid, resume_token=token)
            assert (await recv_event(ws))["type"] == "session.resumed"
            assert list(gw.runners) == [sid] and not gw.past_limit
            await send(ws, type="say", text="Back again.")
            turn = await read_turn(ws)
            assert turn.done["status"] == "completed"
            await refused_503(url)  # still full: the resumed session is the one
            # and it can be taken over again from a socket that names it
            async with connect(f"{url}?resume={sid}") as again:
                await recv_event(again, "session.created")
                await send(again, type="session.resume", session_id=sid, resume_token=token,
                           last_seq=turn.frames[-1].seq)
                assert (await recv_event(again))["type"] == "session.resumed"
                with pytest.raises(ConnectionClosed):
                    await ws.recv()
                assert ws.close_code == 4000
    assert gw.metrics.errors["server_full"] == 4  # three 503s and the quiet socket


async def raw_resume_handshake(gw, sid: str, version: int = 13):
    """A reconnect naming session ``sid`` (``?resume=``) on a raw socket, so a test can
    send what no websockets client would: (reader, writer) after the upgrade request."""
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(f"GET /v1/voice?resume={sid} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                 "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                 f"Sec-WebSocket-Version: {version}\r\n\r\n".encode())
    return reader, writer


async def test_a_resume_handshake_that_failed_does_not_block_the_next(start_gateway):
    """The gateway let a socket naming the session past the limit, then websockets refused
    its handshake (here a wrong Sec-WebSocket-Version): its place stayed taken, and the
    phone's proper resume got 503 "another socket is resuming" until a full GC (I/O review)."""

    gw = await start_gateway(server={"max_sessions": 1, "resume_window_s": 30.0})
    url = f"ws://127.0.0.1:{gw.port}/v1/voice"
    created = await dropped(url)
    sid, token = created["session_id"], created["resume_token"]
    reader, writer = await raw_resume_handshake(gw, sid, version=7)
    answer = await reader.read()  # to the end: the server has closed it
    writer.close()
    assert answer.startswith(b"HTTP/1.1 400 ")
    async with connect(f"{url}?resume={sid}") as ws:
        await recv_event(ws, "session.created")
        await send(ws, type="session.resume", session_id=sid, resume_token=token)
        assert (await recv_event(ws))["type"] == "session.resumed"
        assert list(gw.past_limit) == []


@pytest.mark.parametrize("first", ["transcript", "wrong token", "silence"])
async def test_a_socket_let_in_past_the_limit_may_only_resume(start_gateway, first,
                                                              monkeypatch):
    from gateway.io import connection

    monkeypatch.setattr(connection, "RESUME_PAST_LIMIT_S", 0.2)
    gw = await start_gateway(server={"max_sessions": 1, "resume_window_s": 30.0})
    url = f"ws://127.0.0.1:{gw.port}/v1/voice"
    created = await dropped(url)
    async with connect(f"{url}?resume={created['session_id']}") as ws:
        await recv_event(ws, "session.created")
        if first == "transcript":
            await send(ws, type="transcript", text="Hello?", event_id="t1")
        elif first == "wrong token":
            await send(ws, type="session.resume", session_id=created["session_id"],
                       resume_token="nope", event_id="r1")
            failed = (await recv_event(ws))["error"]
            assert failed["code"] == "resume_failed" and failed["event_id"] == "r1"
            assert failed["message"].endswith("the gateway is full, so this socket closes")
        error = await recv_event(ws)
        assert error["error"]["code"] == "server_full"
        assert created["session_id"] in error["error"]["message"]
        # it names the message that had the socket refused, if one did (protocol.md, Errors)
        assert error["error"].get("event_id") == {"transcript": "t1", "wrong token": "r1",
                                                  "silence": None}[first]
        with pytest.raises(ConnectionClosed):
            await ws.recv()
        assert (ws.close_code, ws.close_reason) == (1013, "server full")
    # the refused socket's own session is gone at once; the held one still waits
    assert list(gw.runners) == [created["session_id"]] and not gw.past_limit
    assert gw.metrics.errors["server_full"] == 1


async def test_a_socket_let_in_past_the_limit_that_drops_leaves_no_session(start_gateway):
    """A reconnect let in past a full gateway only to resume (``?resume=``) whose socket
    dropped before it resumed kept its own fresh session for the resume window (30 s),
    over ``max_sessions``: one more held session per such drop (a phone retrying on a
    flaky network), sessions nobody would ever resume."""
    from tests.test_ws_limits import no_connections

    gw = await start_gateway(server={"max_sessions": 1, "resume_window_s": 30.0})
    url = f"ws://127.0.0.1:{gw.port}/v1/voice"
    created = await dropped(url)
    sid, token = created["session_id"], created["resume_token"]
    for _ in range(3):
        ws = await connect(f"{url}?resume={sid}")
        await recv_event(ws, "session.created")
        ws.transport.abort()
        await ws.wait_closed()
        await no_connections(gw)
        assert list(gw.runners) == [sid] and not gw.past_limit
    # the phone's next attempt resumes, and the session it gets back waits for it again
    async with connect(f"{url}?resume={sid}") as ws:
        await recv_event(ws, "session.created")
        await send(ws, type="session.resume", session_id=sid, resume_token=token)
        assert (await recv_event(ws))["type"] == "session.resumed"
        ws.transport.abort()
        await ws.wait_closed()
        await no_connections(gw)
    assert list(gw.runners) == [sid] and gw.runners[sid].session.held


async def test_a_socket_refused_past_the_limit_cannot_resume_on_its_way_out(start_gateway):
    """A phone's first reconnect went quiet and its retry took its place (the first is
    refused: server_full, close 1013); the first one's session.resume, held up in the
    network, arrives while that socket closes. It was acted on: the stale socket took the
    session from the retry that had resumed it (4000, "resumed elsewhere", which a client
    reads as another device taking over), then dropped it again as it closed."""
    from websockets.frames import Close, Frame, Opcode

    gw = await start_gateway(server={"max_sessions": 1, "resume_window_s": 30.0})
    url = f"ws://127.0.0.1:{gw.port}/v1/voice"
    created = await dropped(url)
    sid, token = created["session_id"], created["resume_token"]
    # the first attempt: a raw socket, so it can still send after the server's close frame
    reader, writer = await raw_resume_handshake(gw, sid)
    seen = await reader.readuntil(b"session.created")
    assert seen.startswith(b"HTTP/1.1 101 ")
    async with connect(f"{url}?resume={sid}") as retry:  # the retry: the first is refused
        await recv_event(retry, "session.created")
        await send(retry, type="session.resume", session_id=sid, resume_token=token)
        assert (await recv_event(retry))["type"] == "session.resumed"
        refused = await reader.readuntil(b"server full")  # its error, then its close frame
        assert b'"server_full"' in refused
        # the first attempt's resume arrives late, then its close reply
        late = json.dumps({"type": "session.resume", "session_id": sid,
                           "resume_token": token}).encode()
        writer.write(Frame(Opcode.TEXT, late).serialize(mask=True, extensions=[])
                     + Frame(Opcode.CLOSE, Close(1013, "").serialize()).serialize(
                         mask=True, extensions=[]))
        rest = await reader.read()  # to the end: the server has handled both and closed
        writer.close()
        assert b"session.resumed" not in rest
        await send(retry, type="ping", id="still mine")  # the retry keeps the session
        assert await recv_event(retry) == {"type": "pong", "id": "still mine"}
        assert not gw.runners[sid].session.held and gw.metrics.sessions_resumed == 1


async def test_a_browser_origin_outside_the_allowlist_is_refused(start_gateway):
    gw = await start_gateway(server={"origins": ("https://console.example",)})
    url = f"ws://127.0.0.1:{gw.port}/v1/voice"
    with pytest.raises(InvalidStatus) as refused:
        async with connect(url, origin="https://elsewhere.example"):
            pass
    assert refused.value.response.status_code == 403
    assert json.loads(refused.value.response.body) == {"error": {  # JSON, like 401 and 503
        "code": "forbidden_origin", "message": "Origin 'https://elsewhere.example' is not "
        "allowed (--origin, [server] origins)", "type": "invalid_request_error", "param": None}}
    async with connect(url, origin="https://console.example") as ws:
        await created(ws)
    async with connect(url) as ws:  # no Origin header: not a browser, allowed
        await created(ws)
    # the gateway's own console (its page is served by this port) was refused unless the
    # operator listed the gateway's own address too; a page on another port still is
    async with connect(url, origin=f"http://127.0.0.1:{gw.port}") as ws:
        await created(ws)
    with pytest.raises(InvalidStatus) as refused:
        async with connect(url, origin=f"http://127.0.0.1:{gw.port + 1}"):
            pass
    assert refused.value.response.status_code == 403


# (a name that only begins with localhost is anyone's: app.localhost is bound, see test_cli)
@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.1", "localhost.example", "",
                                  "hub.example"])
async def test_no_bind_beyond_loopback_without_a_token(host):
    # ("": every interface, as 0.0.0.0; a name may resolve to any address)
    gw = Gateway(load_config(server={"host": host, "port": 0}, tts={"engine": "espeak"}))
    try:
        with pytest.raises(ValueError, match="without a token"):
            await gw.start()
        assert gw._server is None and not gw.ready  # nothing was bound
    finally:
        await gw.aclose()


@pytest.mark.parametrize(("host", "server"), [
    ("localhost", {}),
    ("0.0.0.0", {"tokens": ("s3cret",)}),
    ("0.0.0.0", {"insecure_bind": True}),
], ids=["localhost", "token", "insecure-bind"])
async def test_the_loopback_a_token_or_insecure_bind_allows_it(host, server):
    gw = Gateway(load_config(server={"host": host, "port": 0, **server},
                             tts={"engine": "espeak"}))
    try:
        await gw.start()
        assert gw.ready and gw.port > 0
    finally:
        await gw.aclose()


async def test_a_voice_port_in_use_leaves_nothing_running():
    """The voice port is bound last, once the engines have loaded. Taken, it failed the
    start but left the HTTP API serving (its /health said "starting" for ever), the lane's
    task running and the engine loaded on its thread: only the process's exit freed them.
    (Taken before the start, the start fails before the engines load: here it is taken
    while they load.)"""
    from tests.test_faults import SlowLoadingEngine

    engine = SlowLoadingEngine()
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    gw = Gateway(load_config(server={"port": port, "http_port": 0}, llm={"tokens_per_s": 0}),
                 engine=engine)
    starting = asyncio.create_task(gw.start())
    with socket.socket() as taken:
        try:
            await asyncio.to_thread(engine.loading.wait, 30)
            http_port = gw.http_port  # (serving while the engine loads)
            taken.bind(("127.0.0.1", port))
            taken.listen()
        finally:
            engine.release.set()
        with pytest.raises(OSError) as refused:
            await starting
    assert refused.value.errno == errno.EADDRINUSE
    assert all(task.done() for task in gw._lane_tasks)
    with pytest.raises(EngineError, match="closed"):
        engine.open(SynthesisRequest(text="Hello."))
    async with httpx.AsyncClient(timeout=5) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(f"http://127.0.0.1:{http_port}/health")


async def refused_403(url: str, origin: str, code: str = "forbidden_origin",
                      **kwargs) -> None:
    with pytest.raises(InvalidStatus) as refused:
        async with connect(url, origin=origin, **kwargs):
            pass
    assert refused.value.response.status_code == 403
    assert json.loads(refused.value.response.body)["error"]["code"] == code


async def test_without_tokens_a_page_of_another_site_cannot_open_a_session(start_gateway):
    # No token: the hub owner's browser, on any page of any site, could open a session on
    # the loopback gateway (WebSockets are not bound by CORS) and use its LLM and voice.
    # Only the gateway's own console, and clients that send no Origin, are let in.
    gw = await start_gateway()
    url = f"ws://127.0.0.1:{gw.port}/v1/voice"
    await refused_403(url, "https://evil.example")
    await refused_403(url, f"http://127.0.0.1:{gw.port + 1}")  # another port, another site
    for origin in (None, f"http://127.0.0.1:{gw.port}"):
        async with connect(url, origin=origin) as ws:
            await created(ws)
    async with connect(f"ws://localhost:{gw.port}/v1/voice", host="127.0.0.1",
                       origin=f"http://localhost:{gw.port}") as ws:
        await created(ws)
    # "*" lets any page in, as before
    gw = await start_gateway(server={"origins": ("*",)})
    async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice", origin="https://a.example") as ws:
        await created(ws)


@pytest.mark.parametrize("origins", [None, ("https://console.example",)])
async def test_dns_rebinding_does_not_pass_for_the_gateways_own_console(start_gateway,
                                                                          origins):
    # A page of rebind.example whose name the attacker then points at 127.0.0.1 sends
    # Origin http://rebind.example:PORT and Host rebind.example:PORT: equal, as the
    # gateway's own console's are. Without tokens, only a Host that no DNS answer can
    # steer (an IP address, localhost) or the operator named makes an Origin the gateway's
    # own; any other Host is refused before the Origin is looked at (test_host_check.py).
    gw = await start_gateway(server={"origins": origins})
    name = f"rebind.example:{gw.port}"
    await refused_403(f"ws://{name}/v1/voice", f"http://{name}", "forbidden_host",
                      host="127.0.0.1")
    # a name the operator allowed is the console's own: its page is let in
    gw = await start_gateway(server={"origins": origins, "allowed_hosts": ("hub.local",)})
    name = f"hub.local:{gw.port}"
    async with connect(f"ws://{name}/v1/voice", host="127.0.0.1",
                       origin=f"http://{name}") as ws:
        await created(ws)
    await refused_403(f"ws://{name}/v1/voice", f"http://other.local:{gw.port}",
                      host="127.0.0.1")


async def test_with_tokens_the_gateways_own_console_is_let_in_by_any_name(start_gateway):
    # (the token is what a page of another site cannot present)
    gw = await start_gateway(server={"tokens": ("s3cret",),
                                     "origins": ("https://console.example",)})
    name = f"hub.local:{gw.port}"
    async with connect(f"ws://{name}/v1/voice?token=s3cret", host="127.0.0.1",
                       origin=f"http://{name}") as ws:
        await created(ws)


async def test_a_refused_resume_handshake_whose_client_stays_does_not_block_the_next(
        start_gateway):
    """A socket let past a full gateway to resume whose handshake websockets then refused
    (400: here a wrong Sec-WebSocket-Version) is answered and half-closed, and the server
    waits for its client to close (websockets' close timeout, 10 s). A client that read the
    400 and kept its socket open held the session: the phone's proper resume got 503
    "another socket is resuming ... right now" for those 10 s, though the refused socket
    could never resume anything."""
    gw = await start_gateway(server={"max_sessions": 1, "resume_window_s": 30.0})
    url = f"ws://127.0.0.1:{gw.port}/v1/voice"
    created = await dropped(url)
    sid, token = created["session_id"], created["resume_token"]
    reader, writer = await raw_resume_handshake(gw, sid, version=7)
    try:
        answer = await reader.read()  # to the end (the server's half-close); it stays open
        assert answer.startswith(b"HTTP/1.1 400 ")
        async with connect(f"{url}?resume={sid}") as ws:
            await recv_event(ws, "session.created")
            await send(ws, type="session.resume", session_id=sid, resume_token=token)
            assert (await recv_event(ws))["type"] == "session.resumed"
            assert list(gw.runners) == [sid] and list(gw.past_limit) == []
    finally:
        writer.close()
    assert gw.metrics.sessions_resumed == 1 and "server_full" not in gw.metrics.errors
