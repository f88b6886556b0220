"""The gateway process: the WebSocket voice server, its GET routes, the engine lane and the
LLM backend, started and stopped together.

``Gateway(config)``; ``await gateway.start()`` binds (port 0 picks a free port, read it back
from ``gateway.port``), loads the engine on its lane thread and starts serving;
``await gateway.aclose()`` closes every connection with 1001, cancels turns and releases
the engine. ``run(config)`` does both around SIGINT/SIGTERM under uvloop.
"""

from __future__ import annotations

import asyncio
import collections
import http
import logging
import os
import secrets
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import orjson
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from engines.base import LlmBackend, TtsEngine
from engines.registry import create_llm, create_voice
from gateway.config import GatewayConfig
from gateway.core.codec import MAX_MESSAGE_BYTES
from gateway.core.scheduler import LanePolicy
from gateway.core.session import Session, SessionLimits, SessionSettings
from gateway.io.aio import cancel_and_wait
from gateway.io.auth import check_token, install_redaction, is_loopback, select_subprotocol
from gateway.io.connection import SessionRunner, VoiceConnection, job_deadline
from gateway.io.http_api import HttpServer, models_body
from gateway.io.lanes import Lane
from gateway.io.static import static_response
from gateway.io.telemetry import CONTENT_TYPE as METRICS_CONTENT_TYPE
from gateway.io.telemetry import Telemetry

log = logging.getLogger("gateway")

VOICE_PATH = "/v1/voice"
WS_MAX_SIZE = 1024 * 1024
"""Frames above this are refused by the WebSocket layer itself (close 1009); frames between
``MAX_MESSAGE_BYTES`` and this get a ``message_too_large`` error event."""


def version() -> str:
    try:
        return metadata.version("voice-gateway")
    except metadata.PackageNotFoundError:
        return "0+unknown"


@dataclass(slots=True)
class Tracer:
    """Latency samples (seconds) by name, for bench/turn_latency.py."""

    samples: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, seconds: float) -> None:
        self.samples.setdefault(name, []).append(seconds)


@dataclass(slots=True)
class Metrics:
    turns: collections.Counter[str] = field(default_factory=collections.Counter)
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    frames: int = 0
    sessions_opened: int = 0
    listeners: list[Callable[[dict[str, Any]], None]] = field(default_factory=list)
    """Called with every turn.done event (telemetry's histograms)."""

    def turn_done(self, event: dict[str, Any]) -> None:
        self.turns[event["status"]] += 1
        for listener in self.listeners:
            listener(event)


