"""Who may use the gateway: bearer tokens (``config.server.tokens``), checked before the
WebSocket upgrade on the voice port and by ``AuthMiddleware`` on the HTTP API port.

A token is accepted from ``Authorization: Bearer <token>``, from a ``?token=`` query
parameter, or from a ``bearer.<token>`` entry of ``Sec-WebSocket-Protocol`` (browsers can
set neither headers nor, safely, URLs that end up in logs). Comparison is constant-time.
Tokens never reach the logs: ``RedactTokens`` masks ``token=`` query values in any record
(the websockets server logs request paths on handshake failures).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import re
from collections.abc import Iterable, Sequence
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import ServerConnection
from websockets.http11 import Request
from websockets.typing import Subprotocol

SUBPROTOCOL = Subprotocol("voice.v1")
_TOKEN_PREFIX = "bearer."
UNAUTHORIZED = ("a valid token is required (Authorization: Bearer, ?token=, or a "
                "'bearer.<token>' WebSocket subprotocol)")
"""The message of the HTTP 401 ``unauthorized`` a request without a valid token gets."""
SENDABLE_TOKEN = re.compile(r"[!-~]([ -~]*[!-~])?")
"""A token an ``Authorization: Bearer`` header carries as written: printable ASCII, inner
spaces, none at either end (headers arrive as ISO-8859-1 and stripped). The gateway's
``[server] tokens`` and the watch relay's ``--watch-token`` are held to it."""
UNSENDABLE_TOKEN = ("a token must be printable ASCII (letters, digits, punctuation, inner "
                    "spaces), without a space at either end: clients send it in an "
                    "Authorization header, which carries nothing else as written")
"""Why a token outside ``SENDABLE_TOKEN`` is refused at start."""
CHALLENGE = {"WWW-Authenticate": "Bearer"}
"""The challenge every 401 carries (RFC 9110), on either port."""
API_UNAUTHORIZED = ("a valid API key is required: send 'Authorization: Bearer <token>' with "
                    "one of the gateway's tokens")
"""The HTTP API port's (``invalid_api_key``), in OpenAI's words."""


def configured_tokens(given: Iterable[str] | None, env_var: str) -> tuple[str, ...]:
    """The tokens of a repeatable ``--token``-like flag, then those of ``env_var``
    (comma-separated; blank entries skipped). An environment variable, unlike a flag, is
    not shown to every user of the machine by ``ps``."""
    env = [t.strip() for t in os.environ.get(env_var, "").split(",") if t.strip()]
    return (*(given or ()), *env)


def refused_bind(host: str, tokens: Sequence[str], insecure_bind: bool,
                 how: str = "set tokens (--token)") -> str | None:
    """Why listening on ``host`` is refused, or None. Beyond the loopback without a token,
    anyone who reaches the port (the café's Wi-Fi, the LAN's other machines) uses the
    service as its owner: allowed only when asked for by name (``--insecure-bind``).
    ``how``: the way to give tokens, for the message."""
    if tokens or insecure_bind or is_loopback(host):
        return None
    return f"refusing to listen on {host or 'every interface'} without a token: {how} or " \
           "pass --insecure-bind"


def presented_tokens(request: Request) -> list[str]:
    # two Authorization headers present no token (which would be meant?): a 401, where
    # headers.get raised and the handshake answered 500
    authorization = request.headers.get_all("Authorization")
    return tokens_from(authorization[0] if len(authorization) == 1 else "", request.path,
                       request.headers.get_all("Sec-WebSocket-Protocol"))


def tokens_from(authorization: str, path: str, subprotocols: Iterable[str] = ()) -> list[str]:
    """The tokens a request presents: its ``Authorization`` header value, its path with
    query, its ``Sec-WebSocket-Protocol`` header values."""
    out = []
    if authorization[:7].lower() == "bearer ":
        out.append(authorization[7:].strip())
    query = parse_qs(urlsplit(path).query)
    out += query.get("token", [])
    for header in subprotocols:
        for entry in header.split(","):
            entry = entry.strip()
            if entry.startswith(_TOKEN_PREFIX):
                out.append(entry[len(_TOKEN_PREFIX):])
    return out


def check_token(request: Request, tokens: Iterable[str]) -> bool:
    """True when any presented token equals a configured one."""
    return token_ok(presented_tokens(request), tokens)


def token_ok(presented: Iterable[str], tokens: Iterable[str]) -> bool:
    """Constant-time compares; every configured token is compared, so timing does not
    reveal which matched."""
    ok = False
    for candidate in presented:
        for token in tokens:
            ok |= hmac.compare_digest(candidate.encode(), token.encode())
    return ok


def select_subprotocol(connection: ServerConnection,
                       subprotocols: Sequence[Subprotocol]) -> Subprotocol | None:
    """``voice.v1`` when the client offered it (browsers offer it next to their token
    entry: a browser fails the handshake when it offered subprotocols and the server picks
    none), else none. Never a ``bearer.`` entry: the answer header would carry the token
    back, where proxies log it; never another unknown name: the server does not speak it."""
    return SUBPROTOCOL if SUBPROTOCOL in subprotocols else None


