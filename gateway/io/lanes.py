"""Lane workers: one thread per lane runs engine steps, one asyncio task drives it.

MLX rejects concurrent command encoders and libespeak-ng is not thread-safe, so every call
into an engine (load, open, step, close) happens on its lane's single thread. The task
picks the next job from the core ``LaneScheduler`` between steps, so an urgent job waits at
most one step of whatever is running.

Steps at once. An engine whose steps mostly wait for a server (``parallel_steps``, the
``http`` engine: a thread-safe client) runs up to that many jobs' steps at once, each on a
thread of its own (``LanePool``): one TTS answer that stalls holds its own job, not every
session on the lane until its read timeout. A job cancelled while its step runs frees its
place at once (its stream is interrupted when it can be, and closed once the step returns).

Faults. An engine that raises fails that job only (``engine_failed``, or the
``EngineError``'s code) and the lane goes on. A call that does not return within
``step_timeout_s`` (an engine hung in a kernel, a dead remote) fails its job with
``engine_timeout``; the lane thread is still stuck in that call, so the lane is marked
unhealthy (``unhealthy`` says why; ``/health`` answers 503 with it) and every queued or
newly submitted job fails at once with ``engine_unavailable`` instead of waiting forever.
If the stuck call ever returns (every one of them, with steps at once), the lane is healthy
again, and failing (``failing``: ``/health`` degraded) until a job comes whole. A lane
whose executor can no longer run anything (shut down, broken) is unhealthy for good, with
the same fast failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from engines.base import (
    EngineError,
    ServerUnreachable,
    SynthesisRequest,
    SynthesisStream,
    TtsEngine,
)
from gateway.core.codec import BYTES_PER_MS
from gateway.core.placement import StepTimes
from gateway.core.scheduler import (
    JIT_GRANULARITY_S,
    DeadlineOf,
    Job,
    LanePolicy,
    LaneScheduler,
    Priority,
    default_reserve,
)

log = logging.getLogger(__name__)

STEP_TIMEOUT_S = 30.0
"""Default limit for one engine call on the lane thread (open or step), seconds. A real
engine's step is one chunk (tens to hundreds of ms); the first step of a cold model may take
a few seconds. Loading the engine is not limited."""


class StepTimeout(Exception):
    """An engine call did not return within ``step_timeout_s``. ``call``: its future, done
    once the stuck call returns (if ever)."""

    def __init__(self, message: str, call: Future[Any]) -> None:
        super().__init__(message)
        self.call = call


class EngineLoadError(Exception):
    """An engine did not load: the gateway cannot start (``voice-gateway`` says why, in one
    line; the traceback is in the DEBUG log)."""


class LaneUnavailable(Exception):
    """The lane cannot run engine calls (its thread is stuck, or its executor is gone)."""


class OutOfReach:
    """Whether a server's failing spell ends when a probe reaches it: it does when its last
    failure was the server out of reach (``ServerUnreachable``: refused, connect timeout)
    and the probe began after it. A spell its answers caused (an error status, a broken or
    stalled stream) waits for whole jobs: a server that answers a probe may still answer
    them wrongly. Without it an idle hub said degraded for good after the server came back.
    A lane's engine (``Lane.server_answers``) and the LLM (``Gateway.llm_probed``) keep one
    each."""

    __slots__ = ("since",)

    def __init__(self) -> None:
        self.since: float | None = None
        """``time.monotonic()`` of the last failure when it was the server out of reach;
        None when the last failure was another."""

    def failed(self, unreachable: bool) -> None:
        """A job failed; ``unreachable``: it could not reach the server."""
        self.since = time.monotonic() if unreachable else None

    def ended_by(self, started: float) -> bool:
        """A probe that began at ``started`` (``time.monotonic()``) reached the server: does
        that end the spell?"""
        return self.since is not None and started >= self.since


class JobSink(Protocol):
    """Where a job's results go (a voice connection, an HTTP speech response)."""

    def on_audio(self, job: Job, pcm: bytes, engine: str, ready_at: float) -> None:
        """``ready_at``: ``time.perf_counter()`` when the engine returned the chunk."""
    def on_done(self, job: Job, truncated: bool = False, notes: tuple[str, ...] = ()) -> None:
        """``truncated``: the engine ended the segment early after failing mid-segment (a
        fallback engine's rule, so nothing is said twice): the rest of its text was not
        spoken. ``notes``: what the engine's server said the segment did not get as asked
        (an ``http`` engine's stream's ``notes``)."""
    def on_failed(self, job: Job, code: str, message: str) -> None: ...


