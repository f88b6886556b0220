"""One voice WebSocket connection: the thin shell around a core ``Session``.

The handler task reads client messages; a writer task owns ``websocket.send``; each turn's
LLM stream runs in its own task; synthesis runs on the shared lanes. All of them feed
inputs to the session and execute the effects it returns (``_apply``), on the event loop,
so the session is only ever touched by one thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any, assert_never

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from engines.base import EngineError, LlmDelta, LlmDone, LlmRequest, SynthesisRequest
from gateway.core import codec
from gateway.core.codec import ProtocolError
from gateway.core.scheduler import Job, Priority
from gateway.core.session import (
    CancelLlm,
    CancelSynthesis,
    Effect,
    SendAudio,
    SendEvent,
    Session,
    StartLlm,
    StartSynthesis,
)
from gateway.io.lanes import SynthesisJob

if TYPE_CHECKING:
    from gateway.io.server import Gateway

log = logging.getLogger(__name__)

OUTBOX_LIMIT = 4096
"""Messages queued for a client that is not reading. Past it the connection is closed
(1008 would be a policy code; we use 1013 "try again later" with reason ``slow_consumer``)."""


class VoiceConnection:
    def __init__(self, gateway: Gateway, websocket: ServerConnection, session: Session):
        self.gateway = gateway
        self.ws = websocket
        self.session = session
        self.loop = asyncio.get_running_loop()
        self._outbox: deque[str | bytes] = deque()
        self._outbox_ready = asyncio.Event()
        self._llm_tasks: dict[int, asyncio.Task[None]] = {}
        self._tasks: asyncio.TaskGroup | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._closing = False
        self.frames_sent = 0
        # tracing (bench/turn_latency.py); None in normal operation
        self._received_at = 0.0
        self._trace_frames: dict[int, float] = {}

    def now(self) -> float:
        return self.loop.time()

    # ---- lifecycle ---------------------------------------------------------------------

    async def run(self) -> None:
        """Serve the connection until the client leaves or the server shuts down."""
        try:
            async with asyncio.TaskGroup() as tasks:
                self._tasks = tasks
                writer = tasks.create_task(self._writer())
                self._apply(self.session.open())
                try:
                    await self._reader()
                finally:
                    self._shutdown()
                    writer.cancel()
        except* ConnectionClosed:
            pass

    def _shutdown(self) -> None:
        """Stop everything the session started (LLM streams, lane jobs, the timer)."""
        if self._closing:
            return
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
        for effect in self.session.close(self.now()):
            if isinstance(effect, CancelLlm | CancelSynthesis):
                self._execute(effect)
        for task in self._llm_tasks.values():
            task.cancel()

    async def _reader(self) -> None:
        async for message in self.ws:
            now = self.now()
            if self.gateway.tracer is not None:
                self._received_at = time.perf_counter()
            try:
                decoded = codec.decode_client(message)
            except ProtocolError as error:
                self.gateway.metrics.errors[error.code] += 1
                self._apply(self.session.protocol_error(error, now))
                continue
            self._apply(self.session.receive(decoded, now))

    async def _writer(self) -> None:
        """The only caller of ``send``. Cancelling it is how the connection stops writing."""
        outbox = self._outbox
        while True:
            if not outbox:
                self._outbox_ready.clear()
                await self._outbox_ready.wait()
                continue
            item = outbox.popleft()
            await self.ws.send(item)
            if self._trace_frames:
                ready_at = self._trace_frames.pop(id(item), None)
                if ready_at is not None and self.gateway.tracer is not None:
                    self.gateway.tracer.add("chunk_to_frame_written",
                                            time.perf_counter() - ready_at)

    # ---- effects -----------------------------------------------------------------------

    def _apply(self, effects: list[Effect]) -> None:
        for effect in effects:
            self._execute(effect)
        self._rearm_timer()

    def _execute(self, effect: Effect) -> None:
        match effect:
            case SendAudio(data=data):
                self._send(data)
                self.frames_sent += 1
                self.gateway.metrics.frames += 1
            case SendEvent(event=event):
                self._send(codec.encode_event(event))
                if event["type"] == "turn.done":
                    self.gateway.metrics.turn_done(event)
            case StartLlm(turn_id=turn_id, request=request):
                if self._tasks is not None and not self._closing:
                    task = self._tasks.create_task(self._run_llm(turn_id, request))
                    self._llm_tasks[turn_id] = task
                    task.add_done_callback(lambda _t, t=turn_id: self._llm_tasks.pop(t, None))
            case CancelLlm(turn_id=turn_id):
                task = self._llm_tasks.get(turn_id)
                if task is not None:
                    task.cancel()
            case StartSynthesis():
                request = SynthesisRequest(text=effect.text, voice=effect.voice)
                self.gateway.lane.submit((self.session.id, effect.turn_id),
                                         SynthesisJob(request, self, effect.index),
                                         deadline=effect.deadline,
                                         priority=Priority.INTERACTIVE)
            case CancelSynthesis(turn_id=turn_id):
                self.gateway.lane.cancel((self.session.id, turn_id))
            case _:
                assert_never(effect)

    def _send(self, item: str | bytes) -> None:
        if self._closing:
            return
        if len(self._outbox) >= OUTBOX_LIMIT:
            self.gateway.metrics.errors["slow_consumer"] += 1
            self._closing = True
            self._tasks_cancel_llm()
            self.loop.create_task(self.ws.close(1013, "slow_consumer"))  # noqa: RUF006
            return
        self._outbox.append(item)
        self._outbox_ready.set()

    def _tasks_cancel_llm(self) -> None:
        for task in self._llm_tasks.values():
            task.cancel()

    def _rearm_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._closing:
            return
        wake = self.session.wake_at()
        if wake is not None:
            self._timer = self.loop.call_at(wake, self._tick)

    def _tick(self) -> None:
        self._timer = None
        self._apply(self.session.tick(self.now()))

    # ---- LLM ---------------------------------------------------------------------------

    async def _run_llm(self, turn_id: int, request: LlmRequest) -> None:
        """Stream one turn's reply into the session. Cancelled on barge-in (closes the HTTP
        stream); every failure becomes an ``llm_*`` error on the turn, never a hang."""
        tracer = self.gateway.tracer
        if tracer is not None:
            tracer.add("transcript_to_llm_request", time.perf_counter() - self._received_at)
        try:
            async with contextlib.aclosing(self.gateway.llm.stream(request)) as stream:
                async for event in stream:
                    match event:
                        case LlmDelta(text=text):
                            self._apply(self.session.llm_delta(turn_id, text, self.now()))
                        case LlmDone(tokens_per_s=rate):
                            self._apply(self.session.llm_done(turn_id, rate, self.now()))
                            return
            raise EngineError("llm_failed", "the LLM stream ended without finishing")
        except EngineError as exc:
            self.gateway.metrics.errors[exc.code] += 1
            self._apply(self.session.llm_failed(turn_id, exc.code, exc.message, self.now()))
        except Exception as exc:
            log.exception("LLM backend failed")
            self.gateway.metrics.errors["llm_failed"] += 1
            self._apply(self.session.llm_failed(turn_id, "llm_failed",
                                                f"{type(exc).__name__}: {exc}", self.now()))

    # ---- lane sink (called on the event loop by the lane task) -----------------------

    def deadline(self, job: Job, now: float) -> float:
        turn_id = job.owner[1]
        deadline = self.session.deadline(turn_id, now)
        return job.deadline if deadline is None else deadline

    def on_audio(self, job: Job, pcm: bytes, engine: str, ready_at: float) -> None:
        payload: SynthesisJob = job.payload
        effects = self.session.audio(job.owner[1], payload.index, pcm, engine, self.now())
        if self.gateway.tracer is not None:
            first = next((e for e in effects if isinstance(e, SendAudio)), None)
            if first is not None:
                self._trace_frames[id(first.data)] = ready_at
        self._apply(effects)

    def on_done(self, job: Job) -> None:
        payload: SynthesisJob = job.payload
        self._apply(self.session.synthesis_done(job.owner[1], payload.index, self.now()))

    def on_failed(self, job: Job, code: str, message: str) -> None:
        payload: SynthesisJob = job.payload
        self.gateway.metrics.errors[code] += 1
        self._apply(self.session.synthesis_failed(job.owner[1], payload.index, code, message,
                                                  self.now()))


def job_deadline(job: Job, now: float) -> float:
    """``deadline_of`` for the lanes: ask the job's sink when its listener needs audio."""
    sink: Any = job.payload.sink
    deadline = getattr(sink, "deadline", None)
    return job.deadline if deadline is None else deadline(job, now)
