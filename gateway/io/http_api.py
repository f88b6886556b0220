"""The gateway's HTTP API: OpenAI-compatible speech for every app on the hub, plus health,
metrics and what is loaded. Starlette on uvicorn, in the gateway's own process and event
loop, so HTTP speech shares the loaded engine (and its lane) with the voice sessions: the
primary engine's, unless only a second engine (``tts.also``) has the requested voice.

Routes (docs/http-api.md has the details and examples):

* ``POST /v1/audio/speech``: text in, audio out as OpenAI's ``response_format``s: ``wav``,
  ``pcm`` (PCM16 24 kHz mono), ``mp3``, ``opus``, ``aac``, ``flac`` (``gateway.core.
  audio_formats``), streamed as it is made (chunked, as OpenAI's endpoint does), as a whole
  file (``"stream": false``) or as OpenAI SSE (``"stream_format": "sse"``, PCM only);
* ``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /v1/audio/voices``, ``GET /health``,
  ``GET /metrics``.

Auth: with tokens configured (``config.server.tokens``, the voice socket's), every route
but ``GET /health`` needs one (``Authorization: Bearer``, as OpenAI clients send it, or
``?token=``); otherwise 401 with an OpenAI-style error (``invalid_api_key``). ``/health``
stays open for load balancers and probes; it reveals counts and versions, not content.

A speech request becomes one lane job per segment (``Segmenter``), all owned by the request
and run in order at ``Priority.BACKGROUND`` (voice sessions go first). Its sink,
``SpeechStream``, feeds a queue the response reads from. Backpressure: the next segment is
submitted only once the reader has drained the queue to ``LOW_WATER_CHUNKS``; if a single
segment still piles up more than ``MAX_BUFFERED_S`` of unread audio while the response waits
for its client to take what was sent, the request fails with ``slow_consumer`` (the lane is
never held for one slow reader). Audio waiting for the gateway's own encoder is not the
client's: a whole file, or a fast client, never fails so. A client that disconnects
cancels its jobs (``lane.cancel(owner)``) at once.

The compressed formats cost CPU (8-13.5 ms per second of audio, 9-10 for mp3, the default;
one 80 ms chunk 0.6-1.3 ms, a sentence-sized one, as chatterbox or an ``http`` upstream
gives, 11-19 ms and up to 48 ms; bench/http_speech.py): they are encoded on one worker
thread (``HttpServer.encoder_thread``), a chunk at a time and in order, never on the event
loop that paces every voice session. PCM and WAV cost nothing and stay on the loop.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import functools
import importlib.util
import itertools
import logging
import reprlib
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, MutableMapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import h11
import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from engines.base import OUTPUT_RATE, SPEED_ANY, SynthesisRequest, streams_always
from gateway.core.audio_formats import FORMATS, Encoder
from gateway.core.codec import blank
from gateway.core.scheduler import Job, Priority, step_ms
from gateway.core.segmenter import ONE_STEP_MAX_CHARS, Segmenter, SegmenterConfig
from gateway.core.session import listed_voice
from gateway.io.aio import unless_stopped
from gateway.io.auth import (
    API_UNAUTHORIZED,
    CHALLENGE,
    empty_lines_end,
    invalid_host,
    refused_host,
    refused_origin,
    token_ok,
    tokens_from,
)
from gateway.io.lanes import Lane, LaneThread, SynthesisJob
from gateway.io.listen import listening_sockets, note_plain_http
from gateway.io.log_limit import limited, log_refused, peer_text
from gateway.io.spool import Spool
from gateway.io.telemetry import CONTENT_TYPE as METRICS_CONTENT_TYPE

if TYPE_CHECKING:
    from gateway.io.server import Gateway

log = logging.getLogger(__name__)

MAX_INPUT_CHARS = 4096
"""Longest ``input`` accepted (OpenAI's own limit for this endpoint)."""
MAX_BODY_BYTES = 64 * 1024
"""Longest request body read; beyond it the request is refused with 413."""
HEADER_TIMEOUT_S = 10.0
"""Longest wait for a request's headers (``_H11``): then the connection is closed."""
BODY_TIMEOUT_S = 10.0
"""Longest wait for a request's whole body; then 408 ``request_timeout``."""
SEND_TIMEOUT_S = 60.0
"""Longest a response may wait for its client to take anything (its socket full, the
server's writes paused); then the connection is aborted. A client playing the answer in
real time takes some every few seconds whatever the format."""
HAS_PYAV = importlib.util.find_spec("av") is not None
"""PyAV encodes the compressed formats. A core dependency; a gateway whose environment
lacks it (code updated without ``pip install``) refuses them with a 400 naming the fix."""
SPEED_RANGE = (0.25, 4.0)
SHOWN_CHARS = 100
"""Most of a refused value an error message quotes (``_shown``)."""
BYTES_PER_S = OUTPUT_RATE * 2
MAX_BUFFERED_S = 60.0
"""Unread audio one response may hold, while its client holds it up, before it fails with
``slow_consumer``."""
MAX_SERVER_NOTES = 8
"""Most notes one answer passes on from an ``http`` engine's server (each at most
``engines.http_tts.MAX_NOTE_CHARS``): they go into ``X-Speech-Notes``. Unbounded, a server
saying something new at each segment made a 40-segment answer's header ~100 KB (320
notes), past what a proxy takes (nginx's ``proxy_buffer_size``: 4 or 8 KiB by default)."""
LOW_WATER_CHUNKS = 8
"""The next segment is submitted once the reader has this few chunks left unread."""
WHOLE_SLICE_BYTES = 64 * 1024
"""A whole file goes to the server this much at a time (``_slices``): the size of the
server's write buffer, past which a ``send`` waits for the client."""
SHUTDOWN_GRACE_S = 2
"""How long a shutdown lets clients take the answers being sent (``HttpServer.aclose``)
before it aborts their connections."""
SERVING = ("ok", "degraded")
"""``/health`` statuses answered 200: "degraded" serves, with a fallback standing in."""
OPENAI_VOICES = frozenset({"alloy", "ash", "ballad", "cedar", "coral", "echo", "fable", "marin",
                           "nova", "onyx", "sage", "shimmer", "verse"})
"""OpenAI's built-in voice names. Apps written for OpenAI send one of them; where the engine
has no voice of that name, the gateway's default voice speaks (with a note) instead of
refusing every request of such an app."""


# ---- errors -------------------------------------------------------------------------------


def origin_form(target: str) -> tuple[str, str] | None:
    """A request target in absolute form (``http://host:port/path?query``: RFC 9112 3.2.2,
    what a client set to go through a proxy sends) as its host (``Host``'s value, which the
    target's replaces) and its path with its query; None for any other target, or one
    without a host."""
    scheme, sep, rest = target.partition("://")
    if not sep or scheme.lower() not in ("http", "https", "ws", "wss"):
        return None
    end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    host, path = rest[:end].rpartition("@")[2], rest[end:]
    if not host:
        return None
    return host, path if path.startswith("/") else "/" + path


def openai_error(status: int, code: str, message: str,
                 param: str | None = None) -> dict[str, Any]:
    """The ``error`` object of OpenAI's error shape, ``{"message", "type", "param",
    "code"}``, for every error either port answers (and the SSE ``speech.audio.error``
    event's): ``type`` ``server_error`` for a 5xx, else ``invalid_request_error``, as
    OpenAI's are. The voice port's refusals had ``code`` and ``message`` alone, so the
    ``openai`` SDK read their ``type`` and ``param`` as None."""
    return {"message": message,
            "type": "server_error" if status >= 500 else "invalid_request_error",
            "param": param, "code": code}


class ApiError(Exception):
    """An OpenAI-style error: ``{"error": {"message", "type", "param", "code"}}``
    (``openai_error``)."""

    def __init__(self, status: int, message: str, *, code: str,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param

    def response(self, headers: dict[str, str] | None = None) -> Response:
        return _json(self.status,
                     {"error": openai_error(self.status, self.code, self.message, self.param)},
                     headers=headers)


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json",
                    headers={"Cache-Control": "no-store", **(headers or {})})


def _notes_header(notes: list[str]) -> str:
    """``X-Speech-Notes``: the notes in ASCII, anything beyond it escaped (``\\u0141``). A
    note may quote a voice named after its reference file (``Łucja``): a header carries
    latin-1 at most, and that one failed the whole response (a plain-text 500)."""
    return "; ".join(notes).encode("ascii", "backslashreplace").decode("ascii")


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother = 3, SHOWN_CHARS, SHOWN_CHARS
"""``_shown``'s repr of a value that is not a string: lists and objects shown 3 levels deep."""


def _shown(value: Any) -> str:
    """``value`` quoted for an error message, cut after ``SHOWN_CHARS`` (as an unknown
    route is): a refusal names what it refused, but a 60,000-character voice came back
    whole, and went whole into the request's log line."""
    if isinstance(value, str) and len(value) > SHOWN_CHARS:
        return f"{value[:SHOWN_CHARS]!r}... ({len(value)} characters)"
    # (repr of a JSON nested 1,000 levels deep, which the body may be, raised RecursionError:
    # a 500 for a 400)
    text = repr(value) if isinstance(value, str) else _SHOWN.repr(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}..."


# ---- the request ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SpeechParams:
    input: str
    model: str | None
    voice: str | None
    response_format: str
    stream_format: str  # "sse" or "audio"
    stream: bool  # audio as it is made (chunked transfer), as OpenAI's endpoint does
    speed: float
    seed: int | None
    temperature: float | None
    instructions: str | None
    notes: tuple[str, ...] = ()
    """What the client should know of how its request was read (X-Speech-Notes)."""

    @property
    def mode(self) -> str:
        return _mode(self.stream_format, self.stream)


def _mode(stream_format: str, stream: bool) -> str:
    """How a response goes out (the ``stream`` label): ``sse``, ``chunked`` or ``whole``."""
    if stream_format == "sse":
        return "sse"
    return "chunked" if stream else "whole"


def asked_labels(body: Any) -> tuple[str, str]:
    """The ``format`` and ``stream`` labels of a speech request refused after its body was
    read: the format and mode it asked for (or would have had by default), when they are
    ones this gateway serves, else ``-`` (a label never takes the client's own string: one
    client could make a series per request)."""
    if not isinstance(body, dict):
        return "-", "-"
    try:
        stream_format, response_format, stream = _formats(body)
    except ApiError:
        return "-", "-"
    return response_format, _mode(stream_format, stream)


def default_format(stream_format: str) -> str:
    """The ``response_format`` of a request that names none (or ``null``): OpenAI's, ``mp3``.
    Apps written for OpenAI leave it out and take the bytes for MP3: they save them as
    ``.mp3`` (Open WebUI's speech cache), forward them as ``audio/mpeg`` (LibreChat) or
    append them to a ``MediaSource`` buffer of ``audio/mpeg`` (LibreChat's streamed
    playback), which no WAV can enter; Kokoro-FastAPI, openedai-speech, Speaches and
    mlx-audio answer them with mp3 too (docs/http-api.md, Formats). SSE carries PCM only;
    without PyAV (a core dependency, so a broken install) the default stays ``wav`` rather
    than refusing the request."""
    if stream_format == "sse":
        return "pcm"
    return "mp3" if HAS_PYAV else "wav"


def parse_speech(body: Any, gateway: Gateway) -> SpeechParams:
    """Validate a speech request body; raises ``ApiError`` (400) naming the bad parameter
    (the first, in this order, of a body with several)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object", code="invalid_json")
    text = _input(body)
    model = _string(body, "model")
    voice, notes = _voice(body, gateway)
    stream_format, response_format, stream = _formats(body)
    speed = _number_in(body, "speed", *SPEED_RANGE)
    seed = _integer(body, "seed")
    temperature = _number_in(body, "temperature", 0, 2)
    instructions = _string(body, "instructions")
    return SpeechParams(input=text, model=model, voice=voice, response_format=response_format,
                        stream_format=stream_format, stream=stream,
                        speed=1.0 if speed is None else speed, seed=seed, temperature=temperature,
                        instructions=instructions or None, notes=tuple(notes))


def _input(body: dict[str, Any]) -> str:
    """The text to speak: a string, not blank, at most ``MAX_INPUT_CHARS``."""
    text = body.get("input")
    if text is not None and not isinstance(text, str):
        raise ApiError(400, "'input' must be a string: the text to speak", code="invalid_type",
                       param="input")
    if not text or blank(text):
        raise ApiError(400, "'input' is required: the text to speak" if not text or
                       not text.strip() else "'input' has invisible characters only: the "
                       "text to speak", code="missing_input", param="input")
    if len(text) > MAX_INPUT_CHARS:
        raise ApiError(400, f"'input' is {len(text)} characters; the limit is "
                       f"{MAX_INPUT_CHARS}", code="string_above_max_length", param="input")
    return text


def _voice(body: dict[str, Any], gateway: Gateway) -> tuple[str | None, list[str]]:
    """The voice asked for (None: the default) and the note to send with it: one of
    OpenAI's names that no engine has stands for the default voice."""
    voice = body.get("voice")
    if isinstance(voice, dict) and "id" in voice:  # OpenAI's custom-voice form {"id": ...}
        voice = voice["id"]
    if voice is None:
        return None, []
    if not isinstance(voice, str):
        raise ApiError(400, "'voice' must be a string (or an object with a string 'id')",
                       code="invalid_type", param="voice")
    if not gateway.voices:
        return voice, []
    listed = listed_voice(voice, gateway.voices)
    if listed is not None:
        return listed, []
    if voice.lower() not in OPENAI_VOICES:
        raise ApiError(400, f"unknown voice {_shown(voice)}; GET /v1/audio/voices lists the "
                       f"{len(gateway.voices)} available", code="unknown_voice",
                       param="voice")
    return None, [f"voice {voice!r} is OpenAI's; the gateway's default voice "
                  f"{gateway.default_voice!r} spoke"]


def _formats(body: dict[str, Any]) -> tuple[str, str, bool]:
    """``stream_format``, ``response_format`` and ``stream``, each defaulted when absent or
    null, and a combination this gateway can answer."""
    stream_format = body.get("stream_format")
    if stream_format is None:  # absent or null: the default
        stream_format = "audio"
    if stream_format not in ("sse", "audio"):
        raise ApiError(400, "'stream_format' must be 'sse' or 'audio', not "
                       f"{_shown(stream_format)}", code="unsupported_stream_format",
                       param="stream_format")
    response_format = body.get("response_format")
    if response_format is None:  # absent or null: the default ("" or false are refused)
        response_format = default_format(stream_format)
    if not isinstance(response_format, str) or response_format not in FORMATS:
        raise ApiError(400, f"response_format {_shown(response_format)} is not supported; use "
                       f"{', '.join(FORMATS)}", code="unsupported_format",
                       param="response_format")
    if FORMATS[response_format].container is not None and not HAS_PYAV:
        raise ApiError(400, f"this gateway cannot encode {response_format}: PyAV is not "
                       "installed (pip install av, or reinstall the gateway); use wav or pcm",
                       code="unsupported_format", param="response_format")
    stream = body.get("stream")
    if stream is None:  # OpenAI's endpoint streams its body; "stream": false waits for all
        stream = True
    if not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be a boolean", code="invalid_type", param="stream")
    if stream_format == "sse" and response_format != "pcm":
        raise ApiError(400, "SSE deltas carry base64 PCM16; use response_format 'pcm' with "
                       "stream_format 'sse'", code="unsupported_format", param="response_format")
    return stream_format, response_format, stream


def _string(body: dict[str, Any], name: str) -> str | None:
    """``body[name]``, a string, None when absent or null (``invalid_type`` otherwise)."""
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise ApiError(400, f"'{name}' must be a string", code="invalid_type", param=name)
    return value


def _integer(body: dict[str, Any], name: str) -> int | None:
    """``body[name]``, an integer (``1.0`` too: JSON does not tell 1 from 1.0), None when
    absent or null (``invalid_type`` otherwise)."""
    value = body.get(name)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise ApiError(400, f"'{name}' must be an integer", code="invalid_type", param=name)
    return value


def _json_kind(value: object) -> str:
    """What a JSON value is, in JSON's words: a refusal said "not str", Python's name for
    a client's string."""
    for kind, name in ((bool, "a boolean"), (str, "a string"), (list, "an array"),
                       (dict, "an object")):
        if isinstance(value, kind):
            return name
    return "null" if value is None else "a number"


def _number_in(body: dict[str, Any], name: str, lo: float, hi: float) -> float | None:
    """``body[name]`` as a float from ``lo`` to ``hi``, None when absent or null: a value
    that is not a number is ``invalid_type``, one out of range (NaN too) ``invalid_value``."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ApiError(400, f"'{name}' must be a number, not {_json_kind(value)}",
                       code="invalid_type", param=name)
    if not lo <= value <= hi:
        raise ApiError(400, f"'{name}' must be from {lo} to {hi}, not {value}",
                       code="invalid_value", param=name)
    return float(value)


# ---- the lane sink ------------------------------------------------------------------------


class SpeechFailed(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


@dataclass(frozen=True, slots=True)
class _Failed:
    code: str
    message: str


_DONE = object()
_ids = itertools.count(1)


@dataclass(eq=False)
class SpeechStream:
    """One speech request on the lane: its jobs, their audio queue, its figures.

    A ``JobSink``; the lane calls ``on_audio``/``on_done``/``on_failed`` on the event loop.
    The response reads ``chunks()``. ``close()`` cancels whatever is still queued or running.
    """

    gateway: Gateway
    requests: list[SynthesisRequest]
    lane: Lane
    """Where its jobs run: the primary lane, unless only another engine has the voice."""
    owner: tuple[str, int] = field(default_factory=lambda: ("http", next(_ids)))
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    started: float = field(default_factory=time.perf_counter)
    loop_started: float = field(default_factory=lambda: asyncio.get_running_loop().time())
    audio_bytes: int = 0
    buffered_bytes: int = 0
    compute_s: float = 0.0
    engines: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What the client should know of how it was spoken (X-Speech-Notes, SSE ``done``)."""
    first_audio_s: float | None = None
    finished: bool = False
    failure: _Failed | None = None
    outcome: str = "disconnected"
    """How its response ended, as counted: completed, failed or disconnected."""
    on_client: bool = False
    """The response is waiting for its client to take what was sent (the socket is full):
    only then is the audio it has not taken the client's to answer for (``slow_consumer``).
    Otherwise it waits for the engine or for the gateway's own encoder, which a fast engine
    outruns by far on a long segment (espeak's digits: 70 s of audio in 400 characters)."""
    _next: int = 0
    _waiting_next: bool = False
    _server_notes: int = 0
    """Notes of the engine's server taken so far (at most ``MAX_SERVER_NOTES``)."""

    def start(self) -> None:
        self.gateway.http.opened(self)
        if self.requests:
            self._submit_next()
        else:  # nothing to speak: an empty (valid) answer
            self._finish(_DONE)

    def _submit_next(self) -> None:
        index = self._next
        self._next += 1
        self._waiting_next = False
        self.lane.submit(self.owner, SynthesisJob(self.requests[index], self, index),
                         deadline=self.deadline(None, self.gateway_now()),
                         priority=Priority.BACKGROUND)

    def gateway_now(self) -> float:
        return asyncio.get_running_loop().time()

    def deadline(self, job: Job | None, now: float) -> float:
        """When a listener playing in real time from the start would run out of audio: a
        request far ahead of real time yields the lane to a newer background request."""
        return self.loop_started + self.audio_bytes / BYTES_PER_S

    # JobSink
    def on_audio(self, job: Job, pcm: bytes, engine: str, ready_at: float) -> None:
        if self.finished or not pcm:
            return
        if engine not in self.engines:
            self.engines.append(engine)
        if self.first_audio_s is None:
            self.first_audio_s = ready_at - self.started
        self.audio_bytes += len(pcm)
        self.buffered_bytes += len(pcm)
        if self.on_client and self.buffered_bytes > MAX_BUFFERED_S * BYTES_PER_S:
            self.fail("slow_consumer", f"more than {MAX_BUFFERED_S:.0f} s of audio unread")
            return
        self.queue.put_nowait(pcm)

    def on_done(self, job: Job, truncated: bool = False, notes: tuple[str, ...] = ()) -> None:
        if self.finished:
            return
        for note in notes:  # (each segment's request says it again: once is enough)
            said = f"TTS server: {note}"
            if said not in self.notes and self._server_notes < MAX_SERVER_NOTES:
                self._server_notes += 1
                self.notes.append(said)
        if truncated:
            index = job.payload.index
            after = " (the fallback engine spoke the segments after it)" \
                if index + 1 < len(self.requests) else ""
            self.notes.append(f"segment {index + 1} of {len(self.requests)} was cut short: "
                              "the engine failed mid-sentence, so the rest of that segment is "
                              f"missing{after}")
        if self._next >= len(self.requests):
            self._finish(_DONE)
        else:
            self._waiting_next = True
            self._refill()

    def on_failed(self, job: Job, code: str, message: str) -> None:
        self.gateway.metrics.errors[code] += 1
        self.fail(code, message)

    def add_compute(self, seconds: float) -> None:
        """Lane compute spent on this request (from telemetry's lane observer)."""
        self.compute_s += seconds

    # control
    def fail(self, code: str, message: str) -> None:
        if not self.finished:
            self.lane.cancel(self.owner)
            self._finish(_Failed(code, message))

    def close(self) -> None:
        """Cancel the request's jobs (queued ones now, a running step at its end)."""
        if not self.finished:
            self.lane.cancel(self.owner)
            self.finished = True
        self.gateway.http.closed(self)

    def _finish(self, item: Any) -> None:
        self.finished = True
        if isinstance(item, _Failed):
            self.failure = item
        if item is _DONE and not self.audio_bytes:  # an empty answer, but a valid one
            self.notes.append("nothing was spoken: the input holds nothing the engine could "
                              "say (only marks, emoji or code)")
        self.queue.put_nowait(item)

    def _refill(self) -> None:
        if self._waiting_next and not self.finished and \
                self.queue.qsize() <= LOW_WATER_CHUNKS:
            self._submit_next()

    async def chunks(self) -> AsyncIterator[bytes]:
        """The PCM16 chunks in order; raises ``SpeechFailed``. Safe to cancel (the caller
        then calls ``close()``)."""
        while True:
            item = await self.queue.get()
            if isinstance(item, bytes):
                self.buffered_bytes -= len(item)
                self._refill()
                yield item
            elif item is _DONE:
                return
            else:
                raise SpeechFailed(item.code, item.message)

    def usage(self) -> dict[str, Any]:
        audio_ms = self.audio_bytes / BYTES_PER_S * 1000.0
        chars = sum(len(r.text) for r in self.requests)
        return {"input_tokens": chars, "output_tokens": round(audio_ms / 80.0),
                "total_tokens": chars + round(audio_ms / 80.0),
                "audio_ms": round(audio_ms), "compute_ms": round(self.compute_s * 1000.0, 1),
                "segments": len(self.requests), "engine": ",".join(self.engines) or None}


# ---- the app ------------------------------------------------------------------------------


OPEN_PATHS = frozenset({"/health"})


class AuthMiddleware:
    """Pure ASGI (streaming responses pass through untouched), the voice socket's rules:
    without tokens, a ``Host`` that is not an IP address, ``localhost`` or an allowed name
    is refused (403, on every path: a page whose name was pointed at the hub reads it
    same-origin, with no Origin header); a browser Origin outside ``--origin``'s allowlist
    is refused (403; CORS alone would let a page's simple POST be spoken, only hiding the
    answer); and a request to anything but ``OPEN_PATHS`` must present one of the
    gateway's tokens when any is configured."""

    def __init__(self, app: Any, gateway: Gateway) -> None:
        self.app, self.gateway = app, gateway

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        server = self.gateway.config.server
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        hosts = [v.decode("latin-1") for k, v in scope["headers"] if k == b"host"]
        if (why := refused_host(hosts, self.gateway.hosts)) is not None:
            await self._refuse(ApiError(403, why, code="forbidden_host"), scope, receive, send)
            return
        if scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])  # (a repeated header: its last value)
        origins = [v.decode("latin-1") for k, v in scope["headers"] if k == b"origin"]
        if (why := refused_origin(origins, self.gateway.origins)) is not None:
            await self._refuse(ApiError(403, why, code="forbidden_origin"), scope, receive,
                               send)
            return
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        query = scope.get("query_string", b"").decode("latin-1")
        if not server.tokens or token_ok(tokens_from(authorization, f"?{query}"),
                                         server.tokens):
            await self.app(scope, receive, send)
            return
        await self._refuse(ApiError(401, API_UNAUTHORIZED, code="invalid_api_key"), scope,
                           receive, send, CHALLENGE)

    async def _refuse(self, error: ApiError, scope: MutableMapping[str, Any], receive: Any,
                      send: Any, headers: dict[str, str] | None = None) -> None:
        self.gateway.metrics.errors["unauthorized" if error.status == 401 else error.code] += 1
        if scope["path"] == "/v1/audio/speech":
            _speech_rejected(self.gateway, error)
        else:  # (/metrics without a token, /health under a Host not allowed)
            log_refused(log, scope["path"], peer_text(scope.get("client")), error.status,
                        error.code, error.message)
        await error.response(headers)(scope, receive, send)


