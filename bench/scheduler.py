"""GPU turn-taking policies in virtual time, against a GPU model calibrated from the hub.

    python -m bench.scheduler [--json PATH] [--seed N] [--quick] [--baseline REV]

Model (calibration.json): the GPU time-slices whatever runs on it, work-conserving, by
weight. Alone, Gemma decodes 51.5 tok/s; beside one TTS generation 28 tok/s, so the LLM gets
28/51.5 = 0.544 of the GPU and TTS the other 0.456 (TTS weight 1, LLM weight 1.19). A
Qwen3-TTS step is GPU work: 0.445 s per second of audio (320 ms per step); the first step of
a job is 16 ms of host time then 91 ms of GPU work (solves 107 ms idle / 216 ms busy).
Jitter (seeded, lognormal) per job and per first step reproduces the measured p90s. The ANE
lane does not share the GPU: first audio 45 ms, then 80 ms chunks at rtf 0.705.

Policies: ``naive`` (every synthesis runs at once, time-sliced), ``fifo`` (the old sidecar:
one whole generation at a time, first come first served), ``scheduler`` (the real
``gateway.core.scheduler.LaneScheduler``: one step at a time, priority, deadline from
playback, just in time, background jobs in 80 ms steps: ``step_ms``), ``sched-320ms``
(the same with the engine's 320 ms steps for background jobs too: the step-size rule off),
``sched-bg-rt`` (background held to real time + ``max_lead`` even when alone on the lane,
``pace_background_always``), ``sched-edf`` (playing listeners by earliest deadline,
``Rank.DEADLINE``, instead of oldest stream first), ``sched+ane``
(``gateway.core.placement.place`` puts interactive jobs on an ANE lane), ``sched-open1``
(``scheduler`` at rule 6's bound: ``max_open`` 1, the lane's other streams taken, so the
background request and the hub's sentences take turns at the one left), and
``scheduler`` with ``max_open`` n and n background apps, without and with streams kept
for interactive jobs (rule 6b, ``default_reserve``).

Scenarios: 1 validation, 2 shared voice, 3 ramp, 4 ANE lane; plus the decision-time
micro-benchmark at 1,000 queued jobs against the old linear scan (same run), and at rule
6's bound (16 streams open, the other owners waiting for one); ``--baseline REV`` times
both with ``LaneScheduler`` as it was at git revision REV too.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import random
import statistics
import subprocess
import sys
import time
import types
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.core import scheduler as scheduler_module
from gateway.core.placement import LaneLoad, LaneProfile, TurnPlacer, place
from gateway.core.scheduler import (
    JIT_GRANULARITY_S,
    Job,
    LaneScheduler,
    Priority,
    Rank,
    default_reserve,
    step_ms,
)

CALIBRATION = Path(__file__).resolve().parent / "data" / "calibration.json"
"""The production hub's measured figures (a copy of the team's shared calibration.json, kept
in the repo so that the simulator and its tests run on any machine)."""


@dataclass(frozen=True)
class Model:
    tts_weight: float
    llm_weight: float
    first_host_s: float
    first_gpu_s: float
    gpu_s_per_audio_s: float
    step_audio_s: float
    llm_tok_s: float
    ane_first_s: float
    ane_rtf: float
    ane_chunk_s: float
    job_sigma: float = 0.08
    first_sigma: float = 0.11
    step_overhead_s: float = 0.005
    """Fixed GPU cost of one streaming step (a codec-decoder call, a host sync). Not in
    calibration.json (measured only at 320 ms steps, where it is inside the 0.44 rtf): an
    assumption, varied in scenario 2's sensitivity rows. A step of ``s`` audio seconds
    costs ``rtf * s + overhead * (1 - s / 0.32)`` (as ``SyntheticEngine`` models it)."""

    @classmethod
    def from_calibration(cls, cal: dict[str, Any], step_overhead_s: float = 0.005) -> Model:
        tts = cal["tts"]["qwen3_0.6b_bf16"]
        llm = cal["llm"]["gemma4_26b_a4b_4bit"]
        ane = cal["tts"]["qwen3_0.6b_ane_fp16"]
        llm_share = llm["decode_tok_s_with_tts_0.6b"] / llm["decode_tok_s_alone"]
        tts_share = 1.0 - llm_share
        idle, busy = tts["idle"]["ttfa_ms"] / 1e3, tts["llm_decoding"]["ttfa_ms"] / 1e3
        first_gpu = (busy - idle) / (1.0 / tts_share - 1.0)
        return cls(tts_weight=1.0, llm_weight=llm_share / tts_share,
                   first_host_s=idle - first_gpu, first_gpu_s=first_gpu,
                   gpu_s_per_audio_s=tts["idle"]["rtf"],
                   step_audio_s=cal["audio"]["qwen3_stream_step_audio_ms"] / 1e3,
                   llm_tok_s=llm["decode_tok_s_alone"],
                   ane_first_s=ane["first_pcm_ms_p50"] / 1e3, ane_rtf=ane["rtf"],
                   ane_chunk_s=ane["chunk_audio_ms"] / 1e3, step_overhead_s=step_overhead_s)


# ---- the virtual machine: a time-sliced GPU, timers ------------------------------------


class Sim:
    def __init__(self, model: Model, seed: int):
        self.m = model
        self.rng = random.Random(seed)
        self.now = 0.0
        self._timers: list[tuple[float, int, Callable[[], object]]] = []
        self._ids = itertools.count()
        self.gpu: dict[int, list] = {}  # id -> [work_left, weight, on_done]
        self.llm_streams: dict[int, list] = {}  # id -> [work_left, on_done]
        self.llm_busy_s = 0.0  # time with an LLM stream decoding
        self.llm_work_s = 0.0  # GPU-alone seconds of LLM progress
        self.tts_gpu_busy_s = 0.0
        self.probe: Callable[[float, float | None, int], None] | None = None
        """Told each slice of time: its seconds, the LLM's rate (None: no stream decoding),
        the GPU tasks running."""

    def at(self, t: float, fn: Callable[[], object]) -> None:
        heapq.heappush(self._timers, (t, next(self._ids), fn))

    def gpu_task(self, work: float, on_done: Callable[[], None]) -> None:
        self.gpu[next(self._ids)] = [work, self.m.tts_weight, on_done]

    def llm_stream(self, work: float, on_done: Callable[[], None]) -> None:
        self.llm_streams[next(self._ids)] = [work, on_done]

    def _rates(self) -> tuple[float, float]:
        total = sum(t[1] for t in self.gpu.values())
        llm_w = self.m.llm_weight if self.llm_streams else 0.0
        total += llm_w
        if total == 0:
            return 0.0, 0.0
        return self.m.tts_weight / total, llm_w / total

    def run(self, until: float) -> None:
        while True:
            tts_rate, llm_rate = self._rates()
            t_next = self._timers[0][0] if self._timers else math.inf
            for work, weight, _ in self.gpu.values():
                t_next = min(t_next, self.now + work / (tts_rate * weight / self.m.tts_weight))
            for work, _ in self.llm_streams.values():
                t_next = min(t_next, self.now + work / llm_rate)
            if t_next > until:
                t_next = until
            dt = t_next - self.now
            if dt > 0:
                for task in self.gpu.values():
                    task[0] -= dt * tts_rate
                for stream in self.llm_streams.values():
                    stream[0] -= dt * llm_rate
                if self.llm_streams:
                    self.llm_busy_s += dt
                    self.llm_work_s += dt * llm_rate
                if self.gpu:
                    self.tts_gpu_busy_s += dt
                if self.probe:
                    self.probe(dt, llm_rate if self.llm_streams else None, len(self.gpu))
            self.now = t_next
            if self.now >= until:
                return
            done = [k for k, t in self.gpu.items() if t[0] <= 1e-12]
            for k in done:
                self.gpu.pop(k)[2]()
            done = [k for k, s in self.llm_streams.items() if s[0] <= 1e-12]
            for k in done:
                self.llm_streams.pop(k)[1]()
            while self._timers and self._timers[0][0] <= self.now + 1e-12:
                heapq.heappop(self._timers)[2]()

    def lognormal(self, sigma: float) -> float:
        return math.exp(self.rng.gauss(0.0, sigma))


# ---- synthesis jobs and their listeners ------------------------------------------------


@dataclass(eq=False)
class Turn:
    """One listener: segments play in order; audio arrives chunk by chunk."""

    start: float
    interactive: bool = True
    segments: list[SimJob] = field(default_factory=list)
    chunks: list[tuple[int, float, float]] = field(default_factory=list)  # seg, t, dur
    play_end: float | None = None
    n_segments: int | None = None
    """How many segments the reply will have (None: not known)."""

    @property
    def synthesized(self) -> bool:
        """Every segment of the reply is submitted and made: no more work will come."""
        return (self.n_segments is not None and len(self.segments) == self.n_segments
                and all(j.done for j in self.segments))

    def deliver(self, seg: int, dur: float, now: float) -> None:
        self.chunks.append((seg, now, dur))
        self.play_end = (now if self.play_end is None else max(self.play_end, now)) + dur

    def metrics(self, client_buffer_s: float = 0.0
                ) -> tuple[float | None, int, float, int, float]:
        """(TTFA from the first segment's submission, underruns caused by synthesis, seconds
        the listener waited in them, sentence gaps, seconds waited in those). A wait counts
        only when the segment's text was there before the listener ran out (a slow LLM is not
        the lane's fault). An *underrun* is the issue's "a listener waiting for audio
        mid-sentence": the wait comes before a chunk that is not its sentence's first. A wait
        before a sentence's first chunk is a *gap* (a longer pause between sentences). The
        listener starts playing ``client_buffer_s`` after the first chunk arrives (the
        protocol asks clients for 100-200 ms; 0 is the strictest listener)."""
        if not self.chunks:
            return None, 0, 0.0, 0, 0.0
        first = self.segments[0]
        ttfa = min(t for s, t, _ in self.chunks if s == 0) - first.submitted
        play_end, underruns, stalled, gaps, gap_s = None, 0, 0.0, 0, 0.0
        previous = None
        for seg, t, dur in sorted(self.chunks, key=lambda c: (c[0], c[1])):
            seg_submitted = self.segments[seg].submitted
            if play_end is not None and t > play_end + 1e-9 and seg_submitted <= play_end:
                if seg == previous:
                    underruns += 1
                    stalled += t - play_end
                else:
                    gaps += 1
                    gap_s += t - play_end
            play_end = (t + client_buffer_s if play_end is None else max(play_end, t)) + dur
            previous = seg
        return ttfa, underruns, stalled, gaps, gap_s


@dataclass(eq=False)
class SimJob:
    turn: Turn
    index: int
    audio_s: float
    submitted: float
    priority: Priority
    step_audio_s: float
    factor: float = 1.0
    produced_s: float = 0.0
    steps: int = 0
    lane: str = "gpu"

    @property
    def done(self) -> bool:
        return self.produced_s >= self.audio_s - 1e-9


def run_step(sim: Sim, job: SimJob, lane: str, on_done: Callable[[], None]) -> None:
    """One engine step of ``job``; delivers its audio to the listener, then ``on_done``."""
    m = sim.m
    step_audio = m.ane_chunk_s if lane == "ane" else job.step_audio_s
    audio = min(step_audio, job.audio_s - job.produced_s)
    first = job.steps == 0

    def finished() -> None:
        job.steps += 1
        job.produced_s += audio
        job.turn.deliver(job.index, audio, sim.now)
        on_done()

    if lane == "ane":
        dur = m.ane_first_s if first else m.ane_rtf * audio
        sim.at(sim.now + dur * job.factor * (sim.lognormal(m.first_sigma) if first else 1.0),
               finished)
        return
    if first:
        work = m.first_gpu_s * job.factor * sim.lognormal(m.first_sigma)
        sim.at(sim.now + m.first_host_s, lambda: sim.gpu_task(work, finished))
    else:
        work = m.gpu_s_per_audio_s * audio
        if step_audio < m.step_audio_s:
            work += m.step_overhead_s * (1 - step_audio / m.step_audio_s)
        sim.gpu_task(work * job.factor, finished)


# ---- policies ------------------------------------------------------------------------


class Naive:
    """Every synthesis starts at once and runs all its steps back to back (time-sliced)."""

    name = "naive"

    def __init__(self, sim: Sim, **_: Any):
        self.sim = sim

    def submit(self, job: SimJob) -> None:
        def step() -> None:
            if not job.done:
                run_step(self.sim, job, "gpu", step)
        step()

    def lane_busy_s(self) -> float:
        return self.sim.tts_gpu_busy_s


class Fifo:
    """The old TTS sidecar: one whole generation at a time, first come first served."""

    name = "fifo"

    def __init__(self, sim: Sim, **_: Any):
        self.sim = sim
        self.queue: deque[SimJob] = deque()
        self.busy = False
        self.busy_s = 0.0

    def submit(self, job: SimJob) -> None:
        self.queue.append(job)
        self._kick()

    def _kick(self) -> None:
        if self.busy or not self.queue:
            return
        job = self.queue.popleft()
        self.busy = True
        started = self.sim.now

        def step() -> None:
            if job.done:
                self.busy = False
                self.busy_s += self.sim.now - started
                self._kick()
            else:
                run_step(self.sim, job, "gpu", step)
        step()

    def lane_busy_s(self) -> float:
        return self.busy_s


class SimLane:
    """A lane driven exactly like ``gateway.io.lanes.Lane``: the real ``LaneScheduler``
    picks the next job between steps; when nothing is eligible it sleeps until
    ``next_eligible_at`` or the next submission."""

    def __init__(self, sim: Sim, name: str, max_lead: float, rank: Rank = Rank.STREAM_AGE,
                 pace_background_always: bool = False, max_open: int | None = None,
                 reserve: int = 0):
        self.sim, self.name = sim, name
        self.sched = LaneScheduler(deadline_of=self._deadline, max_lead=max_lead, rank=rank,
                                   pace_background_always=pace_background_always,
                                   tolerance=JIT_GRANULARITY_S, max_open=max_open,
                                   reserve=reserve)
        self.busy = False
        self.busy_s = 0.0
        self.active: set[int] = set()  # interactive turns with queued work (for placement)
        self.on_job_done: Callable[[SimJob], None] | None = None
        self._wake_at: float | None = None

    @staticmethod
    def _deadline(job: Job, now: float) -> float:
        sj: SimJob = job.payload
        if sj.priority is not Priority.INTERACTIVE:
            # like the HTTP sink (SpeechStream.deadline): a listener playing in real time
            # from the start of the request
            return sj.turn.start + sj.produced_s
        if sj.turn.play_end is None:
            return job.deadline  # first audio: due at submission
        return sj.turn.play_end  # in the past when overdue: never slides with now

    def submit(self, sj: SimJob) -> None:
        sj.lane = self.name
        since = sj.turn.segments[0].submitted if sj.index else None
        self.sched.submit(Job(owner=id(sj.turn), priority=sj.priority,
                              deadline=self.sim.now, payload=sj, since=since))
        if sj.priority is Priority.INTERACTIVE:
            self.active.add(id(sj.turn))
        self.kick()

    def kick(self) -> None:
        if self.busy:
            return
        self.sched.llm_decoding = len(self.sim.llm_streams) if self.name == "gpu" else 0
        job = self.sched.next_job(self.sim.now)
        if job is None:
            at = self.sched.next_eligible_at
            if at is not None and (self._wake_at is None or at < self._wake_at
                                   or self._wake_at <= self.sim.now):
                self._wake_at = at
                self.sim.at(at, self.kick)
            return
        sj: SimJob = job.payload
        self.busy = True
        started = self.sim.now

        def done() -> None:
            self.busy = False
            self.busy_s += self.sim.now - started
            job.steps += 1
            if sj.done:
                self.sched.finish(job)
                if job.owner not in self.sched.owners():
                    self.active.discard(job.owner)
                if self.on_job_done is not None:
                    self.on_job_done(sj)
            self.kick()
        run_step(self.sim, sj, self.name, done)


class Scheduler:
    name = "scheduler"

    def __init__(self, sim: Sim, max_lead: float = 1.0, ane: bool = False,
                 rank: Rank = Rank.STREAM_AGE, pace_background_always: bool = False,
                 active: str = "queued", max_open: int | None = None, reserve: int = 0,
                 **_: Any):
        """``active``, with ``ane``: which turns count on a lane when placing a new one.
        ``queued``: turns with work queued on it now; ``sent``: turns placed on it until
        their last audio is made and delivered (the live gateway: ``TurnPlacer`` until
        ``turn.done``, which goes out with the last frame); ``played``: until the listener
        has played it all. ``sent`` and ``played`` run the live ``TurnPlacer``."""
        self.sim = sim
        self.gpu = SimLane(sim, "gpu", max_lead, rank, pace_background_always, max_open,
                           reserve)
        self.ane = SimLane(sim, "ane", max_lead, rank) if ane else None
        self.active = active
        m = sim.m
        self.profiles = {
            "gpu": LaneProfile("gpu", m.first_host_s + m.first_gpu_s, m.gpu_s_per_audio_s,
                               shares_gpu=True,
                               first_s_llm=m.first_host_s + m.first_gpu_s * (1 + m.llm_weight),
                               rtf_llm=m.gpu_s_per_audio_s * (1 + m.llm_weight)),
            "ane": LaneProfile("ane", m.ane_first_s, m.ane_rtf),
        }
        self.placer: TurnPlacer | None = None
        if self.ane is not None and active != "queued":
            self.placer = TurnPlacer(self.profiles, {"gpu": ["v"], "ane": ["v"]}, "gpu")
            self.gpu.on_job_done = self.ane.on_job_done = self._job_done

    def _job_done(self, sj: SimJob) -> None:
        turn = sj.turn
        if self.placer is None or not turn.interactive or not turn.synthesized:
            return
        placer = self.placer
        if self.active == "sent":
            placer.release(id(turn))
        else:  # "played": when the listener has played it all
            end = max(self.sim.now, turn.play_end or self.sim.now)
            self.sim.at(end, lambda: placer.release(id(turn)))

    def submit(self, job: SimJob) -> None:
        lane, ane = self.gpu, self.ane
        if ane is not None and job.priority is Priority.INTERACTIVE:
            if self.placer is not None:  # (there is a placer only beside an ANE lane)
                chosen = self.placer.place_turn(id(job.turn), "v", bool(self.sim.llm_streams))
                lane = ane if chosen == "ane" else self.gpu
            elif job.index > 0:  # a turn stays on the lane its first segment chose
                lane = ane if job.turn.segments[0].lane == "ane" else self.gpu
            else:
                options = [LaneLoad(self.profiles[ln.name], len(ln.active))
                           for ln in (self.gpu, ane)]
                chosen = place(options, llm_decoding=bool(self.sim.llm_streams))
                lane = ane if chosen == "ane" else self.gpu
        lane.submit(job)

    def lane_busy_s(self) -> float:
        return self.gpu.busy_s


POLICIES: dict[str, Callable[..., Any]] = {
    "naive": Naive,
    "fifo": Fifo,
    "scheduler": Scheduler,
    "sched-320ms": Scheduler,
    "sched-bg-rt": lambda sim, **kw: Scheduler(sim, pace_background_always=True, **kw),
    "sched-edf": lambda sim, **kw: Scheduler(sim, rank=Rank.DEADLINE, **kw),
    "sched+ane": lambda sim, **kw: Scheduler(sim, ane=True, **kw),
    "sched-open1": lambda sim, **kw: Scheduler(sim, max_open=1, **kw),
}


# ---- workloads -----------------------------------------------------------------------


def pct(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile of ``values`` (the nearest rank); None for none."""
    if not values:
        return None
    ranked = sorted(values)
    return ranked[min(len(ranked) - 1, int(round(q * (len(ranked) - 1))))]


