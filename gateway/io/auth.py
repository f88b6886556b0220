"""Who may open a voice session: bearer tokens checked before the WebSocket upgrade.

A token is accepted from ``Authorization: Bearer <token>``, from a ``?token=`` query
parameter, or from a ``bearer.<token>`` entry of ``Sec-WebSocket-Protocol`` (browsers can
set neither headers nor, safely, URLs that end up in logs). Comparison is constant-time.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable, Sequence
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import ServerConnection
from websockets.http11 import Request
from websockets.typing import Subprotocol

SUBPROTOCOL = Subprotocol("voice.v1")
_TOKEN_PREFIX = "bearer."


def presented_tokens(request: Request) -> list[str]:
    out = []
    auth = request.headers.get("Authorization", "")
    if auth[:7].lower() == "bearer ":
        out.append(auth[7:].strip())
    query = parse_qs(urlsplit(request.path).query)
    out += query.get("token", [])
    for header in request.headers.get_all("Sec-WebSocket-Protocol"):
        for entry in header.split(","):
            entry = entry.strip()
            if entry.startswith(_TOKEN_PREFIX):
                out.append(entry[len(_TOKEN_PREFIX):])
    return out


def check_token(request: Request, tokens: Iterable[str]) -> bool:
    """True when any presented token equals a configured one (constant-time compares;
    every configured token is compared, so timing does not reveal which matched)."""
    presented = presented_tokens(request)
    ok = False
    for candidate in presented:
        for token in tokens:
            ok |= hmac.compare_digest(candidate.encode(), token.encode())
    return ok


def select_subprotocol(connection: ServerConnection,
                       subprotocols: Sequence[Subprotocol]) -> Subprotocol | None:
    """Answer browsers that offered subprotocols (a token entry, ``voice.v1``): Chrome
    fails the handshake when it offered some and the server picks none."""
    if not subprotocols:
        return None
    if SUBPROTOCOL in subprotocols:
        return SUBPROTOCOL
    plain = [p for p in subprotocols if not p.startswith(_TOKEN_PREFIX)]
    return plain[0] if plain else subprotocols[0]


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
