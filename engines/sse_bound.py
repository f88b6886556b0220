"""A bound on the bytes an SSE answer may send between events, for httpx-sse's readers.

httpx-sse holds a line, and an event's lines, whole and without a bound: a broken server or
proxy that sends one endless line grew the gateway by gigabytes before the read timeout
(``engines.llm_openai``: 512 MiB sent, +534 MiB; ``engines.http_tts``: 256 MiB, +773 MiB).
``bounded`` (``abounded``) gives the parser an answer whose body is the original's as
decoded, counted between the events the parser gives (the caller calls ``event_read`` after
each), that fails past the limit. Counted after decoding: a gzip answer (httpx asked for
one) of one endless line took a thousandth of its size on the wire, so 1 GiB of it stayed
under the bound and grew the gateway by 1,060 MiB. The parser pulls a read only when the
events of the last one are out, so what it holds unparsed is at most the limit and one
decoded read.

And a decoded read is bounded too (``pieces``, ``apieces``): httpx decodes each read whole,
so one 64 KiB read of gzip became 64 MiB at once, and ``Content-Encoding: gzip, gzip``
(httpx decodes every layer) made 600 bytes on the wire 256 MiB, before the bound saw a byte
(+569 MiB of Python memory, measured by tracemalloc, in either client). The clients ask for
an uncompressed answer (``UNCOMPRESSED``); one compressed anyway (a proxy) is decoded here,
``PIECE`` bytes at a time. An encoding other than gzip and deflate (``br``, ``zstd``: httpx
decoded them, without a bound, only with the optional brotli / zstandard packages, and
passed them on undecoded otherwise) fails the answer, naming it; except the body of one
refused for its status, which only gives the message its start (``head``, ``ahead``): the
status stands, with as much of the body as decodes.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import AsyncIterator, Iterator

import httpx

from engines.base import EngineError

UNCOMPRESSED = {"Accept-Encoding": "identity"}
"""A client's headers that ask for its answers as they are (httpx asked for gzip): an event
stream gains little from compression, and its decoding costs the gateway memory."""

PIECE = 64 << 10
"""The most one step of decoding a compressed answer gives (a layer of it)."""

_WBITS = {"gzip": zlib.MAX_WBITS | 16, "x-gzip": zlib.MAX_WBITS | 16, "deflate": zlib.MAX_WBITS}


class _Layer:
    """One layer of a compressed answer's encoding, decoded ``PIECE`` bytes at a time."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        self._unzip = zlib.decompressobj(_WBITS[encoding])
        self._started = False

    def inflate(self, data: bytes) -> Iterator[bytes]:
        while True:
            try:
                out = self._unzip.decompress(data, PIECE)
            except zlib.error as exc:
                if self.encoding != "deflate" or self._started:
                    raise httpx.DecodingError(f"{self.encoding} answer: {exc}") from exc
                # (raw deflate, no zlib header: some servers send it so; httpx reads it too)
                self._unzip = zlib.decompressobj(-zlib.MAX_WBITS)
                self._started = True
                continue
            self._started = True
            if out:
                yield out
            data = self._unzip.unconsumed_tail
            if not data and len(out) < PIECE:  # (else more may wait inside, for no input)
                return

    def flush(self) -> bytes:
        return self._unzip.flush()  # (what a cut answer leaves: drained by ``inflate``)


class _Decoder:
    """A streamed answer's body as its ``Content-Encoding`` says, in pieces of at most
    ``PIECE`` bytes whatever it decodes to; ``code`` and ``who`` name an encoding it does not
    know in the error (``EngineError``), as in ``_Count``."""

    def __init__(self, response: httpx.Response, code: str, who: str) -> None:
        # (an empty name, ``Content-Encoding:`` with no value or "gzip,", names none: httpx
        # skipped it, and so does this)
        names = [name for value in response.headers.get_list("content-encoding",
                                                              split_commas=True)
                 if (name := value.strip().lower())]
        unknown = [name for name in names if name not in _WBITS and name != "identity"]
        if unknown:
            raise EngineError(code, f"{who} sent its answer {', '.join(unknown)}-encoded, "
                              "which the gateway does not decode (it asks for identity)")
        # (the last encoding named was the last applied: the first to decode)
        self._layers = [_Layer(name) for name in reversed(names) if name != "identity"]

    def feed(self, data: bytes, layer: int = 0) -> Iterator[bytes]:
        if layer == len(self._layers):
            if data:
                yield data
            return
        for piece in self._layers[layer].inflate(data):
            yield from self.feed(piece, layer + 1)

    def end(self) -> Iterator[bytes]:
        for layer, decoding in enumerate(self._layers):
            yield from self.feed(decoding.flush(), layer + 1)


