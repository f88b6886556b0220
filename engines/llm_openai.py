"""LLM backend for any OpenAI-compatible streaming chat server (oMLX, mlx_lm.server, vLLM, ...).

One ``httpx.AsyncClient`` per backend keeps connections alive between turns; SSE framing is
parsed by ``httpx-sse``, with a bound on the bytes one event may take (``engines.sse_bound``).
What this module adds on top is the knowledge of how these servers actually behave
(checked against mlx_lm.server and oMLX, see platform-facts.md):

* keep-alive comment lines (``: keepalive 12/40``) arrive before the first token; oMLX's
  keep-alives (its default ``sse_keepalive_mode = "chunk"``) are ``data:`` chunks with an
  empty delta instead, sent first and then every 10 s the stream is quiet;
* every delta may repeat ``role``; a chunk may carry many tokens (oMLX sends bursts);
* with ``stream_options.include_usage`` the usage arrives in its own chunk *after* the
  ``finish_reason`` chunk, so the stream is read up to ``data: [DONE]``; a strict server
  that refuses ``stream_options`` (HTTP 400 or 422 naming it: Azure AI's serverless
  models, Mistral's API) is asked again without it, and once so answered never with it
  again (a 4xx that only echoes the request, as FastAPI's 422 does, changes nothing);
* uvicorn (under oMLX and vLLM) and llama.cpp close a connection idle for 5 s: a request
  that goes out on a kept-alive connection as it closes, and gets nothing back, is sent
  again at once, once (``_Stale``);
* the decode rate comes from the server (oMLX's ``generation_tokens_per_second``, or
  llama.cpp's ``timings``, else ``usage.completion_tokens`` over the time the text took to
  arrive), never from counting chunks;
* a reasoning model's thoughts are not the reply: ``reasoning_content`` (vLLM, llama.cpp,
  oMLX) and ``reasoning`` (mlx_lm.server) are not yielded, and neither is
  ``<think>...</think>`` in the content (``ThinkFilter``), nor, with ``thinking="opened"``,
  everything before the first ``</think>`` (a chat template that opens ``<think>`` in the
  prompt: DeepSeek-R1 distills, QwQ). A server that parses thoughts itself sends them in
  those fields whatever the template did, and its content is then the reply.

Every failure leaves as ``EngineError``: ``llm_unavailable`` when the server cannot be reached
or stops answering in time (connection refused, DNS, connect/read timeout, no data event
that says something for ``stall_s`` even if keep-alives still arrive; ``ServerUnreachable``
when no connection was made: refused, DNS, connect timeout, or one lost as it was made,
before a byte of the request), ``llm_failed``
when it answers wrongly (HTTP status >= 400, an error payload, event or field (older
llama.cpp's ``error:``, ``_ErrorFieldDecoder``), malformed JSON, an event
longer than ``MAX_EVENT_BYTES``, a stream that breaks off or ends without ``finish_reason``
or ``[DONE]``, or with a ``finish_reason`` that says it gave up: ``ABORTED``). After a
``finish_reason`` that does not, the reply is whole: a break, or an error, is no failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import httpx
import orjson
from httpx_sse import ServerSentEvent, aconnect_sse
from httpx_sse._decoders import SSEDecoder, SSELineDecoder

from engines.base import (
    LOST_AS_MADE,
    THINKING_MODES,
    EngineError,
    LlmContextFull,
    LlmDelta,
    LlmDone,
    LlmEvent,
    LlmRequest,
    NewConnectionWatch,
    ServerUnreachable,
    http_url_fault,
    shown_url,
)
from engines.sse_bound import UNCOMPRESSED, abounded, ahead

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = httpx.Timeout(connect=5.0, read=60.0, write=10.0, pool=10.0)
"""``read`` bounds the silence between two received bytes (servers send keep-alives while
they process a long prompt), not the length of the whole reply; ``OpenAiLlm`` sets it to its
``stall_s`` unless given a timeout of its own."""

DEFAULT_STALL_S = 60.0
"""The longest a stream may go without a data event that says something (text, a
thought, a finish, usage). Keep-alives reset httpx's read timeout but not this, whether
comments (``: keepalive``) or oMLX's empty chunks: a server stuck after its first token
that keeps sending them would otherwise hold the turn open for ever. Generous, because servers
also send keep-alives while they process a long prompt before the first token."""

MIN_DECODE_S = 0.25
"""Below this much decode time a rate from our own clock says more about how the chunks
were buffered on the way than about the server (two chunks 1 ms apart: thousands of
tokens per second): no rate then."""

AFTER_FINISH_S = 2.0
"""How long the usage chunk and ``[DONE]`` may take after the ``finish_reason`` chunk (or
each other), and the end of the body after ``[DONE]``. The reply is whole by then: a server
(or a proxy) slow to send the rest, or to end its body, must not fail the turn after
``stall_s``, nor one that breaks the connection off instead."""

CONTEXT_FULL = ("context window", "context length", "context_length", "maximum context",
                "context size", "exceed_context_size", "too many tokens", "prompt is too long",
                "input is too long", "maximum prompt length",
                "`inputs` tokens + `max_new_tokens`", "`inputs` must have less than")
"""Words of an HTTP 400 (or 422) that refuses a prompt longer than the model's context:
oMLX ("exceeds max context window of 32768 tokens"), vLLM and OpenAI ("maximum context
length", ``context_length_exceeded``), llama.cpp ("exceeds the available context size",
``exceed_context_size_error``), SGLang, TGI (a 422: "Input validation error: `inputs`
tokens + `max_new_tokens` must be <= 4096", "`inputs` must have less than 4096 tokens"),
and others. A 413 is taken as one too."""

ABORTED = ("abort", "error")
"""The ``finish_reason`` of a reply the server gave up on (vLLM: an aborted request, an
engine shutting down or pausing; some servers: an error while decoding), which it ends as
it ends a whole one, ``[DONE]`` included: the reply is cut short, so the turn fails."""

_SNIPPET = 200
"""How many characters of a bad body end up in an error message."""

MAX_EVENT_BYTES = 4 << 20
"""The most body bytes read between one SSE event and the next. A chunk is a few hundred
bytes (mlx_lm.server: 339 in the median, 368 at most; oMLX's bursts of several tokens a
few more); a server that sends a runaway reply in one chunk is still read (it is cut at
``max_reply_chars``, tested with 1.1 MB). A line that never ends (a broken server or
proxy) was buffered by the SSE parser until ``stall_s``: 534 MB of memory for 512 MB
sent."""



class ThinkFilter:
    """Drops thoughts from streamed content: reasoning models served without a reasoning
    parser (Qwen3, DeepSeek-R1) think in their content, and thoughts are not for the
    listener (nor for the history the next turn sends back).

    ``opened``: the stream starts inside a thought (its template opened ``<think>``), which
    the first ``</think>`` ends; nothing is said before it. Otherwise ``<think>`` opens a
    thought and nothing is held back but what may be the start of a tag: a tag split
    across chunks is held until it is whole (so is a ``<`` at a chunk's end, briefly).

    A ``</think>`` that closes no thought is dropped and counted in ``unopened``: the text
    before it was most likely a thought of a template that opens them, already said
    (``said_before_unopened`` characters of it).
    """

    OPEN, CLOSE = "<think>", "</think>"

    def __init__(self, opened: bool = False) -> None:
        self.inside = opened
        """In a thought now."""
        self.opened = opened
        """In the thought the template opened (``opened``), no ``</think>`` yet."""
        self.unopened = 0
        self.said_before_unopened = 0
        self.said = 0
        """Characters given out to speak so far."""
        self._held = ""

    def feed(self, text: str) -> str:
        """The part of ``text`` (after what was held) to speak."""
        text, self._held = self._held + text, ""
        out = []
        while text:
            tags = (self.CLOSE,) if self.inside else (self.OPEN, self.CLOSE)
            found = [(at, tag) for tag in tags if (at := text.find(tag)) >= 0]
            if not found:
                keep = max(_partial_tag(text, tag) for tag in tags)
                if not self.inside:
                    out.append(text[:len(text) - keep])
                self._held = text[len(text) - keep:]
                break
            at, tag = min(found)
            if not self.inside:
                out.append(text[:at])
            text = text[at + len(tag):]
            if tag == self.OPEN:
                self.inside = True
            elif self.inside:
                self.inside = self.opened = False
            else:
                if not self.unopened:
                    self.said_before_unopened = self.said + sum(map(len, out))
                self.unopened += 1
        said = "".join(out)
        self.said += len(said)
        return said

    def reasoning_seen(self) -> None:
        """The server sent a thought in a field of its own (``reasoning_content``,
        ``reasoning``): it parses thoughts itself, so the content is the reply, and the
        thought the template opened (``opened``) is not in it."""
        if self.opened:
            self.inside = self.opened = False
            self._held = ""

    def finish(self) -> str:
        """The end of the stream: what was held back and turned out not to be a tag."""
        held, self._held = self._held, ""
        if self.inside:
            return ""
        self.said += len(held)
        return held


def _partial_tag(text: str, tag: str) -> int:
    """How many characters at the end of ``text`` may begin ``tag``."""
    return next((k for k in range(len(tag) - 1, 0, -1) if text.endswith(tag[:k])), 0)


def _snippet(text: str | bytes) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    return repr(text[:_SNIPPET]) + ("..." if len(text) > _SNIPPET else "")


KEEPALIVE_CONNECTIONS = 100
"""Idle connections to the LLM server kept for the next turns (httpx's default is 20)."""


def tokens_per_s_from(usage: dict[str, Any] | None, timings: dict[str, Any] | None,
                      decode_s: float | None = None,
                      first_share: float | None = None) -> float | None:
    """The decode rate, from what the server reported, or ``None`` when it reported none.

    oMLX puts ``generation_tokens_per_second`` in ``usage``; llama.cpp sends a ``timings``
    object (``predicted_per_second``, or ``predicted_n`` tokens in ``predicted_ms``). A plain
    OpenAI ``usage`` (mlx_lm.server, vLLM) has only token counts: then the rate is its
    ``completion_tokens`` after those of the first chunk, over ``decode_s``, the time between
    the first and the last text chunk received (the server's count on our clock; chunks are
    never counted: a chunk may hold many tokens). ``first_share``: the first chunk's share of
    the text, which stands for its share of the tokens (a burst: with 6 tokens a chunk,
    counting it as one token overstated the rate by 30 %); None: one token.
    """
    if usage:
        rate = usage.get("generation_tokens_per_second")
        if isinstance(rate, int | float) and rate > 0:
            return float(rate)
    if timings:
        rate = timings.get("predicted_per_second")
        if isinstance(rate, int | float) and rate > 0:
            return float(rate)
        tokens = timings.get("predicted_n")
        if tokens is None and usage:
            tokens = usage.get("completion_tokens")
        ms = timings.get("predicted_ms")
        if isinstance(tokens, int | float) and isinstance(ms, int | float) and ms > 0:
            return tokens / (ms / 1000.0)
    tokens = usage.get("completion_tokens") if usage else None
    if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 1 and \
            decode_s is not None and decode_s >= MIN_DECODE_S:
        after_first = tokens - 1 if first_share is None else tokens * (1.0 - first_share)
        return after_first / decode_s
    return None


class OpenAiLlm:
    """Streams chat completions from ``{url}/chat/completions``.

    ``url`` is the API base, as an OpenAI SDK would take it (``http://127.0.0.1:8081/v1``).
    ``model`` is sent only when given: mlx_lm.server tries to download unknown model names.
    ``timeout`` is a number of seconds or an ``httpx.Timeout``; ``stall_s`` bounds the time
    between two data events (``DEFAULT_STALL_S``), and by default the wait for the answer's
    headers too (the read timeout): a server that takes a request and answers nothing fails
    the turn after ``stall_s`` as one that stops mid-stream does.

    ``thinking``: how thoughts show in the content (``THINKING_MODES``, ``ThinkFilter``).
    ``chat_template_kwargs`` go with each request when given (mlx_lm.server, oMLX, vLLM and
    llama.cpp pass them to the chat template, e.g. ``{"enable_thinking": False}``).
    """

    name = "openai"

    def __init__(
        self,
        url: str,
        model: str | None = None,
        api_key: str | None = None,
        timeout: float | httpx.Timeout | None = None,
        stall_s: float = DEFAULT_STALL_S,
        thinking: str = "tagged",
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if thinking not in THINKING_MODES:
            raise ValueError(f"thinking must be one of {', '.join(THINKING_MODES)}, not "
                             f"{thinking!r}")
        self.stall_s = stall_s
        self.thinking = thinking
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.thoughts_unopened = 0
        """Replies with a ``</think>`` that closed no thought: what came before it was most
        likely thinking (a template that opens ``<think>``), and was said."""
        self.thoughts_unclosed = 0
        """Replies that ended inside a thought (with ``opened`` and no ``</think>``: all of
        it), which was not said."""
        self._warned: set[str] = set()
        self.stream_options = True
        """False once the server refused ``stream_options`` (``_OptionsRefused``)."""
        if timeout is None:
            timeout = httpx.Timeout(DEFAULT_TIMEOUT.connect, read=stall_s,
                                    write=DEFAULT_TIMEOUT.write, pool=DEFAULT_TIMEOUT.pool)
        if (wrong := http_url_fault(url)) is not None:
            raise ValueError(f"LLM url must be http(s)://host[:port]/base, not {wrong}")
        self.url = url.rstrip("/")
        self.shown_url = shown_url(self.url)
        """``url`` for messages (no password)."""
        self.model = model
        self._endpoint = f"{self.url}/chat/completions"
        headers = {**UNCOMPRESSED, **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
        # No cap on connections: each turn holds one for its whole reply, and httpx's
        # default of 100 failed the 101st concurrent turn after its 10 s pool timeout
        # without reaching the server; the server queues what it cannot run at once.
        self._client = httpx.AsyncClient(headers=headers, timeout=timeout, limits=httpx.Limits(
            max_connections=None, max_keepalive_connections=KEEPALIVE_CONNECTIONS))

    def _body(self, request: LlmRequest, options: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "messages": request.messages,
            "stream": True,
        }
        if options:
            body["stream_options"] = {"include_usage": True}
        model = request.model or self.model
        if model is not None:
            body["model"] = model
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.max_tokens is not None:
            body["max_tokens"] = request.max_tokens
        if self.chat_template_kwargs:
            body["chat_template_kwargs"] = self.chat_template_kwargs
        return body

    def _without_options(self, refused: str) -> None:
        """A request without ``stream_options`` was answered after the server refused them
        (``refused``, its answer): from now on they are not sent (once, whatever turns were
        refused at once). Not before: a server that refuses a request for another reason
        may echo the whole request, ``stream_options`` included (FastAPI's 422), and the
        request without them fails the same way."""
        if self.stream_options:
            self.stream_options = False
            log.warning("the LLM server refuses stream_options (%s): asked without them from "
                        "now on, so llm_tokens_per_s comes only from what else it sends",
                        refused)

    async def stream(self, request: LlmRequest) -> AsyncGenerator[LlmEvent, None]:
        """Yield ``LlmDelta`` items as the server sends them, then one ``LlmDone``.

        Safe to cancel: cancelling the consuming task (or closing this generator, e.g. with
        ``contextlib.aclosing``) closes the HTTP response, and with it the connection, so
        the server sees the client go and stops decoding. A consumer that merely stops
        iterating leaves the connection open until the generator is garbage-collected:
        close it explicitly.
        """
        try:
            try:
                async for event in self._attempt(request):
                    yield event
            except _Busy as busy:
                # nothing was said yet: one more try after the wait the server asked for
                await asyncio.sleep(busy.retry_after_s)
                async for event in self._attempt(request):
                    yield event
        except _Busy as busy:
            raise EngineError("llm_failed", busy.message) from None
        except httpx.ReadTimeout as exc:
            raise EngineError(
                "llm_unavailable", f"LLM server {self.shown_url} sent nothing for "
                f"{self._client.timeout.read:g} s (ReadTimeout)") from exc
        except httpx.TimeoutException as exc:
            # (out of reach only when the connection was never made: a server that took the
            # request and then stalled answers the probe's /models all the same)
            error = ServerUnreachable if isinstance(exc, httpx.ConnectTimeout) else EngineError
            raise error(
                "llm_unavailable", f"LLM server {self.shown_url} timed out ({type(exc).__name__})"
            ) from exc
        except httpx.ConnectError as exc:
            raise ServerUnreachable(
                "llm_unavailable", f"cannot reach LLM server {self.shown_url}: {exc}"
            ) from exc
        except httpx.HTTPError as exc:
            # RemoteProtocolError, ReadError, ...: it answered, then broke off.
            raise EngineError(
                "llm_failed",
                f"LLM stream from {self.shown_url} broke off: {type(exc).__name__}: {exc}"
            ) from exc

    async def _attempt(self, request: LlmRequest) -> AsyncIterator[LlmEvent]:
        """``_stream``, sent again at once, once, when it went out on a kept-alive
        connection that the server closed as the request arrived (``_Stale``), and when the
        server refused its ``stream_options`` (``_OptionsRefused``; only raised while they
        are sent: the request again goes without them)."""
        stale_again = False
        refused: str | None = None
        while True:
            try:
                async for event in self._stream(request, refused):
                    yield event
                return
            except _OptionsRefused as refusal:
                refused = refusal.message
            except _Stale as stale:
                if stale_again:
                    raise stale.error from None
                stale_again = True
                log.debug("the LLM server closed a kept-alive connection as a request went "
                          "out (%s: %s): sent again", type(stale.error).__name__, stale.error)

    async def _stream(self, request: LlmRequest,
                      refused: str | None = None) -> AsyncIterator[LlmEvent]:
        """One request, and its reply's events. ``refused``: the server's answer to this
        request with ``stream_options``, which this one goes without."""
        finish_reason: str | None = None
        usage: dict[str, Any] | None = None
        timings: dict[str, Any] | None = None
        seen_done = False
        deltas = 0
        first_at = last_at = 0.0  # when the first and the last text chunk came (monotonic)
        first_chars = all_chars = 0  # the first chunk's text, and all of it, thoughts too
        thoughts = ThinkFilter(opened=self.thinking == "opened")
        loop = asyncio.get_running_loop()
        watch = NewConnectionWatch()  # (reused: the request goes out on a kept-alive one)

        async with contextlib.AsyncExitStack() as stack:
            try:
                body = self._body(request, self.stream_options and refused is None)
                source = await stack.enter_async_context(aconnect_sse(
                    self._client, "POST", self._endpoint, json=body,
                    extensions={"trace": watch}))
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
                if watch.reused:  # (a new connection broken before the answer is no race)
                    raise _Stale(exc) from exc
                raise
            except AttributeError as exc:
                if not watch.lost_as_made(exc):
                    raise
                # (nothing was sent: out of reach, told as a refused connection is, by
                # stream's ConnectError handler)
                raise httpx.ConnectError(LOST_AS_MADE) from exc
            response = source.response
            if response.status_code >= 400:
                head = await _read_head(response)
                message = f"LLM server answered HTTP {response.status_code}: {_snippet(head)}"
                if response.status_code == 413 or response.status_code in (400, 422) and any(
                        words in head.decode("utf-8", "replace").lower()
                        for words in CONTEXT_FULL):
                    raise LlmContextFull(message)
                wait_s = _retry_after_s(response)
                if wait_s is not None:
                    raise _Busy(message, wait_s)
                if response.status_code in (400, 422) and b"stream_options" in head and \
                        "stream_options" in body:
                    raise _OptionsRefused(message)
                raise EngineError("llm_failed", message)
            content_type = response.headers.get("content-type", "")
            if "text/event-stream" not in content_type:
                raise EngineError(
                    "llm_failed",
                    f"LLM server answered {content_type or 'no content type'!r}, not an event "
                    f"stream: {_snippet(await _read_head(response))}",
                )
            if refused is not None:
                self._without_options(refused)
            answer, bound = abounded(response, MAX_EVENT_BYTES, "llm_failed", "the LLM server")
            events = await stack.enter_async_context(contextlib.aclosing(_events(answer)))
            said_at = loop.time()  # the last data event that said something (no keep-alive)
            while True:
                # once the reply is whole, the rest (usage, [DONE], the body's end) gets a
                # short while only, and not getting it is no failure
                finished = seen_done or finish_reason is not None
                try:
                    async with asyncio.timeout_at(
                            said_at + (AFTER_FINISH_S if finished else self.stall_s)):
                        sse = await anext(events)
                    bound.event_read()
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    # (httpx's read timeout, stall_s too unless timeout gave one, is a
                    # TransportError: after a whole reply it ends the wait below, and before
                    # it stream() names the read timeout, not stall_s, which had not passed)
                    if finished:
                        break  # (the connection is closed, not reused)
                    raise EngineError(
                        "llm_unavailable", f"LLM server {self.shown_url} sent no data for "
                        f"{self.stall_s:g} s " + (f"(deltas so far: {deltas})" if deltas else
                                                  "before its first token (queued behind "
                                                  "other requests, or stuck)")) from None
                except httpx.TransportError:
                    # the rest broke off (a server or proxy that drops the connection after
                    # its last chunk): failing the whole reply left its last sentence unsaid
                    # and the history saying it was cut
                    if finished:
                        break
                    raise
                data = sse.data
                if not data:  # comments never get here; an id-only or empty event does
                    continue
                if seen_done:
                    continue  # read to the end of the body so the connection can be reused
                if data == "[DONE]":
                    seen_done = True
                    said_at = loop.time()
                    continue
                chunk = None
                if sse.event != "error":  # (an error event's data is in any shape: JSON or text)
                    try:
                        chunk = orjson.loads(data)
                    except orjson.JSONDecodeError as exc:
                        raise EngineError(
                            "llm_failed", f"malformed JSON in LLM stream: {_snippet(data)}"
                        ) from exc
                    if not isinstance(chunk, dict):
                        raise EngineError("llm_failed",
                                          f"unexpected LLM chunk: {_snippet(data)}")
                if chunk is None or chunk.get("error") or chunk.get("object") == "error":
                    # ({"error": {...}}; vLLM's ErrorResponse unwrapped, {"object": "error",
                    # "message": ...}, in some versions: then [DONE], as after a whole reply)
                    if finish_reason is not None and finish_reason not in ABORTED:
                        # the reply is whole, as when the connection breaks after it: only
                        # what was to follow (usage, [DONE]) is lost
                        self._error_after_finish(data)
                        break
                    raise _server_error(data, deltas)
                if isinstance(chunk.get("usage"), dict):
                    usage = chunk["usage"]
                if isinstance(chunk.get("timings"), dict):
                    timings = chunk["timings"]
                choices = _choices(chunk, data)
                if _says_something(chunk):
                    said_at = loop.time()
                for text, thought, reason in choices:
                    # completion_tokens counts a reasoning model's thinking too (vLLM sends
                    # it as reasoning_content): the decode time must cover it as well
                    if text or thought:
                        last_at = time.monotonic()
                        first_at = first_at or last_at
                        first_chars = first_chars or len(text) + len(thought)
                        all_chars += len(text) + len(thought)
                    if thought:
                        thoughts.reasoning_seen()
                    unopened = thoughts.unopened
                    if text and (text := thoughts.feed(text)):
                        deltas += 1
                        yield LlmDelta(text)
                    if thoughts.unopened and not unopened:
                        self._unopened_thought(thoughts.said_before_unopened)
                    if reason:
                        finish_reason = reason
                # A burst of chunks can sit fully buffered; let other sessions run between.
                await asyncio.sleep(0)
        if not seen_done and finish_reason is None:
            raise EngineError(
                "llm_failed",
                f"LLM stream ended after {deltas} deltas without finish_reason or [DONE]",
            )
        if finish_reason in ABORTED:
            raise EngineError("llm_failed", f"the LLM server ended the reply early "
                              f"({finish_reason!r}) after {deltas} deltas")
        if rest := thoughts.finish():
            yield LlmDelta(rest)
        if thoughts.inside:
            self._unclosed_thought(thoughts.opened, finish_reason, all_chars)
        yield LlmDone(
            finish_reason=finish_reason,
            tokens_per_s=tokens_per_s_from(usage, timings, last_at - first_at,
                                           first_chars / all_chars if all_chars else 0.0),
            usage=usage,
            thought_chars=max(0, all_chars - thoughts.said),
        )

    def _error_after_finish(self, data: str) -> None:
        if "after finish" in self._warned:
            log.debug("LLM server error after a whole reply, ignored: %s", _snippet(data))
            return
        self._warned.add("after finish")
        log.warning("The LLM server sent an error after its reply's finish_reason (%s): the "
                    "reply is whole and was kept, only its usage may be lost (warned once)",
                    _snippet(data))

    def _unopened_thought(self, said: int) -> None:
        self.thoughts_unopened += 1
        if "unopened" in self._warned:
            return
        self._warned.add("unopened")
        if self.thinking == "tagged":
            why, advice = ("as when a chat template opens the thought in the prompt",
                           'set [llm] thinking = "opened"')
        else:  # (oMLX has seen an empty </think> before the thought: jundot/omlx#2649)
            why, advice = ("after the thought the template opened had ended",
                           "the model closed a thought twice")
        log.warning("The LLM wrote </think> with no <think> before it, %s: the %d characters "
                    "said before it were most likely thinking, spoken and kept in the "
                    "history; %s (warned once; counted in thoughts_unopened)",
                    why, said, advice)

    def _unclosed_thought(self, opened: bool, finish_reason: str | None, chars: int) -> None:
        self.thoughts_unclosed += 1
        if "unclosed" in self._warned:
            return
        self._warned.add("unclosed")
        if finish_reason == "length":
            advice = ("it reached its token limit while thinking: raise [llm] max_tokens, or "
                      "turn thinking off (e.g. [llm] chat_template_kwargs = "
                      "{enable_thinking = false})")
        elif opened:
            advice = ('no </think> came: if this model does not think, or its template does '
                      'not open <think>, set [llm] thinking = "tagged"')
        else:
            advice = "its <think> was never closed"
        log.warning("The LLM's reply (%d characters) ended inside a thought, which was not "
                    "said; %s (warned once; counted in thoughts_unclosed)", chars, advice)

    async def aclose(self) -> None:
        """Close pooled connections. Idempotent."""
        await self._client.aclose()


MAX_RETRY_AFTER_S = 3.0
"""The longest ``Retry-After`` a turn waits, once, for a busy or loading LLM server (429,
503): a listener would rather wait that long than hear nothing; beyond it, the turn fails."""


class _Stale(Exception):
    """The connection broke before the answer's headers were whole, and it was a kept-alive
    one: the server closed it as the request went out (uvicorn, under oMLX and vLLM, and
    llama.cpp close a connection idle for 5 s, httpx's own limit too), so the request
    never reached the server's application. It is sent again, as browsers do (Chromium
    resends any request that meets a closed reused connection before the answer's
    headers); a chat completion changes nothing on the server, so even a server that did
    read it, then died, gets nothing worse than the same request twice."""

    def __init__(self, error: httpx.HTTPError) -> None:
        super().__init__(str(error))
        self.error = error


class _OptionsRefused(Exception):
    """The server refused the request for its ``stream_options`` (HTTP 400 or 422 naming
    them), before any reply: ask again without them."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _Busy(Exception):
    """The server asked to be tried again shortly (429 or 503 with ``Retry-After``)."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.message, self.retry_after_s = message, retry_after_s


def _retry_after_s(response: httpx.Response) -> float | None:
    """The wait a 429 or 503 asks for, when it asks for one short enough to take."""
    if response.status_code not in (429, 503):
        return None
    try:
        wait_s = float(response.headers.get("retry-after", ""))
    except ValueError:  # absent, or an HTTP date: not worth a turn's wait
        return None
    return wait_s if 0 <= wait_s <= MAX_RETRY_AFTER_S else None


class _ErrorFieldDecoder(SSEDecoder):
    """httpx-sse's event decoder, which also takes a field named ``error``: llama.cpp's
    server reported a failure mid-stream as ``error: {...}`` until September 2025 (its
    PR #16109), then sent ``[DONE]``. SSE ignores a field it does not know, so the failure
    read as the end of a whole reply (or an empty one: a prompt past the context failed
    every turn as ``llm_empty_reply`` instead of forgetting old turns). The field stands
    for ``event: error`` with its value as data, as newer llama.cpp sends it."""

    def decode(self, line: str) -> ServerSentEvent | None:
        name, colon, value = line.partition(":")
        if name == "error":
            super().decode("event: error")
            line = "data" + colon + value
        return super().decode(line)


async def _events(response: httpx.Response) -> AsyncGenerator[ServerSentEvent, None]:
    """``EventSource.aiter_sse`` (httpx-sse's own line splitting, which follows SSE, not
    ``str.splitlines``), with ``_ErrorFieldDecoder``."""
    lines, decoder = SSELineDecoder(), _ErrorFieldDecoder()
    async for text in response.aiter_text():
        for line in lines.decode(text):
            if (sse := decoder.decode(line)) is not None:
                yield sse


def _server_error(data: str, deltas: int) -> EngineError:
    """An error the server sent in its stream: ``llm_failed`` with its words, or, before
    anything was said, ``LlmContextFull`` when they say the context is full (llama.cpp
    answers so in the stream when prompt and reply outgrow it)."""
    message = f"LLM server error: {_snippet(data)}"
    if not deltas and any(words in data.lower() for words in CONTEXT_FULL):
        return LlmContextFull(message)
    return EngineError("llm_failed", message)


def _choices(chunk: dict[str, Any], data: str) -> list[tuple[str, str, str | None]]:
    """A chunk's choices as (content, reasoning, finish_reason); a shape no OpenAI-compatible
    server sends is ``llm_failed`` naming it (it raised deep in the gateway, with a
    traceback and Python's words for the client)."""
    choices = chunk.get("choices") or []
    if not isinstance(choices, list):
        raise EngineError("llm_failed", f"malformed LLM chunk ('choices'): {_snippet(data)}")
    out = []
    for choice in choices:
        delta = (choice.get("delta") or {}) if isinstance(choice, dict) else None
        if not isinstance(delta, dict):
            raise EngineError("llm_failed", f"malformed LLM chunk ('delta'): {_snippet(data)}")
        text = delta.get("content") or ""
        thought = delta.get("reasoning_content") or delta.get("reasoning") or ""
        reason = choice.get("finish_reason")
        if not isinstance(text, str) or not isinstance(thought, str) or \
                not isinstance(reason, str | None):
            raise EngineError("llm_failed", f"malformed LLM chunk (not text): {_snippet(data)}")
        out.append((text, thought, reason))
    return out


def _says_something(chunk: dict[str, Any]) -> bool:
    """Whether a chunk (already checked by ``_choices``) is more than a keep-alive: oMLX's
    is a chunk whose delta has a ``role`` and an empty ``content``, and nothing else."""
    if chunk.get("usage") or chunk.get("timings"):
        return True
    return any(choice.get("finish_reason") or
               any(value for key, value in (choice.get("delta") or {}).items() if key != "role")
               for choice in chunk.get("choices") or [])


async def _read_head(response: httpx.Response, limit: int = 2048) -> bytes:
    """The first ``limit`` bytes of a (possibly endless) response body (``ahead``)."""
    return await ahead(response, limit, "llm_failed", "the LLM server")
