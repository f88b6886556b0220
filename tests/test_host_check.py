"""DNS rebinding: without tokens, both ports answer only requests whose ``Host`` no DNS
answer can steer (an IP address, ``localhost``) or that the operator named
(``[server] allowed_hosts``, the names of ``[server] origins``).

A page of rebind.example whose name the attacker then points at 127.0.0.1 is same-origin
with the gateway: its GETs carry no Origin header, so the Origin check let it read
``/health``, ``/metrics`` and ``/v1/models``; only its Host header (its own name) tells."""

from __future__ import annotations

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from engines.synthetic import SyntheticEngine
from gateway.config import load_config
from gateway.io.auth import host_allowed, own_origin, refused_host
from gateway.io.server import Gateway
from tests.hang_guard import HANG_S
from tests.wsclient import recv_event

READS = ("/health", "/metrics", "/v1/models")


@pytest.fixture
async def start():
    started: list[Gateway] = []

    async def start(**server) -> Gateway:
        gw = Gateway(load_config(server={"port": 0, **server}, llm={"tokens_per_s": 0}),
                     engine=SyntheticEngine(rtf=0, ttfa_ms=0, lane="cpu"))
        started.append(gw)
        await gw.start()
        return gw

    yield start
    for gw in reversed(started):
        await gw.aclose()


def assert_forbidden_host(response: httpx.Response, name: str) -> None:
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert error["code"] == "forbidden_host"
    assert f"'{name}'" in error["message"] and "allowed_hosts" in error["message"]
    # the flag to type: the bare name, without the port
    assert f"(--allowed-host {name.split(':')[0].lower()})" in error["message"]
    assert "access-control-allow-origin" not in response.headers


async def test_without_tokens_a_rebound_name_reads_nothing_on_either_port(start):
    gw = await start()
    async with httpx.AsyncClient(timeout=HANG_S) as http:
        for port in (gw.port, gw.http_port):
            for path in (*READS, "/", "/v1/audio/voices"):
                if path in ("/",) and port == gw.http_port or \
                        path == "/v1/audio/voices" and port == gw.port:
                    continue
                url = f"http://127.0.0.1:{port}{path}"
                assert_forbidden_host(await http.get(url, headers={
                    "Host": f"rebind.example:{port}"}), f"rebind.example:{port}")
                for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}",
                             "LocalHost", "10.1.2.3:99"):
                    answer = await http.get(url, headers={"Host": host})
                    assert answer.status_code == 200, (host, path, answer.text)
        speech = await http.post(f"http://127.0.0.1:{gw.http_port}/v1/audio/speech",
                                 json={"input": "Hi.", "response_format": "pcm"},
                                 headers={"Host": "rebind.example"})
        assert_forbidden_host(speech, "rebind.example")
    assert gw.metrics.errors["forbidden_host"] == 9
    # the WebSocket upgrade too, whatever Origin comes with it
    for origin in (None, f"http://rebind.example:{gw.port}"):
        with pytest.raises(InvalidStatus) as refused:
            async with connect(f"ws://rebind.example:{gw.port}/v1/voice", host="127.0.0.1",
                               origin=origin):
                pass
        assert refused.value.response.status_code == 403
        assert b"forbidden_host" in refused.value.response.body


async def test_names_the_operator_allows_are_answered(start):
    gw = await start(allowed_hosts=("hub.local",), origins=("https://hub.example.ts.net",))
    async with httpx.AsyncClient(timeout=HANG_S) as http:
        for port in (gw.port, gw.http_port):
            for host in ("hub.local", f"HUB.local:{port}", "hub.local.",
                         "hub.example.ts.net"):
                answer = await http.get(f"http://127.0.0.1:{port}/v1/models",
                                        headers={"Host": host})
                assert answer.status_code == 200, (host, answer.text)
            assert_forbidden_host(await http.get(
                f"http://127.0.0.1:{port}/v1/models", headers={"Host": "sub.hub.local"}),
                "sub.hub.local")
    async with connect(f"ws://hub.local:{gw.port}/v1/voice", host="127.0.0.1") as ws:
        assert (await recv_event(ws))["type"] == "session.created"


async def test_a_name_under_localhost_is_answered_like_localhost(start):
    """RFC 6761: a name under localhost means the loopback, and browsers resolve it so
    without asking DNS (a page at http://hub.localhost is a secure context, as one at
    localhost): no DNS answer steers it, and it was refused 403 on both ports."""
    gw = await start()
    async with httpx.AsyncClient(timeout=HANG_S) as http:
        for port in (gw.port, gw.http_port):
            answer = await http.get(f"http://127.0.0.1:{port}/v1/models",
                                    headers={"Host": f"hub.localhost:{port}"})
            assert answer.status_code == 200, answer.text
    # its console's socket carries its own Origin, let in as localhost's is; another
    # name's Origin is not its own, as http://localhost is not 127.0.0.1's
    own = f"http://hub.localhost:{gw.port}"
    async with connect(f"ws://hub.localhost:{gw.port}/v1/voice", host="127.0.0.1",
                       origin=own) as ws:
        assert (await recv_event(ws))["type"] == "session.created"
    for host, origin in ((f"hub.localhost:{gw.port}", f"http://other.localhost:{gw.port}"),
                         (f"localhost:{gw.port}", own)):
        with pytest.raises(InvalidStatus) as refused:
            async with connect(f"ws://{host}/v1/voice", host="127.0.0.1", origin=origin):
                pass
        assert b"forbidden_origin" in refused.value.response.body
    assert gw.metrics.errors["forbidden_host"] == 0