def pct_us(ns: Sequence[int], q: float) -> float | None:
    """``pct`` of nanoseconds, in microseconds."""
    at = pct(ns, q)
    return None if at is None else at / 1e3


def make_job(sim: Sim, turn: Turn, audio_s: float, priority: Priority,
             step_audio_s: float) -> SimJob:
    job = SimJob(turn=turn, index=len(turn.segments), audio_s=audio_s, submitted=sim.now,
                 priority=priority, step_audio_s=step_audio_s,
                 factor=sim.lognormal(sim.m.job_sigma))
    turn.segments.append(job)
    return job


def scenario_validation(model: Model, seed: int, runs: int) -> dict[str, Any]:
    """One voice session (5 s utterances), naive concurrency, LLM idle or decoding nonstop."""
    out: dict[str, Any] = {}
    for label, llm in (("idle", False), ("llm_decoding", True)):
        sim = Sim(model, seed)
        policy = Naive(sim)
        turns: list[Turn] = []
        window = {"t": 0.0, "work": 0.0}

        def probe(dt: float, llm_rate: float | None, n_tts: int, w=window) -> None:
            if n_tts and llm_rate is not None:
                w["t"] += dt
                w["work"] += dt * llm_rate
        sim.probe = probe
        if llm:
            sim.llm_stream(math.inf, lambda: None)
        t = 0.0
        for _ in range(runs):
            t += 8.0
            turn = Turn(start=t)
            turns.append(turn)

            def submit(turn: Turn = turn, sim: Sim = sim, policy: Naive = policy) -> None:
                policy.submit(make_job(sim, turn, 5.0, Priority.INTERACTIVE,
                                       model.step_audio_s))
            sim.at(t, submit)
        sim.run(t + 10.0)
        # (as summarize: a turn with no audio yet has no TTFA, and no RTF)
        ttfa = [first * 1e3 for tr in turns if (first := tr.metrics()[0]) is not None]
        rtf = [(max(c[1] for c in tr.chunks) - tr.start) / 5.0 for tr in turns if tr.chunks]
        out[label] = {"ttfa_ms": pct(ttfa, 0.5), "ttfa_p90_ms": pct(ttfa, 0.9),
                      "rtf": pct(rtf, 0.5), "rtf_p90": pct(rtf, 0.9)}
        if llm:
            out[label]["llm_tok_s"] = model.llm_tok_s * window["work"] / window["t"]
        else:
            out[label]["llm_tok_s_alone"] = model.llm_tok_s
    return out


