"""Where the HTTP API listens (``gateway.io.listen``): the addresses the voice port's server
listens on, bound as it binds them; port 0, one port on all of them, for either port. Real
sockets on the loopback; the one fake, labelled, is a resolver that maps ``localhost`` to
both families (as macOS does; a Linux whose ``/etc/hosts`` names it for 127.0.0.1 alone
cannot show that for real), or to an address this host does not have beside 127.0.0.1."""

from __future__ import annotations

import errno
import logging
import os
import socket

import httpx
import pytest

from gateway.io.listen import bind_all, listen_addresses
from tests.hang_guard import HANG_S

V6_LOOPBACK = (socket.AF_INET6, ("::1", 0, 0, 0))
V4_LOOPBACK = (socket.AF_INET, ("127.0.0.1", 0))


@pytest.fixture(autouse=True)
def ipv6_loopback():
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("this machine has no IPv6 loopback")


def test_a_name_of_both_families_gives_each_address_once_in_the_resolvers_order(monkeypatch):
    """``localhost`` on macOS resolves to ``::1`` first, then ``127.0.0.1``: the HTTP API
    bound an AF_INET socket to the name, so 127.0.0.1 only, and a client trying ``::1``
    first got "connection refused" there while the voice port answered it."""
    asked = []

    def fake_getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):  # FAKE resolver
        asked.append((host, port, type, flags))
        tcp = (socket.SOCK_STREAM, socket.IPPROTO_TCP, "")
        return [(socket.AF_INET6, *tcp, ("::1", port, 0, 0)),
                (socket.AF_INET, *tcp, ("127.0.0.1", port)),
                (socket.AF_INET, *tcp, ("127.0.0.1", port))]  # /etc/hosts naming it twice

    monkeypatch.setattr(socket, "getaddrinfo", fake_getaddrinfo)
    assert listen_addresses("localhost", 8781) == [
        (socket.AF_INET6, ("::1", 8781, 0, 0)), (socket.AF_INET, ("127.0.0.1", 8781))]
    listen_addresses("", 8781)  # every interface: asked as the loop's create_server asks
    assert asked == [("localhost", 8781, socket.SOCK_STREAM, socket.AI_PASSIVE),
                     (None, 8781, socket.SOCK_STREAM, socket.AI_PASSIVE)]


def test_port_0_is_one_free_port_on_every_address():
    """The port printed and read back (``Gateway.http_port``) must work on each address;
    the loop's ``create_server`` would pick one port per socket."""
    sockets = bind_all([V6_LOOPBACK, V4_LOOPBACK], "HTTP API, --http-port")
    try:
        v6, v4 = sockets
        assert v6.getsockname()[1] == v4.getsockname()[1] != 0
        for sock in sockets:
            assert sock.proto == socket.IPPROTO_TCP  # asyncio sets TCP_NODELAY on these only
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR)
        # as the voice port's: "::" takes IPv6 only, IPv4 has a socket of its own
        assert v6.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 1
    finally:
        for sock in sockets:
            sock.close()


