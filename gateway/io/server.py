"""The gateway process: the WebSocket voice server, its GET routes, the engine lanes and the
LLM backend, started and stopped together.

One ``Lane`` per engine: the primary (``tts.engine``, with its fallback) and optionally a
second engine on another lane (``tts.also``, e.g. ``ane`` next to ``qwen3`` on ``gpu``).
With two, each voice turn is placed on one lane when its first segment is ready
(``gateway.core.placement.TurnPlacer``) and stays there; HTTP speech stays on the primary
lane unless only the other engine has the requested voice.

``Gateway(config)``; ``await gateway.start()`` binds (port 0 picks a free port, read it back
from ``gateway.port``), loads each engine on its lane's thread and starts serving;
``await gateway.aclose()`` closes every connection with 1001, cancels turns and releases
the engine. ``run(config)`` does both around SIGINT/SIGTERM under uvloop.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import gc
import http
import ipaddress
import logging
import os
import secrets
import sys
import time
import urllib.parse
import weakref
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from engines.base import LlmBackend, TtsEngine, shown_url, streams_always
from engines.registry import create_engine, create_llm, create_voice, refused_as
from gateway import version
from gateway.config import TTS_OPTION_NAMES, GatewayConfig, LlmConfig, table_option_names
from gateway.core.codec import MAX_MESSAGE_BYTES
from gateway.core.placement import LaneProfile, TurnPlacer, profile_from
from gateway.core.scheduler import Job, LanePolicy
from gateway.core.segmenter import ONE_STEP_MAX_CHARS, SegmenterConfig
from gateway.core.session import Session, SessionLimits, SessionSettings, listed_voice
from gateway.io.aio import cancel_and_wait, stop_signal, unless_stopped
from gateway.io.auth import (
    CHALLENGE,
    UNAUTHORIZED,
    bind_address,
    check_token,
    host_allowlist,
    install_redaction,
    invalid_host,
    origin_allowlist,
    own_origin,
    refused_bind,
    refused_host,
    refused_origin,
    select_subprotocol,
)
from gateway.io.connection import (
    KEEPALIVE_PING_S,
    SessionRunner,
    UnfinishedBudget,
    VoiceConnection,
    VoiceSocket,
    gateway_socket,
    job_deadline,
)
from gateway.io.http_api import (
    SERVING,
    SHUTDOWN_GRACE_S,
    HttpServer,
    model_body,
    models_body,
    openai_error,
    origin_form,
)
from gateway.io.lanes import Lane, OutOfReach
from gateway.io.listen import free_port, note_plain_http
from gateway.io.log_limit import LogLimit, limited, log_refused, peer_text
from gateway.io.static import static_response
from gateway.io.telemetry import CONTENT_TYPE as METRICS_CONTENT_TYPE
from gateway.io.telemetry import Telemetry

log = logging.getLogger("gateway")

VOICE_PATH = "/v1/voice"
MODELS_PATH = "/v1/models/"
"""Where the voice port answers one model, as the HTTP API port does (``model_body``)."""
WS_MAX_SIZE = 1024 * 1024
"""Frames above this are refused by the WebSocket layer itself (close 1009); frames between
``MAX_MESSAGE_BYTES`` and this get a ``message_too_large`` error event."""


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
    connections_opened: int = 0
    """Voice sockets accepted (each starts a new session, unless it resumes one)."""
    sessions_resumed: int = 0
    """Sockets that resumed a session waiting for them."""
    listeners_lost: int = 0
    """Sockets dropped because a client went quiet while it should have been playing and
    answered no ping (``ProbeListener``)."""
    listeners: list[Callable[[dict[str, Any]], None]] = field(default_factory=list)
    """Called with every turn.done event (telemetry's histograms)."""

    def turn_done(self, event: dict[str, Any]) -> None:
        self.turns[event["status"]] += 1
        for listener in self.listeners:
            listener(event)


LLM_RECOVERED_AFTER = 3
"""Whole replies in a row that end an LLM's failing spell (``Gateway.llm_answered``)."""


_LLM_UNUSED = {"replay": ("model", "api_key", "temperature", "stall_timeout_s", "thinking",
                          "chat_template_kwargs"),
               "openai": ("replies", "tokens_per_s")}
"""The [llm] settings each backend has no use for: one set for the other is said."""
_LLM_DEFAULTS = LlmConfig()


class Gateway:
    def __init__(self, config: GatewayConfig, *, engine: TtsEngine | None = None,
                 llm: LlmBackend | None = None) -> None:
        self.config = config
        self.origins = origin_allowlist(config.server.tokens, config.server.origins)
        """The browser origins both ports let in besides their own pages (None: any)."""
        self.hosts = host_allowlist(config.server.tokens, config.server.allowed_hosts,
                                    config.server.origins, tls=bool(config.server.tls_cert))
        """The ``Host`` names both ports answer besides IP addresses and localhost (None:
        any; ``gateway.io.auth.host_allowed``)."""
        models = config.llm.models
        self.llm_models = None if "*" in models else tuple(models)
        """The LLM models a session may ask for besides ``[llm] model`` (None: any)."""
        t = config.tts
        self.engine = engine or create_voice(t.engine, t.engine_options(), t.fallback,
                                             t.fallback_options, t.fallback_policy,
                                             names=TTS_OPTION_NAMES,
                                             fallback_names=table_option_names(
                                                 "tts.fallback_options"))
        self.engines: list[TtsEngine] = [self.engine]
        if t.also:
            with refused_as("the second engine ([tts] also, [tts.also_options])"):
                self.engines.append(create_engine(
                    t.also, names=table_option_names("tts.also_options"), **t.also_options))
            if self.engines[1].lane == self.engine.lane:
                raise ValueError(
                    f"tts.also: engine {t.also!r} runs on lane {self.engine.lane!r} like the "
                    f"primary engine {t.engine!r}; the two engines must declare different "
                    "lanes (one worker per lane)")
        for eng in self.engines:
            _check_read_timeouts(eng, t.step_timeout_s)
        self.profiles = self._profiles() if len(self.engines) > 1 else {}
        if t.profiles and len(self.engines) == 1:
            log.warning("[tts.profiles] is ignored: it places turns between two lanes, and "
                        "only one engine runs (add one with [tts] also)")
        for name, where, named, tables in (
                ("fallback engine", "[tts] fallback, --fallback", t.fallback,
                 ("fallback_policy", "fallback_options")),
                ("second engine", "[tts] also, --tts-also", t.also, ("also_options",))):
            for table in tables:  # (an engine that is there is refused a bad key of its own)
                if getattr(t, table) and not named:
                    log.warning("[tts.%s] is ignored: no %s is configured (%s)", table, name,
                                where)
        self.llm = llm or self._make_llm()
        self.lanes: dict[str, Lane] = {}
        """One lane (worker thread + scheduler) per engine, by lane name; primary first."""
        for eng in self.engines:
            # just in time: a turn more than max_lead ahead of its listener yields the lane
            streams = t.max_open_streams
            if streams is None:
                streams = getattr(eng, "max_open_streams", None)
            lane = Lane(eng.lane, eng, deadline_of=job_deadline,
                        max_lead=config.session.max_lead_ms / 1000.0,
                        step_timeout_s=t.step_timeout_s, max_open_streams=streams or None,
                        reserved_streams=t.interactive_reserved_streams)
            lane.scheduler.policy = LanePolicy(config.server.lane_policy)
            if getattr(eng, "one_stream_at_a_time", False):
                # interleaving two jobs' steps would open a second stream, which this engine
                # refuses: whole jobs, in arrival order
                lane.scheduler.policy = LanePolicy.FIFO
            self.lanes[lane.name] = lane
        self.lane = self.lanes[self.engine.lane]
        """The primary engine's lane."""
        self.placer: TurnPlacer | None = None
        """Places voice turns between lanes (set at start, with two lanes)."""
        self.llm_streams = 0
        """This gateway's LLM streams decoding now."""
        self.metrics = Metrics()
        self.unfinished = UnfinishedBudget(self.metrics.errors)
        """What the voice sockets hold of messages still arriving, beyond 80 KiB each."""
        self.telemetry = Telemetry(self)
        self.telemetry.llm_probe.on_answer = self.llm_probed
        self._llm_out_of_reach = OutOfReach()
        """Whether a probe of the LLM server ends ``llm_failing``."""
        s = config.server
        self.http = HttpServer(self, bind_address(s.host), s.http_port if s.http_port is not None
                               else (s.port + 1 if s.port else 0),
                               tls=(s.tls_cert, s.tls_key) if s.tls_cert else None)
        self.connections: set[VoiceConnection] = set()
        self.runners: dict[str, SessionRunner] = {}
        """Live sessions by id, attached to a connection or waiting for a resume."""
        self.log_limit = LogLimit()
        """Limits the log lines that come in floods (refusals, turns the LLM fails) while the
        gateway runs."""
        self.llm_failing: dict[str, Any] | None = None
        """While the LLM fails turns (``llm_answered``; /health): since when, turns failed,
        replies that came whole meanwhile and in a row, the last code and message."""
        self.past_limit: weakref.WeakKeyDictionary[ServerConnection, str] = \
            weakref.WeakKeyDictionary()
        """Sockets let in beyond ``max_sessions`` to resume the session named (``?resume=``),
        until they do. Weak: a handshake that fails after the check leaves no entry."""
        self.closing = False
        self._live_changed = asyncio.Event()
        """Set when a session is forgotten or a socket's handler ends (wait_no_sessions)."""
        self.started_at = time.time()
        self.ready = False
        self.certificate_names: list[str] = []
        """With TLS, the names and addresses its certificate is for (``certificate_names``),
        once started."""
        self._server: Server | None = None
        self._lane_tasks: list[asyncio.Task[None]] = []
        self.voices: list[str] = []
        """Every engine's voices (the primary's first)."""
        self.lane_voices: dict[str, list[str]] = {}
        self.tracer: Tracer | None = None
        """Set by benchmarks to collect the gateway's own latencies."""

    def _make_llm(self) -> LlmBackend:
        c = self.config.llm
        backend = "openai" if c.url else "replay"
        unused = [f"llm.{key}" for key in _LLM_UNUSED[backend]
                  if getattr(c, key) != getattr(_LLM_DEFAULTS, key)]
        if unused:  # (--llm-model without --llm-url went unnoticed)
            log.warning("%s ignored: the %s backend does not use %s%s", ", ".join(unused),
                        backend, "them" if len(unused) > 1 else "it",
                        " (it needs llm.url, --llm-url)" if backend == "replay" else "")
        if c.url:
            return create_llm("openai", url=c.url, model=c.model, api_key=c.api_key,
                              stall_s=c.stall_timeout_s, thinking=c.thinking,
                              chat_template_kwargs=c.chat_template_kwargs)
        from engines.llm_replay import RepliesError

        try:
            return create_llm("replay", path=c.replies, tokens_per_s=c.tokens_per_s)
        except RepliesError as exc:  # (it named the file and its line, not the key or flag)
            raise ValueError(f"llm.replies (--replies): {exc}") from None

    def _profiles(self) -> dict[str, LaneProfile]:
        """Each lane's timing for placement: the engine's ``timing``, overridden by
        ``[tts.profiles.<lane>]``."""
        overrides = self.config.tts.profiles
        lanes = [e.lane for e in self.engines]
        if unknown := set(overrides) - set(lanes):
            raise ValueError(f"tts.profiles: no engine runs on lane(s) "
                             f"{', '.join(sorted(unknown))}; lanes: {', '.join(lanes)}")
        profiles: dict[str, LaneProfile] = {}
        for eng in self.engines:
            figures = {**(getattr(eng, "timing", None) or {}), **overrides.get(eng.lane, {})}
            if not figures:
                raise ValueError(f"engine {eng.name!r} declares no timing figures to place "
                                 f"turns with: set [tts.profiles.{eng.lane}] first_s and rtf")
            profiles[eng.lane] = profile_from(eng.lane, figures)
        return profiles

    # ---- lanes -------------------------------------------------------------------------

    def llm_started(self) -> None:
        """An LLM stream of this gateway began decoding: every lane is told (a lane decides
        by its name whether it shares the GPU with the LLM)."""
        self.llm_streams += 1
        for lane in self.lanes.values():
            lane.llm_started()

    def llm_ended(self) -> None:
        self.llm_streams = max(0, self.llm_streams - 1)
        for lane in self.lanes.values():
            lane.llm_ended()

    def llm_answered(self, failure: tuple[str, str] | None, *,
                     unreachable: bool = False) -> None:
        """A turn's LLM stream ended: ``failure`` is its ``(code, message)``, None if the
        reply came whole; ``unreachable``: it could not reach the server at all. The
        operator hears of a change, once (a WARNING when replies start failing, an INFO when
        they come back), not of every turn: a dead LLM used to fail every turn without a
        log line while /health said ok. They are back after ``LLM_RECOVERED_AFTER`` whole
        replies in a row (``llm_probed``: or, out of reach, once it answers its probe): an
        LLM failing every other turn (busy, answering 429) flipped the health and the log
        on each turn."""
        failing = self.llm_failing
        if failure is None:
            self.telemetry.llm_probe.observed(True, "answered a turn")
            if failing is not None:
                failing["answered"] += 1
                failing["in_a_row"] += 1
                if failing["in_a_row"] >= LLM_RECOVERED_AFTER:
                    self._llm_back("")
            return
        code, message = failure
        if unreachable:  # (it answered, wrongly or too slowly: its probe reaches it)
            self.telemetry.llm_probe.observed(False, message)
        self._llm_out_of_reach.failed(unreachable)
        if failing is None:
            log.warning("the LLM fails turns (%s): %s", code, message)
            failing = self.llm_failing = {"since": time.time(), "turns": 0, "answered": 0}
        failing.update(turns=failing["turns"] + 1, in_a_row=0, code=code, message=message)

    def llm_probed(self, started: float) -> None:
        """A probe that ``started`` at that ``time.monotonic()`` found the LLM server
        answering: a failing spell ends here if the server's being out of reach caused it
        (``OutOfReach``: the last failure ``llm_unavailable`` with no connection made). One
        that its replies caused (``llm_failed``; ``llm_unavailable`` from a server that took
        the request and then stalled) still ends only with whole replies: a server that
        answers ``/models`` may still answer chats wrongly, or not at all."""
        if self.llm_failing is None or not self._llm_out_of_reach.ended_by(started):
            return
        self._llm_back(" (its server answers the probe)")

    def _llm_back(self, how: str) -> None:
        """The LLM's failing spell ends, said once (``how``: how it was found)."""
        failing, self.llm_failing = self.llm_failing, None
        assert failing is not None
        log.info("the LLM answers again%s: %d turn(s) failed, %d came whole, since %s", how,
                 failing["turns"], failing["answered"],
                 time.strftime("%H:%M:%S", time.localtime(failing["since"])))

    def place_turn(self, owner: Hashable, voice: str | None) -> Lane:
        """The lane of a voice turn (``owner``: its jobs' owner): chosen at its first
        segment, among the lanes whose engine has ``voice``, then kept until
        ``release_turn``."""
        if self.placer is None:
            return self.lane
        usable = [n for n, lane in self.lanes.items() if lane.usable]
        return self.lanes[self.placer.place_turn(owner, voice, self.llm_streams > 0, usable,
                                                 now=time.monotonic())]

    def job_succeeded(self, job: Job) -> None:
        """A voice turn's job ended with its audio: its lane's breaker starts over."""
        if self.placer is not None and (lane := self.placer.lane_of(job.owner)) is not None:
            self.placer.succeeded(lane, time.monotonic())

    def reroute(self, job: Job, code: str, message: str) -> str | None:
        """A voice turn's job failed on a lane other than the primary's. That engine has no
        fallback of its own, so the primary's takes over, with the rule of
        ``engines.fallback``: the rest of the turn moves to the primary lane (its queued
        jobs along), and the failed segment is said again there when none of its audio
        went out (``"again"``), else it ends where it stopped (``"truncated"``: the caller
        ends it as done; saying it again would repeat what the listener heard). None when
        the primary cannot take it (no such voice, not loaded, unhealthy): the session is
        told, as for a failure on the primary. Every failure here counts against the
        lane's breaker (``TurnPlacer.failed``), but ``internal_error``: a bug in the
        gateway handling the job (``Lane._consumer_failed``), not its engine failing. That
        one fails the turn as on the primary (the lane has dropped its other jobs); taken
        for the engine's, it counted against a healthy engine's breaker and cut the
        sentence short, and the turn waited for ever for the sentences dropped."""
        placer = self.placer
        if placer is None or job.cancelled or code == "internal_error":
            return None
        name = placer.lane_of(job.owner)
        if name is None or name == self.lane.name:
            return None
        placer.failed(name, time.monotonic())
        if (self.lane.name not in placer.lanes_with(job.payload.request.voice)
                or not self.lane.usable):
            return None
        moved = self.lanes[name].hand_over(job.owner)
        placer.move(job.owner, self.lane.name)
        again = job.steps == 0
        log.warning("lane %s: %s (%s); turn %s continues on lane %s (%s)", name, code, message,
                    job.owner, self.lane.name,
                    "segment said again" if again else "segment truncated")
        for j in ((job, *moved) if again else moved):
            self.lane.submit(j.owner, j.payload, deadline=j.deadline, priority=j.priority,
                             since=j.since, max_lead=j.max_lead)
        return "again" if again else "truncated"

    def lane_for(self, owner: Hashable) -> Lane:
        """The lane ``owner``'s jobs went to (the primary for an owner never placed)."""
        name = self.placer.lane_of(owner) if self.placer is not None else None
        return self.lane if name is None else self.lanes[name]

    def release_turn(self, owner: Hashable) -> None:
        """``owner``'s turn ended: its lane serves one turn fewer. Idempotent."""
        if self.placer is not None:
            self.placer.release(owner)

    def lane_for_voice(self, voice: str | None) -> Lane:
        """Background (HTTP) speech: the primary lane, unless only another engine has
        ``voice``."""
        if self.placer is None:
            return self.lane
        lanes = self.placer.lanes_with(voice)  # the primary first when it has the voice
        return self.lanes[lanes[0]] if lanes else self.lane

    # ---- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        s = self.config.server
        install_redaction()  # no token reaches a log line (websockets logs request paths)
        if (why := refused_bind(s.host, s.tokens, s.insecure_bind)) is not None:
            raise ValueError(why)
        ssl_context = _tls_context(s.tls_cert, s.tls_key)  # before either port serves
        if ssl_context is not None and s.tls_cert:
            self.certificate_names = certificate_names(ssl_context, s.tls_cert)
            note_plain_http(ssl_context, functools.partial(self.plain_http_refused,
                                                           "voice port", "wss://"))
        host = bind_address(s.host)
        # the voice port taken fails the start now, not once the engines have loaded
        # (qwen3's tiny test model takes 24 s on this CPU): bound, let go at once, and bound
        # again by serve() below (taken in between, that one says so as late)
        hosts, port = await free_port(host, s.port, "voice port, --port")
        await self.http.start()  # first, so /health answers 503 while the engine warms up
        self.log_limit.install()  # a flood of refused requests is not a flood of lines
        self.telemetry.start()
        self._lane_tasks = [asyncio.create_task(lane.run(), name=f"lane-{lane.name}")
                            for lane in self.lanes.values()]
        try:
            seconds = await asyncio.gather(*(lane.load() for lane in self.lanes.values()))
        except BaseException:
            # shielded: when the start itself is cancelled (a ^C during the load), the
            # cleanup must not stop at its first await (cancel_and_wait re-raises there)
            await asyncio.shield(self._close_started())
            raise
        voices = {lane.name: list(lane.engine.voices()) for lane in self.lanes.values()}
        self.lane_voices = voices
        self.voices = list(dict.fromkeys(v for vs in voices.values() for v in vs))
        if len(self.lanes) > 1:
            self.placer = TurnPlacer(self.profiles, voices, primary=self.lane.name,
                                     timing={n: lane.timing for n, lane in self.lanes.items()})
        for lane, s_ in zip(self.lanes.values(), seconds, strict=True):
            log.info("engine %s loaded on lane %s in %.2f s", lane.engine.name, lane.name, s_)
        self._log_voice_set_aside()
        try:
            self._server = await serve(
                # (the loop's create_server takes a list of hosts too; websockets passes it on)
                self._handle, cast(str, hosts), port,
                create_connection=gateway_socket(self._refused_method, self._unreadable),
                process_request=self._process_request,
                max_size=WS_MAX_SIZE,
                # PCM does not compress, and audio headers are cached without extensions
                # (connection.binary_header, tests/test_framing.py)
                compression=None,
                ping_interval=KEEPALIVE_PING_S, ping_timeout=KEEPALIVE_PING_S,
                select_subprotocol=select_subprotocol,
                ssl=ssl_context,
            )
        except BaseException as exc:
            # the voice port taken (or the start cancelled here): the engines have loaded,
            # so everything closes as at the end, the engines too (shielded, as above)
            await asyncio.shield(self.aclose())
            if isinstance(exc, OSError) and exc.errno is not None:
                # named as the HTTP port's refusal is (gateway.io.listen), not as asyncio's
                # "error while attempting to bind on address (...)", which names no flag
                raise OSError(exc.errno, f"cannot listen on {s.host}:{s.port} (voice port, "
                                         f"--port): {os.strerror(exc.errno)}") from None
            raise
        self.ready = True

    async def _close_started(self) -> None:
        """Close what ``start`` opened before its engines loaded."""
        for task in self._lane_tasks:
            await cancel_and_wait(task)
        for lane in self.lanes.values():
            lane.close_soon()
        await self.telemetry.aclose()
        await self.http.aclose()
        self.log_limit.remove()

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        return self._server.sockets[0].getsockname()[1]

    @property
    def http_port(self) -> int:
        return self.http.port

    async def aclose(self) -> None:
        """End every turn (``shutting_down``), close connections with 1001 (going away),
        release the engine.

        The two ports close at the same time, each within its ``SHUTDOWN_GRACE_S``: neither
        needs the other, nor the lanes (a voice turn ends at once, a speech stream fails at
        once; what each grace protects is a client taking what was already made). One
        after the other, a voice turn went on speaking while an HTTP client held the HTTP
        API's grace, and the stop took both graces."""
        self.ready = False
        self.closing = True
        if self._server is not None:
            self._server.server.close()  # no new voice connections
        results = await asyncio.gather(self.http.aclose(), self._close_sessions(),
                                       return_exceptions=True)
        self.log_limit.remove()  # (no port answers now)
        for task in self._lane_tasks:
            await cancel_and_wait(task)
        for runner in list(self.runners.values()):
            runner.close()
        for lane in self.lanes.values():
            await lane.aclose()
        await self.llm.aclose()
        await self.telemetry.aclose()
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def _close_sessions(self) -> None:
        """End every session's turn (``shutting_down``) and close its socket with 1001;
        abort the sockets still open after ``SHUTDOWN_GRACE_S``. Their clients read nothing
        (not the close frame either): websockets would wait out its close timeout for each
        (10 s), and the stop with them. What the kernel holds for them (the turn's end, the
        close frame) still reaches them after the abort."""
        if self._server is None:
            return
        log.info("shutting down: closing %d session(s) (1001), %d turn(s) in progress "
                 "cut short", len(self.runners), self.active_turns())
        for runner in list(self.runners.values()):
            runner.shutdown()  # each writer sends the turn's end, then closes (1001)
        try:
            async with asyncio.timeout(SHUTDOWN_GRACE_S):
                await self.wait_no_sessions()
        except TimeoutError:
            if stuck := list(self.connections):
                log.info("shutting down: %d socket(s) had not taken their close when the "
                         "shutdown's %g s grace ended: aborted", len(stuck), SHUTDOWN_GRACE_S)
            for connection in stuck:
                connection.ws.transport.abort()
        self._server.close(close_connections=True)
        await self._server.wait_closed()

    # ---- HTTP on the voice port ----------------------------------------------------------

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        if (absolute := origin_form(request.path)) is not None:
            # a target in absolute form: its path is served, its host replaces Host (RFC
            # 9112 3.2.2); websockets took it whole for the path ("no route http://...")
            host, request.path = absolute
            if "Host" in request.headers:
                del request.headers["Host"]
            request.headers["Host"] = host
        # RFC 9112 3.2: a request with no Host (websockets reads HTTP/1.1 only), more than
        # one, or one no host[:port] is answered 400, whatever the tokens, as the HTTP API's
        # port answers it; "evil@127.0.0.1" and an empty Host passed the check against DNS
        # rebinding, as an IP address and as no Host at all (HTTP/1.0)
        hosts = request.headers.get_all("Host")
        response: Response | None
        if (why := invalid_host(hosts) if hosts else "no Host (HTTP/1.1 requires one)"):
            response = self._unreadable(connection, why)
        # websockets answers any method as a GET: a HEAD got the body too, a POST the page
        elif request.method == "GET":
            response = self._answer_request(connection, request)
        elif request.method == "HEAD" and request.path.split("?", 1)[0] != VOICE_PATH:
            response = self._answer_request(connection, request)
            assert response is not None  # (only the voice path goes on to a handshake)
            response = dataclasses.replace(response, body=b"")  # its Content-Length stays
        else:
            response = self._refused_method(request.method, request.path)
        if response is not None:
            # websockets closes the connection after any answer but a 101: say so, or a
            # client reusing it (httpx's pool) sends its next request into a closed socket
            response.headers["Connection"] = "close"
        return response

    def _refused_method(self, method: str, path: str) -> Response:
        """405 for ``method`` on the voice port, naming the HTTP API's port: a POST here is
        most likely an OpenAI client given this port for ``--http-port``'s. The voice path
        takes only the GET that opens a WebSocket: its 405 to a HEAD said HEAD was allowed."""
        allowed = "GET" if path.split("?", 1)[0] == VOICE_PATH else "GET, HEAD"
        response = _error_response(
            http.HTTPStatus.METHOD_NOT_ALLOWED, "method_not_allowed",
            f"{method[:20]} is not allowed here on the voice port ({allowed}); the HTTP API "
            f"(POST /v1/audio/speech) is on port {self.http_port} (--http-port)")
        response.headers["Allow"] = allowed
        return response

    def _unreadable(self, connection: ServerConnection, why: str) -> Response:
        """400 ``invalid_http`` for a request websockets could not read (a GET with a body,
        a request line it cannot parse), as the HTTP API's port answers one: it was closed
        unanswered, with no line and no count. Counted, and said in one line (a few a
        minute), as that port's are (``_H11.send_400_response``)."""
        self.metrics.errors["invalid_http"] += 1
        message = "the request could not be read: " + \
            "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in why[:200])
        log.info("HTTP request from %s refused (400 invalid_http): %s",
                 peer_text(connection.remote_address), message, extra=limited("invalid_http"))
        return _error_response(http.HTTPStatus.BAD_REQUEST, "invalid_http", message)

    def _answer_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = request.path.split("?", 1)[0]
        hosts = request.headers.get_all("Host")
        if (why := refused_host(hosts, self.hosts)) is not None:  # (DNS rebinding)
            return self._refuse(connection, request, http.HTTPStatus.FORBIDDEN,
                                "forbidden_host", why)
        tokens = self.config.server.tokens
        # like the HTTP API port: everything but /health and the console page needs a token
        if (path in (VOICE_PATH, "/metrics", "/v1/models") or path.startswith(MODELS_PATH)) \
                and tokens and not check_token(request, tokens):
            refused = self._refuse(connection, request, http.HTTPStatus.UNAUTHORIZED,
                                   "unauthorized", UNAUTHORIZED)
            refused.headers.update(CHALLENGE)  # (as the HTTP API port's 401 has it)
            return refused
        if path == VOICE_PATH:
            scheme = "https" if self.config.server.tls_cert else "http"
            own = own_origin(scheme, hosts[0] if len(hosts) == 1 else "", self.hosts)
            why = refused_origin(request.headers.get_all("Origin"), self.origins, own=own)
            if why is not None:
                return self._refuse(connection, request, http.HTTPStatus.FORBIDDEN,
                                    "forbidden_origin", why)
            if len(self.runners) >= self.config.server.max_sessions:
                resuming, why = self._resumable_past_limit(request.path)
                if resuming is not None:
                    self.past_limit[connection] = resuming
                    return None
                return self._refuse(connection, request, http.HTTPStatus.SERVICE_UNAVAILABLE,
                                    "server_full", f"too many sessions; {why}")
            return None  # go on with the WebSocket handshake
        if path == "/health":
            health = self.health()
            status = http.HTTPStatus.OK if health["status"] in SERVING else \
                http.HTTPStatus.SERVICE_UNAVAILABLE
            return _json_response(status, health)
        if path == "/metrics":
            data = self.telemetry.exposition()
            return Response(200, "OK", Headers([("Content-Type", METRICS_CONTENT_TYPE),
                                                ("Content-Length", str(len(data)))]), data)
        if path == "/v1/models":
            return _json_response(http.HTTPStatus.OK, models_body(self))
        if path.startswith(MODELS_PATH):  # the HTTP API port's answer (the SDK's retrieve)
            code, model = model_body(self, urllib.parse.unquote(path[len(MODELS_PATH):]))
            return _json_response(http.HTTPStatus(code), model)
        if (page := static_response(path)) is not None:  # the browser console
            return page
        return _error_response(http.HTTPStatus.NOT_FOUND, "not_found", f"no route {path}")

    def _refuse(self, connection: ServerConnection, request: Request,
                status: http.HTTPStatus, code: str, message: str) -> Response:
        """The answer to a request refused before anything is served: counted, and its log
        line (a few a minute of each code: ``LogLimit``). A phone refused for a wrong token,
        or for a name not in ``allowed_hosts``, left no line: the operator read a silent
        log while its client said 401 or 403."""
        self.metrics.errors[code] += 1
        log_refused(log, request.path, peer_text(connection.remote_address), status, code,
                    message)
        return _error_response(status, code, message)

    def plain_http_refused(self, port: str, scheme: str) -> None:
        """A client spoke plain HTTP to ``port``, which serves TLS (``note_plain_http``):
        counted, and logged as the refusals are (its client only sees the connection
        close)."""
        self.metrics.errors["plain_http"] += 1
        log.info("a plain HTTP request (ws:// or http://) reached the %s, which serves TLS: "
                 "closed unanswered; its client must dial %s", port, scheme,
                 extra=limited("refused plain_http"))

    def _resumable_past_limit(self, path: str) -> tuple[str | None, str]:
        """The session a socket names with ``?resume=<session_id>`` when a full gateway may
        still let it in: the session is live (it counts toward the limit already, and the
        resume frees the new socket's own session at once). One such socket per session:
        a newer one replaces one still on its way (the client's retry after its last attempt
        went quiet). Else None and why, for the refusal."""
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
        session_id = query.get("resume", [""])[0]
        if not session_id:
            return None, "retry later (to resume a session, name it: ?resume=<session_id>)"
        runner = self.runners.get(session_id)
        if runner is None or runner.closed:
            return None, f"session {session_id!r} is not waiting for a resume; retry later"
        for ws, pending in list(self.past_limit.items()):
            if pending != session_id:
                continue
            older = next((c for c in self.connections if c.ws is ws), None)
            if older is not None:
                older.refuse_past_limit()
            elif ws.transport.is_closing() or (ws.response is not None
                                               and ws.response.status_code != 101):
                # its handshake failed: it never came to be (refused, websockets half-closes
                # it and waits up to its close timeout for a client that may stay)
                del self.past_limit[ws]
            else:  # still in its handshake
                return None, f"another socket is resuming {session_id} right now; retry"
        return session_id, ""

    def active_turns(self) -> int:
        """Turns in progress, over every live session."""
        return sum(1 for r in self.runners.values()
                   if r.session.turn is not None and not r.session.turn.ended)

    def status(self) -> str:
        """``/health``'s ``status`` (one of ``telemetry.STATUSES``), also in ``/metrics``
        (``gateway_status``)."""
        lane = self.lane
        # the primary decides: a stuck second lane only loses its turns to the primary
        # (placement skips it); it shows in lanes[...]["unhealthy"]
        return "stopping" if self.closing else \
            "unhealthy" if lane.unhealthy is not None else \
            "starting" if not (self.ready and all(ln.loaded for ln in self.lanes.values())) \
            else "degraded" if getattr(self.engine, "degraded", None) or lane.failing or \
            self.llm_failing or self.telemetry.llm_probe.reachable is False or \
            self.tts_unreachable() else "ok"

    def engine_lanes(self) -> dict[str, Lane]:
        """Each lane, the primary first, by the id of its engine in ``/health`` (``engines``)
        and ``/v1/models``: the engine's name, or ``<name>@<lane>`` when two engines have
        the same name (two ``synthetic`` without a ``name``), which ``/v1/models`` listed
        twice under one id."""
        names = [ln.engine.name for ln in self.lanes.values()]
        return {(ln.engine.name if names.count(ln.engine.name) == 1 else
                 f"{ln.engine.name}@{ln.name}"): ln for ln in self.lanes.values()}

    def tts_unreachable(self) -> bool:
        """The primary lane's TTS server (an ``http`` engine's) does not answer its probe."""
        probe = self.telemetry.tts_probes.get(self.lane.name)
        return probe is not None and probe.reachable is False

    def health(self) -> dict[str, Any]:
        lane = self.lane
        degraded = getattr(self.engine, "degraded", None)  # (a fallback speaks)
        llm = self.telemetry.llm_health()
        status = self.status()
        engines = {name: {
            "loaded": ln.loaded, "lane": ln.name,
            "warm": ln.loaded and ln.stats.jobs_done > 0,
            "voices": len(self.lane_voices.get(ln.name, ()))}
            for name, ln in self.engine_lanes().items()}
        return {
            "status": status,
            "version": version(),
            "pid": os.getpid(),
            "uptime_s": round(time.time() - self.started_at, 1),
            "sessions": len(self.runners),
            "connections": len(self.connections),
            "active_turns": self.active_turns(),
            "engines": engines,
            "engine": {"name": self.engine.name, "lane": self.lane.name, "loaded": lane.loaded,
                       "voices": len(self.lane_voices.get(lane.name, ())),
                       "unhealthy": lane.unhealthy,
                       "degraded": degraded, "failing": lane.failing,
                       **({"fallback": self.engine.counters()}
                          if hasattr(self.engine, "counters") else {})},
            "lanes": self.telemetry.lane_health(),
            "llm": {**llm, "failing": self.llm_failing and dict(self.llm_failing)},
            "loop": {**self.telemetry.loop_lag.health(), **self.telemetry.gc_pauses.health()},
            "http": {"port": self.http.port if self.http.started else None,
                     "speech_streams": len(self.http.streams)},
            "turns": dict(self.metrics.turns),
            "errors": dict(self.metrics.errors),
            "frames": self.metrics.frames,
            "listeners_lost": self.metrics.listeners_lost,
            "limits": {"message_bytes": MAX_MESSAGE_BYTES, "max_sessions":
                       self.config.server.max_sessions, "max_speech_requests":
                       self.config.server.max_speech_requests},
            "auth": "bearer" if self.config.server.tokens else "none",
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
            self._live_changed.set()

    async def wait_no_sessions(self) -> None:
        """Return once no session is live (attached or waiting for a resume) and every
        socket's handler has finished."""
        while self.runners or self.connections:
            self._live_changed.clear()
            await self._live_changed.wait()

    @property
    def configured_voice(self) -> str | None:
        """``tts.voice`` spelt as the engines list it (``--voice En-GB`` was announced as
        the default of ``/v1/audio/voices`` and in ``session.created`` though the list says
        ``en-gb``), as written when they list none, and None when they list others: its
        engine did not load, and the fallback speaks with its own default. A session then
        said ``voice: "vivian"`` while espeak spoke ``en-us``."""
        configured = self.config.tts.voice
        if not configured or not self.voices:
            return configured
        return listed_voice(configured, self.voices)

    def _log_voice_set_aside(self) -> None:
        """A configured voice no engine lists (``configured_voice``: a primary that did not
        load, and a fallback without it) is set aside for the speaker's own default: the
        operator is told which and why, once. Only the primary's load error said anything,
        and the banner's "voice en-us" was the one trace of ``--voice vivian`` going
        unused."""
        configured = self.config.tts.voice
        if not configured or self.configured_voice is not None:
            return
        speaker = getattr(self.engine, "speaker", self.engine)
        why = getattr(self.engine, "primary_load_error", None)
        log.warning("tts.voice %r is set aside: %s has no such voice%s; sessions and requests "
                    "without a voice get %s", configured, speaker.name,
                    f" (it speaks because {why})" if why else "",
                    self.default_voice or "the engine's default")

    @property
    def default_voice(self) -> str | None:
        """The voice a session or request without one gets: the configured one where the
        engine has it, else the engine's own (behind a fallback whose primary did not load,
        the fallback's)."""
        return self.configured_voice or getattr(self.engine, "default_voice", None)

    @property
    def segmenter_defaults(self) -> SegmenterConfig:
        """Each session's segmenter unless it asks otherwise: shorter segments when a voice
        may make one in one step (``ONE_STEP_MAX_CHARS``), as the HTTP API cuts them."""
        if all(streams_always(e) for e in self.engines):
            return SegmenterConfig()
        return SegmenterConfig(max_chars=ONE_STEP_MAX_CHARS)

    def new_session(self) -> Session:
        d = self.config.session
        settings = SessionSettings(voice=self.configured_voice, instructions=d.instructions,
                                   llm_model=self.config.llm.model,
                                   temperature=self.config.llm.temperature,
                                   max_tokens=self.config.llm.max_tokens,
                                   frame_ms=d.frame_ms, max_lead_ms=d.max_lead_ms,
                                   segmenter=self.segmenter_defaults)
        return Session(f"sess_{secrets.token_urlsafe(9)}", settings=settings,
                       limits=SessionLimits(history_turns=d.history_turns,
                                            max_reply_chars=d.max_reply_chars),
                       voices=self.voices or None,
                       llm_models=self.llm_models,
                       reads_digits=all(getattr(e, "reads_digits", True) for e in self.engines))

    async def _handle(self, websocket: ServerConnection) -> None:
        # websockets binds our select_subprotocol to the protocol through a closure over
        # the connection: connection -> protocol -> closure -> connection. Only a full GC
        # would free a closed connection then, and at 2,000 sessions a full GC holds the
        # loop for 0.3-0.8 s. The handshake is over, so drop the binding (the class's own
        # method takes its place) and let reference counting free the connection.
        vars(websocket.protocol).pop("select_subprotocol", None)
        # The handshake's headers (a list per name, both ways: ~20 objects, a sixth of a
        # session's) are read by nothing after it, yet each full collection walked them for
        # the life of the socket. (The request itself stays: websockets reads it as the
        # sign that the handshake is over.)
        assert websocket.request is not None
        websocket.request.headers.clear()
        websocket.response = None
        socket = cast(VoiceSocket, websocket)  # (create_connection)
        socket.budget = self.unfinished
        conn = VoiceConnection(self, socket, resume_only=self.past_limit.get(websocket))
        self.connections.add(conn)
        self.metrics.connections_opened += 1
        try:
            await conn.run()
        finally:
            self.connections.discard(conn)
            self.past_limit.pop(websocket, None)
            self._live_changed.set()
            # A dropped socket leaves websockets' parser its EOFError, whose traceback holds
            # the parser's suspended frame, which holds the protocol: another cycle for the
            # full GC. The message and type stay (``close_exc`` chains to it).
            if (exc := websocket.protocol.parser_exc) is not None:
                exc.__traceback__ = None


def _check_read_timeouts(engine: TtsEngine, step_timeout_s: float | None) -> None:
    """Refuse an engine (or one behind a fallback wrapper) that waits for its server
    (``read_timeout_s``, the ``http`` engine) as long as the lane waits for a step, or
    longer: a stalled TTS server then held the lane past its deadline, and the lane turned
    unhealthy for every session (``engine_unavailable``, /health 503) instead of that one
    sentence failing with ``engine_timeout``, which a fallback would have spoken."""
    if step_timeout_s is None:
        return
    for eng in (engine, getattr(engine, "primary", None), getattr(engine, "fallback", None)):
        read = getattr(eng, "read_timeout_s", None)
        if eng is not None and read is not None and read >= step_timeout_s:
            raise ValueError(
                f"tts: the {eng.name} engine's read_timeout_s ({read:g} s) must be below "
                f"[tts] step_timeout_s ({step_timeout_s:g} s): a TTS server that stalls "
                "would hold the lane past its step deadline and make it unhealthy for every "
                "session, instead of failing that sentence (engine_timeout) for the fallback "
                "to speak; lower read_timeout_s in the engine's options or raise "
                "step_timeout_s")


def _tls_context(cert: str | None, key: str | None) -> Any:
    """The voice port's TLS context (None: plain ws://); a file that cannot be loaded is a
    ``ValueError`` naming it (ssl's own error names none)."""
    if not cert:
        return None
    import ssl

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except OSError as exc:  # ssl.SSLError too
        if key is None and isinstance(exc, ssl.SSLError) and not _holds_private_key(cert):
            # (ssl says "[SSL] PEM lib": the key it looked for in the certificate's file)
            raise ValueError(f"server.tls_key (--tls-key) is missing: the certificate file "
                             f"server.tls_cert {cert!r} holds no private key; name the key's "
                             "file with --tls-key ([server] tls_key), or put the key in the "
                             "certificate's file") from None
        files = f"server.tls_cert {cert!r}" + ("" if key is None else f" / tls_key {key!r}")
        raise ValueError(f"{files} cannot be loaded: {exc.strerror or exc}") from None
    return context


def _holds_private_key(path: str) -> bool:
    """Whether the PEM file ``path`` has a private key in it (a certificate's file may hold
    its key too, and then ``server.tls_key`` is not needed)."""
    try:
        with open(path, "rb") as file:
            return b"PRIVATE KEY-----" in file.read(1 << 20)
    except OSError:
        return True  # (not ours to say: the load's own error is said)


def certificate_names(context: Any, cert: str) -> list[str]:
    """The names and IP addresses the certificate of ``context`` (loaded from ``cert``) is
    for (its subjectAltName), read by a TLS handshake in memory with a client that trusts
    that certificate itself (the ssl module decodes a certificate only for a peer it has
    verified). [] when it cannot be read so (expired, or no subjectAltName)."""
    import ssl

    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN  # (the leaf itself, trusted)
    try:
        client.load_verify_locations(cert)
    except (OSError, ValueError):
        return []
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    ends = [client.wrap_bio(to_client, to_server),
            context.wrap_bio(to_server, to_client, server_side=True)]
    for _ in range(8):  # (TLS 1.3 and 1.2 take two or three round trips)
        waiting = 0
        for end in ends:
            try:
                end.do_handshake()
            except ssl.SSLWantReadError:
                waiting += 1
            except ssl.SSLError:
                return []
        if not waiting:
            break
    else:
        return []
    peer = ends[0].getpeercert() or {}
    return [str(value) for kind, value in peer.get("subjectAltName", ())
            if kind in ("DNS", "IP Address")]


def _json_response(status: http.HTTPStatus, body: dict[str, Any]) -> Response:
    data = orjson.dumps(body)
    headers = Headers([("Content-Type", "application/json"),
                       ("Content-Length", str(len(data))), ("Cache-Control", "no-store")])
    return Response(status.value, status.phrase, headers, data)


def _error_response(status: http.HTTPStatus, code: str, message: str) -> Response:
    """An error in OpenAI's shape, the HTTP API port's (``openai_error``)."""
    return _json_response(status, {"error": openai_error(status.value, code, message)})


def freeze_startup_heap() -> int:
    """After one last collection, move every object alive now (the libraries, the loaded
    engines' Python objects, the gateway's own) to the collector's permanent generation.
    None of them will become garbage, yet each full collection would walk them all again
    while every session waits: with the qwen3 engine loaded that is ~121,000 objects,
    about 50 ms per full collection on this machine. Process-wide, so only the serving
    entry points call it, once, after the engines have loaded. Returns how many objects
    were frozen (also in ``/health`` → ``loop.gc_frozen_objects``)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


async def started_unless_stopped(gateway: Gateway, stop: asyncio.Event) -> bool:
    """Start ``gateway``; False if ``stop`` is set first. A model may take a minute to load,
    and a ^C then must not wait for it: the start is cancelled and closes what it opened
    (the load itself runs on in its engine thread until the process exits)."""
    started = await unless_stopped(gateway.start(), stop.wait())
    if started is None:
        return False
    started.result()  # (a start that failed raises here)
    return True


WILDCARDS = {"": "every interface", "0.0.0.0": "every IPv4 interface",
             "::": "every IPv6 interface"}
"""The hosts that bind no one address, and where each listens."""


def banner_host(host: str, names: Sequence[str] = ()) -> tuple[str, str | None, str | None]:
    """The host the banner's URLs name for ``host``; for a wildcard, where it listens in
    words; with TLS, a line on the name. A wildcard is no address to open: ``ws://:8780``
    does not parse and browsers refuse ``0.0.0.0``, so its URLs name the loopback it
    includes. With TLS (``names``: what the certificate is for, ``certificate_names``) a
    client checks the name it dials against the certificate, so ``wss://127.0.0.1`` failed
    with a certificate for ``hub.example``: the URLs name the certificate's first name
    instead, or, when it has only wildcard names, the line says to dial one. An IPv6
    address goes in brackets."""
    shown, scope = host, None
    if host in WILDCARDS:
        shown = "::1" if host == "::" else "127.0.0.1"
        scope = f"{WILDCARDS[host]} ({host or 'an empty --host'})"
    tls = None
    if names and _host_key(shown) not in map(_host_key, names):
        if usable := [name for name in names if "*" not in name]:
            tls = (f"the URLs name {usable[0]}, the certificate's, not {shown}: a client "
                   "checks the name it dials against the certificate")
            shown = usable[0]
        else:
            tls = (f"the certificate is for {', '.join(names)}, not {shown}: a client must "
                   "dial a name it holds")
    return (f"[{shown}]" if ":" in shown else shown), scope, tls


def _host_key(name: str) -> str:
    """``name`` to compare: an IP address in its one form (a certificate's IPv6 address
    comes written out, ``0:0:0:0:0:0:0:1``), a name in lower case."""
    try:
        return str(ipaddress.ip_address(name.strip()))
    except ValueError:
        return name.lower()


async def serve_until_signalled(config: GatewayConfig, *, stop: asyncio.Event | None = None,
                                gateway: Gateway | None = None) -> None:
    """``voice-gateway serve``: start, say where it serves, serve until SIGINT or SIGTERM
    (or ``stop``, for tests), then close."""
    stop = stop or stop_signal()
    gateway = gateway or Gateway(config)
    if not await started_unless_stopped(gateway, stop):
        _say("stopped while starting")
        return
    frozen = freeze_startup_heap()
    log.info("%d objects alive after start-up frozen out of garbage collection", frozen)
    c = config
    ws, http = ("wss", "https") if c.server.tls_cert else ("ws", "http")
    host, scope, tls = banner_host(c.server.host, gateway.certificate_names)
    base = f"{host}:{gateway.port}"
    _say(f"voice-gateway {version()} serving {ws}://{base}{VOICE_PATH} "
         f"(health: {http}://{base}/health)")
    if scope:
        _say(f"  bound: {scope}" + ("" if tls else "; the URLs name this machine's loopback "
                                    "(from another machine, use this one's address)"))
    if tls:
        _say(f"  TLS:   {tls}")
    _say(f"  console: {http}://{base}/ (type a transcript, hear the reply)")
    llm = f"openai at {shown_url(c.llm.url)}" + (f" model {c.llm.model}" if c.llm.model else "") \
        if c.llm.url else "replay (scripted replies; pass --llm-url for a real LLM)"
    _say(f"  HTTP:  {http}://{host}:{gateway.http_port}/v1/audio/speech "
         "(OpenAI-compatible), /v1/models, /health, /metrics")
    _say(f"  LLM:   {llm}")
    _say(f"  voice: {gateway.engine.name} on lane {gateway.lane.name}"
         f" (voice {gateway.default_voice or 'the engine default'}, "
         f"{len(gateway.voices)} available)")
    if degraded := getattr(gateway.engine, "primary_load_error", None):
        _say(f"  DEGRADED: {degraded}; the fallback speaks every sentence")
    for lane in list(gateway.lanes.values())[1:]:
        _say(f"  also:  {lane.engine.name} on lane {lane.name} (turns whose voice it has "
             "may be placed there)")
    auth = f"{len(c.server.tokens)} token(s) required" if c.server.tokens else \
        "none (no token configured: loopback only)" if not c.server.insecure_bind else \
        "NONE, and bound beyond loopback (--insecure-bind)"
    _say(f"  auth:  {auth}")
    try:
        await stop.wait()
    finally:
        await gateway.aclose()
        log.info("stopped")


def _say(line: str) -> None:
    """A line of the start banner, on stdout. A reader that is gone (``serve | head -3``,
    a log shipper restarted) is no reason to stop serving: the broken pipe stopped the
    gateway (exit 1, "cannot serve: [Errno 32] Broken pipe") over lines nobody reads.
    Stdout then goes to /dev/null, its buffered line too; the log (stderr) goes on."""
    try:
        print(line, flush=True)
    except OSError:  # (a broken pipe; EIO from a terminal that closed)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def run(config: GatewayConfig) -> None:
    try:
        import uvloop
    except ImportError:  # Windows
        asyncio.run(serve_until_signalled(config))
    else:
        uvloop.run(serve_until_signalled(config))
