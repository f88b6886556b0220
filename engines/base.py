"""The interfaces every TTS engine and LLM backend implements, and the one error type.

Engines never know about sessions or sockets. A TTS engine turns one piece of text into a
*stream* of PCM16 chunks; the gateway's lane worker advances that stream one step at a
time (``SynthesisStream.step``) on the lane's single worker thread, so it can switch to a
more urgent job between two steps. An LLM backend turns a chat request into an async
stream of text deltas followed by one final ``LlmDone``.

Every engine emits **PCM16 little-endian mono at 24,000 Hz** (``OUTPUT_RATE``); an engine
whose model runs at another rate resamples inside its stream.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

OUTPUT_RATE = 24_000
"""Sample rate of every chunk an engine returns, in Hz."""
SPEED_ANY = (0.0, float("inf"))
"""``speed_range`` of an engine that does not declare one: it honours any speed."""

Lane = Literal["gpu", "ane", "cpu", "remote"]


class EngineError(Exception):
    """Any failure of an engine or LLM backend, mapped at the boundary.

    ``code`` is a stable, machine-readable word (``engine_failed``, ``engine_timeout``,
    ``engine_runaway``, ``llm_unavailable``, ``llm_failed``, ...): the logs, ``/health`` and
    the HTTP API's errors show it as it is; a voice client's ``error`` event has it when
    protocol.md lists it, else ``engine_failed`` or ``llm_failed`` with the code leading
    the message (``gateway.core.session.SYNTHESIS_ERROR_CODES``). Library errors are
    chained with ``raise EngineError(...) from exc``.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class RequestRefused(EngineError):
    """The engine's server refused one request for what it asks (a voice a client chose that
    the server lacks), not for being unwell: a fallback speaks the sentence without counting
    it against the primary's breaker, so one client's choice does not move every session
    onto the fallback."""


class ServerUnreachable(EngineError):
    """An engine's server could not be reached (connection refused, no route, connect
    timeout), as opposed to one that answered wrongly: a probe that reaches the server
    again says it is back (``gateway.io.lanes.Lane.server_answers``; an LLM's
    ``llm_unavailable``, ``gateway.io.server.Gateway.llm_probed``)."""


class LlmContextFull(EngineError):
    """The LLM server refused a request as longer than its context window: the prompt must
    shrink before it can answer (the session forgets its oldest turns). An ``llm_failed``
    when nothing is left to forget."""

    def __init__(self, message: str) -> None:
        super().__init__("llm_failed", message)


@dataclass(frozen=True, slots=True)
class SynthesisRequest:
    """One piece of text to speak, with the per-request knobs an engine may honour."""

    text: str
    voice: str | None = None
    speed: float = 1.0
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    """Engine-specific knobs. ``first_audio_timeout_s``: seconds within which the first
    audio must come, for an engine that waits on a server (``http``; others ignore it):
    later, its step fails with ``engine_timeout`` (a fallback engine's probe asks it)."""
    step_ms: float | None = None
    """Audio per step the lane would like, in ms (None: the engine's default). A streaming
    engine honours it as closely as its frame size allows (Qwen3-TTS: whole 80 ms codec
    frames); one that cannot ignores it. The lane asks for small steps for background work
    so that interactive work arriving meanwhile waits less (``gateway.core.scheduler``)."""


@runtime_checkable
class SynthesisStream(Protocol):
    """One synthesis in progress. Not thread-safe: only the lane's worker thread calls it."""

    def step(self) -> bytes | None:
        """Run one step and return its PCM16 chunk (24 kHz mono), or ``None`` when done.

        Blocking; may take as long as one model step. An empty ``bytes`` is allowed (a
        step that produced no audio). Raises ``EngineError`` on failure.
        """
        ...

    def close(self) -> None:
        """Stop early and free what the stream holds. Idempotent; safe after the end."""
        ...

    def interrupt(self) -> None:
        """Called from the event loop's thread when the stream's job is cancelled while its
        step runs. A stream whose step may wait on I/O (``http``) makes that step (and every
        later one) return ``None`` now, so a barge-in does not wait for a stalled server; a
        failure it causes is not an engine failure (no error raised). One whose steps do
        not wait has nothing to cut (``Uninterruptible``): its step ends at its chunk."""
        ...


