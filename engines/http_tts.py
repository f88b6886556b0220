"""A remote TTS server over HTTP: OpenAI-style SSE or mlx-audio's raw PCM stream.

Two wire formats, both answering ``POST <url>`` (``url`` is the full endpoint, or a base
URL to which ``/audio/speech`` is appended):

``format="sse"`` (OpenAI speech streaming; what the hub's old sidecar spoke)
    request ``{"model", "input", "voice", "response_format": "pcm", "stream_format": "sse"}``;
    ``text/event-stream`` of ``speech.audio.delta`` (base64 PCM16 24 kHz),
    ``speech.audio.done`` and, on failure, ``speech.audio.error``. Parsed with ``httpx-sse``.
``format="pcm"`` (mlx-audio's server)
    request ``{..., "response_format": "pcm", "stream": true, "streaming_interval": 0.32}``;
    a chunked body of raw PCM16 LE.

Style instructions (the HTTP API's ``instructions``, ``SynthesisRequest.options``) go on as
OpenAI's ``instructions`` (SSE: OpenAI's gpt-4o-mini-tts takes them, and so does another
gateway) or mlx-audio's ``instruct`` (``pcm``; its server ignores an ``instructions`` it does
not know), unless the engine's ``instructions`` option says the server does not take them
(by default: not to OpenAI's ``tts-1`` and ``tts-1-hd``, which its reference says they do
not work with). The server may still ignore them: a gateway says so in its
``speech.audio.done`` event's ``notes``, which the stream keeps (``notes``) for the HTTP API
to pass on.

One ``step`` returns the next piece of audio as it arrives (one SSE delta, or one network
chunk of the raw body), so the lane is not held longer than the server's own pacing. The
synchronous ``httpx.Client`` is shared by all streams of the engine, each request on a
connection of its own (so a cancelled one can be cut: ``HttpTtsStream``); steps run on
the ``remote`` lane's threads, ``parallel_steps`` (8) of them at once (one stalled answer
holds its own job only). ``close()`` closes the response, which closes the
connection mid-body so the server sees the client leave. Both formats are assumed to
carry 24 kHz mono PCM16 (OpenAI's ``pcm`` and mlx-audio's Qwen3-TTS are); a raw body that
is a WAV file after all fails (``engine_failed``) rather than be played as samples.

Errors: transport failures and non-2xx answers raise ``engine_failed`` (timeouts
``engine_timeout``); an error event (``speech.audio.error``, ``"type": "error"`` or an
``event: error`` line) raises ``engine_failed`` with the server's message, and so does an
SSE answer that sends more than ``MAX_EVENT_BYTES`` without ending an event.
"""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Literal

import httpx

from engines.base import (
    EngineError,
    RequestRefused,
    ServerUnreachable,
    SynthesisRequest,
    http_url_fault,
    shown_url,
)
from engines.sse_bound import UNCOMPRESSED, bounded, head, pieces

MAX_EVENT_BYTES = 32 << 20
"""The most an SSE answer may send without ending an event (``engines.sse_bound``). 32 MiB
is 5.8 min of 24 kHz PCM16 in base64 in one event: more than the longest segment (4,000
characters) takes to say, for a server that answers a sentence in one event."""


OPENAI_WITHOUT_INSTRUCTIONS = frozenset({"tts-1", "tts-1-hd"})
"""OpenAI's speech models that its API reference says ``instructions`` do not work with
(whether it then refuses or ignores them, the reference does not say): style instructions
are not sent to them unless the ``instructions`` option asks."""
MAX_NOTES = 8
"""Most notes a stream keeps of a server's ``speech.audio.done`` (``_notes_of``)."""
MAX_NOTE_CHARS = 300
"""Longest note kept; a longer one is cut (a server's text goes into a response header)."""


