"""What the gateway reports about itself: Prometheus metrics and the richer ``/health``.

One ``Telemetry`` per ``Gateway``, with its own ``CollectorRegistry`` (never the global one,
so tests that run several gateways in one process do not clash).

Where the figures come from, each observed once, where the data already exists:

* ``turn.done`` events (``Metrics.turn_done``): TTFT, first segment, TTFA, underruns,
  fallbacks (a turn spoken by more than one engine);
* the lane (``Lane.observer``): step time, queue wait (submit → first step), real-time
  factor per job (compute seconds / audio seconds) and the busy share of the last minute.
  All of these count **compute only** (time inside ``engine.open``/``step`` on the lane
  thread), never the time a client kept a stream open. They are booked at every engine
  step, so they go into ``LaneHistogram``s (a bisect and an add) and reach Prometheus at
  scrape time, not through ``prometheus_client.Histogram`` (a lock per value and a walk
  over the bounds per observation: a tenth of the gateway's CPU per audio frame at 400
  streaming sessions, bench/CAPACITY.md);
* counters the gateway already keeps (turns by status, frames, errors by code, sessions,
  lane cancels) are read at scrape time by a custom collector, so nothing is counted twice.

The LLM probe asks ``GET {llm.url}/models`` at most every ``LLM_PROBE_INTERVAL_S`` seconds,
in a background task started by ``health()``; ``health()`` itself never waits on it. A lane
whose engine speaks through a TTS server (``http``, behind a fallback too) has a probe of
its own, the same way (``ServerProbe``).
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import gc
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
import orjson
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    StateSetMetricFamily,
)
from prometheus_client.registry import Collector

from engines.base import LOST_AS_MADE, OUTPUT_RATE, NewConnectionWatch, shown_url
from engines.llm_openai import OpenAiLlm
from engines.sse_bound import UNCOMPRESSED
from gateway.core.scheduler import Job
from gateway.io.aio import cancel_and_wait

if TYPE_CHECKING:
    from gateway.io.server import Gateway

log = logging.getLogger(__name__)

# A ``_created`` timestamp beside every counter and histogram (prometheus_client's default)
# doubled the series of a scrape and told the operator nothing: the process start is in
# process_start_time_seconds.
disable_created_metrics()

STATUSES = ("starting", "ok", "degraded", "unhealthy", "stopping")
"""What ``/health`` may say (``Gateway.status``)."""
BUSY_WINDOW_S = 60
LLM_PROBE_INTERVAL_S = 5.0
LLM_PROBE_TIMEOUT_S = 2.0
LLM_PROBE_BODY_BYTES = 64 << 10
"""The most of its ``/models`` answer the probe reads, undecoded, to reuse the connection
(a model list is a few KB); the answer's status is all it uses."""
KEY_REFUSED = (401, 403)
"""A probe's answers that say the server refuses the gateway's key (or asks for one): not
reachable, for the gateway, as every request it sends gets the same."""
_BYTES_PER_S = OUTPUT_RATE * 2

_LATENCY_BUCKETS = (0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
_STEP_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 1.0, 2.0, 5.0)
_RTF_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.44, 0.6, 0.8, 1.0, 1.5, 2.0, 4.0)
_LAG_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)
LOOP_LAG_INTERVAL_S = 0.1


class BusyWindow:
    """Seconds booked per wall-clock second over the last ``window_s`` seconds: a lane's
    step seconds (``Telemetry.compute``) or the wall time it had a step in flight
    (``Telemetry.busy``).

    Pure: ``now`` is passed in. One bucket per second; a step is booked in the second it
    ended (a step longer than a second is booked whole there; shares are capped at 1).
    """

    def __init__(self, window_s: int = BUSY_WINDOW_S, started: float = 0.0) -> None:
        self.window_s = window_s
        self.started = started
        self._buckets: collections.deque[tuple[int, float]] = collections.deque()

    def add(self, now: float, seconds: float) -> None:
        second = math.floor(now)
        if self._buckets and self._buckets[-1][0] == second:
            self._buckets[-1] = (second, self._buckets[-1][1] + seconds)
        else:
            self._buckets.append((second, seconds))
        self._trim(now)

    def _trim(self, now: float) -> None:
        horizon = math.floor(now) - self.window_s
        while self._buckets and self._buckets[0][0] <= horizon:
            self._buckets.popleft()

    def busy_s(self, now: float) -> float:
        self._trim(now)
        return sum(s for _, s in self._buckets)

    def share(self, now: float) -> float:
        """Busy fraction of the window (of the time since ``started`` while shorter)."""
        span = min(float(self.window_s), max(now - self.started, 1e-9))
        return min(1.0, self.busy_s(now) / span)


