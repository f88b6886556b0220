"""A bound on the bytes an SSE answer may send between events, for httpx-sse's readers.

httpx-sse holds a line, and an event's lines, whole and without a bound: a broken server or
proxy that sends one endless line grew the gateway by gigabytes before the read timeout
(``engines.llm_openai``: 512 MiB sent, +534 MiB; ``engines.http_tts``: 256 MiB, +773 MiB).
Wrapping ``response.stream`` counts the body between the events the parser gives (the caller
calls ``event_read`` after each) and fails past the limit. The parser pulls a read only
when the events of the last one are out, so what it holds unparsed is at most the limit and
one read.
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


class EventBound(_Count, httpx.SyncByteStream):
    """``response.stream`` of a synchronous client's SSE answer, bounded."""

    def __init__(self, stream: httpx.SyncByteStream | httpx.AsyncByteStream, limit: int,
                 code: str, who: str) -> None:
        super().__init__(limit, code, who)
        assert isinstance(stream, httpx.SyncByteStream)
        self._stream = stream

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._stream:
            yield self.add(chunk)

    def close(self) -> None:
        self._stream.close()


class AsyncEventBound(_Count, httpx.AsyncByteStream):
    """``response.stream`` of an async client's SSE answer, bounded."""

    def __init__(self, stream: httpx.SyncByteStream | httpx.AsyncByteStream, limit: int,
                 code: str, who: str) -> None:
        super().__init__(limit, code, who)
        assert isinstance(stream, httpx.AsyncByteStream)
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            yield self.add(chunk)

    async def aclose(self) -> None:
        await self._stream.aclose()