_HOW = {("idle", "ttfa_ms"): "fitted", ("idle", "rtf"): "fitted",
        ("llm_decoding", "ttfa_ms"): "fitted", ("llm_decoding", "llm_tok_s"): "fitted",
        ("llm_decoding", "rtf"): "predicted"}
"""How each validation figure relates to the model (the rest, the p90s, come from the
assumed spread): ``Model.from_calibration`` solves for the idle TTFA and RTF, the TTFA
with the LLM decoding and the LLM's rate beside TTS; the RTF with the LLM decoding follows
from the time-slicing alone."""


HUB_TURN: type[Turn] = Turn
"""What ``hub_session`` makes its turns of (bench/scheduler_variants.py --holds swaps in its
listener that holds playback back)."""


def hub_session(sim: Sim, policy: Any, turns: list[Turn], until: float, step_s: float,
                llm: bool, tokens_per_s_audio: float = 3.75) -> None:
    """A hub session taking turns: the user speaks (1 s) after a pause (exp, mean 3 s);
    the reply is 1-2 sentences of 2-6 s of audio each. With ``llm`` the reply is decoded by
    the LLM first (TTFT work 0.25 s, then the sentence's tokens) and each sentence is
    submitted when its last token arrives; without, the text is there at once (``say``)."""
    rng = sim.rng

    def start_turn() -> None:
        if sim.now >= until:
            return
        turn = HUB_TURN(start=sim.now)
        turns.append(turn)
        lengths = [rng.uniform(2.0, 6.0) for _ in range(1 if rng.random() < 0.5 else 2)]
        turn.n_segments = len(lengths)
        if not llm:
            for a in lengths:
                policy.submit(make_job(sim, turn, a, Priority.INTERACTIVE, step_s))
        else:
            phases = [0.25 + lengths[0] * tokens_per_s_audio / sim.m.llm_tok_s]
            phases += [a * tokens_per_s_audio / sim.m.llm_tok_s for a in lengths[1:]]

            def decode(k: int) -> None:
                if k > 0:
                    policy.submit(make_job(sim, turn, lengths[k - 1], Priority.INTERACTIVE,
                                           step_s))
                if k < len(phases):
                    sim.llm_stream(phases[k], lambda: decode(k + 1))
            decode(0)
        watch(turn, sum(lengths))

    def watch(turn: Turn, total: float) -> None:
        produced = sum(c[2] for c in turn.chunks)
        if produced >= total - 1e-9 and turn.play_end is not None:
            sim.at(max(sim.now, turn.play_end) + 1.0 + rng.expovariate(1 / 3.0), start_turn)
        else:
            sim.at(sim.now + 0.25, lambda: watch(turn, total))

    sim.at(sim.now + rng.uniform(0.0, 4.0), start_turn)