class LaneHistogram:
    """Observations of one lane's figure in fixed buckets (Prometheus ``le`` semantics: a
    value counts in the first bucket whose bound is at least the value). Filled on the
    event loop only, so it needs no lock; read by ``_StateCollector`` at scrape time."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, count of values <= le)`` per bound, then ``+Inf``."""
        out, total = [], 0
        for bound, n in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out


@dataclass(slots=True)
class _JobTally:
    queued_at: float | None
    add_compute: Any = None
    """The sink's ``add_compute(seconds)`` (an HTTP speech request), looked up once."""
    compute_s: float = 0.0
    audio_bytes: int = 0


class ServerProbe:
    """Does a server answer? ``GET target()``: any HTTP answer below 500 but a 401 or 403
    (the key refused: ``KEY_REFUSED``) counts as reachable. Cached; refreshed in a
    background task at most every ``interval_s``, when the gateway starts and while
    ``/health`` or ``/metrics`` is asked (``refresh_if_stale``).
    The log says when the server stops answering (a WARNING, the probe at start included:
    a gateway started before its server said nothing until a turn failed) and when it
    answers again (an INFO), not at every probe. ``LlmProbe`` asks the LLM server,
    ``TtsProbe`` an ``http`` TTS engine's."""

    def __init__(self, url: str | None, headers: dict[str, str], what: str, failing: str,
                 interval_s: float = LLM_PROBE_INTERVAL_S) -> None:
        """``what``: the server, for the log ("the LLM server"); ``failing``: what fails
        while it does not answer ("turns fail with llm_unavailable")."""
        self.url = url
        self.headers = headers
        self.what = what
        self.failing = failing
        self.interval_s = interval_s
        self.reachable: bool | None = None
        self.detail: str | None = None
        self.checked_at: float | None = None
        self._task: asyncio.Task[None] | None = None
        self._client: httpx.AsyncClient | None = None
        """One for every probe: building one loads the CA bundle on the loop (~18 ms)."""
        self._said_down = False
        """The log says the server does not answer, and not yet that it answers again."""
        self.on_answer: Callable[[float], None] | None = None
        """Called when a probe finds the server answering, with the ``time.monotonic()``
        the probe started at (``Gateway.llm_probed``; ``Lane.server_answers``, for a lane
        without a fallback)."""

    @property
    def shown_url(self) -> str | None:
        """``url`` for the log and /health (no password)."""
        return self.url and shown_url(self.url)

    def target(self) -> str:
        """The URL a probe asks (GET)."""
        raise NotImplementedError

    def refresh_if_stale(self) -> None:
        """Start a probe in the background when the cached answer is too old."""
        if self.url is None or (self._task is not None and not self._task.done()):
            return
        if self.checked_at is not None and time.monotonic() - self.checked_at < self.interval_s:
            return
        self._task = asyncio.get_running_loop().create_task(self.probe())

    async def probe(self) -> None:
        """GET ``target()``; any HTTP answer below 500 but a 401 or 403 counts as reachable.

        Its body is read raw, and at most ``LLM_PROBE_BODY_BYTES`` of it: ``client.get``
        read it whole and decoded it whole, so a long (or endless) body, or a few hundred
        bytes of ``Content-Encoding: gzip, gzip`` that decode to 64 MiB, grew the gateway
        at every probe (traced: +134 MB, +149 MB)."""
        assert self.url is not None
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=LLM_PROBE_TIMEOUT_S,
                                             headers={**UNCOMPRESSED, **self.headers})
        was = self.reachable
        started = time.monotonic()
        error: httpx.HTTPError | None = None
        refused = False
        watch = NewConnectionWatch()
        try:
            async with self._client.stream("GET", self.target(),
                                           extensions={"trace": watch}) as response:
                body = bytearray()
                async for data in response.aiter_raw():  # (a whole one frees the connection)
                    body += data
                    if len(body) >= LLM_PROBE_BODY_BYTES:
                        break  # (and the connection is closed, not reused)
            status = response.status_code
            # a 401 or 403 is no answer either: every request would get the same (a wrong
            # api_key read "reachable", /health ok, and nothing was logged until turns failed)
            refused = status in KEY_REFUSED
            self.reachable = status < 500 and not refused
            if status == 200 and len(body) < LLM_PROBE_BODY_BYTES:
                self._read_answer(bytes(body))
            self.detail = f"HTTP {status}"
            if refused:
                self.detail += (": it refuses the api_key sent" if "Authorization" in
                                self.headers else ": it asks for an api_key, and none is set")
        except (httpx.HTTPError, AttributeError) as exc:
            if isinstance(exc, AttributeError):
                if not watch.lost_as_made(exc):
                    raise
                exc = httpx.ConnectError(LOST_AS_MADE)  # (as a refused connection is told)
            error = exc
            self.reachable = False
            self.detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        finally:
            self.checked_at = time.monotonic()
        # said when it changes, not at every probe
        if not self.reachable and was is not False:
            log.warning("%s at %s %s (%s): %s until it %s", self.what, self.shown_url,
                        "refuses the gateway's requests" if refused else "does not answer",
                        self.detail, self.meanwhile(error), "takes them" if refused else "does")
            self._said_down = True
        elif self.reachable:
            self._said_back()
            if self.on_answer is not None:
                self.on_answer(started)

    def meanwhile(self, error: httpx.HTTPError | None) -> str:
        """What fails while the probe meets ``error`` (None: a 5xx answer)."""
        return self.failing

    def _read_answer(self, body: bytes) -> None:
        """A whole 200 answer's body (at most ``LLM_PROBE_BODY_BYTES``): nothing to do."""

    def _said_back(self) -> None:
        if self._said_down:
            self._said_down = False
            log.info("%s at %s answers again (%s)", self.what, self.shown_url, self.detail)

    def observed(self, reachable: bool, detail: str) -> None:
        """What a job for the server showed: it answered, or could not reach the server. As
        good as a probe, and newer: a probe only runs when /health is asked, and answers
        with the previous one's result (a restarted server read unreachable for turns
        after)."""
        if self.url is None:
            return
        self.reachable, self.detail = reachable, detail
        self.checked_at = time.monotonic()
        if reachable:  # back: said here when a turn finds it first, or never
            self._said_back()

    async def aclose(self) -> None:
        await cancel_and_wait(self._task)
        if self._client is not None:
            await self._client.aclose()

    def status(self) -> dict[str, Any]:
        age = None if self.checked_at is None else round(time.monotonic() - self.checked_at, 1)
        return {"reachable": self.reachable, "detail": self.detail, "checked_s_ago": age}