def pieces(response: httpx.Response, code: str, who: str) -> Iterator[bytes]:
    """The decoded body of ``response`` (a synchronous client's, streamed) in pieces of at
    most ``PIECE`` bytes (``iter_bytes`` decoded each read whole), or the error
    (``EngineError``: ``code``, naming ``who``) for an encoding it cannot decode."""
    decoder = _Decoder(response, code, who)
    for data in response.iter_raw():
        yield from decoder.feed(data)
    yield from decoder.end()


async def apieces(response: httpx.Response, code: str, who: str) -> AsyncIterator[bytes]:
    """``pieces`` for an async client's answer."""
    decoder = _Decoder(response, code, who)
    async for data in response.aiter_raw():
        for piece in decoder.feed(data):
            yield piece
    for piece in decoder.end():
        yield piece


def head(response: httpx.Response, limit: int, code: str, who: str) -> bytes:
    """The first ``limit`` bytes of ``response``'s body (a synchronous client's, streamed),
    for the message of an answer refused by its status or type: as much of it as decodes
    (``pieces``: ``read`` held it whole, endless or a bomb's), then why the rest does not.
    Never an error of its own: an error page in an encoding the gateway does not decode
    (a proxy's ``br``, a ``gzip`` that is not) failed with that, and hid the answer's
    status, and what the status asks for (a 429's ``Retry-After``, a 413's context full)."""
    start = _Head(limit)
    with start.reading():
        for piece in pieces(response, code, who):
            if start.full(piece):
                break
    return start.data[:limit] + start.note


async def ahead(response: httpx.Response, limit: int, code: str, who: str) -> bytes:
    """``head`` for an async client's answer."""
    start = _Head(limit)
    with start.reading():
        async for piece in apieces(response, code, who):
            if start.full(piece):
                break
    return start.data[:limit] + start.note


class _Head:
    """The start of a body as ``head`` reads it, and why the rest did not decode."""

    def __init__(self, limit: int) -> None:
        self.limit, self.data, self.note = limit, b"", b""

    def full(self, piece: bytes) -> bool:
        self.data += piece
        return len(self.data) >= self.limit

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        try:
            yield
        except (EngineError, httpx.DecodingError) as exc:
            self.note = f"[body not decoded: {exc}]".encode()


class _Count:
    """The bytes since the last event, and the error past ``limit``: ``code`` (the
    caller's error code), ``who`` (the server, as the message names it)."""

    def __init__(self, limit: int, code: str, who: str) -> None:
        self.limit, self.code, self.who = limit, code, who
        self.pending = 0

    def event_read(self) -> None:
        self.pending = 0

    def add(self, chunk: bytes) -> bytes:
        self.pending += len(chunk)
        if self.pending > self.limit:
            raise EngineError(self.code, f"{self.who} sent {self.pending:,} bytes without "
                              f"ending an SSE event (at most {self.limit:,})")
        return chunk


def bounded(response: httpx.Response, limit: int, code: str,
            who: str) -> tuple[httpx.Response, EventBound]:
    """An answer to give ``EventSource`` instead of ``response`` (a synchronous client's,
    streamed), and its bound. Closing it closes ``response``."""
    bound = EventBound(response, limit, code, who)
    return httpx.Response(response.status_code, headers=_decoded(response),
                          stream=bound), bound


def abounded(response: httpx.Response, limit: int, code: str,
             who: str) -> tuple[httpx.Response, AsyncEventBound]:
    """``bounded`` for an async client's answer."""
    bound = AsyncEventBound(response, limit, code, who)
    return httpx.Response(response.status_code, headers=_decoded(response),
                          stream=bound), bound


def _decoded(response: httpx.Response) -> list[tuple[str, str]]:
    """``response``'s headers for its decoded body: httpx decodes it once."""
    return [(name, value) for name, value in response.headers.multi_items()
            if name.lower() != "content-encoding"]


class EventBound(_Count, httpx.SyncByteStream):
    """The decoded body of a synchronous client's SSE answer, bounded."""

    def __init__(self, response: httpx.Response, limit: int, code: str, who: str) -> None:
        super().__init__(limit, code, who)
        self._response = response

    def __iter__(self) -> Iterator[bytes]:
        for chunk in pieces(self._response, self.code, self.who):
            yield self.add(chunk)

    def close(self) -> None:
        self._response.close()


class AsyncEventBound(_Count, httpx.AsyncByteStream):
    """The decoded body of an async client's SSE answer, bounded."""

    def __init__(self, response: httpx.Response, limit: int, code: str, who: str) -> None:
        super().__init__(limit, code, who)
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in apieces(self._response, self.code, self.who):
            yield self.add(chunk)

    async def aclose(self) -> None:
        await self._response.aclose()