def _refuse_speech_now(gateway: Gateway, lane: Lane | None) -> None:
    """Raise the 503 for a speech request the gateway, or ``lane`` (its voice's, once
    known), cannot take now, if it cannot."""
    if gateway.closing:
        raise ApiError(503, "the gateway is shutting down", code="shutting_down")
    if not gateway.ready or (lane is not None and not lane.loaded):
        raise ApiError(503, "the engine is still warming up; retry shortly",
                       code="warming_up")
    if lane is not None and lane.unhealthy is not None:
        raise ApiError(503, f"the engine cannot synthesize now: {lane.unhealthy}",
                       code="engine_unavailable")


def _speech_rejected(gateway: Gateway, error: ApiError,
                     labels: tuple[str, str] = ("-", "-")) -> None:
    """A speech request refused before any synthesis: counted (with ``labels``, its format
    and mode, once its body was read: ``asked_labels``), and its one log line (a few a
    minute of each code: ``LogLimit``)."""
    gateway.telemetry.http_speech.labels(*labels, "rejected").inc()
    log.info("speech rejected: %d %s: %s", error.status, error.code, error.message,
             extra=limited(f"speech {error.code}"))


class SpeechApi:
    """The Starlette app bound to one gateway."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.app = Starlette(routes=[
            Route("/v1/audio/speech", self.speech, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/models/{model_id:path}", self.model, methods=["GET"]),
            Route("/v1/audio/voices", self.voices, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
        ], exception_handlers={HTTPException: _http_error, Exception: self._internal_error})
        self.app.router.redirect_slashes = False  # /v1/audio/speech/: a JSON 404, not a 307
        # CORS outside auth: a browser's preflight carries no token. Browser apps on the hub
        # may call the API from the origins the voice socket admits (auth.origin_allowlist:
        # any with tokens, none without, unless --origin)
        origins = gateway.origins
        self.asgi = CORSMiddleware(
            AuthMiddleware(self.app, gateway),
            allow_origins=["*"] if origins is None else list(origins),
            # any header: OpenAI's JS SDK adds its own (x-stainless-*); no cookies are used
            allow_methods=["GET", "POST"], allow_headers=["*"],
            # Retry-After too, which CORS hides from a page otherwise: a 503's wait, read
            # by OpenAI's JS SDK (and a page's own retry)
            expose_headers=["X-Audio-Ms", "X-Compute-Ms", "X-Engine", "X-Sample-Rate",
                            "X-Speech-Notes", "Retry-After"], max_age=600)

    async def _internal_error(self, request: Request, exc: Exception) -> Response:
        """A bug's 500 (``_internal_error``), counted: as ``internal_error`` in the errors, as
        the voice port's are, and a speech request not counted yet as ``failed``."""
        self.gateway.metrics.errors["internal_error"] += 1
        labels = getattr(request.state, "speech_uncounted", None)
        if labels is not None:
            request.state.speech_uncounted = None
            self.gateway.telemetry.http_speech.labels(*labels, "failed").inc()
        return await _internal_error(request, exc)

    async def health(self, request: Request) -> Response:
        body = self.gateway.health()
        return _json(200 if body["status"] in SERVING else 503, body)

    async def metrics(self, request: Request) -> Response:
        return Response(self.gateway.telemetry.exposition(), media_type=METRICS_CONTENT_TYPE)

    async def models(self, request: Request) -> Response:
        return _json(200, models_body(self.gateway))

    async def model(self, request: Request) -> Response:
        return _json(*model_body(self.gateway, request.path_params["model_id"]))

    async def voices(self, request: Request) -> Response:
        gw = self.gateway
        return _json(200, {"object": "list", "engine": gw.engine.name,
                           "default": gw.default_voice,
                           "data": [{"id": v, "object": "voice"} for v in gw.voices]})

    async def speech(self, request: Request) -> Response:
        """``POST /v1/audio/speech``: admitted (``_admit``), cut into lane jobs
        (``synthesis_requests``), answered as its ``mode`` asks."""
        gw = self.gateway
        try:
            params, voice, lane = await self._admit(request)
        except ClientDisconnect:  # gone while sending its request
            gw.telemetry.http_speech.labels("-", "-", "disconnected").inc()
            log.info("speech disconnected (499) while sending its request")
            return Response(status_code=499)
        except ApiError as error:
            _speech_rejected(gw, error, getattr(request.state, "asked", ("-", "-")))
            return error.response({"Retry-After": "1"} if error.status == 503 else None)
        fmt, mode = params.response_format, params.mode
        request.state.speech_uncounted = (fmt, mode)  # (a bug's 500 counts it: _internal_error)
        engine = lane.engine
        stream = SpeechStream(gw, synthesis_requests(params, voice, engine), lane,
                              notes=self._notes(params, engine))
        # made before the synthesis starts, which nothing would stop if this failed (the
        # encoder thread may not start); the encoder then opens on its thread while the
        # engine makes the first chunk
        encoding = None if mode == "sse" else gw.http.encoding(fmt, streamed=mode == "chunked")
        stream.start()

        def counter(status: str) -> None:
            """The request's end: counted, and one log line (the access log's place)."""
            request.state.speech_uncounted = None
            gw.telemetry.http_speech.labels(fmt, mode, status).inc()
            failure = stream.failure
            log.info("speech %s%s (%s, %s, voice %s): %d ms of audio in %.0f ms%s", status,
                     " (499)" if status == "disconnected" else "", fmt, mode,
                     voice or gw.default_voice,
                     stream.audio_bytes * 1000 // BYTES_PER_S,
                     (time.perf_counter() - stream.started) * 1000.0,
                     f": {failure.code}: {failure.message}" if failure else "")

        # a fallback wrapper names the voice engine it wraps (usage.engine names both)
        headers = {"Cache-Control": "no-store", "X-Sample-Rate": str(OUTPUT_RATE),
                   "X-Engine": getattr(engine, "primary", engine).name}
        # start() may have added one (nothing to say); what happens while it is spoken
        # joins them later
        if stream.notes:
            headers["X-Speech-Notes"] = _notes_header(stream.notes)
        if encoding is None:
            return _Streamed(_sse(stream, request), stream, counter,
                             media_type="text/event-stream",
                             headers={**headers, "X-Accel-Buffering": "no"})
        if mode == "chunked":
            return await _chunked(request, stream, encoding, headers, counter)
        return await _whole(request, stream, encoding, headers, counter)

    async def _admit(self, request: Request) -> tuple[SpeechParams, str | None, Lane]:
        """The request's parameters, its voice (None: the engine's default) and the lane
        that speaks it, once the gateway can take it now; raises ``ApiError`` (503 when it
        cannot, 4xx for the request) or ``ClientDisconnect``."""
        gw = self.gateway
        _refuse_speech_now(gw, None)  # before the body: it may take seconds
        # ...unless the gateway begins to stop meanwhile: uvicorn would wait out its
        # grace for the body, then cancel the request (a bare 500 and a traceback)
        body = await unless_stopped(_read_json(request), gw.http.stopping.wait())
        if body is None:
            raise ApiError(503, "the gateway is shutting down", code="shutting_down")
        request.state.asked = asked_labels(body.result())  # (counted so if refused)
        params = parse_speech(body.result(), gw)
        voice = params.voice or gw.configured_voice
        lane = gw.lane_for_voice(voice)
        # again after it: the gateway may have begun to stop meanwhile (its open speech
        # streams already failed, this one would not be), and the voice may be another
        # lane's
        _refuse_speech_now(gw, lane)
        # counted here, with nothing awaited before speech() opens its stream: a burst of
        # requests cannot all pass the check at once
        if len(gw.http.streams) >= (most := gw.config.server.max_speech_requests):
            raise ApiError(503, f"{most} speech requests are open, the most this gateway "
                           "takes at once ([server] max_speech_requests); retry shortly",
                           code="server_full")
        return params, voice, lane

    def _notes(self, params: SpeechParams, engine: Any) -> list[str]:
        notes = list(params.notes)
        speeds = getattr(engine, "speed_range", SPEED_ANY)
        if params.speed != 1.0 and speeds is None:
            notes.append(f"speed ignored: engine {engine.name} speaks at its own pace")
        elif params.speed != 1.0 and not speeds[0] <= params.speed <= speeds[1]:
            notes.append(f"speed {params.speed:g} is beyond engine {engine.name}'s "
                         f"{speeds[0]:.2f}-{speeds[1]:.2f}: spoken at "
                         f"{min(max(params.speed, speeds[0]), speeds[1]):.2f}")
        if params.instructions and not getattr(engine, "instructions", False):
            notes.append(f"instructions ignored: engine {engine.name} does not take them")
        return notes


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (no such route, wrong method) in OpenAI's error shape, as
    every other error here: an SDK shows the message instead of a bare status."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        error = ApiError(405, f"{request.method} is not allowed on {request.url.path} "
                         f"(allowed: {allowed})", code="method_not_allowed")
        return error.response({"Allow": allowed})
    if exc.status_code == 404:
        hint = "; the voice socket is on the voice port" if request.url.path.startswith(
            "/v1/voice") else ""
        return ApiError(404, f"no route {request.url.path[:200]!r}{hint}",
                        code="not_found").response()
    return ApiError(exc.status_code, str(exc.detail), code="http_error").response()