@runtime_checkable
class TtsEngine(Protocol):
    """A text-to-speech engine. Created by ``engines.registry.create_engine``."""

    name: str
    lane: Lane

    @property
    def streams(self) -> bool:
        """True when a step is a bounded chunk; False when one step is the whole segment."""
        ...

    @property
    def reads_digits(self) -> bool:
        """True when the engine reads numbers, symbols and abbreviations itself."""
        ...

    # Optional: ``timing``, a dict of the engine's measured costs for placing turns between
    # lanes (``gateway.core.placement.profile_from``): ``first_s`` (time to first audio on a
    # free lane), ``rtf`` (lane seconds per audio second) and, for an engine that shares the
    # GPU with the LLM, ``first_s_llm``/``rtf_llm`` while the LLM decodes.
    # Optional: ``max_open_streams``, for an engine whose open streams hold much memory (an
    # in-process model's caches): its lane opens no more at once, and a sentence not started
    # waits for one to end (``gateway.core.scheduler`` rule 6; ``[tts] max_open_streams``).
    # Optional: ``one_stream_at_a_time = True`` for an engine that refuses a second open
    # stream (``engine_busy``); its lane then runs whole jobs in arrival order instead of
    # interleaving their steps (``gateway.io.server``).
    # Optional: ``speed_range = (lo, hi)``, the speeds the engine honours (it clamps to
    # them); absent: it honours any speed the API takes; ``None``: it ignores speed. The HTTP
    # API says so in ``X-Speech-Notes`` instead of silently speaking at another pace.
    # Optional: ``parallel_steps``, for an engine whose steps mostly wait for a server
    # (``http``): its lane runs that many jobs' steps at once, on as many threads
    # (``gateway.io.lanes``); absent: 1. Such an engine must be ``thread_safe``.
    # Optional: ``thread_safe = True``, for an engine whose calls may come from several
    # threads at once (it serialises what must be: espeak's one synthesis at a time). A
    # fallback engine keeps its primary's ``parallel_steps`` only behind such a fallback.
    # Optional: ``streams_always``, for a wrapper whose ``streams`` is only its engine of the
    # moment (``FallbackEngine``): False when another engine behind it makes a segment in
    # one step (see ``streams_always`` below).

    def voices(self) -> list[str]:
        """Names of the voices this engine can speak with."""
        ...

    def load(self) -> None:
        """Load models and warm up. Blocking; called once on the engine's lane thread."""
        ...

    def open(self, request: SynthesisRequest) -> SynthesisStream:
        """Begin a synthesis. Cheap; the work happens in ``step``. Lane thread only."""
        ...

    def close(self) -> None:
        """Release models and threads. Idempotent."""
        ...

    def interrupt(self) -> None:
        """Called from the event loop's thread when the gateway closes. An engine whose call
        may wait on I/O (``http``) makes the call in flight on the lane thread return now
        (it may fail), so that ``close`` does not wait behind it; one whose calls do not
        wait has nothing to cut (``Uninterruptible``)."""
        ...


class Uninterruptible:
    """The ``interrupt`` of an engine or stream whose calls do not wait on I/O (a model step,
    espeak): nothing to cut, the step in flight ends at its chunk. A mixin, so that the
    engines that must cut something cannot leave ``interrupt`` out (or misspell it) and be
    skipped without a word: the protocols above require it."""

    def interrupt(self) -> None:
        """Nothing to do."""


def streams_always(engine: TtsEngine) -> bool:
    """False when some segment on ``engine`` may be made in one step: it does not stream,
    or it is a wrapper with such an engine behind it (chatterbox as qwen3's fallback). A
    voice like that holds its lane for a whole segment, and the gateway then cuts shorter
    segments (``gateway.core.segmenter.ONE_STEP_MAX_CHARS``)."""
    return bool(getattr(engine, "streams_always", engine.streams))