class LaneObserver(Protocol):
    """Watches a lane's compute for metrics (``gateway.io.telemetry``). Called on the loop."""

    def job_queued(self, lane: str, job: Job) -> None: ...
    def job_step(self, lane: str, job: Job, started: float, seconds: float,
                 audio_bytes: int, occupied: float) -> None:
        """One step ran from ``started`` (perf_counter) for ``seconds`` of lane time; the
        lane had a step in flight for ``occupied`` more seconds of wall time (``seconds``
        on a lane of one step at a time; less while steps run at once)."""
    def job_ended(self, lane: str, job: Job, outcome: str) -> None:
        """``outcome``: ``done``, ``failed``, ``cancelled`` or ``moved`` (to another lane)."""
    def server_unreachable(self, lane: str, message: str) -> None:
        """A job failed as the engine could not reach its server (``ServerUnreachable``)."""


class LaneThread:
    """One worker thread running calls in order: ``ThreadPoolExecutor(max_workers=1)``,
    except that the thread is a daemon. A pool's threads are joined at interpreter exit,
    so an engine call stuck forever (``engine_timeout``) would keep a SIGTERMed gateway
    from ever exiting; a daemon thread does not."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[tuple[Future[Any], Any, tuple[Any, ...]] | None] = \
            queue.SimpleQueue()
        self._shutdown = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Any, *args: Any) -> Future[Any]:
        with self._lock:
            if self._shutdown or not self._thread.is_alive():
                raise RuntimeError("cannot schedule new futures after shutdown")
            future: Future[Any] = Future()
            self._queue.put((future, fn, args))
            return future

    def shutdown(self, wait: bool = True) -> None:
        """No more calls; the ones queued still run. ``wait``: until they have."""
        with self._lock:
            if not self._shutdown:
                self._shutdown = True
                self._queue.put(None)
        if wait and self._thread is not threading.current_thread():
            self._thread.join()

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            _run_call(*item)
            # nothing of the call stays referenced while the thread waits for the next: the
            # last one's arguments (an HTTP response's encoder and its whole file) did
            del item


class LanePool:
    """Daemon worker threads for a lane that runs several calls at once (``parallel_steps``):
    a call goes to an idle thread, or to a new one when none is idle; a thread stays for the
    next call. As many threads as calls were ever in flight at once: the lane's steps, plus
    those of cancelled jobs still waiting for their server, plus streams being closed."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._queue: queue.SimpleQueue[tuple[Future[Any], Any, tuple[Any, ...]] | None] = \
            queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._shutdown = False

    def submit(self, fn: Any, *args: Any) -> Future[Any]:
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            future: Future[Any] = Future()
            self._queue.put((future, fn, args))
            if self._idle:
                self._idle -= 1  # (an idle thread takes it)
            else:
                thread = threading.Thread(target=self._work, daemon=True,
                                          name=f"{self._name}-{len(self._threads)}")
                self._threads.append(thread)
                thread.start()
            return future

    def shutdown(self, wait: bool = True) -> None:
        """No more calls; the ones queued still run. ``wait``: until they have."""
        with self._lock:
            if not self._shutdown:
                self._shutdown = True
                for _ in self._threads:
                    self._queue.put(None)
            threads = list(self._threads)
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            _run_call(*item)
            del item
            with self._lock:
                self._idle += 1