ANY_ORIGIN = "*"
"""In ``[server] origins`` (``--origin '*'``): any browser Origin is let in."""


def origin_allowlist(tokens: Sequence[str],
                     origins: Sequence[str] | None) -> Sequence[str] | None:
    """The browser origins both ports let in besides their own (None: any). Unset, any when
    tokens are required (a page of another site cannot present one), else none: without a
    token, any page the owner's browser opens could otherwise use the gateway (a WebSocket
    is not bound by CORS, and a page's simple POST needs no preflight)."""
    if origins is None:
        return None if tokens else ()
    return None if ANY_ORIGIN in origins else origins


ANY_HOST = "*"
"""In ``[server] allowed_hosts`` (``--allowed-host '*'``): any ``Host`` is answered."""


def host_allowlist(tokens: Sequence[str], hosts: Sequence[str],
                   origins: Sequence[str] | None, *, tls: bool) -> tuple[str, ...] | None:
    """The ``Host`` names both ports answer besides IP addresses, ``localhost`` and names
    under it (None: any). Any when tokens are required (a page cannot present one), with
    TLS (a name pointed at the hub does not match its certificate: the browser stops
    there), or when ``*`` is among the allowed hosts or origins (the operator let every
    page in); else the names of ``[server] allowed_hosts`` and of ``[server] origins``:
    an origin the operator trusts names a machine of theirs, whose console and clients use
    that name."""
    if tokens or tls or ANY_HOST in hosts or (origins is not None and ANY_ORIGIN in origins):
        return None
    names = [host_name(h) for h in hosts]
    names += [host_name(urlsplit(o).netloc) for o in origins or ()]
    return tuple(dict.fromkeys(n for n in names if n))


HOST_VALUE = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9\-._~!$&'()*+,;=%]+)(:[0-9]*)?")
"""RFC 9110 7.2's ``Host = uri-host [ ":" port ]`` (RFC 3986: an IP literal in brackets, or a
name of unreserved, percent-encoded and sub-delimiter characters): no user info (``@``), no
path, no white space."""


def empty_lines_end(data: bytes | bytearray) -> int:
    """Where a request line may begin in ``data``: past the empty lines (CRLF, or a bare LF)
    before it, which RFC 9112 2.2 has a server ignore (a client may send one after a
    request's body). Both ports skip them (``VoiceSocket``, ``http_api._Requests``)."""
    start = 0
    while True:
        if data.startswith(b"\n", start):
            start += 1
        elif data.startswith(b"\r\n", start):
            start += 2
        else:
            return start


def invalid_host(hosts: Sequence[str]) -> str | None:
    """Why a request with these ``Host`` values is not a valid HTTP request (RFC 9112 3.2: a
    server answers it 400, whatever its tokens), or None: more than one, an empty one (a
    client sends that only for a target without an authority, and every target here is an
    ``http``/``ws`` URI, which has one), or one that is not ``host[:port]`` (user info, as
    ``evil@127.0.0.1``, whose name ``host_name`` took for the IP address after it; a port
    past 65535). None for no ``Host`` at all: HTTP/1.0 needs none (the caller refuses an
    HTTP/1.1 request without one)."""
    if len(hosts) > 1:
        return f"more than one Host ({len(hosts)}): which would be meant?"
    if not hosts:
        return None
    host = hosts[0]
    if not host:
        return "an empty Host (every target here has a host: send the one dialled)"
    if "@" in host:
        return f"Host {host[:200]!r} holds user info (RFC 9110 4.2.4): send host[:port] only"
    if not HOST_VALUE.fullmatch(host) or host_name(host) is None:
        return f"Host {host[:200]!r} is not a host[:port]"
    return None


def host_name(host: str) -> str | None:
    """The name in a ``Host`` value (``name[:port]``, ``[v6]:port``), in lower case without
    a final dot; None when malformed (user info included: ``invalid_host``)."""
    if "@" in host:
        return None
    try:
        parts = urlsplit(f"//{host}")
        name = parts.hostname or ""
        parts.port  # noqa: B018 (a malformed port raises)
    except ValueError:
        return None
    return name.removesuffix(".") or None


def host_allowed(host: str, names: Iterable[str] | None) -> bool:
    """Whether a request with this ``Host`` is answered (``names``: ``host_allowlist``). A
    page of an attacker's site whose name is pointed at this machine once it has loaded
    (DNS rebinding) is same-origin with the gateway: its GETs carry no Origin, and only
    its ``Host`` (its own name) tells. An IP address or ``localhost`` no DNS answer can
    steer, nor a name under ``localhost`` (``is_localhost``). No ``Host`` at all: not a
    browser."""
    if names is None or not host:
        return True
    name = host_name(host)
    if name is None:
        return False
    if is_localhost(name) or name in names:
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def is_localhost(name: str) -> bool:
    """``localhost`` or a name under it (``hub.localhost``): RFC 6761 has every name under
    ``localhost`` mean the loopback, and browsers resolve them so without asking DNS (and
    take their pages for secure contexts, as ``localhost``'s), so no DNS answer steers
    them, and a page served there is one of this machine's."""
    return name == "localhost" or name.endswith(".localhost")