# --- LLM backends -----------------------------------------------------------------------


THINKING_MODES = ("tagged", "opened")
"""How a reasoning model's thoughts show in its content (``[llm] thinking``): ``tagged``,
between ``<think>`` and ``</think>``; ``opened``, the chat template opens ``<think>`` in the
prompt (DeepSeek-R1 distills, QwQ), so the stream starts inside a thought and only its
``</think>`` comes (``engines.llm_openai.ThinkFilter``)."""


@dataclass(frozen=True, slots=True)
class LlmRequest:
    messages: list[dict[str, str]]
    model: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class LlmDelta:
    text: str


@dataclass(frozen=True, slots=True)
class LlmDone:
    finish_reason: str | None = None
    tokens_per_s: float | None = None
    """Decode rate as reported by the server's usage (never inferred from chunk counts)."""
    usage: dict[str, Any] | None = None
    thought_chars: int = 0
    """Characters of thought the reply had (``reasoning_content``, ``<think>``), not said."""


LlmEvent = LlmDelta | LlmDone


class LlmBackend(Protocol):
    name: str

    def stream(self, request: LlmRequest) -> AsyncGenerator[LlmEvent, None]:
        """Stream the reply: ``LlmDelta`` items, then exactly one ``LlmDone``.

        Raises ``EngineError`` (``llm_unavailable``, ``llm_failed``) instead of library
        errors. Cancelling the consuming task closes the HTTP stream (safe to cancel).
        """
        ...

    async def aclose(self) -> None: ...


def shown_url(url: str) -> str:
    """``url`` as errors, logs and ``/health`` show it: without the password of a
    ``user:password@`` part (an LLM or TTS server behind a proxy with basic auth).
    ``/health`` is open to anyone who reaches the port, and errors go to every client."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    user, _, host = parts.netloc.rpartition("@")
    return parts._replace(netloc=f"{user.partition(':')[0]}:***@{host}").geturl()


def http_url_fault(url: str) -> str | None:
    """What keeps ``url`` from naming an HTTP server, as a refusal at start shows it (no
    password), or None. Checked at start: a url without its scheme started a gateway that
    failed every turn, and a port out of range (``:99999``, which httpx takes) one that
    could never connect; httpx's own ``InvalidURL`` (``:abc``) was a traceback."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as exc:  # a broken [IPv6] (and no password to hide from it)
        return f"{url!r} ({exc})"
    try:
        if parts.scheme in ("http", "https") and parts.hostname and parts.port != 0:
            return None
    except ValueError as exc:  # a port out of range or not a number
        return f"{shown_url(url)!r} ({exc})"
    return repr(shown_url(url))


LOST_AS_MADE = "the connection was lost as it was made"
"""How a connection lost as it was made (``NewConnectionWatch.lost_as_made``) is told."""


class NewConnectionWatch:
    """httpcore's ``trace`` extension for one async request (``extensions={"trace":
    watch}``): ``reused`` until a new connection is made for it, and ``made`` from when
    one is made until the request starts going out on it."""

    def __init__(self) -> None:
        self.reused = True
        self.made = False

    async def __call__(self, name: str, info: dict[str, Any]) -> None:
        if name.startswith("connection.connect_"):
            self.reused = False
            self.made = name.endswith(".complete")
        elif name.endswith(".send_request_headers.started"):
            self.made = False

    def lost_as_made(self, exc: BaseException) -> bool:
        """Whether ``exc``, out of the request, is an ``AttributeError`` raised between a
        new connection made and the request going out: anyio's ``'NoneType' object has no
        attribute 'getpeername'``, which comes of a connection reset (a server killed) as
        it was made: uvloop's transport has no socket left when httpcore asks the
        connection its ``ssl_object``, and anyio builds every attribute from ``None``
        (httpcore maps only ``OSError``). The server is out of reach."""
        return self.made and isinstance(exc, AttributeError)