def summarize(turns: list[Turn], client_buffer_s: float = 0.0) -> dict[str, Any]:
    ms = [t.metrics(client_buffer_s) for t in turns]
    ttfa = [m[0] * 1e3 for m in ms if m[0] is not None]
    return {"turns": len(ttfa), "ttfa_p50_ms": pct(ttfa, 0.5), "ttfa_p90_ms": pct(ttfa, 0.9),
            "underruns": sum(m[1] for m in ms), "stall_s": sum(m[2] for m in ms),
            "turns_with_underrun": sum(1 for m in ms if m[1]),
            "sentence_gaps": sum(m[3] for m in ms), "gap_s": sum(m[4] for m in ms)}


def scenario_shared(model: Model, seed: int, duration: float, policy_name: str,
                    apps: int = 1, **policy_kw: Any) -> dict[str, Any]:
    """A hub session (say-style turns) while ``apps`` background apps each send 20-40 s
    utterances back to back. ``policy_kw``: the policy's options (``max_open``,
    ``reserve``)."""
    sim = Sim(model, seed)
    policy = POLICIES[policy_name](sim, **policy_kw)
    # The lane's step-size rule (gateway.core.scheduler.step_ms) for the scheduler; the
    # engine's own 320 ms steps for the baselines and for the old default (sched-320ms).
    bg_step = model.step_audio_s
    if policy_name in ("scheduler", "sched+ane", "sched-bg-rt", "sched-open1"):
        bg_step = (step_ms(Priority.BACKGROUND) or model.step_audio_s * 1e3) / 1e3
    hub: list[Turn] = []
    bg_audio = [0.0]

    def background() -> None:
        turn = Turn(start=sim.now, interactive=False)
        job = make_job(sim, turn, sim.rng.uniform(20.0, 40.0), Priority.BACKGROUND, bg_step)
        policy.submit(job)

        def wait() -> None:
            if job.done:
                bg_audio[0] += job.audio_s
                background()
            else:
                sim.at(sim.now + 0.05, wait)
        wait()

    for _ in range(apps):
        sim.at(0.0, background)
    hub_session(sim, policy, hub, duration, model.step_audio_s, llm=False)
    sim.run(duration)
    out = summarize(hub)
    out["background_audio_s_per_s"] = bg_audio[0] / duration
    return out