def refused_host(hosts: Sequence[str], names: Iterable[str] | None) -> str | None:
    """Why a request with these ``Host`` header values is refused (403 ``forbidden_host``),
    or None. More than one is refused (which would be meant?)."""
    if names is None or (len(hosts) <= 1 and host_allowed(hosts[0] if hosts else "", names)):
        return None
    host = hosts[-1][:200]
    name = host_name(host) or host
    return (f"Host {host!r} is not allowed without a token: another site's name pointed at "
            f"this machine would look the same (DNS rebinding). Use an IP address, "
            f"localhost or a name under it (hub.localhost), add the name to [server] "
            f"allowed_hosts (--allowed-host {name}), or require tokens")


def own_origin(scheme: str, host: str, names: Iterable[str] | None) -> str | None:
    """The origin of the port asked (``scheme://Host``), whose pages (the voice port's
    console) are let in, or None. ``names`` (``host_allowlist``): unless any, only when
    ``Host`` is an IP address, ``localhost`` (or a name under it) or a name the operator
    allowed. A page of an attacker's site whose name is pointed at this machine once it
    has loaded (DNS rebinding) sends its own name as both Origin and Host, so an Origin
    equal to ``scheme://Host`` proves nothing unless no DNS answer can steer the name."""
    if not host or not host_allowed(host, names):
        return None
    return f"{scheme}://{host}"


def refused_origin(origins: Sequence[str], allowed: Iterable[str] | None,
                   own: str | None = None) -> str | None:
    """Why a request with these ``Origin`` header values is refused (403
    ``forbidden_origin``), or None. Both ports' rule: with an allowlist
    (``origin_allowlist``), a browser Origin outside it, or more than one, is refused; no
    Origin (not a browser) is let in. ``own``: the origin of the port asked
    (``own_origin``), whose pages (the voice port's console) are let in too."""
    if allowed is None or not origins or (
            len(origins) == 1 and (origins[0] in allowed or origins[0] == own)):
        return None
    return f"Origin {origins[-1][:200]!r} is not allowed (--origin, [server] origins)"


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` listens on the loopback only: a loopback address,
    ``localhost`` or a name under it (``bind_address``)."""
    if not host:
        return False
    if is_localhost(host.lower()):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_address(host: str) -> str:
    """What to bind for ``--host``: a name under ``localhost`` (``app.localhost``) binds
    what ``localhost`` does. RFC 6761 has it mean the loopback, and browsers resolve it
    so themselves, but the system's resolver need not know it (glibc does not, without
    systemd-resolved): binding the name failed ("Name or service not known")."""
    return "localhost" if is_localhost(host.lower()) else host


_TOKEN_IN_TEXT = re.compile(r"((?:[?&]|\b)token=)[^&\s\"']+")
_BEARER_IN_TEXT = re.compile(r"(bearer[ .])[^\s,]+", re.IGNORECASE)
"""A bearer token, whatever its characters (up to a space, or the comma that ends a
subprotocol entry), after ``Bearer`` in any case: the scheme is accepted so."""


_OWN_WORDS = frozenset({UNAUTHORIZED, API_UNAUTHORIZED})
"""The refusals that say where a token goes: their placeholders are no tokens. Masked,
the log read "send 'Authorization: Bearer *** with one of the gateway's tokens" (the
quote gone with ``<token>``) and "?token=*** or a 'bearer.*** WebSocket subprotocol)"."""


def redact(text: str) -> str:
    if text in _OWN_WORDS:
        return text
    return _BEARER_IN_TEXT.sub(r"\1***", _TOKEN_IN_TEXT.sub(r"\1***", text))


class RedactTokens(logging.Filter):
    """Masks ``token=`` query values and bearer tokens in a record's message and args."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if record.args:
            if isinstance(record.args, dict):
                record.args = {k: redact(v) if isinstance(v, str) else v
                               for k, v in record.args.items()}
            else:
                record.args = tuple(redact(a) if isinstance(a, str) else a
                                    for a in record.args)
        return True


_FILTER = RedactTokens()


def install_redaction() -> None:
    """Redact on the loggers that see request lines and on the root logger's handlers
    (idempotent: ``addFilter`` adds a filter once). A logger's filter only sees records
    created on that very logger, so the request-line loggers are named; a handler's filter
    sees everything that reaches it, so the root handlers (``logging.basicConfig`` in the
    CLI) cover every other logger."""
    for name in ("websockets.server", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).addFilter(_FILTER)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_FILTER)