async def _internal_error(request: Request, exc: Exception) -> Response:
    """A bug (or a process out of threads) failing a request before its answer started: a
    500 ``internal_error`` in OpenAI's shape too (Starlette's own is plain text). uvicorn
    logs the traceback."""
    return ApiError(500, f"internal error: {type(exc).__name__}: {exc}",
                    code="internal_error").response()


def synthesis_requests(params: SpeechParams, voice: str | None,
                       engine: Any) -> list[SynthesisRequest]:
    """A speech request's lane jobs: one per segment of its input with something to say,
    cut by the ``Segmenter`` as a voice session's reply is (shorter segments where the
    engine may make one in one step), in small background steps."""
    segmenter = Segmenter(None if streams_always(engine)
                          else SegmenterConfig(max_chars=ONE_STEP_MAX_CHARS),
                          reads_digits=getattr(engine, "reads_digits", True))
    # a segment may have nothing to say (an emoji, a code block): no job for it
    segments = [s for s in segmenter.feed(params.input) + segmenter.finish()
                if s.spoken.strip()]
    options = {"instructions": params.instructions} if params.instructions and \
        getattr(engine, "instructions", False) else {}
    return [SynthesisRequest(text=s.spoken, voice=voice, speed=params.speed,
                             temperature=params.temperature, seed=params.seed,
                             step_ms=step_ms(Priority.BACKGROUND), options=options)
            for s in segments]


