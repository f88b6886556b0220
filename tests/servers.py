"""HTTP servers that tests (and benchmarks) talk to over real sockets on 127.0.0.1.

* ``ScriptedLlmServer``: a TEST DOUBLE of an OpenAI-compatible streaming chat server, run by
  uvicorn in the test's own event loop; each request plays a script of steps.
* ``TinyLlamaServer``: a real ``mlx_lm.server`` process serving a tiny random-weight llama
  built locally (``tests.tiny_models.llama``).
* ``EncodedSseServer``: a TEST DOUBLE that answers one request with an event stream encoded
  as the test gives it (gzip'd twice, brotli...), whatever the request asked for (the LLM
  probe's ``/models`` too: it reads no content type).
* ``resetting_port``: a port whose every connection is reset as it is made (an LLM server
  killed as the connection came), accepted on the test's own event loop.
* ``ServeProcess``: ``voice-gateway serve`` itself as a process, for what only a process
  shows: its banner, its log, signals and its exit code.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn

# --- script steps -----------------------------------------------------------------------


@dataclass(frozen=True)
class Text:
    """One ``chat.completion.chunk`` whose delta carries ``text`` (and repeats ``role``)."""

    text: str


@dataclass(frozen=True)
class Finish:
    """The chunk with ``finish_reason`` and an empty delta."""

    reason: str = "stop"


@dataclass(frozen=True)
class Usage:
    """The usage chunk (``choices: []``), as mlx_lm.server and oMLX send it after finishing."""

    usage: dict[str, Any]


@dataclass(frozen=True)
class Done:
    """``data: [DONE]``."""


@dataclass(frozen=True)
class Comment:
    """An SSE comment line, e.g. mlx_lm.server's ``: keepalive 3/40``."""

    text: str = "keepalive"


@dataclass(frozen=True)
class Raw:
    """Bytes written as they are (malformed JSON, odd framing)."""

    data: bytes


@dataclass(frozen=True)
class Burst:
    """Several steps written in one ``send`` (one read on the client side, like oMLX)."""

    steps: tuple[Any, ...]


@dataclass(frozen=True)
class Status:
    """Answer with this HTTP status and body instead of a stream. Must be the only step."""

    code: int
    body: bytes = b'{"error": {"message": "scripted failure"}}'
    content_type: str = "application/json"
    retry_after: str | None = None
    """A ``Retry-After`` header's value."""


@dataclass(frozen=True)
class Drop:
    """Abort the connection mid-response (the client sees an incomplete chunked body)."""


@dataclass(frozen=True)
class Pause:
    """Send nothing for ``seconds`` (a model decoding), then go on with the script."""

    seconds: float


@dataclass(frozen=True)
class Hang:
    """Send nothing more until the client goes away (or the server shuts down).

    As the first step it hangs before the response headers are sent.
    """


@dataclass(frozen=True)
class KeepAlive:
    """Send a ``: keepalive`` comment every ``every_s`` seconds until the client goes away
    (or the server shuts down): a server stuck mid-reply that still looks alive.
    ``chunk``: send oMLX's keep-alive instead (its default ``sse_keepalive_mode``), a
    ``data:`` chunk with an empty delta (``OMLX_KEEPALIVE``)."""

    every_s: float = 0.05
    chunk: bool = False


OMLX_KEEPALIVE = (
    b'data: {"id":"chatcmpl-keepalive","object":"chat.completion.chunk","created":0,'
    b'"model":"keepalive","choices":[{"index":0,"delta":{"role":"assistant","content":""},'
    b'"finish_reason":null}]}\n\n')
"""What oMLX sends, by default, every 10 s while a stream is quiet (and once before the
first token): a chunk that says nothing, in ``data:``, not an SSE comment."""


def reply_script(
    pieces: Sequence[str],
    usage: dict[str, Any] | None = None,
    finish: str = "stop",
) -> list[Any]:
    """A well-behaved stream: one chunk per piece, finish, usage (if any), ``[DONE]``."""
    steps: list[Any] = [Text(p) for p in pieces]
    steps.append(Finish(finish))
    if usage is not None:
        steps.append(Usage(usage))
    steps.append(Done())
    return steps