def scenario_ramp(model: Model, seed: int, duration: float, policy_name: str,
                  sessions: int) -> dict[str, Any]:
    """``sessions`` hub sessions with LLM replies: underruns and TTFA against lane load."""
    sim = Sim(model, seed + sessions)
    policy = POLICIES[policy_name](sim)
    turns: list[Turn] = []
    for _ in range(sessions):
        hub_session(sim, policy, turns, duration, model.step_audio_s, llm=True)
    sim.run(duration)
    out = summarize(turns)
    for ms in (100, 200):  # the same run, heard by clients that buffer as protocol.md asks
        out[f"underruns_client_buffer_{ms}ms"] = summarize(turns, ms / 1000)["underruns"]
    out["lane_load"] = policy.lane_busy_s() / duration
    out["llm_tok_s"] = (model.llm_tok_s * sim.llm_work_s / sim.llm_busy_s
                        if sim.llm_busy_s else None)
    if isinstance(policy, Scheduler) and policy.ane is not None:
        on_ane = sum(1 for t in turns if t.segments and t.segments[0].lane == "ane")
        out["ane_share"] = on_ane / max(1, len(turns))
        out["ane_load"] = policy.ane.busy_s / duration
    return out


# ---- decision time -------------------------------------------------------------------


def linear_next_job(queues: dict, deadline_of: Callable[[Job, float], float], now: float):
    """The old LaneScheduler.next_job: ask every owner's head (the baseline)."""
    best = best_key = None
    for queue in queues.values():
        job = queue[0]
        key = (job.priority, deadline_of(job, now), job.seq)
        if best_key is None or key < best_key:
            best, best_key = job, key
    return best


