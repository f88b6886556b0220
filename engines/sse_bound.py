"""A bound on the bytes an SSE answer may send between events, for httpx-sse's readers.

httpx-sse holds a line, and an event's lines, whole and without a bound: a broken server or
proxy that sends one endless line grew the gateway by gigabytes before the read timeout
(``engines.llm_openai``: 512 MiB sent, +534 MiB; ``engines.http_tts``: 256 MiB, +773 MiB).
``bounded`` (``abounded``) gives the parser an answer whose body is the original's as
decoded, counted between the events the parser gives (the caller calls ``event_read`` after
each), that fails past the limit. Counted after decoding: a gzip answer (httpx asks for
one) of one endless line took a thousandth of its size on the wire, so 1 GiB of it stayed
under the bound and grew the gateway by 1,060 MiB. The parser pulls a read only when the
events of the last one are out, so what it holds unparsed is at most the limit and one
decoded read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx

from engines.base import EngineError


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
        for chunk in self._response.iter_bytes():
            yield self.add(chunk)

    def close(self) -> None:
        self._response.close()


class AsyncEventBound(_Count, httpx.AsyncByteStream):
    """The decoded body of an async client's SSE answer, bounded."""

    def __init__(self, response: httpx.Response, limit: int, code: str, who: str) -> None:
        super().__init__(limit, code, who)
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._response.aiter_bytes():
            yield self.add(chunk)

    async def aclose(self) -> None:
        await self._response.aclose()