@pytest.mark.parametrize("server", [{"tokens": ("s3cret",)}, {"allowed_hosts": ("*",)},
                                    {"origins": ("*",)}])
async def test_tokens_or_a_star_let_any_name_in(start, server):
    gw = await start(**server)
    async with httpx.AsyncClient(timeout=HANG_S) as http:
        for port in (gw.port, gw.http_port):
            answer = await http.get(f"http://127.0.0.1:{port}/health",
                                    headers={"Host": "hub.anything.example"})
            assert answer.status_code == 200


async def test_a_host_with_user_info_is_refused_400_with_tokens_too(start):
    """Tokens let any name in (the check against DNS rebinding is off), not a ``Host`` that
    is no ``host[:port]`` (RFC 9112 3.2: 400 whatever the server's auth)."""
    gw = await start(tokens=("s3cret",))
    async with httpx.AsyncClient(timeout=HANG_S) as http:
        for port in (gw.port, gw.http_port):
            answer = await http.get(f"http://127.0.0.1:{port}/health",
                                    headers={"Host": "evil@127.0.0.1"})
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"]["code"] == "invalid_http"


@pytest.mark.parametrize(("host", "ok"), [
    ("127.0.0.1", True), ("127.0.0.1:8780", True), ("[::1]:8780", True), ("[::1]", True),
    ("localhost", True), ("localhost:1", True), ("LOCALHOST.", True), ("", True),
    ("192.168.1.20:8780", True), ("hub.local", False), ("localhost.evil.example", False),
    ("evil.localhost", True), ("Hub.LocalHost.:8780", True), ("evil-localhost", False),
    ("127.0.0.1.evil.example", False), ("[::1", False),
    ("127.0.0.1:99999", False), ("a b", False), ("hub.local:8780", False),
    ("evil@127.0.0.1", False), ("127.0.0.1@rebind.example", False)])
def test_host_allowed(host, ok):
    assert host_allowed(host, ()) is ok
    assert host_allowed(host, None)  # any


def test_host_allowed_names():
    assert host_allowed("Hub.Local:8780", ("hub.local",))
    assert not host_allowed("hub.local.evil.example", ("hub.local",))


def test_the_allowlist_holds_the_allowed_names_and_origins_names():
    from gateway.io.auth import host_allowlist

    names = host_allowlist((), ("Hub.Local.",), ("https://hub.example.ts.net", "null"),
                           tls=False)
    assert names == ("hub.local", "hub.example.ts.net")
    assert host_allowlist((), (), None, tls=False) == ()
    # any name: tokens (a page cannot present one), TLS (a name pointed at the hub fails
    # its certificate in the browser), or a '*'
    assert host_allowlist(("s3cret",), (), None, tls=False) is None
    assert host_allowlist((), (), None, tls=True) is None
    assert host_allowlist((), ("*",), None, tls=False) is None
    assert host_allowlist((), (), ("*",), tls=False) is None


@pytest.mark.parametrize("name", ["http://hub.local", "hub.local:8780", "", "a b", "-x"])
def test_allowed_hosts_are_names(name):
    with pytest.raises(ValueError, match="allowed_hosts"):
        load_config(server={"allowed_hosts": (name,)})


def test_more_than_one_host_is_refused_and_none_is_not_a_browser():
    """Two ``Host`` values: which would be meant? (a proxy may route by the other one).
    None at all (HTTP/1.0): not a browser, answered as before."""
    for hosts in (["127.0.0.1", "rebind.example"], ["127.0.0.1", "127.0.0.1"]):
        assert refused_host(hosts, ()) is not None
    assert refused_host([], ()) is None
    assert refused_host(["127.0.0.1", "rebind.example"], None) is None  # any


def test_the_own_origin_is_only_that_of_a_name_no_dns_answer_steers():
    """A rebound page sends its own name as both Host and Origin: ``own_origin`` must not
    make it the gateway's own (the voice port relies on it, not only on the Host check)."""
    assert own_origin("http", "rebind.example:8780", ()) is None
    assert own_origin("http", "rebind.example:8780", ("hub.local",)) is None
    assert own_origin("http", "hub.local:8780", ("hub.local",)) == "http://hub.local:8780"
    assert own_origin("https", "127.0.0.1:8780", ()) == "https://127.0.0.1:8780"
    assert own_origin("http", "rebind.example", None) == "http://rebind.example"  # any
    assert own_origin("http", "", None) is None