def models_body(gateway: Gateway) -> dict[str, Any]:
    """One model per engine lane, the primary first (ids: ``Gateway.engine_lanes``)."""
    return {"object": "list", "data": [{
        "id": model_id, "object": "model", "created": int(gateway.started_at),
        "owned_by": "voice-gateway", "lane": lane.name, "loaded": lane.loaded,
        "streams": getattr(lane.engine, "streams", True),
        "voices": len(gateway.lane_voices.get(lane.name, ())),
        "sample_rate": OUTPUT_RATE} for model_id, lane in gateway.engine_lanes().items()]}


def model_body(gateway: Gateway, model_id: str) -> tuple[int, dict[str, Any]]:
    """``GET /v1/models/{model_id}`` on either port (the SDK's ``models.retrieve``): the
    status and body, 200 with the model ``/v1/models`` lists under that id, else 404
    ``model_not_found``. ``tts-1`` and other names a speech request's ``model`` may give
    (it takes any) are not listed, so not found: the list says what is loaded."""
    for model in models_body(gateway)["data"]:
        if model["id"] == model_id:
            return 200, model
    return 404, {"error": openai_error(
        404, "model_not_found", f"no model {_shown(model_id)}; GET /v1/models lists them",
        "model")}


async def _read_json(request: Request) -> Any:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise ApiError(413, f"the body is larger than {MAX_BODY_BYTES} bytes",
                       code="body_too_large")
    body = bytearray()
    try:
        # a client that trickles its body would hold the request (and a socket) for ever
        async with asyncio.timeout(BODY_TIMEOUT_S):
            async for chunk in request.stream():
                body += chunk
                if len(body) > MAX_BODY_BYTES:
                    raise ApiError(413, f"the body is larger than {MAX_BODY_BYTES} bytes",
                                   code="body_too_large")
    except TimeoutError:
        raise ApiError(408, f"the body did not arrive within {BODY_TIMEOUT_S:g} s",
                       code="request_timeout") from None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc}", code="invalid_json") from None