class LlmProbe(ServerProbe):
    """Is the LLM server answering? ``GET {url}/models``."""

    def __init__(self, url: str | None, api_key: str | None = None,
                 interval_s: float = LLM_PROBE_INTERVAL_S, model: str | None = None) -> None:
        super().__init__(url, {"Authorization": f"Bearer {api_key}"} if api_key else {},
                         "the LLM server", "turns fail with llm_unavailable", interval_s)
        self.model = model
        """``[llm] model``: the probe's answer says whether the server lists it."""
        self._said_unlisted = False
        if not url:
            self.reachable, self.detail = True, "in-process replay backend"

    def target(self) -> str:
        assert self.url is not None
        return self.url.rstrip("/") + "/models"

    def _read_answer(self, body: bytes) -> None:
        """Warn, once, when the server's model list (OpenAI's ``{"data": [{"id"}]}``)
        lacks ``[llm] model``: a misspelt name (``gemma`` for ``gemma-4-26b-a4b``) started
        a gateway whose every turn then failed, mlx_lm.server's with a 404 about the
        model hub. A body of another shape, or an empty list, says nothing (servers that
        take any name: proxies, aliases)."""
        if self.model is None or self._said_unlisted:
            return
        try:
            listed = [m["id"] for m in orjson.loads(body)["data"]
                      if isinstance(m, dict) and isinstance(m.get("id"), str)]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return
        if listed and self.model not in listed:
            self._said_unlisted = True
            shown = ", ".join(listed[:10]) + (f" and {len(listed) - 10} more"
                                              if len(listed) > 10 else "")
            log.warning("the LLM server at %s lists no model %r (it lists %s): turns that "
                        "ask for it may fail; set [llm] model (--llm-model) to one it lists",
                        self.shown_url, self.model, shown)


class TtsProbe(ServerProbe):
    """Is an ``http`` TTS engine's server answering? ``GET`` its ``probe_url``
    (``engines.http_tts.HttpTtsEngine.probe_url``: never a synthesis)."""

    def __init__(self, lane: str, engine: Any, fallback: str | None) -> None:
        """``fallback``: the name of the engine that speaks the lane's sentences while the
        server does not answer, if any."""
        super().__init__(engine.url, engine.probe_headers, f"the TTS server of lane {lane}",
                         f"the fallback {fallback} speaks its sentences" if fallback
                         else "its sentences fail with engine_failed")
        self.fallback = fallback
        self.probe_url: str = engine.probe_url

    def meanwhile(self, error: httpx.HTTPError | None) -> str:
        """A sentence that meets a timeout fails with engine_timeout
        (``engines.http_tts.HttpTtsStream.step``): the WARNING said engine_failed after
        a probe that had timed out."""
        if self.fallback is None and isinstance(error, httpx.TimeoutException):
            return "its sentences fail with engine_timeout"
        return self.failing

    def target(self) -> str:
        return self.probe_url