class HttpTtsEngine:
    name = "http"
    lane = "remote"
    streams = True
    thread_safe = True
    """Its calls may come from several threads at once (``engines.base``)."""

    def __init__(
        self,
        url: str,
        model: str | None = None,
        voice: str | None = None,
        format: Literal["sse", "pcm"] = "sse",
        api_key: str | None = None,
        streaming_interval: float = 0.32,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 20.0,
        reads_digits: bool = True,
        extra_body: dict[str, Any] | None = None,
        parallel_steps: int = 8,
        instructions: bool | None = None,
    ) -> None:
        if format not in ("sse", "pcm"):
            raise ValueError(f"format must be 'sse' or 'pcm', not {format!r}")
        if not (isinstance(parallel_steps, int) and parallel_steps >= 1):
            raise ValueError(f"parallel_steps must be an integer at least 1, not "
                             f"{parallel_steps!r}")
        if (wrong := http_url_fault(url)) is not None:
            # (refused here, as the LLM's url is: without its scheme the gateway started,
            # "loaded", and failed every sentence with engine_failed)
            raise ValueError(f"the http engine's url must be http(s)://host[:port]/path (the "
                             f"speech endpoint or the base it is under), not {wrong}")
        self.parallel_steps = parallel_steps
        """Steps the remote lane runs at once (``gateway.io.lanes``), each waiting for its
        own answer: a stalled answer holds its own job only, and a server that speaks
        several requests at once is asked for them at once."""
        url = url.rstrip("/")
        self.url = url if url.endswith("/audio/speech") else url + "/audio/speech"
        self.model = model
        self.default_voice = voice
        self.format = format
        self.streaming_interval = streaming_interval
        self.reads_digits = reads_digits
        self.extra_body = dict(extra_body or {})
        # (``extra_body`` goes into the request last, so a model named there is the one asked)
        asked = self.extra_body.get("model", model)
        self.instructions = not (isinstance(asked, str) and asked in OPENAI_WITHOUT_INSTRUCTIONS) \
            if instructions is None else instructions
        """Whether style instructions go on to the server (the HTTP API notes them ignored
        otherwise): the ``instructions`` option, by default true but for OpenAI's models
        that do not take them."""
        self.probe_headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._headers = {**UNCOMPRESSED, **self.probe_headers}
        self.probe_url = self.url.removesuffix("/audio/speech") + "/models"
        """What the gateway asks (GET) to tell whether the server answers, at start and
        while /health or /metrics is asked (``gateway.io.telemetry.TtsProbe``): OpenAI's
        model list beside the speech endpoint, which mlx-audio's server and Kokoro-FastAPI
        serve. Any answer below 500 but a 401 or 403 (the key refused or missing) counts (a
        server without the list answers 404, and is there); a synthesis would cost the
        server a model's work at every probe."""
        self.read_timeout_s = read_timeout_s
        """How long a step waits for the server (``engine_timeout`` after it). Below the
        lane's step deadline (``[tts] step_timeout_s``, 30 s; the gateway checks it), so a
        stalled server fails its sentence, which a fallback then speaks, instead of holding
        the lane past its deadline (the lane unhealthy for every session)."""
        self._timeout = httpx.Timeout(read_timeout_s, connect=connect_timeout_s)
        self._client: httpx.Client | None = None
        self._streams: weakref.WeakSet[HttpTtsStream] = weakref.WeakSet()
        self._sockets: weakref.WeakSet[socket.socket] = weakref.WeakSet()
        """The sockets of the client's connections (``interrupt`` cuts them)."""
        self._sockets_lock = threading.Lock()

    def voices(self) -> list[str]:
        return [self.default_voice] if self.default_voice else []

    def load(self) -> None:
        if self._client is None:
            # No cap on connections: each open stream holds one until it ends, and the lane
            # interleaves many on this one thread, so a stream waiting for a free one (past
            # httpx's default 100) waited for what only this thread could free, until its
            # pool timeout. None kept alive: a request on a connection taken from the pool
            # could not be cut while it waited for its answer's headers (the stream knew its
            # socket only from them), so a barge-in waited for a stalled server's read
            # timeout. A connection of its own costs a raw-PCM request 2.3 ms more to its
            # first audio on 127.0.0.1 (3.5 -> 5.8 ms, median; an SSE answer, closed at
            # ``speech.audio.done``, never left its connection for reuse anyway).
            self._client = httpx.Client(
                timeout=self._timeout, headers=self._headers,
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=0))

    def open(self, request: SynthesisRequest) -> HttpTtsStream:
        if self._client is None:
            raise EngineError("engine_failed", "http engine used before load()")
        stream = HttpTtsStream(self._client, self.url, self._body(request), self.format,
                               self._note_socket,
                               request.options.get("first_audio_timeout_s"),
                               self.read_timeout_s,
                               chosen_voice=request.voice not in (None, self.default_voice))
        with self._sockets_lock:  # (opened on several threads at once)
            self._streams.add(stream)
        return stream

    def interrupt(self) -> None:
        """Make a call waiting for the server on the lane thread return now: the gateway is
        closing, and the engine's ``close`` waits behind that call (for a silent server,
        until the read timeout). Cuts every connection (the step in flight fails); safe from
        any thread."""
        with self._sockets_lock:
            sockets = list(self._sockets)
        for sock in sockets:
            _cut(sock)

    def _note_socket(self, sock: socket.socket) -> None:
        """A stream opened a new connection on ``sock`` (``interrupt`` cuts it)."""
        with self._sockets_lock:
            self._sockets.add(sock)

    def close(self) -> None:
        with self._sockets_lock:
            streams = list(self._streams)
        for stream in streams:
            stream.close()
        client, self._client = self._client, None
        if client is not None:
            client.close()

    def _body(self, request: SynthesisRequest) -> dict[str, Any]:
        body: dict[str, Any] = {"input": request.text, "response_format": "pcm"}
        if self.model is not None:
            body["model"] = self.model
        voice = request.voice or self.default_voice
        if voice is not None:
            body["voice"] = voice
        if request.speed != 1.0:
            body["speed"] = request.speed
        for key in ("temperature", "top_p", "seed"):
            if (value := getattr(request, key)) is not None:
                body[key] = value
        if self.instructions and (style := request.options.get("instructions")):
            body["instructions" if self.format == "sse" else "instruct"] = style
        if self.format == "sse":
            body["stream_format"] = "sse"
        else:
            body["stream"] = True
            body["streaming_interval"] = (self.streaming_interval if request.step_ms is None
                                          else request.step_ms / 1000)
        body |= self.extra_body
        body |= request.options.get("http_body", {})
        return body