def _sse_event(event: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(event) + b"\n\n"


class _Streamed(StreamingResponse):
    """A streamed speech response that closes its ``SpeechStream`` and counts it however it
    ends: its body generator's own ``finally`` would not run if it never started (a client
    gone before the first chunk was asked for), leaving the jobs running and the stream
    counted open."""

    def __init__(self, content: AsyncIterator[bytes | memoryview], stream: SpeechStream,
                 counter: Callable[[str], None], encoding: Encoding | None = None,
                 **kwargs: Any) -> None:
        super().__init__(_sent(content, stream), **kwargs)
        self.stream, self.counter, self.encoding = stream, counter, encoding

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            _end(self.stream, self.encoding, self.counter, self.stream.outcome)


async def _sent(content: AsyncIterator[bytes | memoryview],
                stream: SpeechStream) -> AsyncIterator[bytes | memoryview]:
    """``content``, marking ``stream.on_client`` while each piece is being sent: the
    server's ``send`` suspends only when the client's socket is full, so the flag is true
    exactly while the client holds the response up."""
    async for data in content:
        stream.on_client = True
        yield data
        stream.on_client = False


def _end(stream: SpeechStream, encoding: Encoding | None, counter: Callable[[str], None],
         outcome: str) -> None:
    """A speech request is over, however it went: its jobs and encoder are freed and it is
    counted (``counter`` reads only the stream's figures, which closing keeps)."""
    stream.close()
    if encoding is not None:
        encoding.close()
    counter(outcome)


async def _sse(stream: SpeechStream, request: Request) -> AsyncIterator[bytes]:
    try:
        async for pcm in stream.chunks():
            yield _sse_event({"type": "speech.audio.delta",
                              "audio": base64.b64encode(pcm).decode("ascii")})
        if await request.is_disconnected():  # (see _chunked)
            return
        stream.outcome = "completed"
        done: dict[str, Any] = {"type": "speech.audio.done", "usage": stream.usage()}
        if stream.notes:
            done["notes"] = stream.notes
        yield _sse_event(done)
    except SpeechFailed as exc:
        stream.outcome = "failed"
        yield _sse_event({"type": "speech.audio.error", "error": openai_error(
            _failed_status(exc.code), exc.code, exc.message)})


def _failed_status(code: str) -> int:
    """The status of a synthesis that failed with ``code`` (docs/http-api.md, Errors)."""
    return 503 if code in ("shutting_down", "engine_unavailable") else \
        504 if code == "engine_timeout" else \
        500 if code in ("internal_error", "encoder_failed") else 502


def _failure(exc: SpeechFailed, headers: dict[str, str]) -> Response:
    """The answer to a synthesis that failed before any audio went out."""
    return ApiError(_failed_status(exc.code), exc.message, code=exc.code).response(headers)


_Data = TypeVar("_Data", bytes, bytes | memoryview)


class Encoding:
    """One response's ``Encoder``, driven from the event loop. The compressed formats run on
    the HTTP server's encoder thread, one call at a time in the order they were made (each
    call is awaited before the next, and ``close`` queues behind whatever is running), so
    the loop only hands chunks over; PCM and WAV, which cost nothing, run inline.

    A whole file (not ``streamed``) is written to ``spool``, which ``close`` frees (after
    the encoder, which may write to it as it closes): the response reads it from there.

    Created before the first chunk: the encoder opens on the thread (and the first one
    imports PyAV there) while the engine works. Failures of the encoder (and of the spool's
    disk) raise ``SpeechFailed("encoder_failed")``. Cancelling ``encode``/``finish`` is safe:
    the call already on the thread runs to its end and ``close`` comes after it.
    """

    def __init__(self, fmt: str, *, streamed: bool, thread: LaneThread | None) -> None:
        """``thread``: where a compressed format is encoded (unused for PCM and WAV)."""
        self.format = FORMATS[fmt]
        self._thread = thread
        self._encoder: Encoder | None = None
        self._opened: Future[Encoder] | None = None
        self._closed = False
        self.spool: Spool | None = None if streamed else Spool()
        if self.format.container is None:
            self._encoder = Encoder(fmt, streamed=streamed, out=self.spool)
        else:
            assert thread is not None, f"{fmt} is encoded on a thread"
            with contextlib.suppress(RuntimeError):  # shut down: encode() says so
                self._opened = thread.submit(functools.partial(Encoder, fmt,
                                                               streamed=streamed,
                                                               out=self.spool))

    @property
    def media_type(self) -> str:
        return self.format.media_type

    async def encode(self, pcm: bytes) -> bytes:
        """The bytes ready after ``pcm`` (``b""`` for a whole file: it goes to ``spool``)."""
        if self._encoder is not None:
            return self._inline(self._encoder.encode, pcm)
        return await self._call(_encode, pcm)

    async def finish(self) -> bytes:
        """The rest of the file (for a whole file: nothing, the file being in ``spool``, all
        of it written there)."""
        if self._encoder is not None:
            return self._inline(_finished, self._encoder, self.spool)
        return await self._call(_finish, self.spool)

    def close(self) -> None:
        """Free the encoder (after the call in progress, if any), then the spool: its
        temporary file is gone. Idempotent."""
        if self._closed:
            return
        self._closed = True
        spool, self.spool = self.spool, None
        if self._encoder is not None:
            self._encoder.close()
        elif self._thread is not None and self._opened is not None:
            try:
                self._thread.submit(_close, self._opened, spool)
                spool = None  # (closed there, after the encoder)
            except RuntimeError:  # the thread is gone: nothing left to write to the spool
                pass
            self._opened = None  # (the response may outlive its encoder)
        if spool is not None:
            spool.close()

    def _inline(self, fn: Callable[..., bytes], *args: Any) -> bytes:
        """A PCM or WAV call, on the loop: only the spool's disk can fail it."""
        try:
            return fn(*args)
        except OSError as exc:
            raise SpeechFailed("encoder_failed", f"writing {self.format.name} failed: "
                               f"{type(exc).__name__}: {exc}") from exc

    async def _call(self, fn: Callable[..., _Data], *args: Any) -> _Data:
        try:
            if self._thread is None or self._opened is None:
                raise RuntimeError("the encoder thread is shut down")
            future = self._thread.submit(fn, self._opened, *args)
        except RuntimeError:  # the HTTP server is closing
            raise SpeechFailed("shutting_down", "the gateway is shutting down") from None
        try:
            return await asyncio.wrap_future(future)
        except Exception as exc:
            raise SpeechFailed("encoder_failed", f"encoding {self.format.name} failed: "
                               f"{type(exc).__name__}: {exc}") from exc


def _encoder_failed(stream: SpeechStream, exc: SpeechFailed) -> None:
    """An encoder's failure ends the request (its jobs cancelled) and is named in the log
    line; a failure of the synthesis itself was recorded already."""
    if stream.failure is None:
        if exc.code == "encoder_failed":
            stream.gateway.metrics.errors[exc.code] += 1
        stream.fail(exc.code, exc.message)
        stream.failure = _Failed(exc.code, exc.message)  # (if it had finished already)


# on the encoder thread, after the call that opened the encoder (whose error they raise)
def _encode(opened: Future[Encoder], pcm: bytes) -> bytes:
    return opened.result().encode(pcm)


def _finish(opened: Future[Encoder], spool: Spool | None) -> bytes:
    return _finished(opened.result(), spool)


def _finished(encoder: Encoder, spool: Spool | None) -> bytes:
    """``encoder`` finished, and what its spool gathered written out (a full disk fails the
    answer here, not once it is being sent)."""
    rest = encoder.finish()
    if spool is not None:
        spool.flush()
    return rest


def _close(opened: Future[Encoder], spool: Spool | None) -> None:
    try:
        if opened.done() and opened.exception() is None:
            opened.result().close()
    finally:
        if spool is not None:
            spool.close()


async def _unless_ended(request: Request, work: Awaitable[_Data], stream: SpeechStream,
                        encoding: Encoding, headers: dict[str, str],
                        counter: Callable[[str], None]) -> _Data | Response:
    """``work``'s result (audio before the status goes out), or the answer to a request
    that ended first, freed and counted: 499 when the client left (``work`` is cancelled),
    the failure's status when the synthesis or the encoder failed. Cancelled (the server
    stopping): freed, counted as disconnected (a whole-file request went uncounted), and
    re-raised."""
    try:
        done = await unless_stopped(work, _disconnected(request))
        if done is not None:
            return done.result()
    except SpeechFailed as exc:
        _encoder_failed(stream, exc)
        _end(stream, encoding, counter, "failed")
        return _failure(exc, headers)
    except BaseException:
        _end(stream, encoding, counter, "disconnected")
        raise
    _end(stream, encoding, counter, "disconnected")  # the client left first
    return Response(status_code=499)  # nobody is listening


async def _chunked(request: Request, stream: SpeechStream, encoding: Encoding,
                   headers: dict[str, str], counter: Callable[[str], None]) -> Response:
    """Audio as it is made, chunked: each engine chunk is encoded as it comes and what the
    encoder has ready goes out. The first chunk is awaited before the status goes out, so a
    synthesis failing before any audio still gets its error status; a failure later aborts
    the connection without the final chunk (the only way such a stream can say it is
    incomplete). A WAV's header says "length unknown" (0xFFFFFFFF), as streamed WAVs do;
    ``gateway.core.audio_formats`` says what each compressed format leaves out. The first
    chunk is encoded before the status too: an encoder that cannot start is a 500."""
    chunks = stream.chunks()

    async def opening() -> bytes | memoryview:
        return await encoding.encode(await anext(chunks, b""))

    head = await _unless_ended(request, opening(), stream, encoding, headers, counter)
    if isinstance(head, Response):
        return head

    async def body() -> AsyncIterator[bytes | memoryview]:
        try:
            if head:
                yield head
            async for pcm in chunks:
                if data := await encoding.encode(pcm):
                    yield data
            if tail := await encoding.finish():
                yield tail
            # A client gone while the last chunks were already made: the server drops what
            # is sent to it, so the loop ran to the end before the hang-up was seen
            if await request.is_disconnected():
                return
            stream.outcome = "completed"
        except SpeechFailed as exc:
            _encoder_failed(stream, exc)
            stream.outcome = "failed"
            raise

    return _Streamed(body(), stream, counter, encoding, media_type=encoding.media_type,
                     headers=headers)


async def _whole(request: Request, stream: SpeechStream, encoding: Encoding,
                 headers: dict[str, str], counter: Callable[[str], None]) -> Response:
    """Collect the whole file (``"stream": false``) in the encoding's spool, encoding each
    chunk as it comes; a client that leaves while we wait cancels the request.
    ``_Streamed`` sends it (``_slices``) and counts it; ``_end`` closes the spool (its
    temporary file is gone) however the request ends."""
    spool = encoding.spool
    assert spool is not None, "a whole file's encoding has a spool"

    async def collect() -> bytes:
        async for pcm in stream.chunks():
            await encoding.encode(pcm)
        return await encoding.finish()

    done = await _unless_ended(request, collect(), stream, encoding, headers, counter)
    if isinstance(done, Response):
        return done
    usage = stream.usage()
    headers = {**headers, "X-Audio-Ms": str(usage["audio_ms"]),
               "X-Compute-Ms": str(usage["compute_ms"])}
    if stream.notes:  # now with what happened while it was spoken
        headers["X-Speech-Notes"] = _notes_header(stream.notes)
    # sent a slice at a time, each waiting for the client to take the ones before it (the
    # server's flow control): Starlette's Response hands the server the whole body in one
    # write and returns, so a client that left mid-file was counted completed, and a
    # shutdown could not tell an answer still being sent from a finished one
    size = spool.size()
    headers["Content-Length"] = str(size)
    return _Streamed(_slices(spool, size, request, stream), stream, counter, encoding,
                     media_type=encoding.media_type, headers=headers)


async def _slices(spool: Spool, size: int, request: Request,
                  stream: SpeechStream) -> AsyncIterator[bytes]:
    """A whole file ``WHOLE_SLICE_BYTES`` at a time, read from its spool as each is sent;
    ``completed`` once it is all sent. Read on the loop: a 64 KiB ``pread`` of a file just
    written (in the page cache) took 3-8 us (p99 10 us), a thread's round trip for it
    46-82 us, so a thread would cost more loop time than it saves; a page the OS has
    dropped meanwhile is one SSD read (~0.1 ms)."""
    for start in range(0, size, WHOLE_SLICE_BYTES):
        # (once the client is gone, the server drops each slice without waiting)
        yield spool.read_at(start, WHOLE_SLICE_BYTES)
    # the last slices are in the server's buffers: as for a stream (_chunked), what a
    # client that left after they were handed over did not take goes unseen
    if not await request.is_disconnected():
        stream.outcome = "completed"


async def _disconnected(request: Request) -> None:
    """Returns when the client goes away (the body was read already, so the next ASGI
    message can only be ``http.disconnect``)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


# ---- the server ---------------------------------------------------------------------------


def _past_empty_lines(buffer: Any) -> bool:
    """Drops the empty lines (CRLF, or a bare LF) at the start of h11's receive ``buffer``,
    where a request line is expected: RFC 9112 2.2 has a server ignore at least one before
    it (a client may send one after a request's body), and h11 refused the request 400
    ("no request line received"). Dropped, they hold no memory; a client sending nothing
    else meets the header deadline (``_H11``). True when all that is left is a CR, which
    the next bytes decide (h11 took it for an illegal request line).

    h11 has no public way to this (its buffer's ``_data`` and ``_extract``): an h11 that
    renamed them leaves the empty lines to h11 (400, as before) instead of failing every
    request, and tests/test_http_api.py's empty-line tests fail on it."""
    data = getattr(buffer, "_data", None)
    extract = getattr(buffer, "_extract", None)
    if not isinstance(data, (bytes, bytearray)) or extract is None:
        return False
    if start := empty_lines_end(data):
        extract(start)
    return bytes(buffer._data) == b"\r"


class _Requests(h11.Connection):
    """h11's server side, refusing a request that has both ``Content-Length`` and
    ``Transfer-Encoding`` (h11 reads it by its chunks and goes on with the connection): that
    is how requests are smuggled past a proxy in front that reads the length, which takes
    for part of the body what the gateway answers as a request of its own. RFC 9112 6.1 lets
    a server refuse it, and has it close the connection after answering it either way; the
    refusal, ``_H11.send_400_response``, closes it."""

    refused: str | None = None
    """Why the request was refused (``send_400_response`` says it), when it was here."""

    def next_event(self) -> Any:
        if self.their_state is h11.IDLE:
            if _past_empty_lines(getattr(self, "_receive_buffer", None)):
                return h11.NEED_DATA  # what follows says whether it begins an empty line
        event = super().next_event()
        if isinstance(event, h11.Request):
            names = {name for name, _ in event.headers}  # (h11 has them in lower case)
            if b"content-length" in names and b"transfer-encoding" in names:
                self.refused = ("a request may not have both Content-Length and "
                                "Transfer-Encoding")
                raise h11.RemoteProtocolError(self.refused, error_status_hint=400)
            # uvicorn took a target in absolute form for a path ("no route
            # '/http://127.0.0.1/health'"); its host replaces Host (RFC 9112 3.2.2)
            if (absolute := origin_form(event.target.decode("latin-1"))) is not None:
                host, path = absolute
                event = h11.Request(
                    method=event.method, target=path.encode("latin-1"),
                    headers=[*((n, v) for n, v in event.headers if n != b"host"),
                             (b"host", host.encode("latin-1"))],
                    http_version=event.http_version)
            # RFC 9112 3.2 (h11 refuses no Host in HTTP/1.1, and more than one): "Host:
            # evil@127.0.0.1" and an empty Host passed the check against DNS rebinding
            hosts = [v.decode("latin-1") for n, v in event.headers if n == b"host"]
            if (why := invalid_host(hosts)) is not None:
                self.refused = why
                raise h11.RemoteProtocolError(why, error_status_hint=400)
        return event


class _H11(H11Protocol):
    """uvicorn's h11 protocol, with a deadline for each request's headers. uvicorn has none:
    a client trickling its headers a byte at a time (or sending nothing) held its socket
    for ever, and enough of them starve the process of file descriptors, the voice port's
    too. Armed when the connection opens and after each response; a request whose headers
    came whole disarms it (its body has ``BODY_TIMEOUT_S``), a pipelined one too."""

    _deadline: asyncio.TimerHandle | None = None
    _stalled: asyncio.TimerHandle | None = None
    """While the client takes nothing of what waits for it (``SEND_TIMEOUT_S``)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (nothing read yet: uvicorn's own, made with the same bound, goes unused)
        self.conn = _Requests(h11.SERVER, self.conn._max_incomplete_event_size)
        super().connection_made(transport)  # type: ignore[arg-type]
        self._arm()

    def on_response_complete(self) -> None:
        # armed before uvicorn takes up a pipelined request already in (which disarms it):
        # armed after, it ran during that request and closed its connection mid-answer
        self._arm()
        super().on_response_complete()

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a request's headers arrived whole
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._resumed()
        super().connection_lost(exc)
        state = self.server_state
        if isinstance(state, _ServerState) and not state.connections:
            state.emptied.set()

    def pause_writing(self) -> None:
        """The client's socket is full: if it takes nothing more for ``SEND_TIMEOUT_S``,
        the connection is aborted (it held its response, its socket and the audio queued
        for it for ever). A shutdown does not wait that long (``HttpServer._drain``)."""
        super().pause_writing()
        if self._stalled is None:
            self._stalled = self.loop.call_later(
                SEND_TIMEOUT_S, self.abort_stalled,
                f"took nothing of its answer for {SEND_TIMEOUT_S:g} s")

    def resume_writing(self) -> None:
        self._resumed()
        super().resume_writing()

    def _resumed(self) -> None:
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None

    def abort_stalled(self, why: str) -> None:
        """Abort the connection if its client is not taking what waits for it (a close
        would wait to flush it): its response ends as a disconnect, its jobs cancelled."""
        if self._stalled is not None:
            self.abort(why)

    @property
    def sending(self) -> bool:
        """An answer is in progress on the connection, or some of one waits to go out."""
        cycle = self.cycle
        return (cycle is not None and not cycle.response_complete) or \
            self.transport.get_write_buffer_size() > 0

    def abort(self, why: str) -> None:
        """Abort the connection now, whatever waits to be sent on it (logged at INFO with
        ``why``): a response still being sent ends as a disconnect."""
        self._resumed()
        log.info("HTTP client %s %s: connection aborted", self._peer, why)
        self.transport.abort()

    @property
    def _peer(self) -> str:
        return peer_text(self.client)

    def _refused(self, code: str, message: str, *args: Any) -> None:
        """A refusal the protocol makes itself, below the app: logged at INFO (rate-limited
        by kind, ``limited``) and counted in ``gateway_errors_total{code}``."""
        log.info(message, self._peer, *args, extra=limited(code))
        if isinstance(state := self.server_state, _ServerState):
            state.errors[code] += 1

    def send_400_response(self, msg: str) -> None:
        # (uvicorn's own WARNING for it, with neither peer nor reason, is filtered out)
        if isinstance(self.conn, _Requests) and self.conn.refused is not None:
            msg = self.conn.refused  # (uvicorn's message is the same for every refusal)
        self._refused("invalid_http", "HTTP request from %s refused (400): %s", msg)
        # OpenAI's error shape, as every other refusal (uvicorn's is plain text)
        body = orjson.dumps({"error": openai_error(400, "invalid_http", msg)})
        for event in (h11.Response(status_code=400, reason=b"Bad Request", headers=[
                          (b"content-type", b"application/json"),
                          (b"content-length", str(len(body)).encode()),
                          (b"connection", b"close")]),
                      h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()

    def _arm(self) -> None:
        self._disarm()
        if not self.transport.is_closing():
            self._deadline = self.loop.call_later(HEADER_TIMEOUT_S, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        # part of a request in, not all its headers: a refusal, counted as the others are
        # (a connection that sent nothing, a preconnect or an idle keep-alive, is not one)
        if self.conn.trailing_data[0]:
            self._refused("request_timeout", "HTTP request from %s closed: its headers did "
                          "not arrive within %g s", HEADER_TIMEOUT_S)
        self.transport.close()


class _ServerState(ServerState):
    """uvicorn's, which it gives every connection's protocol: telling when its last
    connection is gone (uvicorn polls for that every 0.1 s), and holding the gateway's
    ``errors`` counters (``Metrics.errors``) for the refusals the protocol makes itself,
    below the app (``_H11._refused``)."""

    def __init__(self, errors: collections.Counter[str]) -> None:
        super().__init__()
        self.emptied = asyncio.Event()
        self.errors = errors


class _Uvicorn(uvicorn.Server):
    """uvicorn in someone else's loop: tells when it serves and when its last connection is
    gone (``tracked.emptied``), leaves signals to the gateway."""

    def __init__(self, config: uvicorn.Config, errors: collections.Counter[str]) -> None:
        super().__init__(config)
        self.serving = asyncio.Event()
        self.tracked = _ServerState(errors)
        self.server_state = self.tracked

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.serving.set()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # Gateway's run() owns SIGINT/SIGTERM


def _not_an_aborted_stream(record: logging.LogRecord) -> bool:
    """A logging filter for uvicorn: a failure that ends a streamed speech body on purpose
    (it must abort the connection, so it leaves the app as an exception) is not an
    "Exception in ASGI application" with a traceback; the request's own line says why.
    Nor is a malformed request a WARNING without a peer: ``_H11`` says it at INFO, with
    the peer."""
    if record.msg == _INVALID_REQUEST:
        return False
    exc = record.exc_info[1] if record.exc_info else None
    if isinstance(exc, BaseExceptionGroup):  # Starlette before 0.42: its task group's
        return exc.split(SpeechFailed)[1] is not None  # logged if it holds anything else
    return not isinstance(exc, SpeechFailed)


_INVALID_REQUEST = "Invalid HTTP request received."


class HttpServer:
    """The HTTP API on its own port, in the running loop. ``start()``; ``port``; ``aclose()``."""

    def __init__(self, gateway: Gateway, host: str, port: int,
                 tls: tuple[str, str | None] | None = None) -> None:
        """``tls``: (certificate, key) PEM files, the voice port's: the HTTP API then
        serves https, so a bearer token never crosses the network in clear on either
        port."""
        self.gateway = gateway
        self.host, self.requested_port = host, port
        self.tls = tls
        self.api = SpeechApi(gateway)
        self._encoder_thread: LaneThread | None = None
        self.streams: set[SpeechStream] = set()
        self.idle = asyncio.Event()
        """Set while no speech response is open (tests await it after a disconnect)."""
        self.idle.set()
        self.stopping = asyncio.Event()
        """Set as ``aclose`` begins: a speech request still reading its body is refused."""
        self._port: int | None = None
        self._server: _Uvicorn | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Bind where the voice port listens (``listening_sockets``: every address the host
        resolves to; port 0 picks one free port for all) and serve; returns once uvicorn
        accepts."""
        sockets = await listening_sockets(self.host, self.requested_port,
                                          "HTTP API, --http-port")
        self._port = int(sockets[0].getsockname()[1])
        cert, key = self.tls or (None, None)
        config = uvicorn.Config(self.api.asgi, lifespan="off", log_config=None,
                                access_log=False, ws="none", http=_H11,
                                timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
                                ssl_certfile=cert, ssl_keyfile=key)
        config.load()  # (serve() would: here, to reach the TLS context it makes)
        if config.ssl is not None:
            note_plain_http(config.ssl, functools.partial(self.gateway.plain_http_refused,
                                                          "HTTP API port", "https://"))
        error_log = logging.getLogger("uvicorn.error")
        if _not_an_aborted_stream not in error_log.filters:
            error_log.addFilter(_not_an_aborted_stream)
        self._server = _Uvicorn(config, self.gateway.metrics.errors)
        self._task = asyncio.create_task(self._server.serve(sockets=sockets), name="http-api")
        try:
            # (the server's task is shielded: it goes on serving once it serves)
            serving = await unless_stopped(self._server.serving.wait(),
                                           asyncio.shield(self._task))
        except BaseException:  # cancelled: uvicorn would go on to serve, owned by nobody
            await asyncio.shield(self.aclose())
            raise
        if serving is None:
            self._task.result()  # raises what stopped uvicorn
            raise RuntimeError("the HTTP server stopped while starting")

    @property
    def encoder_thread(self) -> LaneThread:
        """Where every speech response's compressed format is encoded (``Encoding``),
        started with the first one."""
        if self._encoder_thread is None:
            self._encoder_thread = LaneThread("http-encoder")
        return self._encoder_thread

    def encoding(self, fmt: str, *, streamed: bool) -> Encoding:
        """A response's encoder (on ``encoder_thread`` unless ``fmt`` is PCM or WAV)."""
        compressed = FORMATS[fmt].container is not None
        return Encoding(fmt, streamed=streamed,
                        thread=self.encoder_thread if compressed else None)

    def opened(self, stream: SpeechStream) -> None:
        self.streams.add(stream)
        self.idle.clear()

    def closed(self, stream: SpeechStream) -> None:
        self.streams.discard(stream)
        if not self.streams:
            self.idle.set()

    @property
    def started(self) -> bool:
        return self._server is not None and self._server.serving.is_set()

    @property
    def port(self) -> int:
        """The port bound (kept: /health asks for it while stopping, when the socket that
        was bound is closed already)."""
        assert self._port is not None, "start() first"
        return self._port

    async def aclose(self) -> None:
        """End every open speech response (``shutting_down``) and every wait for a speech
        request's body, let clients take what is being sent to them (``_drain``), then stop
        uvicorn."""
        self.stopping.set()
        self._refuse_connections()
        for stream in list(self.streams):
            stream.fail("shutting_down", "the gateway is shutting down")
        if self._server is not None and self._task is not None:
            await self._drain(self._server)
            self._server.should_exit = True
            await self._task
        if self._encoder_thread is not None:  # a daemon: it never holds up the exit
            self._encoder_thread.shutdown(wait=False)

    async def _drain(self, server: _Uvicorn) -> None:
        """Wait, ``SHUTDOWN_GRACE_S`` at most, until every connection has closed (each closes
        once its answer is sent: a whole file already made goes out whole, an ended stream
        sends its ending), then abort those still open: their clients took too little of
        their answers, or nothing. uvicorn would wait out its own grace, then cancel their
        requests with an ERROR (and a traceback each, once the request is still sending),
        and leave their sockets open (a close waits to flush); and an answer being taken
        slowly is not one taking nothing, which was aborted at once."""
        state = server.tracked
        state.emptied.clear()
        if not state.connections:
            return
        try:
            async with asyncio.timeout(SHUTDOWN_GRACE_S):
                await state.emptied.wait()
        except TimeoutError:
            ended = f"when the shutdown's {SHUTDOWN_GRACE_S:g} s grace ended"
            for connection in list(state.connections):
                if isinstance(connection, _H11):
                    # (an idle TLS connection's close waits for the client's close_notify)
                    connection.abort(f"had not taken its answer {ended}" if connection.sending
                                     else f"had not acknowledged the close {ended}")

    def _refuse_connections(self) -> None:
        """No new connection, and none kept alive between requests (one mid-request closes
        after its answer): now, as the voice port does, not at uvicorn's next tick (it reads
        ``should_exit`` every 0.1 s), which does both again."""
        if self._server is None:
            return
        for server in getattr(self._server, "servers", ()):  # (none before it started)
            server.close()
        for connection in list(self._server.server_state.connections):
            connection.shutdown()