def bench_decision(core: types.ModuleType = scheduler_module, n: int = 1000,
                   decisions: int = 20000, seed: int = 1) -> dict[str, Any]:
    """``n`` queued jobs (one per owner, the worst case); each decision is followed by the
    chosen job's step, which moves its listener's deadline later (as a real step does).
    ``core``: the scheduler module to measure (``--baseline`` passes an older revision's)."""
    rng = random.Random(seed)
    play_end: dict[Hashable, float] = {}

    def deadline_of(job: Job, now: float) -> float:
        return play_end[job.owner]

    sched = core.LaneScheduler(deadline_of=deadline_of, max_lead=1.0)
    for owner in range(n):
        play_end[owner] = rng.uniform(0.0, 1.0)
        sched.submit(core.Job(owner=owner, priority=core.Priority.INTERACTIVE, deadline=0.0))
    now, times = 0.0, []
    for _ in range(decisions):
        now += 0.0001
        t0 = time.perf_counter_ns()
        job = sched.next_job(now)
        times.append(time.perf_counter_ns() - t0)
        if job is not None:
            play_end[job.owner] = max(now, play_end[job.owner]) + 0.32
        else:
            now = sched.next_eligible_at or now
    queues = {o: deque([Job(owner=o, priority=Priority.INTERACTIVE, deadline=0.0)])
              for o in range(n)}
    base = []
    for _ in range(min(decisions, 2000)):
        now += 0.0001
        t0 = time.perf_counter_ns()
        job = linear_next_job(queues, deadline_of, now)
        base.append(time.perf_counter_ns() - t0)
        play_end[job.owner] = max(now, play_end[job.owner]) + 0.32
    return {"queued": len(sched), "decisions": len(times),
            "heap_us_p50": pct_us(times, 0.5), "heap_us_p99": pct_us(times, 0.99),
            "heap_us_mean": statistics.fmean(times) / 1e3,
            "linear_us_p50": pct_us(base, 0.5), "goal_us": 20.0}