class HttpTtsStream:
    """One remote synthesis; the request is sent by the first ``step``.

    ``interrupt`` (any thread) makes a step waiting for the server return ``None`` now by
    cutting the stream's connection: the lane calls it when the job is cancelled while its
    step waits (a barge-in during a stalled answer waited out the read timeout, 20 s, and
    the lane with it). The stream knows its connection as it opens it (httpcore's ``trace``
    hook; every request opens one: ``HttpTtsEngine.load``), so it can cut it before the
    answer's headers came too.

    ``first_audio_timeout_s`` (``SynthesisRequest.options``): no audio by then, and the
    connection is cut the same way: the step fails with ``engine_timeout``. So is a step
    that waits ``wait_timeout_s`` (the engine's ``read_timeout_s``) for its piece: httpx's
    read timeout is per read, and a server that stalls but keeps its answer alive with SSE
    comments (sse-starlette pings every 15 s) never let it pass; the step then ran into the
    lane's step deadline, which makes the lane unhealthy for every session."""

    def __init__(self, client: httpx.Client, url: str, body: dict[str, Any], fmt: str,
                 note_socket: Callable[[socket.socket], None],
                 first_audio_timeout_s: float | None = None,
                 wait_timeout_s: float | None = None, *, chosen_voice: bool = False) -> None:
        self._client = client
        self._chosen_voice = chosen_voice
        """The request names a voice of the client's choosing (not the engine's ``voice``):
        a 400, 404 or 422 is then taken for that choice refused (``RequestRefused``). With
        no ``voice`` configured the gateway lists none and lets any through to the server."""
        self._first_audio_timeout_s = first_audio_timeout_s
        self._wait_timeout_s = wait_timeout_s
        self._started_at: float | None = None
        """``time.monotonic()`` when the first step began (for ``first_audio_timeout_s``)."""
        self._waiting_since: float | None = None
        """When the step in flight began (None between steps)."""
        self._watching = False
        """A watchdog timer is armed (``_watch``): one at a time, and only while needed."""
        self._watchdog: threading.Timer | None = None
        self._audio_came = False
        self._late: float | None = None
        """The limit (seconds) after which no audio had come: the connection was cut."""
        self._note_socket = note_socket
        self._url = url
        self._shown_url = shown_url(url)
        """``url`` for messages (no password)."""
        self._body = body
        self._format = fmt
        self._response: httpx.Response | None = None
        self._pieces: Iterator[bytes] | None = None
        self._carry = b""  # an odd trailing byte waits for its partner
        self._done = False
        self._interrupted = False
        self.notes: tuple[str, ...] = ()
        """What the server said the request did not get as asked (another gateway's
        ``speech.audio.done`` ``notes``: instructions its engine ignored, ...), once it
        ended; read by the lane when the job is done (``Lane``, ``JobSink.on_done``)."""
        self._socket: socket.socket | None = None
        """The socket of this stream's connection while the stream uses it."""
        self._socket_lock = threading.Lock()

    def step(self) -> bytes | None:
        if self._done or self._interrupted:
            self.close()
            return None
        try:
            self._wait_starts()
            if self._pieces is None:
                self._pieces = self._start()
            piece = next(self._pieces, None)
            with self._socket_lock:
                self._waiting_since = None
                if piece and self._late is None:
                    self._audio_came = True
            if self._late is not None:  # (it came as the connection was cut)
                raise self._late_error()
        except Exception as exc:
            self.close()
            if self._interrupted:  # (the cut connection's error): nobody wants this audio
                return None
            if self._late is not None and not isinstance(exc, EngineError):
                raise self._late_error() from exc
            if isinstance(exc, EngineError):
                raise
            code = "engine_timeout" if isinstance(exc, httpx.TimeoutException) else \
                "engine_failed"
            error = ServerUnreachable if isinstance(
                exc, httpx.ConnectError | httpx.ConnectTimeout) else EngineError
            raise error(code, f"TTS server {self._shown_url}: {exc!r}") from exc
        if piece is None:
            self.close()
            return None
        data = self._carry + piece
        cut = len(data) & ~1
        self._carry = data[cut:]
        return data[:cut]

    def interrupt(self) -> None:
        """Make the step in flight (if any) return ``None`` now, and every later one: the
        job was cancelled. Safe from any thread."""
        self._interrupted = True
        with self._socket_lock:
            _cut(self._socket)

    def _late_error(self) -> EngineError:
        return EngineError("engine_timeout", f"TTS server {self._shown_url}: no audio within "
                                             f"{self._late:g} s")

    def _wait_starts(self) -> None:
        """A step begins waiting for its piece: watch it (``_check_wait``)."""
        with self._socket_lock:
            now = time.monotonic()
            self._waiting_since = now
            if self._started_at is None:
                self._started_at = now
            if not self._watching:
                self._watch(now)

    def _watch(self, now: float) -> None:
        """Arm the watchdog for the earliest limit that applies (lock held); none: no timer
        (a stream between steps, e.g. ahead of its listener, is not waiting for anyone)."""
        due = self._due()
        self._watching = due is not None
        if due is not None:
            self._watchdog = threading.Timer(max(0.0, due[0] - now), self._check_wait)
            self._watchdog.daemon = True
            self._watchdog.start()

    def _due(self) -> tuple[float, float] | None:
        """When the wait for audio passes a limit, and that limit: the first audio's
        (``first_audio_timeout_s``, from the first step), the step's (``wait_timeout_s``)."""
        limits = []
        if self._first_audio_timeout_s is not None and not self._audio_came and \
                self._started_at is not None:
            limits.append((self._started_at + self._first_audio_timeout_s,
                           self._first_audio_timeout_s))
        if self._wait_timeout_s is not None and self._waiting_since is not None:
            limits.append((self._waiting_since + self._wait_timeout_s, self._wait_timeout_s))
        return min(limits, default=None)

    def _check_wait(self) -> None:
        """(timer thread) Cut the connection if a limit passed with no audio; else watch on
        (a later step began since the timer was armed, or audio came)."""
        with self._socket_lock:
            if self._done:
                self._watching = False
                return
            now = time.monotonic()
            due = self._due()
            if due is not None and now >= due[0]:
                self._watching = False
                self._late = due[1]
                _cut(self._socket)
                return
            self._watch(now)

    def close(self) -> None:
        self._done = True
        with self._socket_lock:
            watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.cancel()
        response, self._response = self._response, None
        if response is not None:
            response.close()
        with self._socket_lock:
            self._socket = None

    def _trace(self, event: str, info: dict[str, Any]) -> None:
        """httpcore's ``trace`` extension, on the thread of the request: note the socket of
        the connection this stream opens, and forget it as the answer closes (``interrupt``
        after that has nothing to cut)."""
        if event == "connection.connect_tcp.complete":
            sock = info["return_value"].get_extra_info("socket")
            if sock is not None:
                self._note_socket(sock)
                with self._socket_lock:
                    self._socket = sock
                    interrupted = self._interrupted or self._late is not None
                if interrupted:  # (interrupted, or late, while it connected)
                    _cut(sock)
        elif event == "http11.response_closed.started":
            with self._socket_lock:
                self._socket = None

    def _start(self) -> Iterator[bytes]:
        request = self._client.build_request(
            "POST", self._url, json=self._body,
            extensions={"trace": self._trace})  # (the stream and the engine note sockets)
        response = self._client.send(request, stream=True)
        self._response = response
        if self._interrupted:
            return iter(())  # (the step returns None)
        if self._late is not None:
            raise self._late_error()
        if response.status_code >= 400:
            detail = _head(response)
            message = f"TTS server {self._shown_url} answered {response.status_code}: {detail}"
            if self._chosen_voice and response.status_code in (400, 404, 422):
                raise RequestRefused("engine_failed", message)
            raise EngineError("engine_failed", message)
        if self._format == "sse":
            return self._sse_audio(response)
        ctype = response.headers.get("content-type", "")
        if ctype.startswith(("application/json", "text/")):
            detail = _head(response)
            raise EngineError("engine_failed", f"TTS server sent {ctype}, not PCM: {detail}")
        # as it arrives, decoded (a gzip body is not PCM), a bounded piece at a time
        return _pcm_of(pieces(response, "engine_failed", "the TTS server"))

    def _sse_audio(self, response: httpx.Response) -> Iterator[bytes]:
        from httpx_sse import EventSource

        answer, bound = bounded(response, MAX_EVENT_BYTES, "engine_failed", "the TTS server")
        for sse in EventSource(answer).iter_sse():
            bound.event_read()
            if sse.event == "error":  # (its data may be JSON or plain text)
                raise EngineError("engine_failed", f"TTS server error: {_error_message(sse.data)}")
            if not sse.data or sse.data == "[DONE]":
                continue
            event = json.loads(sse.data)
            kind = event.get("type", sse.event)
            if kind == "speech.audio.delta":
                yield base64.b64decode(event.get("audio", ""))
            elif kind == "speech.audio.done":
                self.notes = _notes_of(event)
                return
            elif kind in ("speech.audio.error", "error"):
                raise EngineError("engine_failed", f"TTS server error: {_error_message(event)}")
        raise EngineError(
            "engine_failed", "TTS server ended the SSE stream without speech.audio.done"
        )


