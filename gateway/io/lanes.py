"""Lane workers: one thread per lane runs engine steps, one asyncio task drives it.

MLX rejects concurrent command encoders and libespeak-ng is not thread-safe, so every call
into an engine (load, open, step, close) happens on its lane's single thread. The task
picks the next job from the core ``LaneScheduler`` between steps, so an urgent job waits at
most one step of whatever is running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from engines.base import EngineError, SynthesisRequest, SynthesisStream, TtsEngine
from gateway.core.scheduler import DeadlineOf, Job, LaneScheduler, Priority

log = logging.getLogger(__name__)


class JobSink(Protocol):
    """Where a job's results go (a voice connection, an HTTP speech response)."""

    def on_audio(self, job: Job, pcm: bytes, engine: str, ready_at: float) -> None:
        """``ready_at``: ``time.perf_counter()`` when the engine returned the chunk."""
    def on_done(self, job: Job) -> None: ...
    def on_failed(self, job: Job, code: str, message: str) -> None: ...


class LaneObserver(Protocol):
    """Watches a lane's compute for metrics (``gateway.io.telemetry``). Called on the loop."""

    def job_queued(self, lane: str, job: Job) -> None: ...
    def job_step(self, lane: str, job: Job, started: float, seconds: float,
                 audio_bytes: int) -> None:
        """One step ran from ``started`` (perf_counter) for ``seconds`` of lane time."""
    def job_ended(self, lane: str, job: Job, outcome: str) -> None:
        """``outcome``: ``done``, ``failed`` or ``cancelled``."""


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


class Lane:
    def __init__(self, name: str, engine: TtsEngine, deadline_of: DeadlineOf | None = None,
                 max_lead: float | None = None):
        self.name = name
        self.engine = engine
        self.inline = getattr(engine, "blocks", True) is False
        self.scheduler = LaneScheduler(deadline_of=deadline_of, max_lead=max_lead)
        self.stats = LaneStats()
        self.loaded = False
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"lane-{name}")
        self._wake = asyncio.Event()
        self._busy_since: float | None = None
        self.observer: LaneObserver | None = None

    # ---- thread helpers ----------------------------------------------------------------

    async def call(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(*args)`` on the lane thread. Cancelling the await does not stop the
        call already running there; its result is discarded."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def _call_step(self, fn: Any, *args: Any) -> Any:
        """A step or an ``open``: on the lane thread, or inline on the event loop for an
        engine whose steps cost (next to) nothing (``blocks = False``), where the thread
        hop and the GIL hand-over would cost more than the step itself."""
        if self.inline:
            result = fn(*args)
            await asyncio.sleep(0)  # let the loop breathe between inline steps
            return result
        return await self.call(fn, *args)

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
        await self.call(self.engine.load)
        self.loaded = True
        return time.perf_counter() - started

    def submit(self, owner: Hashable, payload: SynthesisJob, *, deadline: float,
               priority: Priority = Priority.INTERACTIVE) -> Job:
        job = Job(owner=owner, priority=priority, deadline=deadline, payload=payload)
        self.scheduler.submit(job)
        if self.observer is not None:
            self.observer.job_queued(self.name, job)
        self._wake.set()
        return job

    def touch(self, owner: Hashable) -> None:
        """``owner``'s deadline may have moved earlier (a playback mark): re-rank it and
        wake the lane if it was waiting for a just-in-time job."""
        self.scheduler.touch(owner)
        self._wake.set()

    def cancel(self, owner: Hashable) -> int:
        """Drop ``owner``'s jobs. Queued ones go now; a running step finishes, then stops."""
        jobs = self.scheduler.cancel(owner)
        for job in jobs:
            self.stats.jobs_cancelled += 1
            if self.observer is not None:
                self.observer.job_ended(self.name, job, "cancelled")
            if not job.running:
                self._close_later(job.state)
                job.state = None
        return len(jobs)

    @property
    def queue_depth(self) -> int:
        return len(self.scheduler)

    @property
    def busy(self) -> bool:
        return self._busy_since is not None

    async def run(self) -> None:
        """Drive the lane until cancelled. Safe to cancel: the step in flight completes on
        its thread and is discarded."""
        loop = asyncio.get_running_loop()
        while True:
            job = self.scheduler.next_job(loop.time())
            if job is None:
                # Nothing eligible: sleep until a submission, or until a job that is too far
                # ahead of its listener (just in time) becomes eligible.
                self._wake.clear()
                wake_at = self.scheduler.next_eligible_at
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(wake_at):
                        await self._wake.wait()
                continue
            await self._step(job)

    async def _step(self, job: Job) -> None:
        payload: SynthesisJob = job.payload
        job.running = True
        self._busy_since = started = time.perf_counter()
        chunk: bytes | None = None
        try:
            if job.state is None:
                job.state = await self._call_step(self.engine.open, payload.request)
            chunk, ready_at = await self._call_step(_timed_step, job.state)
        except EngineError as exc:
            self._drop(job)
            self.stats.jobs_failed += 1
            self._ended(job, "failed")
            if not job.cancelled:
                payload.sink.on_failed(job, exc.code, exc.message)
            return
        except Exception as exc:  # an engine bug must not take the lane down
            log.exception("engine %s failed", self.engine.name)
            self._drop(job)
            self.stats.jobs_failed += 1
            self._ended(job, "failed")
            if not job.cancelled:
                payload.sink.on_failed(job, "engine_failed", f"{type(exc).__name__}: {exc}")
            return
        finally:
            job.running = False
            seconds = time.perf_counter() - started
            self.stats.busy_s += seconds
            self._busy_since = None
            self.stats.steps += 1
            if self.observer is not None:
                self.observer.job_step(self.name, job, started, seconds,
                                       0 if chunk is None else len(chunk))
        if job.cancelled:
            self._close_later(job.state)
            job.state = None
            return
        if chunk is None:
            self._drop(job)
            self.stats.jobs_done += 1
            self._ended(job, "done")
            payload.sink.on_done(job)
            return
        job.steps += 1
        engine_name = getattr(job.state, "engine_name", None) or self.engine.name
        payload.sink.on_audio(job, chunk, engine_name, ready_at)

    def _ended(self, job: Job, outcome: str) -> None:
        if self.observer is not None:
            self.observer.job_ended(self.name, job, outcome)

    def _drop(self, job: Job) -> None:
        self.scheduler.finish(job)
        self._close_later(job.state)
        job.state = None

    async def aclose(self) -> None:
        """Cancel every job and release the engine on its thread."""
        for owner in self.scheduler.owners():
            self.cancel(owner)
        try:
            await self.call(self.engine.close)
        finally:
            self._executor.shutdown(wait=False)


def _timed_step(stream: SynthesisStream) -> tuple[bytes | None, float]:
    chunk = stream.step()
    return chunk, time.perf_counter()


def _close_quietly(stream: SynthesisStream) -> None:
    try:
        stream.close()
    except Exception:
        log.exception("closing a synthesis stream failed")