def _run_call(future: Future[Any], fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        result = fn(*args)
    except Exception as exc:
        future.set_exception(exc)
    except BaseException as exc:
        # an engine's library ending its thread (``sys.exit``): on this thread nothing
        # else can mean it, and passed on as it was it stopped the event loop, every
        # session with it; a failure of this call like any other
        error = RuntimeError(f"the call ended its thread: {type(exc).__name__}: {exc}")
        error.__cause__ = exc
        future.set_exception(error)
    else:
        future.set_result(result)


@dataclass(frozen=True, slots=True)
class SynthesisJob:
    request: SynthesisRequest
    sink: JobSink
    index: int = 0


@dataclass(slots=True)
class LaneStats:
    steps: int = 0
    busy_s: float = 0.0
    jobs_done: int = 0
    jobs_failed: int = 0
    jobs_cancelled: int = 0


INLINE_SLICE_S = 0.002
"""Inline (``blocks = False``) steps run back to back on the event loop for at most this
long before the loop gets a turn."""


class Lane:
    def __init__(self, name: str, engine: TtsEngine, deadline_of: DeadlineOf | None = None,
                 max_lead: float | None = None, step_timeout_s: float | None = STEP_TIMEOUT_S,
                 max_open_streams: int | None = None, reserved_streams: int | None = None):
        """``max_open_streams``: jobs whose engine stream is open at once (scheduler rule
        6; None: no limit); ``reserved_streams``: of those, the ones only interactive jobs
        may open (rule 6b; None: ``default_reserve``)."""
        self.name = name
        self.step_timeout_s = step_timeout_s
        """None: no limit (a hung engine then holds the lane forever)."""
        self._unhealthy: str | None = None
        self._healthy = asyncio.Event()
        self._healthy.set()
        self._broken = False
        self._stuck: list[float] = []
        """When each engine call past the step deadline that has not returned yet began
        (``time.monotonic()``, oldest first): with steps at once (``parallel_steps``)
        several may be, and the lane is healthy again only once none is left
        (``_stuck_call_returned``)."""
        self.engine = engine
        self.inline = getattr(engine, "blocks", True) is False
        self.parallel_steps = 1 if self.inline else \
            max(1, int(getattr(engine, "parallel_steps", 1)))
        """Steps the engine may run at once (module docstring, "Steps at once")."""
        self._inline_since = 0.0
        self.scheduler = LaneScheduler(deadline_of=deadline_of, max_lead=max_lead,
                                       tolerance=JIT_GRANULARITY_S, max_open=max_open_streams,
                                       reserve=default_reserve(max_open_streams)
                                       if reserved_streams is None else reserved_streams)
        self._streams_full = False
        """Jobs wait for an open stream to end (rule 6): said once in the log, not per job."""
        self.stats = LaneStats()
        self.timing = StepTimes()
        """What this lane's interactive steps measured, for placing turns between lanes."""
        self.loaded = False
        self._executor: LaneThread | LanePool = LaneThread(f"lane-{name}") \
            if self.parallel_steps == 1 else LanePool(f"lane-{name}")
        self._closed = False
        self._wake = asyncio.Event()
        self._stepping: set[Job] = set()
        """Jobs whose step is in flight (a cancelled one's too, until it returns)."""
        self._step_tasks: set[asyncio.Task[None]] = set()
        """The tasks of steps at once (``parallel_steps``)."""
        self._in_step = 0
        """Steps running now (``_step``)."""
        self._occupied_at = 0.0
        """While a step runs: the time up to which the lane's occupied wall time is booked
        (``LaneObserver.job_step``'s ``occupied``): steps at once count once."""
        self.observer: LaneObserver | None = None
        self.failing: str | None = None
        """The code of the engine's last failure, until a job ends whole again, or, when it
        could not reach its server, until a probe reaches it (``server_answers``;
        ``/health`` is "degraded" meanwhile, ``engine.failing``)."""
        self._out_of_reach = OutOfReach()
        """Whether a probe of the engine's server ends ``failing``."""

    @property
    def usable(self) -> bool:
        """Loaded and healthy: jobs placed here now will run."""
        return self.loaded and self._unhealthy is None

    @property
    def unhealthy(self) -> str | None:
        """Why the lane cannot run jobs now, or None when it can."""
        return self._unhealthy

    @unhealthy.setter
    def unhealthy(self, reason: str | None) -> None:
        self._unhealthy = reason
        if reason is None:
            self._healthy.set()
        else:
            self._healthy.clear()

    async def wait_healthy(self) -> None:
        await self._healthy.wait()

    # ---- thread helpers ----------------------------------------------------------------

    async def call(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(*args)`` on the lane thread. Cancelling the await does not stop the
        call already running there; its result is discarded."""
        return await asyncio.wrap_future(self._submit(fn, *args))

    def _submit(self, fn: Any, *args: Any) -> Future[Any]:
        try:
            return self._executor.submit(fn, *args)
        except RuntimeError as exc:  # shut down, or BrokenThreadPool: no thread will run it
            self._mark_broken(f"the lane executor cannot run jobs: {type(exc).__name__}: {exc}")
            raise LaneUnavailable(self.unhealthy) from exc

    async def _call_limited(self, fn: Any, *args: Any) -> Any:
        """``call`` with the step deadline. On timeout the lane turns unhealthy until the
        stuck call returns (if ever)."""
        if self.step_timeout_s is None:
            return await self.call(fn, *args)
        began = time.monotonic()
        future = self._submit(fn, *args)
        wrapped = asyncio.wrap_future(future)
        try:
            done, _ = await asyncio.wait({wrapped}, timeout=self.step_timeout_s)
        except asyncio.CancelledError:
            wrapped.cancel()
            raise
        if done:
            return wrapped.result()
        wrapped.cancel()  # stop waiting; the call itself goes on on the lane thread
        self._stuck.append(began)
        self.unhealthy = (f"engine_timeout: an engine call ({getattr(fn, '__name__', fn)}) "
                          f"of {self.engine.name} ran more than {self.step_timeout_s:g} s "
                          "and still holds the lane thread")
        log.error("lane %s: %s", self.name, self.unhealthy)
        loop = asyncio.get_running_loop()

        def returned(_f: Future[Any]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop may be closed by then
                loop.call_soon_threadsafe(self._stuck_call_returned, began)

        future.add_done_callback(returned)
        raise StepTimeout(self.unhealthy, future)

    def _stuck_call_returned(self, began: float) -> None:
        """The stuck call that began at ``began`` returned."""
        # one call returning says nothing of the others stuck: their server (or model)
        # may hang still, and turns placed here would each wait out the step deadline
        self._stuck.remove(began)
        if self._stuck:
            log.info("lane %s: a stuck engine call returned; %d still stuck", self.name,
                     len(self._stuck))
            return
        if not self._broken and self.unhealthy is not None:
            log.info("lane %s: the stuck engine call returned; the lane is healthy again",
                     self.name)
            self.unhealthy = None
            self._wake.set()

    def _mark_broken(self, reason: str) -> None:
        if not self._broken:
            log.error("lane %s: %s", self.name, reason)
        self._broken = True
        self.unhealthy = reason
        self._wake.set()

    async def _call_step(self, fn: Any, *args: Any) -> Any:
        """A step or an ``open``: on the lane thread, or inline on the event loop for an
        engine whose steps cost (next to) nothing (``blocks = False``), where the thread
        hop and the GIL hand-over would cost more than the step itself."""
        if self.inline:
            result = fn(*args)
            now = time.perf_counter()
            if now - self._inline_since >= INLINE_SLICE_S:
                # let the loop breathe; not after every step: one yield is a task switch,
                # 4 % of the gateway's CPU at 1,500 sessions when taken per step
                await asyncio.sleep(0)
                self._inline_since = time.perf_counter()
            return result
        return await self._call_limited(fn, *args)

    def _close_later(self, stream: SynthesisStream | None) -> None:
        if stream is None:
            return
        if self.inline:
            _close_quietly(stream)
        else:
            self._executor.submit(_close_quietly, stream)

    # ---- API ---------------------------------------------------------------------------

    async def load(self) -> float:
        """Load the engine on its thread; returns the seconds it took."""
        started = time.perf_counter()
        try:
            await self.call(self.engine.load)
        except Exception as exc:
            detail = exc.message if isinstance(exc, EngineError) else \
                f"{type(exc).__name__}: {exc}"
            raise EngineLoadError(f"the {self.engine.name} engine did not load (lane "
                                  f"{self.name}): {detail}") from exc
        self.loaded = True
        return time.perf_counter() - started

    def submit(self, owner: Hashable, payload: SynthesisJob, *, deadline: float,
               priority: Priority = Priority.INTERACTIVE, since: float | None = None,
               max_lead: float | None = None) -> Job:
        """``since``: when the owner's stream started (``Job.since``), for a later job of it;
        ``max_lead``: the job's own just-in-time lead (``Job.max_lead``)."""
        job = Job(owner=owner, priority=priority, deadline=deadline, payload=payload,
                  since=since, max_lead=max_lead)
        self.scheduler.submit(job)
        if self.unhealthy is not None:
            # fail fast, but never inside the caller's own call (sinks are not re-entrant)
            asyncio.get_running_loop().call_soon(self._fail_queued)
        if self.observer is not None:
            self.observer.job_queued(self.name, job)
        self._wake.set()
        return job

    def llm_started(self) -> None:
        """An LLM stream of this gateway began decoding. On a ``gpu`` lane (the LLM shares the
        device) background work is then paced just in time (scheduler rule 3)."""
        if self.name == "gpu":
            self.scheduler.llm_decoding += 1

    def llm_ended(self) -> None:
        """The LLM stream ended (done, failed or cancelled): background work may run flat
        out again, so wake the lane."""
        if self.name == "gpu" and self.scheduler.llm_decoding > 0:
            self.scheduler.llm_decoding -= 1
            self._wake.set()

    def touch(self, owner: Hashable) -> None:
        """``owner``'s deadline may have moved earlier (a playback mark): re-rank it and
        wake the lane if it was waiting for a just-in-time job."""
        self.scheduler.touch(owner)
        self._wake.set()

    def cancel(self, owner: Hashable) -> int:
        """Drop ``owner``'s jobs. Queued ones go now; a running step finishes, then stops: at
        once when its stream can ``interrupt`` (``engines.base``: a remote engine's step
        waiting for a stalled server held the lane, a barge-in included, until its read
        timeout)."""
        jobs = self._remove(owner, "cancelled")
        self.stats.jobs_cancelled += len(jobs)
        return len(jobs)

    def hand_over(self, owner: Hashable) -> list[Job]:
        """Take ``owner``'s queued jobs off this lane, in order, to be submitted to another
        (not counted as cancelled). Called from a sink's ``on_failed``, between two steps
        of this lane: no job is running."""
        return self._remove(owner, "moved")

    def _remove(self, owner: Hashable, outcome: str) -> list[Job]:
        """Take ``owner``'s jobs off the lane and report each as ``outcome``; the streams of
        those not running are closed (a running step finishes, then stops)."""
        jobs = self.scheduler.cancel(owner)
        for job in jobs:
            self._ended(job, outcome)
            if not job.running:
                self._close_later_safe(job.state)
                job.state = None
            else:
                stream: SynthesisStream | None = job.state  # (None while it opens)
                if stream is not None:
                    stream.interrupt()
        if jobs:
            self._wake.set()  # a step's place or an open stream's is free: another may start
        return jobs

    @property
    def queue_depth(self) -> int:
        return len(self.scheduler)

    @property
    def busy(self) -> bool:
        """A step is in flight, or an engine call past the step deadline still holds a lane
        thread: the step it was for has ended (``engine_timeout``), the thread's work has
        not (``stuck_calls``, ``stuck_s``)."""
        return bool(self._stepping) or bool(self._stuck)

    @property
    def stuck_calls(self) -> int:
        """Engine calls past the step deadline that have not returned yet."""
        return len(self._stuck)

    def stuck_s(self, now: float) -> float | None:
        """Seconds since the oldest engine call still stuck past the step deadline began
        (``now``: ``time.monotonic()``), or None when none is."""
        return now - min(self._stuck) if self._stuck else None

    async def run(self) -> None:
        """Drive the lane until cancelled. Safe to cancel: the step in flight completes on
        its thread and is discarded. Should the lane itself fail (a bug here or in the
        scheduler), it turns unhealthy for good and fails what waits, rather than leave
        every job queued with nothing serving it."""
        try:
            await self._serve()
        except Exception as exc:  # (not raised on: nobody awaits this task until the end)
            log.exception("lane %s stopped", self.name)
            self._mark_broken(f"the lane stopped: {type(exc).__name__}: {exc}")
            self._fail_queued()

    async def _serve(self) -> None:
        try:
            await self._serve_jobs()
        finally:  # (steps at once are the lane's: they end with it)
            for task in list(self._step_tasks):
                task.cancel()

    async def _serve_jobs(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self.unhealthy is not None:
                self._fail_queued()
                self._wake.clear()
                await self._wake.wait()
                continue
            at_once = self.parallel_steps
            if at_once > 1 and self.scheduler.policy is LanePolicy.FIFO:
                at_once = 1  # (whole jobs in arrival order: one at a time)
            if at_once > 1 and sum(not j.cancelled for j in self._stepping) >= at_once:
                self._wake.clear()  # every place taken: until a step returns
                await self._wake.wait()
                continue
            job = self.scheduler.next_job(loop.time())
            self._say_streams_full()
            if job is None:
                # Nothing eligible: sleep until a submission, or until a job that is too far
                # ahead of its listener (just in time) becomes eligible.
                self._wake.clear()
                wake_at = self.scheduler.next_eligible_at
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(wake_at):
                        await self._wake.wait()
                continue
            if at_once == 1:
                await self._step_guarded(job)
            else:
                self.scheduler.hold(job)
                # its place is taken now, not when the task runs; and it is no queued job
                # for ``_fail_queued`` to fail meanwhile
                job.running = True
                self._stepping.add(job)
                task = asyncio.create_task(self._step_held(job))
                self._step_tasks.add(task)
                task.add_done_callback(self._step_tasks.discard)

    def _say_streams_full(self) -> None:
        """Once when sentences start waiting for an open stream to end (rule 6), once when
        none waits any more: not at every stream that ends meanwhile (the scheduler keeps
        it for a waiting sentence, which may take it a few steps later)."""
        scheduler = self.scheduler
        if not self._streams_full:
            if scheduler.streams_waiting:
                self._streams_full = True
                log.warning("lane %s: %d streams open (max_open_streams %s, %d kept for voice "
                            "sessions): new sentences wait for one to end", self.name,
                            scheduler.open_streams, scheduler.max_open, scheduler.reserved)
        elif not scheduler.streams_waiting:
            self._streams_full = False
            log.info("lane %s: no sentence waits for an open stream any more", self.name)

    async def _step_guarded(self, job: Job) -> None:
        try:
            await self._step(job)
        except Exception as exc:
            self._consumer_failed(job, exc)

    async def _step_held(self, job: Job) -> None:
        """One of several steps at once: its owner is held meanwhile (scheduler rule 5)."""
        try:
            await self._step_guarded(job)
        finally:
            self.scheduler.release(job)
            self._wake.set()

    def _consumer_failed(self, job: Job, exc: Exception) -> None:
        """A step raised outside the engine: a bug in what consumes the audio (the session
        or HTTP request the job is for) or in an observer; or telling a sink that the lane
        cannot run its job raised (``_fail_queued``). That owner's jobs end failed
        with ``internal_error``; the lane and every other owner's jobs go on."""
        log.exception("lane %s: internal error in a job of %s", self.name, job.owner)
        cancelled = job.cancelled  # (before _remove, which cancels it and frees its stream)
        # each job taken off counts, as the observer sees each end; ``job`` itself is one of
        # them unless it had ended already (done, or failed by ``_fail_queued``: counted)
        self.stats.jobs_failed += len(self._remove(job.owner, "failed"))
        if cancelled:
            return
        try:
            job.payload.sink.on_failed(job, "internal_error", f"{type(exc).__name__}: {exc}")
        except Exception:
            log.exception("lane %s: telling %s of its internal error failed too", self.name,
                          job.owner)

    def _fail_queued(self) -> None:
        """The lane is unhealthy: every job waiting for it fails now, each owner's in order
        and as a failed step does (``_step_failed``): the sink hears of its first job and
        decides for the rest, which it may cancel or move to another lane (a voice turn on
        a second lane goes on on the primary, ``Gateway.reroute``). They were taken off as
        cancelled, which a reroute skips: a turn waiting on a stuck second lane failed
        while the primary was free. An owner whose step is in flight is left to that step,
        which reports itself."""
        for owner in self.scheduler.owners():
            while (self.unhealthy is not None
                   and (job := self.scheduler.head(owner)) is not None and not job.running):
                reason = self.unhealthy
                self._drop(job)
                self.stats.jobs_failed += 1
                self._ended(job, "failed")
                try:
                    job.payload.sink.on_failed(
                        job, "engine_unavailable",
                        f"the {self.name} lane cannot synthesize: {reason}")
                except Exception as exc:  # a bug in the sink: its owner only, as in a step
                    self._consumer_failed(job, exc)

    def _close_after(self, stream: SynthesisStream | None, call: Future[Any]) -> None:
        """Close a job's stream on the lane thread after ``call``, stuck there now, has
        returned (the thread runs its calls in order; a pool's threads do not, so there
        the close is submitted once it returned): ``stream``, or the one ``call`` returns
        when it is the job's ``open``."""

        def submit(_call: Future[Any] | None = None) -> None:
            with contextlib.suppress(RuntimeError):  # the thread is gone: nothing can close it
                self._executor.submit(_close_after_call, stream, call)

        if isinstance(self._executor, LaneThread):
            submit()
        else:
            call.add_done_callback(submit)

    def _close_later_safe(self, stream: SynthesisStream | None) -> None:
        with contextlib.suppress(RuntimeError):
            self._close_later(stream)

    async def _step(self, job: Job) -> None:
        payload: SynthesisJob = job.payload
        job.running = True
        self._stepping.add(job)
        started = time.perf_counter()
        if not self._in_step:
            self._occupied_at = started
        self._in_step += 1
        chunk: bytes | None = None
        opened = job.state is None
        llm = self.scheduler.llm_decoding > 0
        try:
            if opened:
                job.state = await self._call_step(self.engine.open, payload.request)
            # cancelled while its stream opened (a barge-in during a model's prefill): no
            # step for audio nobody hears, ahead of the new turn's first audio
            if not job.cancelled:
                chunk, ready_at = await self._call_step(_timed_step, job.state)
        except StepTimeout as exc:  # the stream stays with the stuck thread...
            # ...which closes it once the call returns: nothing else would (an engine keeps
            # its open streams, and a model's holds its caches)
            self._close_after(job.state, exc.call)
            job.state = None
            # a failure like any other once the call returns: /health is degraded until a
            # job comes whole again, not ok at once (``_call_limited`` said it at ERROR)
            self.failing = "engine_timeout"
            self._out_of_reach.failed(False)
            self._step_failed(job, "engine_timeout", f"{self.engine.name} did not answer "
                              f"within {self.step_timeout_s:g} s", free_stream=False)
            return
        except LaneUnavailable as exc:
            self._step_failed(job, "engine_unavailable", str(exc), free_stream=False)
            return
        except EngineError as exc:
            self._engine_failed(exc.code, exc.message)
            unreachable = isinstance(exc, ServerUnreachable)
            self._out_of_reach.failed(unreachable)
            if unreachable and self.observer is not None:
                self.observer.server_unreachable(self.name, exc.message)
            self._step_failed(job, exc.code, exc.message)
            return
        except Exception as exc:  # an engine bug must not take the lane down
            # failing like any other failure (/health degraded), said once with its
            # traceback: one per sentence flooded the log while /health said ok
            if self.failing is None:
                log.exception("engine %s failed", self.engine.name)
            self.failing = "engine_failed"
            self._out_of_reach.failed(False)  # (no probe ends it)
            self._step_failed(job, "engine_failed", f"{type(exc).__name__}: {exc}")
            return
        finally:
            job.running = False
            self._stepping.discard(job)
            ended = time.perf_counter()
            seconds = ended - started
            self.stats.busy_s += seconds
            self.stats.steps += 1
            self._in_step -= 1
            occupied, self._occupied_at = ended - self._occupied_at, ended
            if self.observer is not None:
                self.observer.job_step(self.name, job, started, seconds,
                                       0 if chunk is None else len(chunk), occupied)
        if job.cancelled:
            self._close_later_safe(job.state)
            job.state = None
            return
        if chunk is None:
            truncated = bool(getattr(job.state, "truncated", False))
            notes = tuple(getattr(job.state, "notes", ()))
            if self.failing is not None:
                log.info("lane %s: %s spoke a whole job again", self.name, self.engine.name)
                self.failing = None
            self._drop(job)
            self.stats.jobs_done += 1
            self._ended(job, "done")
            payload.sink.on_done(job, truncated, notes)
            return
        if job.priority is Priority.INTERACTIVE:
            # until the engine returned: not the loop's delay in taking the result
            self.timing.step(ready_at - started, len(chunk) / BYTES_PER_MS / 1000.0,
                             opened=opened, llm=llm)
        if not chunk:
            # a step that made no audio (allowed: engines.base) is not audio heard: passed
            # on and counted, it named its engine on the sentence and made a failure after
            # it cut the sentence short with nothing said (Gateway.reroute), not say it again
            return
        job.steps += 1
        engine_name = getattr(job.state, "engine_name", None) or self.engine.name
        payload.sink.on_audio(job, chunk, engine_name, ready_at)

    def _ended(self, job: Job, outcome: str) -> None:
        if self.observer is not None:
            self.observer.job_ended(self.name, job, outcome)

    def server_answers(self, started: float) -> None:
        """A probe of the engine's server that began at ``started`` (``time.monotonic()``)
        found it answering (``gateway.io.telemetry.TtsProbe``): a failing spell ends here
        if the server's being out of reach caused it (``OutOfReach``); one of failed answers
        still waits for a whole job."""
        if self.failing is None or not self._out_of_reach.ended_by(started):
            return
        log.info("lane %s: %s's server answers again", self.name, self.engine.name)
        self.failing = None

    def _engine_failed(self, code: str, message: str) -> None:
        """One WARNING when the engine starts failing jobs, not one per turn (README, Logs;
        a stuck lane says so at ERROR itself, an engine bug once): a TTS server that was
        down or a model that ran away failed every turn without a line in the log."""
        if self.failing is None:
            log.warning("lane %s: %s fails (%s): %s", self.name, self.engine.name, code,
                        message)
        self.failing = code

    def _step_failed(self, job: Job, code: str, message: str, *,
                     free_stream: bool = True) -> None:
        """The job's step failed: it ends ``failed`` (its stream freed, unless a thread that
        cannot be stopped still holds it), and its sink hears why. A job cancelled while
        its step ran ended then (``_remove``: counted and observed as cancelled), so it is
        not counted failed too. Before the step's figures are booked (``_step``'s
        ``finally``), as it always was."""
        if free_stream:
            self._drop(job)
        else:
            self.scheduler.finish(job)
        if job.cancelled:
            return
        self.stats.jobs_failed += 1
        self._ended(job, "failed")
        job.payload.sink.on_failed(job, code, message)

    def _drop(self, job: Job) -> None:
        self.scheduler.finish(job)
        self._close_later_safe(job.state)
        job.state = None

    def close_soon(self) -> None:
        """Release the engine, then the thread, once the call running there returns (a load
        the start no longer waits for), without waiting for it: a start that failed or was
        cancelled while engines loaded, which has no job to cancel. It left both open, a
        thread more per failed start in a process that goes on."""
        if self._closed:
            return
        self._closed = True
        self.engine.interrupt()
        with contextlib.suppress(RuntimeError):  # (a broken executor: nothing runs there)
            self._executor.submit(self.engine.close)
        self._executor.shutdown(wait=False)

    async def aclose(self) -> None:
        """Cancel every job and release the engine on its thread (once: closing again is a
        no-op, as for the gateway that calls it)."""
        if self._closed:
            return
        self._closed = True
        for owner in self.scheduler.owners():
            self.cancel(owner)
        # a remote engine's step waiting for a silent server (still running on the thread
        # after the lane's task was cancelled) held the close, and a SIGTERMed gateway,
        # until its read timeout: its result is not wanted anyway
        self.engine.interrupt()
        try:
            if self.unhealthy is None:
                await self.call(self.engine.close)
            else:  # a stuck thread would never run it: do not wait for it
                log.warning("lane %s: not closing the engine (%s)", self.name, self.unhealthy)
        finally:
            if self.unhealthy is None:
                # Let the thread end before the interpreter does: MLX's C++ state torn down
                # under a live thread aborted a SIGTERMed qwen3 gateway (exit -6, "terminate
                # called without an active exception") in 4 of 5 runs; 2 of 35 with this
                # join, 0 of 20 with the CLI's os._exit after it (gateway.cli.entry).
                await asyncio.to_thread(self._executor.shutdown, True)
            else:
                self._executor.shutdown(wait=False)


def _timed_step(stream: SynthesisStream) -> tuple[bytes | None, float]:
    chunk = stream.step()
    return chunk, time.perf_counter()


def _close_after_call(stream: SynthesisStream | None, call: Future[Any]) -> None:
    """On the lane thread, once ``call`` (an engine call that timed out) has returned."""
    if stream is None:  # the stuck call was the open: close what it opened
        if call.cancelled() or call.exception() is not None:
            return
        stream = call.result()
    _close_quietly(stream)


def _close_quietly(stream: SynthesisStream) -> None:
    try:
        stream.close()
    except Exception:
        log.exception("closing a synthesis stream failed")