class WindowMax:
    """Largest value seen over the last ``window_s`` seconds. Pure: ``now`` is passed in.

    A monotonic deque: each new value drops the older, smaller ones, so the head is always
    the window's maximum and ``add`` is amortised O(1)."""

    def __init__(self, window_s: float = BUSY_WINDOW_S) -> None:
        self.window_s = window_s
        self._values: collections.deque[tuple[float, float]] = collections.deque()

    def add(self, now: float, value: float) -> None:
        while self._values and self._values[-1][1] <= value:
            self._values.pop()
        self._values.append((now, value))
        self._trim(now)

    def _trim(self, now: float) -> None:
        while self._values and self._values[0][0] <= now - self.window_s:
            self._values.popleft()

    def max(self, now: float) -> float:
        self._trim(now)
        return self._values[0][1] if self._values else 0.0


class LoopLagMonitor:
    """How late the event loop runs callbacks: a timer asks to wake every ``interval_s``
    and books how much later it woke. A session's frames wait behind whatever callback
    holds the loop, so this is the first figure to read when frames arrive late."""

    def __init__(self, histogram: Any, interval_s: float = LOOP_LAG_INTERVAL_S) -> None:
        """``histogram``: anything with ``observe(seconds)`` (a prometheus Histogram)."""
        self.histogram = histogram
        self.interval_s = interval_s
        self.recent = WindowMax()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="loop-lag")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.interval_s
            await asyncio.sleep(self.interval_s)
            now = loop.time()
            lag = max(0.0, now - due)
            self.histogram.observe(lag)
            self.recent.add(now, lag)

    def health(self) -> dict[str, float]:
        loop = asyncio.get_running_loop()
        return {"lag_max_ms_1m": round(self.recent.max(loop.time()) * 1000.0, 1),
                "tasks": len(asyncio.all_tasks(loop))}

    async def aclose(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None


class GcPauses:
    """How long each garbage collection stopped the process, by generation, through
    ``gc.callbacks``. A collection of the oldest generation walks every tracked object
    while no thread runs Python: with 2,000 streaming sessions one took 0.27 s, and every
    listener's frames waited behind it. This is the figure that explains a loop lag no
    callback accounts for.

    A collection can start in any thread that allocates (the lane workers too), but two
    never overlap, so the histograms have one writer at a time; readers only read."""

    def __init__(self) -> None:
        self.histograms = {generation: LaneHistogram(_LAG_BUCKETS) for generation in (0, 1, 2)}
        self.recent = WindowMax()
        self._started = 0.0

    def start(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def stop(self) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        seconds = time.perf_counter() - self._started
        self.histograms[info["generation"]].observe(seconds)
        self.recent.add(time.monotonic(), seconds)

    def health(self) -> dict[str, float | int]:
        return {"gc_pause_max_ms_1m": round(self.recent.max(time.monotonic()) * 1000.0, 1),
                "gc_frozen_objects": gc.get_freeze_count()}


class Telemetry:
    """Metrics of one gateway. Attach with ``Telemetry(gateway)``; see the module docstring."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.registry = CollectorRegistry()
        r = self.registry
        # the process's own figures (RSS, open fds, CPU seconds, start time): what a soak
        # watches for leaks (Linux; the collector reports nothing where /proc is missing)
        ProcessCollector(registry=r)
        # by the turn's status: a failed or cut turn's first audio says something else
        # than a completed one's
        self.ttft = Histogram("gateway_turn_ttft_seconds", "Transcript to first LLM token",
                              ["status"], buckets=_LATENCY_BUCKETS, registry=r)
        self.first_segment = Histogram("gateway_turn_first_segment_seconds",
                                       "Transcript to first speakable segment", ["status"],
                                       buckets=_LATENCY_BUCKETS, registry=r)
        self.ttfa = Histogram("gateway_turn_ttfa_seconds", "Transcript to first audio frame sent",
                              ["status"], buckets=_LATENCY_BUCKETS, registry=r)
        lanes = list(gateway.lanes)
        self.step = {lane: LaneHistogram(_STEP_BUCKETS) for lane in lanes}
        self.queue_wait = {lane: LaneHistogram(_LATENCY_BUCKETS) for lane in lanes}
        self.rtf = {lane: LaneHistogram(_RTF_BUCKETS) for lane in lanes}
        self.underruns = Counter("gateway_underruns", "Playback underruns reported in turn.done",
                                 registry=r)
        self.fallbacks = Counter("gateway_fallbacks", "Turns spoken by more than one engine",
                                 registry=r)
        self.http_speech = Counter("gateway_http_speech_requests",
                                   "POST /v1/audio/speech requests by outcome",
                                   ["format", "stream", "status"], registry=r)
        self.loop_lag = LoopLagMonitor(Histogram(
            "gateway_loop_lag_seconds", "How late the event loop woke a timer due every "
            f"{LOOP_LAG_INTERVAL_S:g} s", buckets=_LAG_BUCKETS, registry=r))
        self.gc_pauses = GcPauses()
        r.register(_StateCollector(self))
        self.llm_tokens_per_s: float | None = None
        self.busy = {name: BusyWindow(started=time.perf_counter()) for name in gateway.lanes}
        """Wall time each lane had a step in flight (its busy share)."""
        self.compute = {name: BusyWindow(started=time.perf_counter())
                        for name in gateway.lanes}
        """Each lane's step seconds, added up (steps at once each count)."""
        self.llm_probe = LlmProbe(gateway.config.llm.url, gateway.config.llm.api_key,
                                  model=gateway.config.llm.model)
        self.tts_probes: dict[str, TtsProbe] = {}
        """By lane: the probe of its engine's TTS server (an ``http`` engine; a fallback's
        primary too), for lanes that have one."""
        for lane in gateway.lanes.values():
            server = getattr(lane.engine, "primary", lane.engine)
            if getattr(server, "probe_url", None) is None:
                continue
            fallback = getattr(lane.engine, "fallback", None)
            probe = self.tts_probes[lane.name] = TtsProbe(
                lane.name, server, fallback and fallback.name)
            if fallback is None:  # (behind one, the lane's failures are the fallback's)
                probe.on_answer = lane.server_answers
        self._jobs: dict[Job, _JobTally] = {}
        for lane in gateway.lanes.values():
            lane.observer = self
        gateway.metrics.listeners.append(self.turn_done)

    # ---- hooks -----------------------------------------------------------------------

    def turn_done(self, event: dict[str, Any]) -> None:
        m = event.get("metrics") or {}
        for histogram, key in ((self.ttft, "ttft_ms"), (self.first_segment, "first_sentence_ms"),
                               (self.ttfa, "ttfa_ms")):
            value = m.get(key)
            if value is not None:
                histogram.labels(event["status"]).observe(value / 1000.0)
        if m.get("underruns"):
            self.underruns.inc(m["underruns"])
        if len(set(m.get("engines") or ())) > 1:
            self.fallbacks.inc()
        if m.get("llm_tokens_per_s") is not None:
            self.llm_tokens_per_s = m["llm_tokens_per_s"]

    def job_queued(self, lane: str, job: Job) -> None:
        self._jobs[job] = _JobTally(queued_at=time.perf_counter(),
                                    add_compute=getattr(job.payload.sink, "add_compute", None))

    def job_step(self, lane: str, job: Job, started: float, seconds: float,
                 audio_bytes: int, occupied: float) -> None:
        self.step[lane].observe(seconds)
        self.busy[lane].add(started + seconds, occupied)
        self.compute[lane].add(started + seconds, seconds)
        tally = self._jobs.get(job)
        if tally is None:
            return
        if tally.queued_at is not None:
            self.queue_wait[lane].observe(max(0.0, started - tally.queued_at))
            tally.queued_at = None
        tally.compute_s += seconds
        tally.audio_bytes += audio_bytes
        if tally.add_compute is not None:
            tally.add_compute(seconds)

    def job_ended(self, lane: str, job: Job, outcome: str) -> None:
        probe = self.tts_probes.get(lane)
        if outcome == "done" and probe is not None and probe.fallback is None:
            # its server spoke a job: as good as a probe (behind a fallback, the fallback
            # may have spoken it)
            probe.observed(True, "spoke a job")
        tally = self._jobs.pop(job, None)
        if tally is not None and outcome == "done" and tally.audio_bytes:
            self.rtf[lane].observe(tally.compute_s / (tally.audio_bytes / _BYTES_PER_S))

    def server_unreachable(self, lane: str, message: str) -> None:
        # as good as a probe, as a turn that could not reach the LLM is: /health said the
        # server reachable beside engine.failing until the next probe (behind a fallback,
        # the server that failed may be the fallback's)
        probe = self.tts_probes.get(lane)
        if probe is not None and probe.fallback is None:
            probe.observed(False, message)

    # ---- reading -----------------------------------------------------------------------

    def lane_health(self) -> dict[str, Any]:
        """Per lane (primary first): its engine, load and compute. With two lanes (see
        ``TurnPlacer``): ``turns``, the voice turns placed on it and not yet ended, and
        ``timing``, the figures placement uses now (``measured``: those its own steps gave,
        from ``samples`` steps each; the others are configured); ``rerouted``, turns that
        moved to the primary after their job failed here; ``tripped``, whether its breaker
        keeps new turns away; ``trips``, how often it opened; ``placed``, the voice turns
        placed on it since the start (read together: no turn is placed on a lane while its
        breaker is open, unless no other lane has the turn's voice)."""
        gw = self.gateway
        now = time.perf_counter()
        out = {}
        for lane in gw.lanes.values():
            window = self.busy[lane.name]
            out[lane.name] = {
                "engine": lane.engine.name,
                "queue_depth": lane.queue_depth,
                # scheduler rule 6: streams open, the bound (null: none), owners waiting
                "open_streams": lane.scheduler.open_streams,
                "max_open_streams": lane.scheduler.max_open,
                "interactive_reserved_streams": lane.scheduler.reserved,  # (rule 6b)
                "streams_waiting": lane.scheduler.streams_waiting,
                "busy": lane.busy,
                "busy_share_1m": round(window.share(now), 4),
                "compute_s_1m": round(self.compute[lane.name].busy_s(now), 3),
                "compute_s": round(lane.stats.busy_s, 3),
                "steps": lane.stats.steps,
                "jobs": {"done": lane.stats.jobs_done, "failed": lane.stats.jobs_failed,
                         "cancelled": lane.stats.jobs_cancelled},
                "unhealthy": lane.unhealthy,
                # an engine call past the step deadline holds the lane's thread: its step
                # ended (engine_timeout), so ``busy`` alone said false the whole time
                "stuck_calls": lane.stuck_calls,
                "stuck_s": None if (stuck := lane.stuck_s(time.monotonic())) is None
                else round(stuck, 3),
            }
            if (probe := self.tts_probes.get(lane.name)) is not None:
                probe.refresh_if_stale()
                out[lane.name]["server"] = {"url": probe.shown_url, **probe.status()}
            if gw.placer is not None:
                out[lane.name]["turns"] = gw.placer.active(lane.name)
                out[lane.name]["rerouted"] = gw.placer.rerouted[lane.name]
                out[lane.name]["tripped"] = gw.placer.tripped(lane.name, time.monotonic())
                out[lane.name]["trips"] = gw.placer.trips[lane.name]
                out[lane.name]["placed"] = gw.placer.placed[lane.name]
                profile = gw.placer.profile(lane.name)
                figures = {key: getattr(profile, key)
                           for key in ("first_s", "rtf", "first_s_llm", "rtf_llm")}
                out[lane.name]["timing"] = {
                    **{k: None if v is None else round(v, 4) for k, v in figures.items()},
                    "measured": sorted(lane.timing.measured()),
                    "samples": lane.timing.samples()}
        return out

    def llm_health(self) -> dict[str, Any]:
        self.llm_probe.refresh_if_stale()
        llm = self.gateway.llm
        # a reasoning model's thoughts the filter met out of place (engines.llm_openai)
        thoughts = {"thinking": {"mode": llm.thinking, "unopened": llm.thoughts_unopened,
                                 "unclosed": llm.thoughts_unclosed}} \
            if isinstance(llm, OpenAiLlm) else {}
        return {"backend": llm.name, "url": self.llm_probe.shown_url,
                **self.llm_probe.status(), "tokens_per_s": self.llm_tokens_per_s, **thoughts}

    def exposition(self) -> bytes:
        """The scrape's text. It probes the LLM server (and the TTS servers) as ``/health``
        does (when the last check is stale): a hub watched by its scrapes alone showed the
        LLM server's state as of the last ``/health`` asked, or of the last turn."""
        self.refresh_probes()
        return generate_latest(self.registry)

    def refresh_probes(self) -> None:
        for probe in self.probes():
            probe.refresh_if_stale()

    def probes(self) -> list[ServerProbe]:
        return [self.llm_probe, *self.tts_probes.values()]

    def start(self) -> None:
        self.loop_lag.start()
        self.gc_pauses.start()
        self.refresh_probes()  # so the first /health knows (it said null, ok)

    async def aclose(self) -> None:
        self.gc_pauses.stop()
        await self.loop_lag.aclose()
        for probe in self.probes():
            await probe.aclose()


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _StateCollector(Collector):
    """Counters and gauges the gateway already keeps, read at scrape time."""

    def __init__(self, telemetry: Telemetry) -> None:
        self.t = telemetry

    def collect(self) -> Iterator[Metric]:
        gw = self.t.gateway
        m = gw.metrics
        turns = CounterMetricFamily("gateway_turns", "Turns ended, by status", labels=["status"])
        for status, n in sorted(m.turns.items()):
            turns.add_metric([status], n)
        yield turns
        errors = CounterMetricFamily("gateway_errors", "Errors by code", labels=["code"])
        for code, n in sorted(m.errors.items()):
            errors.add_metric([code], n)
        yield errors
        yield CounterMetricFamily("gateway_frames", "Audio frames sent to voice clients",
                                  value=m.frames)
        yield CounterMetricFamily("gateway_connections_opened", "Voice sockets accepted",
                                  value=m.connections_opened)
        yield CounterMetricFamily("gateway_sessions_opened", "Voice sessions started: sockets "
                                  "that did not resume one", value=m.connections_opened
                                  - m.sessions_resumed)
        yield CounterMetricFamily("gateway_sessions_resumed", "Sockets that resumed a session "
                                  "waiting for them", value=m.sessions_resumed)
        yield CounterMetricFamily(
            "gateway_listeners_lost", "Sockets dropped because a client went quiet while it "
            "should have been playing and answered no ping (the session waits for a resume)",
            value=m.listeners_lost)
        counters = getattr(gw.engine, "counters", None)  # (a voice behind a fallback)
        if counters is not None:
            yield CounterMetricFamily(
                "gateway_fallback_segments", "Sentences the fallback engine spoke (all of "
                "them while its breaker is open)", value=counters()["fallback_segments"])
        cancels = CounterMetricFamily("gateway_lane_cancels", "Synthesis jobs cancelled",
                                      labels=["lane"])
        compute = CounterMetricFamily("gateway_lane_compute_seconds",
                                      "Compute time spent in engine steps", labels=["lane"])
        for lane in gw.lanes.values():
            cancels.add_metric([lane.name], lane.stats.jobs_cancelled)
            compute.add_metric([lane.name], lane.stats.busy_s)
        yield cancels
        if gw.placer is not None:
            turns = CounterMetricFamily("gateway_lane_turns_placed", "Voice turns placed on "
                                        "the lane (none while its breaker is open, unless "
                                        "no other lane has the voice)", labels=["lane"])
            trips = CounterMetricFamily("gateway_lane_breaker_trips", "Times the lane's "
                                        "breaker opened", labels=["lane"])
            for name in gw.lanes:
                turns.add_metric([name], gw.placer.placed[name])
                trips.add_metric([name], gw.placer.trips[name])
            yield turns
            yield trips
        yield compute
        for name, doc, figures in (
                ("gateway_lane_step_seconds", "Compute time of one engine step", self.t.step),
                ("gateway_lane_queue_wait_seconds",
                 "Synthesis job submitted to its first step starting", self.t.queue_wait),
                ("gateway_synthesis_rtf", "Compute seconds per second of audio, per finished "
                 "job", self.t.rtf)):
            family = HistogramMetricFamily(name, doc, labels=["lane"])
            for lane_name, histogram in figures.items():
                family.add_metric([lane_name], histogram.cumulative(), sum_value=histogram.sum)
            yield family
        pauses = HistogramMetricFamily("gateway_gc_pause_seconds", "How long each garbage "
                                       "collection stopped the process", labels=["generation"])
        for generation, histogram in self.t.gc_pauses.histograms.items():
            pauses.add_metric([str(generation)], histogram.cumulative(), sum_value=histogram.sum)
        yield pauses
        yield GaugeMetricFamily("gateway_sessions", "Live voice sessions, those waiting for "
                                "a resume included", value=len(gw.runners))
        yield GaugeMetricFamily("gateway_sessions_held", "Voice sessions waiting for a resume",
                                value=sum(r.connection is None for r in gw.runners.values()))
        yield GaugeMetricFamily("gateway_connections", "Open voice sockets",
                                value=len(gw.connections))
        yield GaugeMetricFamily("gateway_loop_tasks", "Tasks alive on the event loop: back "
                                "to its idle figure once sessions have ended (what a task "
                                "left behind by each would show)",
                                value=len(asyncio.all_tasks(asyncio.get_running_loop())))
        yield GaugeMetricFamily("gateway_llm_failing", "1 while the LLM fails turns (from a failed "
                                "turn until three replies in a row came whole, or, when the "
                                "server could not be reached, until its probe reaches it), "
                                "else 0",
                                value=float(gw.llm_failing is not None))
        reachable = self.t.llm_probe.reachable
        yield GaugeMetricFamily("gateway_llm_reachable", "1 while the LLM server answers (its "
                                "last probe or turn), 0 while it does not, NaN before the "
                                "first check (/health llm.reachable)",
                                value=math.nan if reachable is None else float(reachable))
        if self.t.tts_probes:
            tts = GaugeMetricFamily("gateway_tts_reachable", "1 while the lane's TTS server "
                                    "answers (its last probe, or a job it spoke), 0 while it "
                                    "does not, NaN before the first check (/health "
                                    "lanes.<lane>.server.reachable; only lanes with one)",
                                    labels=["lane"])
            for name, probe in self.t.tts_probes.items():
                tts.add_metric([name], math.nan if probe.reachable is None
                               else float(probe.reachable))
            yield tts
        status = gw.status()
        yield StateSetMetricFamily("gateway_status", "The /health status now",
                                   value={name: name == status for name in STATUSES})
        speech = getattr(gw, "http", None)
        yield GaugeMetricFamily("gateway_http_speech_streams", "Open HTTP speech responses",
                                value=len(speech.streams) if speech is not None else 0)
        depth = GaugeMetricFamily("gateway_lane_queue_depth", "Synthesis jobs queued or running",
                                  labels=["lane"])
        busy = GaugeMetricFamily("gateway_lane_busy_ratio", "Share of the last minute the "
                                 "lane had an engine step in flight (0-1)", labels=["lane"])
        placed = GaugeMetricFamily("gateway_lane_turns", "Voice turns placed on the lane and "
                                  "not yet ended", labels=["lane"])
        streams = GaugeMetricFamily("gateway_lane_open_streams", "Synthesis jobs whose engine "
                                    "stream is open (started, not ended)", labels=["lane"])
        bound = GaugeMetricFamily("gateway_lane_max_open_streams", "Engine streams the lane "
                                  "keeps open at once at most (only a lane with a bound)",
                                  labels=["lane"])
        reserved = GaugeMetricFamily("gateway_lane_interactive_reserved_streams", "Of the "
                                     "lane's open streams, those only voice sessions may "
                                     "open (only a lane with a bound)", labels=["lane"])
        waiting = GaugeMetricFamily("gateway_lane_streams_waiting", "Owners whose next "
                                    "sentence waits for an open stream to end", labels=["lane"])
        # (gateway_status follows the primary lane only: a stuck second lane, which just
        # loses its turns to the primary, showed nowhere in a scrape)
        unhealthy = GaugeMetricFamily("gateway_lane_unhealthy", "1 while the lane is stuck "
                                      "or broken (/health lanes.<lane>.unhealthy)",
                                      labels=["lane"])
        stuck = GaugeMetricFamily("gateway_lane_stuck_seconds", "Seconds since the oldest "
                                  "engine call still holding the lane past the step deadline "
                                  "began, 0 when none does (/health lanes.<lane>.stuck_s)",
                                  labels=["lane"])
        now, monotonic = time.perf_counter(), time.monotonic()
        for lane in gw.lanes.values():
            depth.add_metric([lane.name], lane.queue_depth)
            stuck.add_metric([lane.name], lane.stuck_s(monotonic) or 0.0)
            busy.add_metric([lane.name], self.t.busy[lane.name].share(now))
            scheduler = lane.scheduler
            streams.add_metric([lane.name], scheduler.open_streams)
            if scheduler.max_open is not None:
                bound.add_metric([lane.name], scheduler.max_open)
                reserved.add_metric([lane.name], scheduler.reserved)
            waiting.add_metric([lane.name], scheduler.streams_waiting)
            unhealthy.add_metric([lane.name], float(lane.unhealthy is not None))
            if gw.placer is not None:
                placed.add_metric([lane.name], gw.placer.active(lane.name))
        yield depth
        yield busy
        yield streams
        yield bound
        yield reserved
        yield waiting
        yield unhealthy
        yield stuck
        if gw.placer is not None:
            yield placed
        rate = self.t.llm_tokens_per_s
        yield GaugeMetricFamily("gateway_llm_tokens_per_second",
                                "LLM decode rate of the last finished turn that measured one",
                                value=float("nan") if rate is None else rate)
