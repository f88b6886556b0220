"""Voice sessions and the WebSocket connections that carry them: the thin shell around a
core ``Session``.

* ``SessionRunner`` owns a ``Session``, its outbox, its LLM tasks, its lane jobs and its
  pacing timer. It outlives a dropped connection for ``resume_window_s`` so a client can
  reconnect and continue (``session.resume``); then it is closed.
* ``VoiceConnection`` is one socket: a reader task feeding client messages to the runner
  and a writer task sending the runner's outbox from its cursor.

All inputs reach the session on the event loop (``SessionRunner._apply``), so the session
is only ever touched by one thread.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import hmac
import logging
import secrets
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, assert_never, cast

import orjson
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed, InvalidMessage
from websockets.frames import OK_CLOSE_CODES, CloseCode, Frame, Opcode
from websockets.http11 import Response
from websockets.protocol import State

from engines.base import (
    EngineError,
    LlmContextFull,
    LlmDelta,
    LlmDone,
    LlmRequest,
    ServerUnreachable,
    SynthesisRequest,
)
from gateway.core import codec
from gateway.core.codec import ProtocolError
from gateway.core.outbox import Outbox
from gateway.core.scheduler import JIT_GRANULARITY_S, Job, Priority, step_ms
from gateway.core.session import (
    CancelLlm,
    CancelSynthesis,
    Effect,
    ProbeListener,
    Received,
    SendAudio,
    SendEvent,
    SendFrames,
    Session,
    StartLlm,
    StartSynthesis,
)
from gateway.io.auth import empty_lines_end
from gateway.io.lanes import SynthesisJob
from gateway.io.log_limit import limited, peer_text

if TYPE_CHECKING:
    from gateway.io.server import Gateway

log = logging.getLogger(__name__)

CLOSE_SLOW_CONSUMER = (1013, "slow_consumer")
CLOSE_SERVER_FULL = (1013, "server full")
KEEPALIVE_PING_S = 20.0
"""The server pings every 20 s and closes a socket whose pong has not come 20 s later."""
PROBE_TIMEOUT_S = 5.0
"""How long a listener that went quiet (``ProbeListener``) has to answer a ping."""
RESUME_PAST_LIMIT_S = 10.0
"""How long a socket let in beyond ``max_sessions`` to resume may take to ask for it."""
WRITE_BATCH = 32
"""Most messages written with one socket write."""
MESSAGE_BURST = 200
MESSAGES_PER_S = 50.0
"""Messages a client may send at once, and then a second, on average (a token bucket): a
client sends a few a second (a mark every 200-500 ms, pings, turns). One flooding pings
had the event loop that paces every session answer all of them; past this it is closed
(``CLOSE_TOO_MANY_MESSAGES``) and its session ends. WebSocket ping and pong frames count
too (``VoiceSocket.on_control_frame``): websockets answers each ping itself, and a client
that read none of the pongs had them all queued for it in the gateway's memory; a flood of
pongs nobody asked for took the loop from the other sessions (one client's: 20 underruns
in another's 30 s turn, none without it)."""


def message_allowed(allowance: float, since: float, now: float, *, burst: int,
                    per_s: float) -> tuple[bool, float]:
    """Whether one more message may come at ``now`` from a peer that had ``allowance`` left
    at ``since`` (a token bucket: ``burst`` at once, ``per_s`` a second), and what it has
    left after it. The gateway's clients (``MESSAGE_BURST``, ``MESSAGES_PER_S``) and the
    watch relay's watches (examples/watch_relay.py, its own copy of them)."""
    allowance = min(float(burst), allowance + (now - since) * per_s)
    if allowance < 1.0:
        return False, allowance
    return True, allowance - 1.0
CLOSE_TOO_MANY_MESSAGES = (1008, "too many messages")
CUT_SHORT = {
    "length": "the reply reached the LLM's token limit (max_tokens); the rest is not spoken",
    "tool_calls": "the LLM stopped its reply to call a tool (finish_reason 'tool_calls'), "
                  "and the gateway offers none; the rest is not spoken",
    "function_call": "the LLM stopped its reply to call a function (finish_reason "
                     "'function_call'), and the gateway offers none; the rest is not spoken",
    "content_filter": "the LLM server's content filter held back the rest of the reply "
                      "(finish_reason 'content_filter'); the rest is not spoken",
}
"""The ``finish_reason`` of a reply that the LLM server ended as asked, short of its end:
the turn fails (``llm_failed``, with these words) after the sentences complete before, and
the LLM is not failing. They went on as ``completed`` turns that spoke the unfinished
sentence, or nothing at all without a word of why (a tool call, a filtered reply)."""
UNFINISHED_FREE_BYTES = codec.MAX_MESSAGE_BYTES + 16 * 1024
"""What a socket may hold of a message still arriving (its frames so far, the frame being
read) without drawing on the gateway's budget (``UnfinishedBudget``): the largest message
answered (64 KiB), and room for frame headers and a few fragments. Any message the
gateway would act on fits, so the budget never refuses one."""
UNFINISHED_BUDGET_BYTES = 16 * 1024 * 1024
"""What all sockets together may hold beyond ``UNFINISHED_FREE_BYTES`` each: room for 16
messages of 1 MiB (each answered ``message_too_large``) arriving at once."""
FRAGMENT_COST = 160
"""Memory a fragment's frame object costs beyond its bytes (measured: 4,095 empty
fragments held 651 KiB)."""
CLOSE_UNFINISHED = (1009, "message too big: the gateway holds too many unfinished messages")
SEND_BUFFER_BYTES = (64 * 1024, 4 * 1024 * 1024)
"""Least and most of a voice socket's kernel send buffer, which holds one lead of its
session's audio (``VoiceConnection.fit_send_buffer``); Linux doubles it."""
CLOSED_TCP_GRACE_S = 1.0
"""Once the server has ended its side of the TCP connection (its close frame sent, its
side shut down), how long the client has to close its own before the connection is
aborted (``VoiceSocket.send_data``), as ``VoiceConnection.close_soon`` waits."""


class SessionRunner:
    def __init__(self, gateway: Gateway, session: Session, *, outbox_bytes: int,
                 resume_window_s: float) -> None:
        self.gateway = gateway
        self.session = session
        self.loop = asyncio.get_running_loop()
        self.resume_token = secrets.token_urlsafe(24)
        self.outbox = Outbox(outbox_bytes)
        self.outbox_bytes = outbox_bytes
        """The outbox's bound beyond what the kernel cannot take of a lead (``_fit_lead``)."""
        self._fitted_lead_ms = 0
        """The lead (ms) the socket's send buffer and the outbox's bound are sized for."""
        self.resume_window_s = resume_window_s
        self.connection: VoiceConnection | None = None
        self.closed = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._llm_tasks: dict[int, asyncio.Task[None]] = {}
        self._timer: asyncio.Handle | None = None
        self._timer_at = 0.0
        self._expiry: asyncio.TimerHandle | None = None
        self._turn_times: list[float] = []
        # tracing (bench/turn_latency.py); unused when gateway.tracer is None
        self.received_at = 0.0
        self._trace_frames: dict[int, float] = {}

    def now(self) -> float:
        return self.loop.time()

    # ---- attachment ------------------------------------------------------------------

    def attach(self, connection: VoiceConnection, position: int, *,
               resumed: bool = False) -> None:
        """Let ``connection`` carry this session, writing from outbox ``position`` on.
        ``resumed``: a ``session.resume`` brought it (from a dropped socket, or taking over
        one that still looks alive, whether or not any frame is replayed)."""
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        self.connection = connection
        self._fit_lead(new_socket=True)
        replayed = self.outbox.rewind(position)
        connection.wake_writer()
        session = self.session
        if resumed:
            # (also with nothing to replay: the old socket's unanswered probe must not keep
            # the new one from ever being probed, Session.resume)
            turn = session.turn
            replayed_ms = 0.0 if turn is None else sum(
                len(frame) - codec.FRAME_HEADER.size for frame in replayed
                if codec.FRAME_HEADER.unpack_from(frame)[3] == turn.id) / codec.BYTES_PER_MS
            self._apply(session.resume(replayed_ms, self.now()))
            if turn is not None:  # its deadline may have been put off while detached
                owner = (session.id, turn.id)
                self.gateway.lane_for(owner).touch(owner)

    def detach(self, connection: VoiceConnection, *, resumable: bool,
               noticed_early_s: float = 0.0) -> None:
        """The socket is gone. Keep the session for a resume, or close it now.
        ``noticed_early_s``: the drop was noticed that much sooner than the keepalive
        would have (a quiet listener's unanswered probe): the wait for the resume is that
        much longer, so sending marks never shortens a suspended app's time to come back."""
        if self.connection is not connection:
            return  # already taken over by a resumed connection
        self.connection = None
        if not resumable or self.closed:
            self.close("the client closed its socket")
            return
        # Nobody is listening: release no more audio until a resume, and ask the lane for
        # none (``Session.deadline``); the LLM goes on feeding the turn its text.
        self.session.held = True
        wait_s = self.resume_window_s + noticed_early_s
        log.info("session %s: socket dropped (%s), waiting %.0f s for a resume",
                 self.session.id, _closed_how(connection.ws), wait_s)
        self._expiry = self.loop.call_later(wait_s, self.close, "no resume came in time")

    def shutdown(self) -> None:
        """The server is going away: tell the client its turn ends (``shutting_down``),
        then close; the writer sends what is queued and closes the socket with 1001."""
        if not self.closed:
            self._apply(self.session.shutdown(self.now()))
        self.close("the gateway is shutting down")

    def close(self, why: str = "") -> None:
        """End the session: cancel its turn, its LLM streams, its lane jobs, its timers.
        ``why``, when given, is logged (INFO): one line per session's end."""
        if self.closed:
            return
        self.closed = True
        if why:
            log.info("session %s ended: %s", self.session.id, why)
        for handle in (self._timer, self._expiry):
            if handle is not None:
                handle.cancel()
        turn = self.session.turn
        for effect in self.session.close(self.now()):
            if isinstance(effect, CancelLlm | CancelSynthesis):
                self._execute(effect)
            elif isinstance(effect, SendEvent):  # not sent: counted, as every turn is
                self.gateway.metrics.turn_done(effect.event)
        if turn is not None:  # its turn.done is not sent: the turn leaves its lane here
            self.gateway.release_turn((self.session.id, turn.id))
        for task in list(self._tasks):
            task.cancel()
        if self.connection is not None:
            self.connection.wake_writer()  # so it sees the end
        self.gateway.forget(self)

    def crashed(self, exc: BaseException) -> None:
        """A bug in the gateway while handling this session (a message, the pacing timer,
        the LLM stream): the session ends, whatever broke may be in its state, where a
        resume would meet it again. Counted as ``internal_error`` and logged once with its
        traceback; the socket closes with 1011 "internal error"; every other session goes
        on. (A bug consuming a lane job's audio fails only that turn: ``Lane``.)"""
        if self.closed:
            return
        self.gateway.metrics.errors["internal_error"] += 1
        log.error("session %s: internal error; the session ends", self.session.id,
                  exc_info=exc)
        connection = self.connection
        self.close()  # (the ERROR above is its line)
        if connection is not None:
            connection.close_soon(1011, "internal error")

    def check_resume_token(self, token: str) -> bool:
        return hmac.compare_digest(self.resume_token.encode(), token.encode())

    # ---- input -----------------------------------------------------------------------

    def receive(self, message: codec.ClientMessage, now: float) -> bool:
        """Feed a client message to the session. True when it acted on it: a turn started
        or the settings changed (``ACTS_ON_THE_SESSION``); a message refused (an ``error``)
        changed nothing, as a ping, a cancel or a mark."""
        if isinstance(message, codec.ClientTranscript | codec.ClientSay):
            limit = self.gateway.config.server.turns_per_minute
            self._turn_times = [t for t in self._turn_times if now - t < 60.0]
            if limit and len(self._turn_times) >= limit:
                turns = "turn" if limit == 1 else "turns"
                self.protocol_error(ProtocolError(
                    "rate_limited", f"more than {limit} {turns} in a minute; wait and retry",
                    event_id=message.event_id), now)
                return False
            self._turn_times.append(now)
        mark = message if isinstance(message, codec.ClientPlayback) else None
        before = None if mark is None else self.session.deadline(mark.turn_id, now)
        turn, settings = self.session.turn, self.session.settings
        self._apply(self.session.receive(message, now))
        acted = self.session.turn is not turn or self.session.settings is not settings
        if acted:  # (a new turn's lead, or the setting's: ``_fit_lead``)
            self._fit_lead()
        if mark is None or before is None:
            return acted
        after = self.session.deadline(mark.turn_id, now)
        if after is not None and after < before - JIT_GRANULARITY_S:
            # the listener needs audio sooner than the scheduler thinks: re-rank its turn.
            # Not for a later deadline (the scheduler re-checks a key that is too early by
            # itself), nor for one within the lane's just-in-time granularity: that woke the
            # lane at every mark (400 sessions marking every 250 ms, bench/capacity.py
            # --marks-ms 250: 0.0274, 0.0243 -> 0.0241, 0.0235 CPU ms per frame).
            owner = (self.session.id, mark.turn_id)
            self.gateway.lane_for(owner).touch(owner)
        return acted

    def protocol_error(self, error: ProtocolError, now: float) -> None:
        self._apply(self.session.protocol_error(error, now))

    # ---- effects ---------------------------------------------------------------------

    def _apply(self, effects: list[Effect]) -> None:
        end = self.outbox.end
        for effect in effects:
            if self.closed and not isinstance(effect, CancelLlm | CancelSynthesis):
                # Closed by an effect of this very list (a slow consumer): the rest is for
                # nobody, and a StartSynthesis would put a dead session's work on the lane
                # ahead of the live ones. Its cancels still run: the session's close found
                # its turn already ended by this list, and cancelled nothing.
                continue
            self._execute(effect)
        if self.outbox.end != end:
            self._flush()
        self._rearm_timer()

    def _execute(self, effect: Effect) -> None:
        match effect:
            case SendFrames(frames=frames):
                self.gateway.metrics.frames += len(frames)
                self.send_all(frames)
            case SendAudio(data=data):
                self.gateway.metrics.frames += 1
                self.send(data)
            case SendEvent(event=event):
                if event["type"] == "turn.done":
                    self.gateway.release_turn((self.session.id, event["turn_id"]))
                    self.gateway.metrics.turn_done(event)
                elif event["type"] == "error":  # every error a client is told of, once
                    self.gateway.metrics.errors[event["error"]["code"]] += 1
                self.send(codec.encode_event(event))
            case StartLlm(turn_id=turn_id, request=request):
                if not self.closed:
                    task = self.loop.create_task(self._run_llm(turn_id, request))
                    self.gateway.llm_started()  # ended in _llm_task_done
                    self._tasks.add(task)
                    self._llm_tasks[turn_id] = task
                    task.add_done_callback(self._llm_task_done)
            case CancelLlm(turn_id=turn_id):
                running = self._llm_tasks.get(turn_id)
                if running is not None:
                    running.cancel()
            case StartSynthesis():
                synthesis = SynthesisRequest(text=effect.text, voice=effect.voice,
                                             step_ms=step_ms(Priority.INTERACTIVE))
                owner = (self.session.id, effect.turn_id)
                # the turn's first segment picks its lane; the others follow it
                self.gateway.place_turn(owner, effect.voice).submit(
                    owner, SynthesisJob(synthesis, self, effect.index), deadline=effect.deadline,
                    priority=Priority.INTERACTIVE, since=effect.since, max_lead=effect.max_lead)
            case CancelSynthesis(turn_id=turn_id):
                owner = (self.session.id, turn_id)
                self.gateway.lane_for(owner).cancel(owner)
                self.gateway.release_turn(owner)
            case Received(seq=seq):
                self.outbox.release_through(seq)
            case ProbeListener(silent_s=silent_s):
                if self.connection is not None:
                    self.connection.probe(silent_s)
            case _:
                assert_never(effect)

    def _fit_lead(self, *, new_socket: bool = False) -> None:
        """One lead of audio (``max_lead_ms``), all the pacer lets out at once, waits for
        the client in the socket's send buffer; what the kernel cannot take of it (a stock
        Linux caps the buffer at ``net.core.wmem_max``, 208 KiB: 4.4 s of audio) is
        added to the outbox's bound, or a client reading a long lead late was ended as a
        slow consumer.

        The lead is the turn in progress's while that is larger: a turn keeps the settings
        it started with (protocol.md) and lets out its own lead at once, and a lead lowered
        by a ``session.update`` mid-turn shrank the buffer and the bound under it (read
        late, that turn's audio ended the session as a slow consumer). A smaller lead is
        fitted only while nothing waits unwritten (``new_socket``: a socket attached, whose
        replay the bound does not count), else at the next call (a turn, an update):
        what was let out under the larger one may still wait for the client."""
        connection = self.connection
        if connection is None:
            return
        lead = self.session.settings.max_lead_ms
        turn = self.session.turn
        if turn is not None and not turn.ended:
            lead = max(lead, turn.settings.max_lead_ms)
        if lead < self._fitted_lead_ms and self.outbox.pending and not new_socket:
            return
        self._fitted_lead_ms = lead
        self.outbox.max_bytes = self.outbox_bytes + connection.fit_send_buffer(lead)

    def _llm_task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self.gateway.llm_ended()
        for turn_id, t in list(self._llm_tasks.items()):
            if t is task:
                del self._llm_tasks[turn_id]

    def send(self, item: str | bytes) -> None:
        if not self.closed and not self.outbox.append(item):
            self._slow_consumer()

    def send_all(self, items: list[bytes]) -> None:
        if not self.closed and not self.outbox.extend(items):
            self._slow_consumer()

    def _slow_consumer(self) -> None:
        """The unwritten output passed the outbox's bound: end the session."""
        self.gateway.metrics.errors["slow_consumer"] += 1
        log.warning("session %s: %d bytes unread; closing (slow consumer)",
                    self.session.id, self.outbox.nbytes)
        connection = self.connection
        self.close()  # (the WARNING above is its line)
        if connection is not None:
            connection.close_soon(*CLOSE_SLOW_CONSUMER)

    def _flush(self) -> None:
        """New output: write it now if the connection can take it without waiting (the
        usual case: one socket write per pacer refill, no task switch), else wake the
        writer task, which waits for the socket with flow control."""
        connection = self.connection
        if connection is not None and not connection.write_now():
            connection.wake_writer()

    def _rearm_timer(self) -> None:
        wake = None if self.closed else self.session.wake_at()
        if self._timer is not None:
            if wake is not None and self._timer_at == wake:
                return  # already armed for that moment: most inputs do not move it
            self._timer.cancel()
            self._timer = None
        if wake is not None:
            # (uvloop returns a plain Handle, without when(), for a time already past)
            self._timer = self.loop.call_at(wake, self._tick)
            self._timer_at = wake

    def _tick(self) -> None:
        self._timer = None
        self._guarded(self.session.tick, self.now())

    def _guarded(self, core: Callable[..., list[Effect]], *args: Any) -> list[Effect]:
        """Apply what ``core(*args)`` returns, and return it, where nothing above would take
        a bug (a timer callback, the LLM task): a bug in either ends the session
        (``crashed``; nothing is returned). It once stopped the session's pacing for good,
        or read as the LLM failing."""
        try:
            effects = core(*args)
            self._apply(effects)
        except Exception as exc:
            self.crashed(exc)
            return []
        return effects

    # ---- LLM ---------------------------------------------------------------------------

    async def _run_llm(self, turn_id: int, request: LlmRequest) -> None:
        """Stream one turn's reply into the session. Cancelled on barge-in (closes the HTTP
        stream); every failure becomes an ``llm_*`` error on the turn, never a hang."""
        tracer = self.gateway.tracer
        if tracer is not None:
            tracer.add("transcript_to_llm_request", time.perf_counter() - self.received_at)
        try:
            async with contextlib.aclosing(self.gateway.llm.stream(request)) as stream:
                async for event in stream:
                    match event:
                        case LlmDelta(text=text):
                            self._guarded(self.session.llm_delta, turn_id, text, self.now())
                        case LlmDone(finish_reason=str(reason)) if reason in CUT_SHORT:
                            # the server answered well, but the reply stops short of its
                            # end: the unfinished sentence is not spoken, as at
                            # max_reply_chars
                            self.gateway.llm_answered(None)
                            self._log_failed_turn(self._guarded(
                                self.session.llm_failed, turn_id, "llm_failed",
                                CUT_SHORT[reason], self.now()))
                            return
                        case LlmDone(tokens_per_s=rate, thought_chars=thought_chars):
                            self.gateway.llm_answered(None)
                            self._log_failed_turn(self._guarded(
                                self.session.llm_done, turn_id, rate, self.now(),
                                thought_chars))
                            return
            raise EngineError("llm_failed", "the LLM stream ended without finishing")
        except LlmContextFull as exc:
            # the LLM answered as it should: the request was too long (not a failing LLM)
            log.info("session %s: the conversation is longer than the LLM's context, its "
                     "older turns are forgotten (%s)", self.session.id, exc.message)
            self._guarded(self.session.llm_context_full, turn_id, exc.message, self.now())
        except EngineError as exc:
            self.gateway.llm_answered((exc.code, exc.message),
                                      unreachable=isinstance(exc, ServerUnreachable))
            self._guarded(self.session.llm_failed, turn_id, exc.code, exc.message, self.now())
        except Exception as exc:
            if self.gateway.llm_failing is None:  # once, as the LLM starts failing turns
                log.exception("LLM backend failed")
            message = f"{type(exc).__name__}: {exc}"
            self.gateway.llm_answered(("llm_failed", message))
            self._guarded(self.session.llm_failed, turn_id, "llm_failed", message, self.now())

    def _log_failed_turn(self, effects: list[Effect]) -> None:
        """A WARNING for the turn error among ``effects``, if any, from a reply the LLM gave
        as asked that still fails the turn (empty or only a thought: ``llm_empty_reply``;
        cut at max_tokens, stopped for a tool or a filter: ``llm_failed``). The LLM is not
        marked failing for it (``llm_answered``), which logs the other failures, so these
        went unlogged, and an operator can fix them (max_tokens, the model's thinking).
        Limited as refusals are (``LogLimit``): an LLM that replies empty to every turn
        wrote a line per turn of every session; ``/metrics`` counts each."""
        for effect in effects:
            if isinstance(effect, SendEvent) and effect.event["type"] == "error":
                error = effect.event["error"]
                log.warning("session %s: the LLM's reply fails the turn (%s): %s",
                            self.session.id, error["code"], error["message"],
                            extra=limited(f"failed turn {error['code']}"))

    # ---- lane sink (called on the event loop by the lane task) -----------------------

    def deadline(self, job: Job, now: float) -> float:
        deadline = self.session.deadline(_turn_of(job), now)
        return job.deadline if deadline is None else deadline

    def on_audio(self, job: Job, pcm: bytes, engine: str, ready_at: float) -> None:
        payload: SynthesisJob = job.payload
        effects = self.session.audio(_turn_of(job), payload.index, pcm, engine, self.now())
        if self.gateway.tracer is not None:
            first = next((e.data if isinstance(e, SendAudio) else e.frames[0]
                          for e in effects if isinstance(e, SendAudio | SendFrames)), None)
            if first is not None:
                self._trace_frames[id(first)] = ready_at
        self._apply(effects)

    def on_done(self, job: Job, truncated: bool = False, notes: tuple[str, ...] = ()) -> None:
        # (a truncated segment ends where the engine stopped, its frames gapless, and the
        # breaker sends the next segments elsewhere; its sentence.done says it was cut. A
        # server's notes are told to the HTTP API's clients, in X-Speech-Notes; protocol.md
        # has no field for them)
        payload: SynthesisJob = job.payload
        self.gateway.job_succeeded(job)
        self._apply(self.session.synthesis_done(_turn_of(job), payload.index, self.now(),
                                                cut_short=truncated))

    def on_failed(self, job: Job, code: str, message: str) -> None:
        payload: SynthesisJob = job.payload
        match self.gateway.reroute(job, code, message):
            case "again":  # the primary lane says it (and the rest of the turn) instead
                return
            case "truncated":  # it ends where it stopped; the primary says the rest
                self._apply(self.session.synthesis_done(_turn_of(job), payload.index,
                                                        self.now(), cut_short=True))
                return
        self._apply(self.session.synthesis_failed(_turn_of(job), payload.index, code, message,
                                                  self.now()))

    def written(self, batch: list[str | bytes]) -> None:
        """``batch`` went to the socket (tracing only: chunk → frame written)."""
        tracer = self.gateway.tracer
        if tracer is None:
            return
        for item in batch:
            ready_at = self._trace_frames.pop(id(item), None)
            if ready_at is not None:
                tracer.add("chunk_to_frame_written", time.perf_counter() - ready_at)


ACTS_ON_THE_SESSION = (codec.ClientTranscript, codec.ClientSay, codec.ClientSessionUpdate)
"""Client messages after which the socket's new session is in use: no resume replaces it."""


def _closed_how(ws: ServerConnection) -> str:
    """Who closed with what ("sent 1009 (message too big) ...", "received 4001 ..."), or
    that nobody did: the network dropped."""
    protocol = ws.protocol
    frames = [f"received {protocol.close_rcvd}" if protocol.close_rcvd else "",
              f"sent {protocol.close_sent}" if protocol.close_sent else ""]
    if protocol.close_rcvd_then_sent is False:
        frames.reverse()
    return ", then ".join(f for f in frames if f) or "no close frame received or sent"


@dataclass(slots=True)
class UnfinishedBudget:
    """The gateway-wide bytes that sockets hold of messages still arriving beyond
    ``UNFINISHED_FREE_BYTES`` each (``VoiceSocket.data_received``). websockets keeps a
    message until its last byte (up to ``max_size``, 1 MiB, whether one frame or 4,096
    fragments): a client that never finished one held 1.1 MiB per socket, ~11 GiB at
    10,000 sessions; websockets offers no way to drop what it holds."""

    errors: collections.Counter[str]
    """The gateway's error counters: a socket refused counts as ``unfinished_messages``."""
    limit: int = UNFINISHED_BUDGET_BYTES
    used: int = 0


class VoiceSocket(ServerConnection):
    """websockets' server connection, which calls ``on_close_frame`` when the client's
    close frame comes. websockets raises ``ConnectionClosed`` only once the TCP connection
    ends, and a client that stopped reading (python websockets past its queue) cannot take
    the close reply queued behind its audio: it waited out its close timeout (10 s) while
    its session went on making audio, the LLM stream open, until 1 MiB went unread
    (``slow_consumer``). A callback, not a task waiting on an event: that task and its
    event cost every idle session 2.2 KiB, a tenth of its memory (bench/capacity.py idle)."""

    on_close_frame: Callable[[], object] | None = None
    on_control_frame: Callable[[], object] | None = None
    """Called for each ping or pong frame from the client (websockets has answered a ping
    already)."""
    deaf = False
    """Set once the gateway reads no more of this socket (a flood of them): what arrives
    is dropped unparsed, so nothing more is answered (the connection is closing)."""
    _abort_later: asyncio.TimerHandle | None = None
    budget: UnfinishedBudget | None = None
    """Set by the gateway once the handshake is over: what unfinished messages draw on."""
    _unfinished = 0
    """The frames so far of a fragmented message still arriving (bytes and their cost)."""
    _charged = 0
    """What this socket draws on ``budget`` now."""
    _method: bytes | None = None
    """The first word of the request line, until the handshake's request is read."""
    _target: bytes = b""
    """The request line's target (path and query), as far as its first bytes hold it."""
    _tail = b""
    """The last bytes of the request so far, until its headers' end (CRLF CRLF) is seen."""
    _held: bytes | None = None
    """What came after the request, held (reading paused) until it is answered."""
    _cr = b""
    """A CR that ended what came before the request line (``_past_empty_lines``)."""

    def refused_method(self, method: str, target: str) -> Response | None:
        """The answer to a ``method`` other than GET and HEAD whose request websockets could
        not read (it has a body). None: websockets' own, the connection closed unanswered.
        The gateway's sockets (``gateway_socket``) answer as to one without a body."""
        return None

    def unreadable(self, why: str) -> Response | None:
        """The answer to any other request websockets could not read (a GET with a body, a
        request line it cannot parse), ``why`` saying what. None: websockets' own, the
        connection closed unanswered, as ``refused_method``."""
        return None

    def data_received(self, data: bytes) -> None:
        """websockets' own, then: what this socket holds of a message still arriving, beyond
        ``UNFINISHED_FREE_BYTES``, is drawn on the gateway's budget. A socket that would
        pass the budget is failed as one over ``max_size`` is: 1009, and its memory goes
        with the connection (at most ``CLOSED_TCP_GRACE_S`` later). Large messages are
        refused thus only while others hold the budget; a message the gateway acts on
        (64 KiB at most) never is."""
        if self.deaf:
            return
        protocol = self.protocol
        if (protocol.state is State.CONNECTING and protocol.handshake_exc is None
                and not protocol.eof_sent):
            if self._method is None and self.request is None:  # (no request line begun)
                data = self._past_empty_lines(data)
            data = self._until_answered(data)
            if not data:
                return
        if self.request is None and self._method is None:
            method, _, rest = data.partition(b" ")  # (for send_data)
            self._method, self._target = method[:20], rest.split(b" ", 1)[0][:1000]
        super().data_received(data)
        budget = self.budget
        if budget is None:
            return
        excess = max(0, self._unfinished + len(self.protocol.reader.buffer)
                     - UNFINISHED_FREE_BYTES)
        if (excess > self._charged and budget.used - self._charged + excess > budget.limit
                and self.protocol.state is State.OPEN):
            budget.errors["unfinished_messages"] += 1
            log.warning("%s: an unfinished message would pass the gateway's budget of %d "
                        "MiB for them; closing (1009)", _peer(self), budget.limit >> 20,
                        extra=limited("unfinished_messages"))
            self.protocol.fail(*CLOSE_UNFINISHED)
            self.send_data()
        if excess != self._charged:  # (most sockets never hold one: no attribute set)
            budget.used += excess - self._charged
            self._charged = excess

    def _past_empty_lines(self, data: bytes) -> bytes:
        """``data`` without the empty lines (CRLF, or a bare LF) before the request line: RFC
        9112 2.2 has a server ignore at least one, and websockets answered it 400 ("invalid
        HTTP request line: "), as it read the empty line for the request line. A CR that
        ends ``data`` is held until the next bytes say whether it begins an empty line.
        Dropped, they hold no memory (the handshake's deadline ends a client sending only
        them)."""
        data = self.__dict__.pop("_cr", b"") + data
        start = empty_lines_end(data)
        if data[start:] == b"\r":
            self._cr = b"\r"
            return b""
        return data[start:]

    def _until_answered(self, data: bytes) -> bytes:
        """What of ``data`` websockets may read before the request is answered: up to the
        end of the request's headers. websockets reads what follows as WebSocket frames at
        once, and bytes that are none (a stray CRLF after the request, a pipelined request)
        failed the connection before its answer, which never went out: the request was
        closed unanswered. What follows is held, and reading paused, until the answer
        (``send_data``): read then after a 101, dropped after any other."""
        if self._held is not None or self.request is not None:
            self._held = (self._held or b"") + data
            self.transport.pause_reading()
            return b""
        seen = self._tail + data
        end = seen.find(b"\r\n\r\n")
        if end < 0:
            self._tail = seen[-3:]
            return data
        self.__dict__.pop("_tail", None)
        cut = end + 4 - (len(seen) - len(data))
        if cut < len(data):
            self._held = data[cut:]
            self.transport.pause_reading()
        return data[:cut]

    def _answered(self) -> None:
        """The request was answered (or refused): what came after it is read now after a 101
        (frames sent before it: RFC 6455 says wait for it, not every client does), and
        dropped after any other answer, which closes the connection."""
        held = self._held
        del self._held
        self.transport.resume_reading()
        if held is not None and self.protocol.state is State.OPEN:
            self.data_received(held)

    def process_event(self, event: Any) -> None:
        if self.request is None:
            del self._method, self._target  # (the request came: nothing held)
            self.__dict__.pop("_tail", None)
        if isinstance(event, Frame) and event.opcode in _DATA_OPCODES:
            if not event.fin:
                self._unfinished += len(event.data) + FRAGMENT_COST
            elif self._unfinished:
                self._unfinished = 0
        super().process_event(event)
        if isinstance(event, Frame):
            if event.opcode is Opcode.CLOSE and self.on_close_frame is not None:
                self.on_close_frame()
            elif event.opcode in _CONTROL_OPCODES and self.on_control_frame is not None:
                self.on_control_frame()

    def send_data(self) -> None:
        """websockets' own, then: once the server has sent its close frame and the end of
        its side of the TCP connection, the client has ``CLOSED_TCP_GRACE_S`` to close its
        side. websockets fails a connection (a message over 1 MiB or of more than 4,096
        fragments: 1009, invalid UTF-8: 1007) so, then waits for the client's end: a client
        that never closed kept the socket, and its session attached to a dead socket, until
        websockets' close timeout (10 s) or the next keepalive ping came to enforce it.
        (Not after a plain HTTP answer: websockets gives its reader the close timeout.)

        Before that, a request websockets could not read (it takes none with a body, and
        then sends nothing but the end of the connection) gets ``refused_method``'s answer
        when its method is not GET or HEAD: a POST of the HTTP API's (an OpenAI client
        given the voice port instead of ``--http-port``) got an empty reply ("Connection
        error."), not the 405 naming the HTTP port that the same POST without a body got."""
        protocol = self.protocol
        method = self._method
        if (method and self.request is None
                and isinstance(protocol.handshake_exc, InvalidMessage)):
            self._method = b""  # (answered once)
            if method.isalpha() and method.isascii() and method not in (b"GET", b"HEAD"):
                response = self.refused_method(method.decode(), self._target.decode("latin-1"))
            else:
                cause = protocol.handshake_exc.__cause__
                response = self.unreadable(str(cause) if cause is not None else
                                           str(protocol.handshake_exc))
            if response is not None:
                response.headers["Connection"] = "close"
                self.transport.write(response.serialize())
        super().send_data()
        if self._held is not None and (protocol.state is not State.CONNECTING
                                       or protocol.eof_sent
                                       or protocol.handshake_exc is not None):
            self._answered()
        if protocol.eof_sent and protocol.close_sent is not None and \
                self._abort_later is None:
            self._abort_later = self.loop.call_later(CLOSED_TCP_GRACE_S,
                                                     self.transport.abort)

    async def keepalive(self) -> None:
        """websockets' own, but the pong's deadline (``ping_timeout``) runs from when the
        ping is queued, not from when it is written out: websockets waits for the socket to
        drain first, and a client that stopped reading with output queued for it (an app
        frozen in the background, a network gone quiet as a turn's last audio went out)
        never drains it. Such a socket, and its session, stayed open for as long as TCP
        held on (for ever, to a peer that acknowledges at a zero window), not closed
        (1011) after ``2 * KEEPALIVE_PING_S`` as a drop, its session kept for a resume."""
        assert self.ping_interval is not None and self.ping_timeout is not None
        latency = 0.0
        try:
            while True:
                await asyncio.sleep(self.ping_interval - latency)
                try:
                    async with asyncio.timeout(self.ping_timeout):
                        latency = await (await self.ping())
                except TimeoutError:
                    # as websockets does; the close frame waits behind the unread output,
                    # so the connection is aborted ``CLOSED_TCP_GRACE_S`` later (send_data)
                    async with self.send_context():
                        self.protocol.fail(CloseCode.INTERNAL_ERROR, "keepalive ping timeout")
                    raise AssertionError("send_context() waits for connection_lost(), "
                                         "which cancels keepalive()") from None
        except Exception:
            self.logger.error("keepalive ping failed", exc_info=True)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._abort_later is not None:
            self._abort_later.cancel()
            self._abort_later = None  # (its callback holds the transport)
        if self.budget is not None:
            self.budget.used -= self._charged
            self._charged = 0
        super().connection_lost(exc)


_DATA_OPCODES = (Opcode.TEXT, Opcode.BINARY, Opcode.CONT)
_CONTROL_OPCODES = (Opcode.PING, Opcode.PONG)
"""The frames websockets handles itself that count as messages (a close ends the socket)."""


def gateway_socket(refused_method: Callable[[str, str], Response],
                   unreadable: Callable[[VoiceSocket, str], Response]) -> type[VoiceSocket]:
    """``VoiceSocket`` answering a request it cannot read with ``refused_method``'s answer,
    or ``unreadable``'s (websockets makes the connection: the gateway's part is its class)."""

    class GatewaySocket(VoiceSocket):
        def refused_method(self, method: str, target: str) -> Response:
            return refused_method(method, target)

        def unreadable(self, why: str) -> Response:
            return unreadable(self, why)

    return GatewaySocket


def _peer(ws: ServerConnection) -> str:
    return peer_text(ws.remote_address)


class VoiceConnection:
    """One WebSocket carrying one session (a new one, or a resumed one)."""

    def __init__(self, gateway: Gateway, websocket: VoiceSocket, *,
                 resume_only: str | None = None) -> None:
        self.gateway = gateway
        self.ws = websocket
        self.loop = asyncio.get_running_loop()
        self.runner: SessionRunner | None = None
        self.resume_only = resume_only
        """Let in past ``max_sessions`` to resume this session: only a resume may follow."""
        self._close_with: tuple[int, str] | None = None
        self._probe: asyncio.Task[None] | None = None
        self._noticed_early_s = 0.0
        self._tasks: asyncio.TaskGroup | None = None
        """The connection's task group, while it runs: the writer task is started in it."""
        self._writer_task: asyncio.Task[None] | None = None
        """Runs while there is output that ``write_now`` could not write (and ends once
        it is all written): a task parked for output for the life of every idle socket was
        a tenth of the objects an idle session made each full collection walk."""
        self._writer_first: str | None = None
        self._closing: asyncio.Task[None] | None = None
        """The close started by ``close_soon``; ``run`` waits for it."""
        self._send_buffer = 0
        """What ``fit_send_buffer`` last set the socket's send buffer to (0: the kernel's)."""
        self._allowance = float(MESSAGE_BURST)
        self._allowance_at = self.loop.time()
        """The messages the client may still send (``MESSAGE_BURST``, ``MESSAGES_PER_S``),
        as of that loop time."""

    async def run(self) -> None:
        """Serve the socket until the client leaves or the server shuts down."""
        runner = self.gateway.new_runner()
        log.info("session %s opened by %s", runner.session.id, _peer(self.ws))
        self._use(runner, 0)
        runner._apply(runner.session.open(resume_token=runner.resume_token,
                                          resume_window_s=runner.resume_window_s,
                                          default_voice=self.gateway.default_voice))
        refuse = None if self.resume_only is None else \
            self.loop.call_later(RESUME_PAST_LIMIT_S, self.refuse_past_limit)
        clean = crashed = False
        try:
            async with asyncio.TaskGroup() as tasks:
                self._tasks = tasks
                self.wake_writer()
                closing: list[asyncio.Task[None]] = []
                self.ws.on_close_frame = lambda: closing.append(
                    tasks.create_task(self._client_closed()))
                self.ws.on_control_frame = self._control_frame
                try:
                    await self._reader()
                    clean = True
                finally:
                    self.ws.on_close_frame = self.ws.on_control_frame = None
                    self._tasks = None
                    if self._writer_task is not None:
                        self._writer_task.cancel()
                    for task in closing:
                        task.cancel()
        except* ConnectionClosed as group:
            rcvd = cast(ConnectionClosed, group.exceptions[0]).rcvd
            # 1000, 1001, or no code at all (1005: a browser's close() without arguments),
            # as websockets counts a normal close when the reader's loop ends by itself
            clean = rcvd is not None and rcvd.code in OK_CLOSE_CODES
            # The group's traceback holds finished frames (Python 3.11's TaskGroup.__aexit__
            # keeps the group it raised in a local) that hold the group: clear them, or this
            # connection waits for a full GC to be freed.
            traceback.clear_frames(group.__traceback__)
        except* Exception as group:
            crashed = True
            if self.runner is not None:  # (the resumed session, after a resume)
                self.runner.crashed(group.exceptions[0])
            self.close_soon(1011, "internal error")  # (crashed did, if it still had us)
        finally:
            # The finished writer holds its CancelledError, whose traceback holds the
            # writer's frame and so this connection: a cycle only a full GC would free.
            self._writer_task = None
            if refuse is not None:
                refuse.cancel()
            if self._probe is not None:
                self._probe.cancel()
            if self.runner is not None:
                # a socket let in past max_sessions that did not resume: its own session
                # was only a way in, and held for a resume it was over the limit for 30 s
                self.runner.detach(self, resumable=not (clean or crashed or self.gateway.closing
                                                        or self.resume_only is not None),
                                   noticed_early_s=self._noticed_early_s)
            if self._closing is not None:
                await self._closing

    def _use(self, runner: SessionRunner, position: int, *, resumed: bool = False) -> None:
        self.runner = runner
        runner.attach(self, position, resumed=resumed)

    def fit_send_buffer(self, max_lead_ms: int) -> int:
        """Size the socket's kernel send buffer to one lead of audio (``max_lead_ms``,
        within ``SEND_BUFFER_BYTES``): all the pacer lets out at once fits, and a client
        that stops reading fills it within seconds, so what follows waits in the outbox,
        whose bound applies (``slow_consumer``). Autotuned, it may grow to 4 MB (Linux's
        ``tcp_wmem``), ~80 s of audio paced in real time: a client that stopped reading
        but went on sending was ended by nothing but the keepalive (40 s), as a network
        drop, with 1.8 MB in the kernel and its session kept for a resume. Returns the
        bytes of what was asked that the kernel did not give (0 when unknown): a lead
        beyond ``SEND_BUFFER_BYTES`` (no pacing) is the outbox's to bound, as before."""
        lead = max_lead_ms * codec.BYTES_PER_MS
        size = min(max(lead, SEND_BUFFER_BYTES[0]), SEND_BUFFER_BYTES[1])
        sock = self.ws.transport.get_extra_info("socket")
        if sock is None:
            return 0
        try:  # (OSError: a socket already gone)
            if size != self._send_buffer:
                self._send_buffer = size
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
            return max(0, min(lead, size) - sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF))
        except OSError:
            return 0

    def close_soon(self, code: int, reason: str) -> None:
        """Stop writing and close. A client that does not read will not read the close
        frame either: after ``CLOSED_TCP_GRACE_S`` the TCP connection is aborted."""
        if self._writer_task is not None:
            self._writer_task.cancel()
        if self._closing is None:
            self._closing = self.loop.create_task(self._close(code, reason,
                                                              CLOSED_TCP_GRACE_S))

    async def _close(self, code: int, reason: str, grace_s: float) -> None:
        try:
            async with asyncio.timeout(grace_s):
                await self.ws.close(code, reason)
        except TimeoutError:
            self.ws.transport.abort()

    async def _client_closed(self) -> None:
        """Started when the client's close frame arrives (``VoiceSocket``): raises
        ``ConnectionClosed`` at once, so the session ends, or waits for a resume, now."""
        self.close_soon(1000, "")  # answered within a second, or the TCP connection goes
        protocol = self.ws.protocol
        raise ConnectionClosed(protocol.close_rcvd, protocol.close_sent,
                               protocol.close_rcvd_then_sent)

    async def _reader(self) -> None:
        fresh = True
        """Nothing has acted on this socket's new session yet (a turn or a settings change;
        a ping, a cancel or a mark change nothing): a ``session.resume`` may still replace
        it (again after a ``resume_failed``: a client may retry)."""
        async for message in self.ws:
            runner = self.runner
            assert runner is not None
            if self._closing is not None or runner.connection is not self or runner.closed:
                # Closing (taken over by a resume, a slow consumer, refused past the limit,
                # the gateway stopping): the messages still arriving during the close
                # handshake belong to no session any more; fed in, they would steer a
                # session another socket now holds (a late session.resume took it over).
                continue
            now = self.loop.time()
            if not self._allowed(now):
                self._flooded(runner)
                continue
            if self.gateway.tracer is not None:
                runner.received_at = time.perf_counter()
            try:
                decoded = codec.decode_client(message)
            except ProtocolError as error:
                runner.protocol_error(error, now)
                continue
            if isinstance(decoded, codec.ClientResume):
                if fresh:
                    fresh = not self._resume(decoded, now)
                    if fresh and self.resume_only is not None:
                        self.refuse_past_limit(decoded.event_id)
                else:
                    runner.protocol_error(ProtocolError(
                        "invalid_message", "session.resume must come before any transcript, "
                        "say or session.update, and only until one succeeds",
                        event_id=decoded.event_id), now)
            elif self.resume_only is not None and isinstance(decoded, ACTS_ON_THE_SESSION):
                self.refuse_past_limit(decoded.event_id)
            else:
                acted = runner.receive(decoded, now)
                # (one refused changed nothing: a resume may still replace the session)
                fresh = fresh and not (acted and isinstance(decoded, ACTS_ON_THE_SESSION))

    def _allowed(self, now: float) -> bool:
        """One more message from the client at ``now``: False past the allowance."""
        allowed, self._allowance = message_allowed(
            self._allowance, self._allowance_at, now, burst=MESSAGE_BURST, per_s=MESSAGES_PER_S)
        self._allowance_at = now
        return allowed

    def _control_frame(self) -> None:
        """A ping (websockets answered it) or a pong came: it counts as a message. Past the
        allowance the socket closes as for any flood, and the gateway reads no more of it:
        websockets would answer every ping still arriving while the close frame waits
        behind the pongs of a client that reads none."""
        runner = self.runner
        if self._closing is not None or runner is None or runner.connection is not self \
                or runner.closed:
            return  # (closing: see _reader)
        if not self._allowed(self.loop.time()):
            self.ws.deaf = True
            self._flooded(runner)

    def _flooded(self, runner: SessionRunner) -> None:
        """The client sent more than ``MESSAGE_BURST`` messages beyond ``MESSAGES_PER_S``:
        its session ends and the socket closes (1008), as for a slow consumer."""
        self.gateway.metrics.errors["too_many_messages"] += 1
        log.warning("session %s: more than %d messages at once, beyond %g a second; closing",
                    runner.session.id, MESSAGE_BURST, MESSAGES_PER_S,
                    extra=limited("too_many_messages"))
        runner.close("the client sent too many messages")
        self.close_soon(*CLOSE_TOO_MANY_MESSAGES)

    def _resume(self, request: codec.ClientResume, now: float) -> bool:
        """``session.resume`` before any other message: swap the fresh session for the old
        one and replay what the client missed. False: a problem, told to the client; the
        fresh session goes on."""
        fresh = self.runner
        assert fresh is not None
        found = self._resumable(request, fresh)
        if isinstance(found, str):
            # past the session limit the socket was let in for the resume only: it closes
            # (refuse_past_limit, next), so there is no new session to continue with
            then = ("the gateway is full, so this socket closes" if self.resume_only is not None
                    else f"continuing with the new session {fresh.session.id}")
            fresh.protocol_error(ProtocolError(
                "resume_failed", f"cannot resume: {found}; {then}", event_id=request.event_id),
                now)
            return False
        old, position = found
        if old.connection is not None:
            old.connection.close_soon(4000, "session resumed elsewhere")
        fresh.close(f"replaced by the session it resumed, {old.session.id}")
        replayed = old.outbox.end - position
        # the resumed event goes first, then the replay from `position` (set before
        # attaching: attaching releases held audio, which must not overtake it)
        self._writer_first = orjson.dumps({
            "type": "session.resumed", "session_id": old.session.id,
            "last_seq": request.last_seq, "replayed": replayed,
            "turn_id": None if old.session.turn is None else old.session.turn.id,
            "session": old.session.settings.to_event(),
        }).decode()
        self._use(old, position, resumed=True)
        self.gateway.metrics.sessions_resumed += 1
        log.info("session %s resumed (%d messages replayed)", old.session.id, replayed)
        if self.resume_only is not None:  # back within the limit: a socket like any other
            self.resume_only = None
            self.gateway.past_limit.pop(self.ws, None)
        return True

    def _resumable(self, request: codec.ClientResume,
                   fresh: SessionRunner) -> tuple[SessionRunner, int] | str:
        """The session ``request`` names and the outbox position its replay starts from,
        or what stands in the way (told to the client as ``resume_failed``)."""
        old = self.gateway.runners.get(request.session_id)
        if old is None or old.closed or not old.check_resume_token(request.resume_token):
            return "unknown or expired session, or wrong resume_token"
        if old is fresh:
            return "that is this socket's own new session"
        position = old.outbox.position_after_frame(request.last_seq)
        if position is None:
            sent = old.session.frames_sent
            if request.last_seq is not None and (request.last_seq - sent) % 2**32 < 2**31:
                return (f"frame {request.last_seq} was never sent (the last one was "
                        f"{(sent - 1) % 2**32})" if sent else
                        f"frame {request.last_seq} was never sent (no frame was)")
            if request.last_seq is None:  # (another device's, say: it holds no frame)
                return ("the session's first messages are no longer buffered: name the "
                        "last frame received as last_seq")
            return "the frames after last_seq are no longer buffered"
        if request.last_seq is None:
            # no frame received: replay from the start, but after the old session's own
            # session.created (always message 0), which the client acted on already
            position = max(position, old.outbox.start + 1)
        return old, position

    def probe(self, silent_s: float) -> None:
        """Ping the client, silent for ``silent_s`` (``ProbeListener``): a pong within
        ``PROBE_TIMEOUT_S`` tells the session someone is there; none, and the socket is
        dropped without a close handshake, as a network drop would, so the session waits
        for a resume."""
        if self._probe is None or self._probe.done():
            self._probe = self.loop.create_task(self._ping(silent_s))

    async def _ping(self, silent_s: float) -> None:
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                await (await self.ws.ping())
        except TimeoutError:
            runner = self.runner
            log.info("session %s: nothing from the client for %.0f s while it should be "
                     "playing, and no pong in %.0f s: dropping its socket, the session waits "
                     "for a resume", None if runner is None else runner.session.id, silent_s,
                     PROBE_TIMEOUT_S)
            self.gateway.metrics.listeners_lost += 1
            self._noticed_early_s = max(0.0, 2 * KEEPALIVE_PING_S - silent_s - PROBE_TIMEOUT_S)
            self.ws.transport.abort()
            return
        except ConnectionClosed:
            return
        runner = self.runner
        if runner is not None and runner.connection is self and not runner.closed:
            runner._apply(runner.session.listener_answered(self.loop.time()))

    def refuse_past_limit(self, event_id: str | None = None) -> None:
        """This socket was let in past ``max_sessions`` only to resume, and did not (in
        time, at all, or a newer socket came to resume the session): tell the client, end
        the socket's own session, close with 1013. ``event_id``: the message that had it
        refused (one that acts on the session, a failed ``session.resume``), if it had one."""
        runner = self.runner
        if self.resume_only is None or runner is None or runner.closed:
            return
        runner.protocol_error(ProtocolError(
            "server_full", f"the gateway is full: this socket was let in only to resume "
                           f"{self.resume_only}; retry later", event_id=event_id),
            self.loop.time())
        self.gateway.past_limit.pop(self.ws, None)
        self._close_with = CLOSE_SERVER_FULL
        runner.close("let in past max_sessions to resume, and did not")

    def wake_writer(self) -> None:
        """The runner has output (or has closed): start the writer task unless it runs,
        the connection is not running yet or any more, or it is closing (``close_soon``)."""
        if self._writer_task is None and self._tasks is not None and self._closing is None:
            self._writer_task = self._tasks.create_task(self._writer())

    async def _writer(self) -> None:
        """The only caller of ``send``: writes until the outbox is empty, then ends (the
        next output starts it again, ``wake_writer``). Cancelling it is how the connection
        stops writing."""
        try:
            await self._write_outbox()
        finally:
            # (also when cancelled: its CancelledError's traceback holds this frame, and so
            # the connection, which would hold the task: a cycle only a full GC frees)
            self._writer_task = None

    async def _write_outbox(self) -> None:
        while True:
            runner = self.runner
            assert runner is not None
            if self._writer_first is not None:
                first, self._writer_first = self._writer_first, None
                await self.ws.send(first)
                continue
            outbox = runner.outbox
            if runner.closed and outbox.cursor >= outbox.end:
                await self.ws.close(*((1001, "server shutting down") if self.gateway.closing
                                      else self._close_with or (1011, "session ended")))
                return
            if outbox.cursor >= outbox.end:
                return
            batch = outbox.take(WRITE_BATCH)
            if len(batch) == 1:
                await self.ws.send(batch[0])
            else:
                await self._send_batch(batch)
            runner.written(batch)

    def write_now(self) -> bool:
        """Write the runner's new output from the caller, without a task switch, when
        nothing stands in the way: the connection runs with no writer task (nothing else to
        send), the socket is open and its buffer below the high-water mark. False: the
        writer task must do it (it waits for the socket to drain, and closes or replays as
        needed).

        At 400 streaming sessions this path cut the gateway's CPU per frame by ~8 %
        (bench/capacity.py, 3 alternating runs: 0.0223 → 0.0205 ms): the task wake-up and
        websockets' ``send_context`` per refill."""
        runner = self.runner
        ws = self.ws
        if (self._writer_task is not None or self._tasks is None
                or self._writer_first is not None or runner is None
                or runner.closed or ws.protocol.state is not State.OPEN or ws.paused
                or ws.transport.is_closing()):
            return False
        batch = runner.outbox.take()
        self._write(batch)
        runner.written(batch)
        return True

    async def _send_batch(self, batch: list[str | bytes]) -> None:
        """Send several messages with one socket write (the pacer releases a few frames per
        wake-up; one write each cost a syscall per frame) inside websockets' own
        ``send_context``, which checks the state before and applies flow control (drain)
        after, exactly as ``send`` does."""
        async with self.ws.send_context():
            self._write(batch)

    def _write(self, batch: list[str | bytes]) -> None:
        """Frame ``batch`` and write it to the socket in one call. Text goes through
        websockets' sans-I/O protocol. A binary message is its payload behind the header
        websockets serialized once for that length (``binary_header``), which holds
        because the server negotiates no extension (``compression=None``). ``send_binary``
        would build a ``Frame`` and a ``BytesIO`` and copy the payload twice per audio
        frame: at 400 streaming sessions this cut the CPU per frame by ~7 %
        (bench/CAPACITY.md)."""
        ws = self.ws
        protocol = ws.protocol
        chunks = protocol.data_to_send()  # whatever websockets queued goes first
        for item in batch:
            if isinstance(item, str):
                protocol.send_text(item.encode())
                chunks += protocol.data_to_send()
            else:
                chunks.append(binary_header(len(item)))
                chunks.append(item)
        ws.transport.write(b"".join(chunks))
        if b"" in chunks:  # an end-of-stream marker: keep its meaning
            ws.transport.write_eof()


@functools.lru_cache(maxsize=64)
def binary_header(length: int) -> bytes:
    """The header websockets itself writes for a server's (unmasked), unfragmented binary
    message of ``length`` bytes without extensions (RFC 6455 5.2), cut from its own
    serialization. Audio messages come in a handful of lengths: computed a few times."""
    frame = Frame(Opcode.BINARY, bytes(length)).serialize(mask=False, extensions=[])
    return frame[:len(frame) - length]


_VoiceOwner = tuple[str, int]
"""A voice job's owner: ``(session_id, turn_id)`` (an alias built once: subscripting
``tuple`` builds a new object at every call, and this runs for every deadline asked)."""


def _turn_of(job: Job) -> int:
    """The turn id of a voice job."""
    return cast(_VoiceOwner, job.owner)[1]


def job_deadline(job: Job, now: float) -> float:
    """``deadline_of`` for the lanes: ask the job's sink when its listener needs audio."""
    sink: Any = job.payload.sink
    deadline = getattr(sink, "deadline", None)
    return job.deadline if deadline is None else deadline(job, now)