# --- the test double ----------------------------------------------------------------------


class _DroppedConnection(Exception):
    """Raised inside the ASGI app to make uvicorn abort the connection."""


@dataclass
class RecordedRequest:
    """What the double saw of one request, and events for what happened to it."""

    path: str
    body: dict[str, Any] | None
    headers: dict[str, str]
    client_port: int | None
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the client closed the connection before the response was complete."""
    completed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the script ran to its end (the whole response was written)."""


class ScriptedLlmServer:
    """TEST DOUBLE: an OpenAI-compatible ``/v1/chat/completions`` that plays scripts.

    Not a model and not a simulation of one: each POST pops the next script queued with
    ``script(...)`` (or replays ``default_script``) and writes exactly those steps, so a test
    controls every byte: chunk boundaries, keep-alives, bursts, usage after the finish,
    HTTP errors, malformed JSON, a dropped connection, a server that hangs. ``requests``
    records what the client sent and when it went away. ``GET /v1/models`` answers too.
    Runs as a real uvicorn server on ``127.0.0.1:0`` in the current event loop.
    """

    def __init__(self) -> None:
        self._scripts: deque[list[Any]] = deque()
        self.default_script: list[Any] = reply_script(["Hello", " there", "."])
        self.requests: list[RecordedRequest] = []
        self.request_arrived = asyncio.Event()
        """Set at the first chat-completion request."""
        self.refused_fields: tuple[str, ...] = ()
        """Request fields it refuses (400 naming them), as a strict server does: Azure AI's
        "Extra parameters ['stream_options'] are not allowed", Mistral's 422
        "extra_forbidden"."""
        self.choose: Callable[[dict[str, Any] | None], list[Any]] | None = None
        """When set, the script each chat request plays: ``choose(body)`` (the request's
        JSON), instead of the queued scripts (bench/fault_llm.py answers by transcript)."""
        self.gzip = False
        """Stream answers gzip-compressed (``content-encoding: gzip``), as a proxy that
        compresses text/event-stream does."""
        self._closing = asyncio.Event()
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        """The API base, as clients take it (ends in ``/v1``)."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def chats(self) -> list[RecordedRequest]:
        """The chat-completion requests, in order (without the gateway's reachability
        probes of ``/v1/models``)."""
        return [r for r in self.requests if r.path == "/v1/chat/completions"]

    def script(self, *scripts: Iterable[Any]) -> None:
        """Queue one script per coming request, in order."""
        for steps in scripts:
            self._scripts.append(list(steps))

    # ASGI --------------------------------------------------------------------------------

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        raw = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        client = scope.get("client")
        record = RecordedRequest(
            path=scope["path"],
            body=body,
            headers={k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]},
            client_port=client[1] if client else None,
        )
        self.requests.append(record)
        if scope["path"] == "/v1/chat/completions":
            self.request_arrived.set()

        if scope["path"] == "/v1/models":
            await _send_plain(send, 200, b'{"object": "list", "data": [{"id": "scripted"}]}')
            record.completed.set()
            return
        if scope["path"] != "/v1/chat/completions" or scope["method"] != "POST":
            await _send_plain(send, 404, b'{"error": "not found"}')
            return

        refused = [f for f in self.refused_fields if f in (body or {})]
        if refused:
            await _send_plain(send, 400, json.dumps({"error": {
                "code": "extra_parameters", "message": f"Extra parameters {refused} are not "
                "allowed"}}).encode())
            record.completed.set()
            return
        steps = (self.choose(body) if self.choose is not None else
                 self._scripts.popleft() if self._scripts else list(self.default_script))

        async def watch_disconnect() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            if not record.completed.is_set():
                record.disconnected.set()

        watcher = asyncio.create_task(watch_disconnect())
        try:
            await self._play(steps, send, record)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    async def _play(self, steps: list[Any], send: Any, record: RecordedRequest) -> None:
        if steps and isinstance(steps[0], Status):
            status = steps[0]
            record.completed.set()
            await _send_plain(send, status.code, status.body, status.content_type,
                              retry_after=status.retry_after)
            return
        if steps and isinstance(steps[0], Hang):
            await self._hang(record)
            return
        packer = zlib.compressobj(wbits=31) if self.gzip else None  # (31: the gzip format)

        def body(data: bytes) -> bytes:
            if packer is None:
                return data
            return packer.compress(data) + packer.flush(zlib.Z_SYNC_FLUSH)

        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream"),
                    (b"cache-control", b"no-cache"),
                    *([(b"content-encoding", b"gzip")] if self.gzip else []),
                ],
            }
        )
        for step in steps:
            if isinstance(step, Drop):
                raise _DroppedConnection("scripted drop")
            if isinstance(step, Pause):
                await asyncio.sleep(step.seconds)
                continue
            if isinstance(step, Hang):
                await self._hang(record)
                return
            if isinstance(step, KeepAlive):
                while not (record.disconnected.is_set() or self._closing.is_set()):
                    await send({"type": "http.response.body", "more_body": True,
                                "body": body(OMLX_KEEPALIVE if step.chunk else
                                             _encode(Comment()))})
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(step.every_s):
                            await self._hang(record)
                return
            await send({"type": "http.response.body", "body": body(_encode(step)),
                        "more_body": True})
        record.completed.set()  # before the last send: from then on a disconnect is normal
        await send({"type": "http.response.body", "body": packer.flush() if packer else b"",
                    "more_body": False})

    async def _hang(self, record: RecordedRequest) -> None:
        closing = asyncio.create_task(self._closing.wait())
        gone = asyncio.create_task(record.disconnected.wait())
        try:
            await asyncio.wait({closing, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closing.cancel()
            gone.cancel()

    # lifecycle ---------------------------------------------------------------------------

    async def start(self, port: int = 0) -> None:
        """Bind 127.0.0.1:``port`` (0: any free one), start uvicorn in this loop, and return
        once it serves."""
        # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY on accepted sockets only when
        # the listener says TCP; with proto 0, Nagle + delayed ACK add ~40 ms per response
        # on a reused connection.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self, lifespan="off", log_level="warning", access_log=False, log_config=None
        )
        self._server = _StartedServer(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        started = asyncio.create_task(self._server.started_event.wait())
        await asyncio.wait({started, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if not started.done():
            started.cancel()
            await self._task  # raises what made start-up fail
            raise RuntimeError("uvicorn stopped before it started serving")

    async def stop(self) -> None:
        """Release hanging scripts, stop uvicorn and wait for it."""
        self._closing.set()
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task


class EncodedSseServer:
    """TEST DOUBLE: a server on 127.0.0.1:0 (a thread of its own, for a synchronous client
    as for an async one) that answers the first request with an event stream whose
    ``Content-Encoding`` is ``encoding`` and whose body is ``body`` as given (encoded by the
    test beforehand, so that its decoding is no memory of the test's), whatever the request
    asked for, as a compressing proxy does; then it ends the answer, and waits for the
    client to leave. ``body`` may be an iterable of pieces, sent one by one (an endless
    one: an answer that never ends). ``status`` and ``content_type``: an error page's, for
    one. ``request`` is the request's head, once ``asked`` is set; ``left`` is set once the
    client has left."""

    def __init__(self, encoding: bytes, body: bytes | Iterable[bytes], status: bytes = b"200 OK",
                 content_type: bytes = b"text/event-stream") -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/v1"
        self.request = b""
        self.asked = threading.Event()
        self.left = threading.Event()
        self._head = (b"HTTP/1.1 " + status + b"\r\ncontent-type: " + content_type +
                      b"\r\ncontent-encoding: " + encoding + b"\r\nconnection: close\r\n\r\n")
        self._thread = threading.Thread(target=self._serve, args=(body,), daemon=True)
        self._thread.start()

    def _serve(self, body: bytes | Iterable[bytes]) -> None:
        with contextlib.suppress(OSError):  # (closed by ``close``, or cut by the client)
            conn, _ = self._listener.accept()
            with conn:
                while b"\r\n\r\n" not in self.request:
                    self.request += conn.recv(65536)
                self.asked.set()
                conn.sendall(self._head)
                for piece in (body,) if isinstance(body, bytes) else body:
                    conn.sendall(piece)  # (not joined to the head: a copy the test would trace)
                conn.shutdown(socket.SHUT_WR)  # (the body's end)
                while conn.recv(65536):  # (the request's body, then the client's close)
                    pass
        self.left.set()

    def close(self) -> None:
        self._listener.close()
        self._thread.join(timeout=10)


class _StartedServer(uvicorn.Server):
    """uvicorn.Server with an event for "listening", so nobody sleeps or polls for it."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.started_event = asyncio.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            self.started_event.set()


def _encode(step: Any) -> bytes:
    match step:
        case Text(text):
            return _data(_chunk({"role": "assistant", "content": text}, None))
        case Finish(reason):
            return _data(_chunk({"role": "assistant"}, reason))
        case Usage(usage):
            return _data(
                {
                    "id": "chatcmpl-scripted",
                    "object": "chat.completion",
                    "choices": [],
                    "usage": usage,
                }
            )
        case Done():
            return b"data: [DONE]\n\n"
        case Comment(text):
            return f": {text}\n\n".encode()
        case Raw(data):
            return data
        case Burst(steps):
            return b"".join(_encode(s) for s in steps)
    raise TypeError(f"cannot encode step {step!r}")


def _chunk(delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion.chunk",
        "model": "scripted",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


def _data(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


async def _send_plain(
    send: Any, status: int, body: bytes, content_type: str = "application/json",
    retry_after: str | None = None,
) -> None:
    headers = [(b"content-type", content_type.encode())]
    if retry_after is not None:
        headers.append((b"retry-after", retry_after.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


# --- a real mlx_lm.server -----------------------------------------------------------------


MLX_LM_SERVER_WARNING = ("ignore:mlx_lm.server is not recommended for production:UserWarning:"
                         "mlx_lm.server")
"""mlx_lm.server warns at every start (``run`` in mlx_lm/server.py, unconditionally, with no
option to say it is known) that it is not for production: a test server on 127.0.0.1 is
none, and the line went into every log the tests read when a start failed. Ignored by its
own message, category and module only."""


class TinyLlamaServer:
    """A real ``mlx_lm.server`` subprocess serving a tiny llama from ``model_dir``.

    Offline by construction: ``HF_HUB_OFFLINE=1`` and ``HF_HUB_CACHE`` pointing at an
    existing empty directory (mlx_lm.server's ``/v1/models`` crashes if it is missing).
    Readiness is its own log line ("Starting httpd ...", printed once the socket is bound),
    confirmed by one ``GET /v1/models``.
    """

    START_TIMEOUT = 120.0

    def __init__(self, model_dir: Path, cache_dir: Path) -> None:
        self.model_dir = model_dir
        self.cache_dir = cache_dir
        self.port = _free_port()
        self.log: list[str] = []
        self._ready = threading.Event()
        self._proc: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        """Start it and wait until it serves. The port was free when picked, but another
        process may take it before mlx_lm.server binds it: its main thread then dies of
        "Address already in use" (the process lives on, in its model thread), and it is
        started again on a newly picked port (three tries)."""
        for _ in range(3):
            if self._start_once():
                return
            self.port = _free_port()
        raise RuntimeError("mlx_lm.server found its port taken three times:\n"
                           + "".join(self.log[-30:]))

    def _start_once(self) -> bool:
        """One start on ``self.port``: True once it serves, False if the port was taken."""
        env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(self.cache_dir))
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.log = []
        self._ready = threading.Event()
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-W",
                MLX_LM_SERVER_WARNING,
                "-m",
                "mlx_lm",
                "server",
                "--model",
                str(self.model_dir),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--log-level",
                "INFO",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        threading.Thread(target=self._read_log, args=(self._proc, self.log, self._ready),
                         daemon=True, name="mlx_lm.server log").start()
        ready = self._ready.wait(self.START_TIMEOUT)
        if any(_PORT_TAKEN in line for line in self.log):
            self.stop()
            return False
        if not ready or self._proc.poll() is not None:
            self.stop()
            raise RuntimeError("mlx_lm.server did not start:\n" + "".join(self.log[-30:]))
        # Bound and serving once it logged; a few tries only cover a slow first accept.
        deadline = time.monotonic() + 10.0
        while True:
            try:
                httpx.get(f"{self.url}/models", timeout=5.0).raise_for_status()
                return True
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise
                time.sleep(0.1)

    @staticmethod
    def _read_log(proc: subprocess.Popen[str], log: list[str], ready: threading.Event,
                  ) -> None:
        """One start's output (its own list and event: a retry gets new ones)."""
        assert proc.stdout is not None
        for line in proc.stdout:
            log.append(line)
            if "Starting httpd" in line or _PORT_TAKEN in line:
                ready.set()  # taken: its model thread lives on, so no exit to wait for
        ready.set()  # exited: wake the waiter, which checks poll()

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        assert self._proc.stdout is not None
        self._proc.stdout.close()  # (left to the GC, unclosed: a ResourceWarning per start)
        self._proc = None


SIGHUP_AT_DEFAULT = [sys.executable, "-c", "import os, signal, sys; "
                     "signal.signal(signal.SIGHUP, signal.SIG_DFL); "
                     "os.execvp(sys.argv[1], sys.argv[1:])"]
"""A command's prefix that runs it with SIGHUP at its default (not ignored)."""


LEAK_WARNINGS = "always::ResourceWarning"
"""The warning filter a server process the tests start runs with (``PYTHONWARNINGS``,
``leak_checked_env``). Python ignores ResourceWarnings by default, so a socket, file or
transport that the process dropped open said nothing, and pyproject's filterwarnings (which
make it an error) reach only the tests' own process. "always", not "error": uvloop warns of
a handle open at its loop's close BEFORE it closes the handle, and as an error that warning
skipped the close and ``loop.close()`` waited for ever (tests/uvloop_leaks.py); shown, it is
printed and the close goes on. What is printed is checked by ``leaks_said``."""

LEAK_SIGNS = (
    "ResourceWarning",  # unclosed <socket...>, unclosed transport, uvloop's unclosed resource
    "Exception ignored",  # sys.unraisablehook's default: an exception in a __del__, a callback
    "Task was destroyed but it is pending",  # asyncio's log: a task dropped unfinished
    "was never awaited",  # RuntimeWarning: a coroutine created and dropped
    "exception was never retrieved",  # asyncio's log: a task's (future's) error nobody saw
)
"""What Python and asyncio print, and can only print, of a leak in a process: the lines
``leaks_said`` looks for in a server process's output."""


_TRACEMALLOC_HINT = "Enable tracemalloc to get the object allocation traceback"
"""The line after a ResourceWarning's (or a coroutine's): part of it, not a leak of its own."""
_LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d |voice-gateway ")
"""The start of the gateway's next log line (or its banner): the end of what a leak said."""


def leak_checked_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: ours) with ``LEAK_WARNINGS`` added to its ``PYTHONWARNINGS`` (last:
    the filter given last takes precedence), for a server process whose output
    ``leaks_said`` then reads. A process it starts inherits it (a bench's gateway)."""
    env = dict(os.environ if env is None else env)
    env["PYTHONWARNINGS"] = ",".join(filter(None, [env.get("PYTHONWARNINGS"), LEAK_WARNINGS]))
    return env


def leaks_said(output: str) -> list[str]:
    """Each leak a process printed (``LEAK_SIGNS``), with the lines that go with it (the
    warning's source line, the traceback of an exception ignored), up to the next log line.
    Empty when it printed none."""
    said: list[str] = []
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if any(sign in line for sign in LEAK_SIGNS) and _TRACEMALLOC_HINT not in line:
            more = itertools.takewhile(lambda x: not _LOG_LINE.match(x) and (
                _TRACEMALLOC_HINT in x or not any(sign in x for sign in LEAK_SIGNS)),
                lines[i + 1:i + 20])
            said.append("\n".join([line, *more]))
    return said


def assert_no_leaks(output: str, who: str = "the server process") -> None:
    """Fail naming each leak ``output`` (a process's, run with ``leak_checked_env``) says."""
    if leaks := leaks_said(output):
        raise AssertionError(f"{who} leaked ({len(leaks)}):\n" + "\n".join(leaks)
                             + "\n(PYTHONTRACEMALLOC=20 in the tests' environment: where "
                             "each unclosed object was made)\n\nIts output:\n" + output)


STOP_BOUND_S = 60.0
"""How long a ``ServeProcess`` has to exit once sent SIGTERM before it counts as hung: a
gateway stops within its shutdown grace (seconds) even on a starved machine."""


class ServeProcess:
    """``python -m gateway.cli serve ARGS`` as its own process (stdout and stderr merged);
    ``command``: another server's whole command line instead (the watch relay's).

    A thread reads the output line by line into ``output`` from the start, so nothing is
    lost between waiting for a line and reading the rest (``communicate`` with a timeout
    reads the raw pipe and loses what ``readline`` had buffered). Use it as a context
    manager: a process still running at the end is stopped with SIGTERM (``__exit__``).

    It starts with SIGHUP at its default even when the tests run under ``nohup`` (SIGHUP
    ignored, which a child inherits and the gateway and the relay then leave ignored, as
    they must): the tests that send SIGHUP failed so, 2 of 2.

    It runs with ``leak_checked_env``: a leak it printed (an unclosed socket, a task
    destroyed pending, an exception ignored in a ``__del__``: ``LEAK_SIGNS``) fails the test
    at ``__exit__``, naming it. Such a leak only went to the process's output, which no
    test read: it passed.
    """

    def __init__(self, *args: str, command: Sequence[str] = ()) -> None:
        self.output: list[str] = []
        self._seen = threading.Condition()
        self._ended = False
        command = command or [sys.executable, "-m", "gateway.cli", "serve", *args]
        if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
            command = [*SIGHUP_AT_DEFAULT, *command]
        self._proc = subprocess.Popen(command,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, env=leak_checked_env(
                                          {**os.environ, "PYTHONUNBUFFERED": "1"}))
        self._reader = threading.Thread(target=self._read, daemon=True, name="serve output")
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            with self._seen:
                self.output.append(line)
                self._seen.notify_all()
        with self._seen:
            self._ended = True
            self._seen.notify_all()

    def wait_for(self, wanted: Callable[[str], bool], timeout: float = 120.0) -> str:
        """The first output line ``wanted`` holds for, once it has come."""
        with self._seen:
            self._seen.wait_for(lambda: self._ended or any(map(wanted, self.output)), timeout)
            if line := next((x for x in self.output if wanted(x)), None):
                return line
        raise AssertionError("the gateway process never printed the line waited for:\n"
                             + "".join(self.output))

    def serving(self) -> str:
        """The banner's first line, ``voice-gateway X serving ws://...``."""
        return self.wait_for(lambda x: x.startswith("voice-gateway") and "serving" in x)

    def banner(self) -> str:
        """The banner's lines through the HTTP API's."""
        self.wait_for(lambda x: x.startswith("  HTTP:"))
        first = self.output.index(self.serving())
        last = next(i for i, x in enumerate(self.output) if x.startswith("  HTTP:"))
        return "".join(self.output[first:last + 1])

    @property
    def voice_url(self) -> str:
        return self.serving().split()[3]

    @property
    def port(self) -> int:
        return int(self.voice_url.rsplit(":", 1)[1].split("/")[0])

    @property
    def http_port(self) -> int:
        http = self.wait_for(lambda x: x.startswith("  HTTP:")).split()[1]
        return int(http.split("//")[1].split("/")[0].rsplit(":", 1)[1])

    def signal(self, sig: int) -> None:
        self._proc.send_signal(sig)

    def finish(self, timeout: float = STOP_BOUND_S) -> tuple[int, str]:
        """Its exit code and all it printed, once it has exited (a hang guard of
        ``timeout``: a shutdown slowed by a starved machine is no failure)."""
        try:
            code = self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the process hung: not exited within {timeout:g} s. "
                                 "Its output:\n" + "".join(self.output)) from None
        self._reader.join(timeout)
        return code, "".join(self.output)

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 *_: object) -> None:
        """A process still running is asked to stop as an operator would (SIGTERM), and
        killed only if it has not within ``STOP_BOUND_S``: then, unless the test failed
        already, the test fails, for a gateway that does not stop on SIGTERM is a
        shutdown defect. (It was killed at once: no gateway here ever shut down cleanly
        at the end of a test, and the subprocess coverage data it writes on SIGTERM,
        pyproject's [tool.coverage.run], was lost.) Then a leak the process printed fails
        the test (``assert_no_leaks``); a test failing already gets it as a note."""
        hung = False
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(STOP_BOUND_S)
            except subprocess.TimeoutExpired:
                hung = True
                self._proc.kill()
                self._proc.wait()
        assert self._proc.stdout is not None
        self._reader.join(5)
        self._proc.stdout.close()
        if hung and exc_type is None:
            raise AssertionError(f"the process hung: still running {STOP_BOUND_S:g} s "
                                 "after SIGTERM, so it was killed. Its output:\n"
                                 + "".join(self.output))
        if (leaks := leaks_said("".join(self.output))) and exc is not None:
            exc.add_note("and the process leaked:\n" + "\n".join(leaks))
        elif leaks:
            assert_no_leaks("".join(self.output), "the process")


_PORT_TAKEN = "Address already in use"  # the OSError of a bind, on Linux and macOS


@contextlib.contextmanager
def resetting_port(loop: asyncio.AbstractEventLoop) -> Iterator[int]:
    """A port on 127.0.0.1 whose every connection is reset (SO_LINGER 0) once it is made,
    before a byte: an LLM server killed as the connection came. The accept runs on ``loop``,
    the client's, among the callbacks after the poll that saw the connection queued (the
    client's end is established before the server's is queued, so that poll saw the
    client's connect succeed): the reset is the first thing the client's next poll reads."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)

    def reset() -> None:
        with contextlib.suppress(BlockingIOError):  # (accepted by an earlier round)
            connection, _ = listener.accept()
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            connection.close()

    # (not in the reader itself: in the same poll, before the client's end is seen to
    # connect, the reset makes the connect fail: a ConnectError)
    loop.add_reader(listener, loop.call_soon, reset)
    try:
        yield listener.getsockname()[1]
    finally:
        loop.remove_reader(listener)
        listener.close()


def _free_port() -> int:
    """A port free right now (mlx_lm.server cannot report the port it got for 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def health_after_a_probe(gateway: Any, probe: Any) -> dict[str, Any]:
    """``gateway``'s /health once ``probe`` (one of its ``ServerProbe``s) asked its server
    again: its last check made stale, a /health starts the probe, which is waited for."""
    probe.checked_at -= probe.interval_s
    gateway.health()
    await probe._task
    result: dict[str, Any] = gateway.health()
    return result


def record_received(monkeypatch: Any) -> list[Any]:
    """The list every client message a gateway's sessions are fed goes into, in order
    (``SessionRunner.receive`` wrapped, its answer passed on: whether the message acted on
    the session decides whether a resume may still replace it)."""
    from gateway.io.connection import SessionRunner

    received: list[Any] = []
    receive = SessionRunner.receive

    def receiving(runner: SessionRunner, message: Any, now: float) -> bool:
        received.append(message)
        return receive(runner, message, now)

    monkeypatch.setattr(SessionRunner, "receive", receiving)
    return received