def _head(response: httpx.Response) -> str:
    """The start of an error answer's body, for its message (``head``)."""
    return head(response, 300, "engine_failed", "the TTS server").decode("utf-8", "replace")


def _error_message(event: Any) -> str:
    """The reason an SSE error event gives: ``{"error": {"message"}}``, ``{"message"}``, or
    its data as it is (``event: error`` with plain text)."""
    if isinstance(event, str):
        try:
            event = json.loads(event)
        except ValueError:
            return event
    err = event.get("error", event) if isinstance(event, dict) else event
    if isinstance(err, dict):
        return str(err.get("message", json.dumps(err)))
    return str(err)


def _notes_of(event: dict[str, Any]) -> tuple[str, ...]:
    """The ``notes`` of a ``speech.audio.done`` event (a gateway's), bounded: the first
    ``MAX_NOTES`` strings, each cut to ``MAX_NOTE_CHARS``; anything else in their place is
    left out."""
    notes = event.get("notes")
    if not isinstance(notes, list):
        return ()
    return tuple(note[:MAX_NOTE_CHARS] for note in notes[:MAX_NOTES] if isinstance(note, str))


def _pcm_of(pieces: Iterator[bytes]) -> Iterator[bytes]:
    """The samples of a raw-PCM body as they come. A body that is a WAV file instead (a
    server that ignores ``response_format``) fails the sentence (``engine_failed``, which a
    fallback then speaks) rather than be played: its header was a loud click at the
    sentence's start ("RIFF" is 18,770 as a sample), and its rate may not be 24 kHz."""
    head = b""
    for piece in pieces:
        head += piece
        if len(head) >= 12:
            break
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        raise EngineError("engine_failed", "TTS server sent a WAV file, not raw PCM: the http "
                          "engine plays 24 kHz mono 16-bit PCM; set the server to answer "
                          "response_format pcm as it is")
    if head:
        yield head
    yield from pieces


def _cut(sock: socket.socket | None) -> None:
    """End both directions of ``sock``'s connection (if any): a call blocked reading it on
    another thread returns now (``interrupt``). Closed already: nothing to do."""
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