def bench_decision_bound(core: types.ModuleType = scheduler_module, n: int = 1000,
                         max_open: int = 16, decisions: int = 20000, seed: int = 1
                         ) -> dict[str, Any]:
    """Rule 6 at its bound: ``n`` owners each with a sentence queued, at most ``max_open``
    (qwen3's 16) streams open, the others waiting for one to end. Each decision is followed
    by the chosen job's step (its listener gains 320 ms of audio); a sentence ends after
    5-40 steps and its owner queues its next one (a later sentence of the same stream),
    which waits for a stream in turn. ``core``: the scheduler module to measure
    (``--baseline`` passes an older revision's)."""
    rng = random.Random(seed)
    play_end: dict[int, float] = {}
    calls = 0

    def deadline_of(job: Any, now: float) -> float:
        nonlocal calls
        calls += 1
        return play_end[job.owner]

    sched = core.LaneScheduler(deadline_of=deadline_of, max_lead=1.0, max_open=max_open,
                               tolerance=JIT_GRANULARITY_S)

    def sentence(owner: int, deadline: float, since: float | None) -> Any:
        """An interactive sentence (``since``: its stream's start, for a later one)."""
        return core.Job(owner=owner, priority=core.Priority.INTERACTIVE, deadline=deadline,
                        since=since)

    left: dict[int, int] = {}
    started: dict[int, float] = {}
    for owner in range(n):
        play_end[owner] = rng.uniform(0.0, 1.0)
        started[owner] = play_end[owner]
        left[owner] = rng.randint(5, 40)
        sched.submit(sentence(owner, play_end[owner], None))
    now, times, waiting, per_decision = 0.0, [], [], []
    for _ in range(decisions):
        now += 0.02  # the lane feeds its open streams: 16 x 320 ms of audio per 5.1 s
        calls = 0
        t0 = time.perf_counter_ns()
        job = sched.next_job(now)
        times.append(time.perf_counter_ns() - t0)
        per_decision.append(calls)
        waiting.append(sched.streams_waiting)
        if job is None:
            now = max(now, sched.next_eligible_at or now)
            continue
        owner = job.owner
        job.steps += 1
        play_end[owner] = max(now, play_end[owner]) + 0.32
        left[owner] -= 1
        if not left[owner]:
            sched.finish(job)
            left[owner] = rng.randint(5, 40)
            sched.submit(sentence(owner, play_end[owner], started[owner]))
    return {"queued": len(sched), "max_open": max_open, "decisions": len(times),
            "waiting_mean": statistics.fmean(waiting),
            "us_p50": pct_us(times, 0.5), "us_p99": pct_us(times, 0.99),
            "us_mean": statistics.fmean(times) / 1e3,
            "deadline_of_per_decision": statistics.fmean(per_decision), "goal_us": 20.0}


def scheduler_at(rev: str) -> types.ModuleType:
    """``gateway.core.scheduler`` as it was at git revision ``rev`` (the decision benchmarks'
    baseline, measured in the same run): its source from ``git show``, run as a module."""
    source = subprocess.run(["git", "show", f"{rev}:gateway/core/scheduler.py"],
                            capture_output=True, text=True, check=True,
                            cwd=Path(__file__).resolve().parent.parent).stdout
    module = types.ModuleType(f"scheduler_at_{rev}")
    sys.modules[module.__name__] = module  # (dataclasses look their module up)
    exec(compile(source, f"{rev}:gateway/core/scheduler.py", "exec"), module.__dict__)
    return module