class Gateway:
    def __init__(self, config: GatewayConfig, *, engine: TtsEngine | None = None,
                 llm: LlmBackend | None = None) -> None:
        self.config = config
        t = config.tts
        self.engine = engine or create_voice(t.engine, t.engine_options(), t.fallback,
                                             t.fallback_options, t.fallback_policy)
        self.llm = llm or self._make_llm()
        # just in time: a turn more than max_lead ahead of its listener yields the lane
        self.lane = Lane(self.engine.lane, self.engine, deadline_of=job_deadline,
                         max_lead=config.session.max_lead_ms / 1000.0,
                         step_timeout_s=config.tts.step_timeout_s)
        self.lane.scheduler.policy = LanePolicy(config.server.lane_policy)
        self.metrics = Metrics()
        self.telemetry = Telemetry(self)
        s = config.server
        self.http = HttpServer(self, s.host, s.http_port if s.http_port is not None
                               else (s.port + 1 if s.port else 0))
        self.connections: set[VoiceConnection] = set()
        self.runners: dict[str, SessionRunner] = {}
        """Live sessions by id, attached to a connection or waiting for a resume."""
        self.closing = False
        self._runners_changed = asyncio.Event()
        self.started_at = time.time()
        self.ready = False
        self._server: Server | None = None
        self._lane_task: asyncio.Task[None] | None = None
        self.voices: list[str] = []
        self.tracer: Tracer | None = None
        """Set by benchmarks to collect the gateway's own latencies."""

    def _make_llm(self) -> LlmBackend:
        c = self.config.llm
        if c.url:
            return create_llm("openai", url=c.url, model=c.model, api_key=c.api_key)
        return create_llm("replay", path=c.replies, tokens_per_s=c.tokens_per_s)

    # ---- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        s = self.config.server
        install_redaction()  # no token reaches a log line (websockets logs request paths)
        if not s.tokens and not is_loopback(s.host) and not s.insecure_bind:
            raise ValueError(f"refusing to listen on {s.host} without a token: set tokens "
                             "(--token) or pass --insecure-bind")
        await self.http.start()  # first, so /health answers 503 while the engine warms up
        self.telemetry.loop_lag.start()
        self._lane_task = asyncio.create_task(self.lane.run(), name=f"lane-{self.lane.name}")
        try:
            seconds = await self.lane.load()
        except BaseException:
            await self.telemetry.loop_lag.aclose()
            await self.http.aclose()
            raise
        self.voices = list(self.engine.voices())
        log.info("engine %s loaded on lane %s in %.2f s", self.engine.name, self.lane.name,
                 seconds)
        ssl_context = None
        if s.tls_cert:
            import ssl

            ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ssl_context.load_cert_chain(s.tls_cert, s.tls_key)
        self._server = await serve(
            self._handle, s.host, s.port,
            process_request=self._process_request,
            max_size=WS_MAX_SIZE,
            compression=None,  # PCM does not compress; deflate would only cost CPU
            ping_interval=20, ping_timeout=20,
            origins=None if s.origins is None else [*s.origins, None],
            select_subprotocol=select_subprotocol,
            ssl=ssl_context,
        )
        self.ready = True

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        return self._server.sockets[0].getsockname()[1]

    @property
    def http_port(self) -> int:
        return self.http.port

    async def aclose(self) -> None:
        """Close connections with 1001 (going away), cancel turns, release the engine."""
        self.ready = False
        self.closing = True
        await self.http.aclose()
        if self._server is not None:
            self._server.close(close_connections=True)
            await self._server.wait_closed()
        await cancel_and_wait(self._lane_task)
        for runner in list(self.runners.values()):
            runner.close()
        await self.lane.aclose()
        await self.llm.aclose()
        await self.telemetry.aclose()

    # ---- HTTP on the voice port ----------------------------------------------------------

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = request.path.split("?", 1)[0]
        tokens = self.config.server.tokens
        # like the HTTP API port: everything but /health and the console page needs a token
        if path in (VOICE_PATH, "/metrics", "/v1/models") and tokens and \
                not check_token(request, tokens):
            self.metrics.errors["unauthorized"] += 1
            return _json_response(http.HTTPStatus.UNAUTHORIZED, {"error": {
                "code": "unauthorized",
                "message": "a valid token is required (Authorization: Bearer, ?token=, "
                           "or a 'bearer.<token>' WebSocket subprotocol)"}})
        if path == VOICE_PATH:
            if len(self.runners) >= self.config.server.max_sessions:
                return _json_response(http.HTTPStatus.SERVICE_UNAVAILABLE,
                                      {"error": {"code": "server_full",
                                                 "message": "too many sessions; retry later"}})
            return None  # go on with the WebSocket handshake
        if path == "/health":
            health = self.health()
            status = http.HTTPStatus.OK if health["status"] == "ok" else \
                http.HTTPStatus.SERVICE_UNAVAILABLE
            return _json_response(status, health)
        if path == "/metrics":
            data = self.telemetry.exposition()
            return Response(200, "OK", Headers([("Content-Type", METRICS_CONTENT_TYPE),
                                                ("Content-Length", str(len(data)))]), data)
        if path == "/v1/models":
            return _json_response(http.HTTPStatus.OK, models_body(self))
        if (page := static_response(path)) is not None:  # the browser console
            return page
        return _json_response(http.HTTPStatus.NOT_FOUND,
                              {"error": {"code": "not_found", "message": f"no route {path}"}})

    def health(self) -> dict[str, Any]:
        lane = self.lane
        active = sum(1 for r in self.runners.values()
                     if r.session.turn is not None and r.session.turn.state.value != "ended")
        status = "unhealthy" if lane.unhealthy is not None else \
            "ok" if self.ready and lane.loaded else "starting"
        return {
            "status": status,
            "version": version(),
            "pid": os.getpid(),
            "uptime_s": round(time.time() - self.started_at, 1),
            "sessions": len(self.runners),
            "connections": len(self.connections),
            "active_turns": active,
            "engines": {self.engine.name: {"loaded": lane.loaded, "lane": lane.name,
                                           "warm": lane.loaded and lane.stats.jobs_done > 0,
                                           "voices": len(self.voices)}},
            "engine": {"name": self.engine.name, "lane": self.lane.name, "loaded": lane.loaded,
                       "voices": len(self.voices), "unhealthy": lane.unhealthy},
            "lanes": self.telemetry.lane_health(),
            "llm": self.telemetry.llm_health(),
            "loop": self.telemetry.loop_lag.health(),
            "http": {"port": self.http.port if self.http.started else None,
                     "speech_streams": len(self.http.streams)},
            "turns": dict(self.metrics.turns),
            "errors": dict(self.metrics.errors),
            "frames": self.metrics.frames,
            "limits": {"message_bytes": MAX_MESSAGE_BYTES, "max_sessions":
                       self.config.server.max_sessions},
        }

    # ---- WebSocket ---------------------------------------------------------------------

    def new_runner(self) -> SessionRunner:
        s = self.config.server
        runner = SessionRunner(self, self.new_session(), outbox_bytes=s.outbox_bytes,
                               resume_window_s=s.resume_window_s)
        self.runners[runner.session.id] = runner
        return runner

    def forget(self, runner: SessionRunner) -> None:
        if self.runners.get(runner.session.id) is runner:
            del self.runners[runner.session.id]
            self._runners_changed.set()

    async def wait_no_sessions(self) -> None:
        """Return once no session is live (attached or waiting for a resume)."""
        while self.runners:
            self._runners_changed.clear()
            await self._runners_changed.wait()

    def new_session(self) -> Session:
        d = self.config.session
        settings = SessionSettings(voice=self.config.tts.voice, instructions=d.instructions,
                                   llm_model=self.config.llm.model,
                                   temperature=self.config.llm.temperature,
                                   max_tokens=self.config.llm.max_tokens,
                                   frame_ms=d.frame_ms, max_lead_ms=d.max_lead_ms)
        return Session(f"sess_{secrets.token_urlsafe(9)}", settings=settings,
                       limits=SessionLimits(history_turns=d.history_turns),
                       voices=self.voices or None,
                       reads_digits=getattr(self.engine, "reads_digits", True))

    async def _handle(self, websocket: ServerConnection) -> None:
        conn = VoiceConnection(self, websocket)
        self.connections.add(conn)
        self.metrics.sessions_opened += 1
        try:
            await conn.run()
        finally:
            self.connections.discard(conn)


