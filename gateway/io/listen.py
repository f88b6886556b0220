"""Listening sockets for ``--host``, on the addresses the voice port listens on.

The voice port's server (websockets' ``serve``: the loop's ``create_server``) listens on
every address ``--host`` resolves to: ``::1`` and ``127.0.0.1`` for ``localhost`` where the
system maps it to both (macOS does), and every interface of each family for ``""``. The
HTTP API (uvicorn, ``serve(sockets=...)``) is handed sockets bound here the same way, so a
client that reaches one port at an address reaches the other there too. Port 0 is one free
port on every address, on either port (``bind_all``, ``free_port``). With TLS, a client that
speaks plain HTTP to either port is noted (``note_plain_http``).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
from collections.abc import Callable
from typing import Any

log = logging.getLogger("gateway")

Address = tuple[socket.AddressFamily, Any]
"""A family and the address to bind in it (``bind``'s tuple for that family)."""


def listen_addresses(host: str, port: int) -> list[Address]:
    """Where the loop's ``create_server`` listens for ``host`` and ``port``: each address
    the resolver gives (``""``: every interface of each family), in its order, once each.
    Raises ``socket.gaierror`` (an ``OSError``) for a name it does not know."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                               flags=socket.AI_PASSIVE)
    return list(dict.fromkeys((family, sockaddr) for family, _, _, _, sockaddr in infos))


def bind_all(addresses: list[Address], what: str) -> list[socket.socket]:
    """A socket bound to each address, not yet listening (the server listens). Port 0: the
    first picks a free port and the others take that one, so the one port shown works on
    each (the loop's ``create_server`` picks one per socket). An address this host does
    not have (``EADDRNOTAVAIL``: ``localhost``'s ``::1`` where IPv6 is turned off, the
    name still mapped to it in ``/etc/hosts``) is left out with a WARNING naming it when
    another address binds: a gateway on ``localhost`` failed to start there. Raises
    ``OSError`` naming the address and ``what`` (which port and flag), with nothing left
    open: a port taken, or no address bound."""
    sockets: list[socket.socket] = []
    missing: list[OSError] = []
    try:
        for family, sockaddr in addresses:
            if sockets and sockaddr[1] == 0:
                sockaddr = (sockaddr[0], sockets[0].getsockname()[1], *sockaddr[2:])
            try:
                sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
            except OSError:
                # a family this system has no sockets for (IPv6 off in a container, with
                # "" resolving to "::" too): skipped, as the loop's create_server skips it
                continue
            try:
                sockets.append(_bound(sock, family, sockaddr, what))
            except OSError as exc:
                if exc.errno != errno.EADDRNOTAVAIL:
                    raise
                missing.append(exc)
        if missing and not sockets:
            raise missing[0]
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    if not sockets:
        raise OSError(f"cannot listen ({what}): no socket can be made for any address "
                      f"of {addresses}")
    for absent in missing:
        log.warning("%s; left out: this host does not have that address (listening on %s)",
                    absent.strerror, ", ".join(_shown(*s.getsockname()[:2]) for s in sockets))
    return sockets


async def listening_sockets(host: str, port: int, what: str) -> list[socket.socket]:
    """``bind_all`` of ``host``'s addresses (``resolved``)."""
    return bind_all(await resolved(host, port, what), what)


async def resolved(host: str, port: int, what: str) -> list[Address]:
    """``listen_addresses``, off the loop (a name may be looked up in DNS). Raises
    ``OSError`` naming ``host`` when it resolves to nothing."""
    try:
        return await asyncio.to_thread(listen_addresses, host, port)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot listen on {host}:{port} ({what}): "
                                 f"{exc.strerror}") from None


async def free_port(host: str, port: int, what: str) -> tuple[str | list[str], int]:
    """Where a server that binds its addresses itself (the voice port: websockets'
    ``serve``, the loop's ``create_server``) is to listen, found before it does: ``host``,
    or the list of its addresses that bound when ``bind_all`` left one out (the loop's
    ``create_server`` takes a list, and would fail on the one left out); and ``port``,
    checked free on every address (taken: ``OSError`` naming ``what`` now, not once the
    engines have loaded); for 0, one port free on all of them, as ``create_server`` picks
    one per socket (``--host ""`` listened on one port for IPv4 and another for IPv6, and
    the port shown worked on IPv4 only), or 0 where there is one address (the server's own
    pick is then that one port). The sockets that found it are closed (bound, never
    listening: nothing holds the port after them)."""
    addresses = await resolved(host, port, what)
    sockets = bind_all(addresses, what)
    found = port or (int(sockets[0].getsockname()[1]) if len(sockets) > 1 else 0)
    bound = [str(sock.getsockname()[0]) for sock in sockets]
    for sock in sockets:
        sock.close()
    return (host if len(bound) == len(addresses) else bound), found


def note_plain_http(context: ssl.SSLContext, noted: Callable[[], None]) -> None:
    """Call ``noted`` for each connection to a port serving ``context`` whose client sends
    a plain HTTP request instead of a TLS handshake (``ws://`` or ``http://`` dialled to a
    TLS port: the ``ssl.SSLError`` with reason ``HTTP_REQUEST``); the connection then closes
    as before, with no answer. The loop's TLS (asyncio's and uvloop's alike) makes each
    connection's ``SSLObject`` with ``context.wrap_bio``, which makes ``sslobject_class``;
    it handles the error below anything the gateway sees, so that client was told only "did
    not receive a valid HTTP response" (curl: "Empty reply from server") and the gateway
    logged nothing. ``noted`` learns no peer: the ``SSLObject`` knows none."""

    class PlainHttpNoted(ssl.SSLObject):
        def do_handshake(self) -> None:
            try:
                super().do_handshake()
            except ssl.SSLError as exc:
                if exc.reason == "HTTP_REQUEST":
                    noted()
                raise

    context.sslobject_class = PlainHttpNoted


def _bound(sock: socket.socket, family: socket.AddressFamily, sockaddr: Any,
           what: str) -> socket.socket:
    """``sock`` (made with IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that
    say they are TCP, uvloop on every one; without it a streamed body's small chunks, a
    compressed format's few hundred bytes, wait for the client's delayed ACK, 40 ms on
    Linux) bound to ``sockaddr``, or closed and an ``OSError`` naming it."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6 and hasattr(socket, "IPV6_V6ONLY"):
            # as the loop's create_server does: IPv4 has a socket of its own when the host
            # has IPv4 addresses, and "::" is IPv6 only on both ports
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(sockaddr)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {_shown(*sockaddr[:2])} ({what}): "
                                 f"{exc.strerror}") from None
    return sock


def _shown(address: str, port: int) -> str:
    """``address:port``, an IPv6 address in brackets."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