# ---- main ----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--quick", action="store_true", help="shorter runs (a smoke test)")
    ap.add_argument("--max-sessions", type=int, default=6)
    ap.add_argument("--baseline", metavar="REV",
                    help="also time rule 6's decisions with LaneScheduler at git revision REV")
    ap.add_argument("--step-overhead-ms", type=float, default=5.0,
                    help="assumed fixed GPU cost per streaming step (see Model)")
    args = ap.parse_args(argv)
    cal = json.loads(CALIBRATION.read_text())
    model = Model.from_calibration(cal, args.step_overhead_ms / 1e3)
    duration = 300.0 if args.quick else 1800.0
    res: dict[str, Any] = {"model": model.__dict__, "seed": args.seed}

    v = scenario_validation(model, args.seed, 60 if args.quick else 400)
    tts = cal["tts"]["qwen3_0.6b_bf16"]
    llm = cal["llm"]["gemma4_26b_a4b_4bit"]
    measured = {"idle": {**tts["idle"]}, "llm_decoding": {**tts["llm_decoding"],
                "llm_tok_s": llm["decode_tok_s_with_tts_0.6b"]}}
    print("1. validation (naive, one session; simulated vs measured, error)")
    worst = 0.0
    for label, fig in measured.items():
        for key, want in fig.items():
            got = v[label][key]
            err = (got - want) / want
            how = _HOW.get((label, key), "spread")
            if how == "predicted":
                worst = max(worst, abs(err))
            print(f"   {label:13} {key:12} {got:8.3f} vs {want:8.3f}  {err:+6.1%}  {how}")
    print("   fitted: an input of Model.from_calibration (the check is the simulation's own "
          "arithmetic); spread: from the assumed job_sigma / first_sigma; predicted: "
          f"neither, worst error {worst:.1%}")
    v["within_10pct"] = worst <= 0.10
    v["fitted"] = sorted(f"{label}.{key}" for (label, key), how in _HOW.items()
                         if how == "fitted")
    res["validation"] = v

    idle_p90 = v["idle"]["ttfa_p90_ms"]
    print(f"\n2. shared voice ({duration:.0f} s): hub turns + background 20-40 s utterances")
    print(f"   goal: hub TTFA p90 <= 1.3 x idle p90 = {1.3 * idle_p90:.0f} ms")
    print(f"   {'policy':11} {'ttfa p50':>9} {'ttfa p90':>9} {'underruns':>9} {'bg audio/s':>10}")
    res["shared"] = {}
    for name in ("fifo", "naive", "sched-320ms", "sched-bg-rt", "scheduler", "sched-open1"):
        r = scenario_shared(model, args.seed, duration, name)
        r["meets_goal"] = r["ttfa_p90_ms"] <= 1.3 * idle_p90
        res["shared"][name] = r
        print(f"   {name:11} {r['ttfa_p50_ms']:9.0f} {r['ttfa_p90_ms']:9.0f} "
              f"{r['underruns']:9d} {r['background_audio_s_per_s']:10.2f}")
    print("   rule 6b: `scheduler` with max_open n and n background apps, no stream kept "
          "(reserve 0) and default_reserve(n):")
    res["reserve"] = {}
    for n in (2, 3, 4):
        for reserve in (0, default_reserve(n)):
            r = scenario_shared(model, args.seed, duration, "scheduler", apps=n, max_open=n,
                                reserve=reserve)
            res["reserve"][f"open{n}-r{reserve}"] = r
            print(f"   open {n} r {reserve} {r['ttfa_p50_ms']:9.0f} {r['ttfa_p90_ms']:9.0f} "
                  f"{r['underruns']:9d} {r['background_audio_s_per_s']:10.2f}  gaps "
                  f"{r['sentence_gaps']} ({r['gap_s']:.0f} s), turns {r['turns']}")
    print("   sensitivity of `scheduler` to the assumed per-step overhead:")
    res["shared_overhead"] = {}
    for overhead_ms in (0.0, 5.0, 10.0, 20.0):
        alt = Model(**{**model.__dict__, "step_overhead_s": overhead_ms / 1e3})
        r = scenario_shared(alt, args.seed, duration, "scheduler")
        res["shared_overhead"][overhead_ms] = r
        print(f"   {overhead_ms:4.0f} ms/step {r['ttfa_p50_ms']:9.0f} {r['ttfa_p90_ms']:9.0f} "
              f"{r['underruns']:9d} {r['background_audio_s_per_s']:10.2f}")

    print(f"\n3./4. ramp ({duration:.0f} s each): sessions with LLM replies")
    print(f"   {'policy':11} {'n':>2} {'load':>5} {'ttfa p50':>9} {'ttfa p90':>9} "
          f"{'underruns':>9} {'stall s':>7} {'u@100':>6} {'u@200':>6} {'gaps':>5} {'gap s':>6} "
          f"{'turns':>5} {'llm tok/s':>9} {'ane':>5}")
    res["ramp"] = {}
    for name in ("fifo", "naive", "sched-edf", "scheduler", "sched+ane"):
        rows = []
        for n in range(1, args.max_sessions + 1):
            r = scenario_ramp(model, args.seed, duration, name, n)
            r["sessions"] = n
            rows.append(r)
            ane = f"{r['ane_share']:5.0%}" if "ane_share" in r else "    -"
            print(f"   {name:11} {n:2d} {r['lane_load']:5.0%} {r['ttfa_p50_ms']:9.0f} "
                  f"{r['ttfa_p90_ms']:9.0f} {r['underruns']:9d} {r['stall_s']:7.1f} "
                  f"{r['underruns_client_buffer_100ms']:6d} "
                  f"{r['underruns_client_buffer_200ms']:6d} "
                  f"{r['sentence_gaps']:5d} {r['gap_s']:6.1f} {r['turns']:5d} "
                  f"{r['llm_tok_s'] or 0:9.1f} {ane}")
        res["ramp"][name] = rows

    cores = {"this tree": scheduler_module}
    if args.baseline:
        cores[args.baseline] = scheduler_at(args.baseline)
    print()
    for label, core in cores.items():
        d = bench_decision(core)
        b = bench_decision_bound(core)
        if label == "this tree":
            res["decision"], res["decision_bound"] = d, b
        else:
            res[f"decision@{label}"], res[f"decision_bound@{label}"] = d, b
        print(f"decision time ({label}), {d['queued']} queued jobs: heap p50 "
              f"{d['heap_us_p50']:.1f} µs, p99 {d['heap_us_p99']:.1f} µs (goal "
              f"{d['goal_us']:.0f}); old linear scan p50 {d['linear_us_p50']:.1f} µs")
        print(f"   at rule 6's bound, {b['queued']} queued, {b['max_open']} open, "
              f"{b['waiting_mean']:.0f} waiting: p50 {b['us_p50']:.1f} µs, p99 "
              f"{b['us_p99']:.1f} µs, mean {b['us_mean']:.1f} µs; "
              f"{b['deadline_of_per_decision']:.1f} deadline_of calls per decision")
    if args.json:
        args.json.write_text(json.dumps(res, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