def test_an_address_taken_names_itself_and_leaves_nothing_bound():
    with socket.socket(socket.AF_INET6) as taken:
        taken.bind(("::1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError) as refused:
            bind_all([(socket.AF_INET, ("127.0.0.1", port)),
                      (socket.AF_INET6, ("::1", port, 0, 0))], "HTTP API, --http-port")
    assert refused.value.errno == errno.EADDRINUSE
    assert str(refused.value).startswith(
        f"[Errno {errno.EADDRINUSE}] cannot listen on [::1]:{port} (HTTP API, --http-port): ")
    with socket.socket() as again:  # the IPv4 socket bound before it was closed
        again.bind(("127.0.0.1", port))


def test_a_family_the_system_has_no_sockets_for_is_left_out(monkeypatch):
    """A container with IPv6 turned off still resolves ``""`` to ``::`` too: the loop's
    ``create_server`` leaves out a family it cannot make a socket for, so the voice port
    listened on IPv4 while the HTTP API failed to start."""
    real = socket.socket

    def no_ipv6(family=socket.AF_INET, *args, **kwargs):  # FAKE: a system without IPv6
        if family == socket.AF_INET6:
            raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")
        return real(family, *args, **kwargs)

    monkeypatch.setattr(socket, "socket", no_ipv6)
    (v4,) = bind_all([V6_LOOPBACK, V4_LOOPBACK], "HTTP API, --http-port")
    with v4:
        assert v4.family == socket.AF_INET and v4.getsockname()[1] != 0
    with pytest.raises(OSError, match=r"cannot listen \(HTTP API, --http-port\): no socket"):
        bind_all([V6_LOOPBACK], "HTTP API, --http-port")


async def test_the_voice_port_0_is_one_port_on_every_address(start_gateway):
    """``--host "" --port 0``: the loop's ``create_server`` picked one free port for the
    IPv4 socket and another for the IPv6 one; the port shown (``Gateway.port``, the
    banner's) was refused on ``[::1]`` while the HTTP API answered there on its own."""
    gateway = await start_gateway(server={"host": "", "tokens": ["s3cret"]})
    async with httpx.AsyncClient(timeout=HANG_S) as client:
        for host in ("127.0.0.1", "[::1]"):
            answer = await client.get(f"http://{host}:{gateway.port}/health")
            assert answer.status_code == 200, host


NOT_HERE = (socket.AF_INET6, ("2001:db8::1", 0, 0, 0))
"""An address no host has (RFC 3849): ``::1`` where IPv6 is turned off is as absent."""


def test_an_address_this_host_does_not_have_is_left_out_with_a_warning(caplog):
    """With IPv6 turned off (``net.ipv6.conf.all.disable_ipv6``) and ``localhost`` still
    mapped to ``::1`` in ``/etc/hosts``, binding ``::1`` fails with ``EADDRNOTAVAIL``, and so
    did a gateway on ``localhost``. What binds is kept, and a WARNING names what was left
    out; with nothing bound, the error names the address."""
    with caplog.at_level(logging.WARNING, logger="gateway"):
        (v4,) = bind_all([NOT_HERE, V4_LOOPBACK], "HTTP API, --http-port")
    with v4:
        port = v4.getsockname()[1]
        assert v4.family == socket.AF_INET and port != 0
    (warning,) = caplog.records
    assert warning.getMessage() == (
        "cannot listen on [2001:db8::1]:0 (HTTP API, --http-port): "
        f"{os.strerror(errno.EADDRNOTAVAIL)}; left out: this host does not have that "
        f"address (listening on 127.0.0.1:{port})")
    with pytest.raises(OSError) as refused:
        bind_all([NOT_HERE], "HTTP API, --http-port")
    assert refused.value.errno == errno.EADDRNOTAVAIL
    assert "cannot listen on [2001:db8::1]:0 (HTTP API, --http-port)" in str(refused.value)


async def test_a_gateway_on_localhost_starts_where_it_can_bind(start_gateway, monkeypatch,
                                                               caplog):
    """``--host localhost`` on a host with IPv6 turned off (``localhost`` mapped to ``::1``
    too) stopped at start with ``[Errno 99] ... Cannot assign requested address``. Both
    ports now listen on the loopback that exists, each saying what it left out."""
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):  # FAKE resolver: localhost is ::1 too
        if host != "localhost":
            return real(host, port, *args, **kwargs)
        tcp = (socket.SOCK_STREAM, socket.IPPROTO_TCP, "")
        return [(NOT_HERE[0], *tcp, (NOT_HERE[1][0], port, 0, 0)),
                (socket.AF_INET, *tcp, ("127.0.0.1", port))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    with caplog.at_level(logging.WARNING, logger="gateway"):
        gateway = await start_gateway(server={"host": "localhost", "http_port": 0})
    async with httpx.AsyncClient(timeout=HANG_S) as client:
        for port in (gateway.port, gateway.http_port):
            answer = await client.get(f"http://127.0.0.1:{port}/health")
            assert answer.status_code == 200, port
    left_out = [r.getMessage() for r in caplog.records if "2001:db8::1" in r.getMessage()]
    assert len(left_out) == 2 and "(voice port, --port)" in left_out[0]
    assert "(HTTP API, --http-port)" in left_out[1]