def _json_response(status: http.HTTPStatus, body: dict[str, Any]) -> Response:
    data = orjson.dumps(body)
    headers = Headers([("Content-Type", "application/json"),
                       ("Content-Length", str(len(data))), ("Cache-Control", "no-store")])
    return Response(status.value, status.phrase, headers, data)


async def until_signalled() -> None:
    """Return at the first SIGINT or SIGTERM (the process's way of asking to stop)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def serve_until_signalled(config: GatewayConfig) -> None:
    gateway = Gateway(config)
    await gateway.start()
    c = config
    print(f"voice-gateway {version()} serving ws://{c.server.host}:{gateway.port}{VOICE_PATH} "
          f"(health: http://{c.server.host}:{gateway.port}/health)", flush=True)
    llm = f"openai at {c.llm.url}" + (f" model {c.llm.model}" if c.llm.model else "") \
        if c.llm.url else "replay (scripted replies; pass --llm-url for a real LLM)"
    print(f"  HTTP:  http://{c.server.host}:{gateway.http_port}/v1/audio/speech "
          "(OpenAI-compatible), /v1/models, /health, /metrics", flush=True)
    print(f"  LLM:   {llm}", flush=True)
    print(f"  voice: {gateway.engine.name} on lane {gateway.lane.name}"
          f" (voice {c.tts.voice or 'default'}, {len(gateway.voices)} available)", flush=True)
    auth = f"{len(c.server.tokens)} token(s) required" if c.server.tokens else \
        "none (no token configured: loopback only)" if not c.server.insecure_bind else \
        "NONE, and bound beyond loopback (--insecure-bind)"
    print(f"  auth:  {auth}", flush=True)
    try:
        await until_signalled()
    finally:
        print("shutting down: closing sessions (1001)", flush=True)
        await gateway.aclose()


def run(config: GatewayConfig) -> None:
    try:
        import uvloop
    except ImportError:  # Windows
        asyncio.run(serve_until_signalled(config))
    else:
        uvloop.run(serve_until_signalled(config))
