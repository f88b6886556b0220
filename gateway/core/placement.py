"""Which lane a job goes to, and how long its steps will take there. Sans-I/O.

LLM awareness: a GPU lane's step times depend on whether this gateway's LLM streams are
decoding on the same device (measured on the hub: TTS 0.44 -> 0.97 s of work per second of
audio, first audio 107 -> 216 ms). When a job's voice is also available on a lane that does
not share the GPU (an ANE engine), the job goes there while that lane can still keep every
listener it serves fed in real time, so the LLM keeps the GPU.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True, slots=True)
class LaneProfile:
    """Measured cost of one engine on one lane (calibration.json)."""

    name: str
    first_s: float
    """Time to first audio of a job when the lane is free."""
    rtf: float
    """Seconds of lane time per second of audio."""
    shares_gpu: bool = False
    first_s_llm: float | None = None
    """Same, while an LLM decodes on the same device (None: no contention measured)."""
    rtf_llm: float | None = None

    def predict(self, llm_decoding: bool) -> tuple[float, float]:
        """(first audio, rtf) under the current LLM activity."""
        if llm_decoding and self.shares_gpu:
            return (self.first_s if self.first_s_llm is None else self.first_s_llm,
                    self.rtf if self.rtf_llm is None else self.rtf_llm)
        return self.first_s, self.rtf


@dataclass(frozen=True, slots=True)
class LaneLoad:
    profile: LaneProfile
    active: int
    """Interactive jobs the lane currently serves (each needs ``rtf`` of its time)."""


def place(options: Sequence[LaneLoad], llm_decoding: bool) -> str:
    """The lane for a new interactive job among those that have its voice.

    A lane is *feasible* when it can serve its current listeners plus this one in real time
    (``(active + 1) * rtf <= 1``). Among feasible lanes, prefer one that leaves the GPU to a
    decoding LLM, then the earliest predicted first audio. With no feasible lane, the one
    with the least predicted load.
    """
    if not options:
        raise ValueError("no lane has this voice")

    def load(o: LaneLoad) -> float:
        return (o.active + 1) * o.profile.predict(llm_decoding)[1]

    feasible = [o for o in options if load(o) <= 1.0]
    if not feasible:
        return min(options, key=load).profile.name
    best = min(feasible, key=lambda o: (llm_decoding and o.profile.shares_gpu,
                                        o.profile.predict(llm_decoding)[0]))
    return best.profile.name


class StepTimes:
    """What one lane's engine measured: the configured ``LaneProfile`` is a guess (another
    Mac, another model size, a voice that speaks faster) until its own steps say otherwise.

    The lane reports each step of an interactive job it ran: a job's first step (it opened
    the stream: prefill and first audio) gives ``first_s``; later steps give ``rtf``, lane
    seconds per audio second. Each figure is kept apart for steps taken while an LLM of this
    gateway was decoding (``*_llm``: only a lane sharing the GPU is ever told one is). A
    figure is the median of the last ``window`` samples, and replaces the configured one
    once it has ``min_samples``: a median ignores the compile-heavy first steps of a cold
    model and a stray slow step, and a window follows a device that got slower or faster.
    """

    def __init__(self, window: int = 32, min_samples: int = 8) -> None:
        self.min_samples = min_samples
        self._samples: dict[str, deque[float]] = {
            key: deque(maxlen=window) for key in ("first_s", "rtf", "first_s_llm", "rtf_llm")}

    def step(self, seconds: float, audio_s: float, *, opened: bool, llm: bool) -> None:
        """A step of ``seconds`` of lane time that produced ``audio_s`` of audio (``opened``:
        the step opened its job's stream, so it includes the time to first audio)."""
        suffix = "_llm" if llm else ""
        if opened:
            self._samples["first_s" + suffix].append(seconds)
        elif audio_s > 0:
            self._samples["rtf" + suffix].append(seconds / audio_s)

    def measured(self) -> dict[str, float]:
        """The figures with enough samples, by ``LaneProfile`` field name."""
        return {key: statistics.median(values) for key, values in self._samples.items()
                if len(values) >= self.min_samples}

    def samples(self) -> dict[str, int]:
        return {key: len(values) for key, values in self._samples.items()}

    def apply(self, profile: LaneProfile) -> LaneProfile:
        """``profile`` with every measured figure in place of the configured one."""
        measured: dict[str, Any] = self.measured()
        return replace(profile, **measured) if measured else profile


def profile_from(lane: str, figures: Mapping[str, float]) -> LaneProfile:
    """A lane's ``LaneProfile`` from an engine's timing figures (``first_s``, ``rtf`` and,
    for an engine that shares the GPU with the LLM, ``first_s_llm``/``rtf_llm``): a lane
    named ``gpu`` shares the device with the LLM, as ``Lane.llm_started`` assumes."""
    unknown = set(figures) - {"first_s", "rtf", "first_s_llm", "rtf_llm"}
    if unknown:
        raise ValueError(f"lane {lane}: unknown timing figure(s) {', '.join(sorted(unknown))}; "
                         "known: first_s, rtf, first_s_llm, rtf_llm")
    missing = {"first_s", "rtf"} - set(figures)
    if missing:
        raise ValueError(f"lane {lane}: timing figure(s) {', '.join(sorted(missing))} missing")
    if any(not v >= 0 for v in figures.values()):
        raise ValueError(f"lane {lane}: timing figures must be >= 0, got {dict(figures)}")
    return LaneProfile(lane, first_s=float(figures["first_s"]), rtf=float(figures["rtf"]),
                       shares_gpu=lane == "gpu", first_s_llm=figures.get("first_s_llm"),
                       rtf_llm=figures.get("rtf_llm"))


class TurnPlacer:
    """Which lane each interactive turn speaks on. Sans-I/O; the gateway holds one.

    A turn is placed once, when its first segment is submitted (``place_turn``), by
    ``place`` (with each lane's ``profile``: measured figures where there are enough) among
    the lanes whose engine has the turn's voice; its later segments and its
    cancellation go to the same lane (``lane_of``): one voice per reply. A turn counts as
    ``active`` on its lane from then until ``release`` (the turn ended), including the
    gaps in which it waits for the LLM's next sentence.

    ``voices``: lane → the voices its engine speaks (compared case-insensitively). A turn
    without a voice (``None``: the engine's default) stays on ``primary``: another engine's
    default voice is another voice.
    """

    def __init__(self, profiles: Mapping[str, LaneProfile],
                 voices: Mapping[str, Collection[str]], primary: str,
                 timing: Mapping[str, StepTimes] | None = None,
                 breaker_failures: int = 3, breaker_reset_s: float = 30.0) -> None:
        if primary not in profiles or set(voices) != set(profiles):
            raise ValueError("every lane needs a profile and a voice list, the primary too")
        self.profiles = dict(profiles)
        """The configured figures (the engines' ``timing``, ``[tts.profiles.<lane>]``)."""
        self.timing = dict(timing or {})
        """What each lane measured (``StepTimes``); it overrides ``profiles`` figure by
        figure as samples come in."""
        self.primary = primary
        self._voices = {lane: {v.casefold() for v in vs} for lane, vs in voices.items()}
        self._lanes: dict[Hashable, str] = {}
        self._active = dict.fromkeys(profiles, 0)
        self.breaker_failures = breaker_failures
        self.breaker_reset_s = breaker_reset_s
        self._failures = dict.fromkeys(profiles, 0)
        self._tripped_until: dict[str, float] = {}
        self.rerouted = dict.fromkeys(profiles, 0)
        """Turns moved off each lane after a failure there (``move``)."""
        self.placed = dict.fromkeys(profiles, 0)
        """Turns placed on each lane since the start (``place_turn``; a move is not one)."""
        self.trips = dict.fromkeys(profiles, 0)
        """Times each lane's breaker opened (``failed``). Two looks at a lane that both
        find it tripped with the same ``trips`` saw it open all the time between: its
        ``placed`` must not have grown meanwhile (bench/soak.py ``--engine-lanes`` checks
        it through ``/health``)."""

    def lanes_with(self, voice: str | None) -> list[str]:
        """The lanes that can speak ``voice``, the primary first."""
        if voice is None:
            return [self.primary]
        key = voice.casefold()
        return [lane for lane in sorted(self.profiles, key=lambda ln: ln != self.primary)
                if key in self._voices[lane]]

    def place_turn(self, owner: Hashable, voice: str | None, llm_decoding: bool,
                   usable: Collection[str] | None = None, now: float | None = None) -> str:
        """The lane of ``owner``'s turn: the one chosen before, else choose now.

        ``usable``: lanes able to run jobs now (loaded, healthy); ``now``: the time of the
        breakers (``failed``): a lane tripped at ``now`` is not usable either (None: the
        breakers are not asked, for a caller that reports no failure). A lane that is not
        usable is chosen only when no usable lane has the voice (its jobs then fail as that
        lane's would). A voice no lane has goes to the primary, whose engine reports it.
        """
        lane = self._lanes.get(owner)
        if lane is not None:
            return lane
        candidates = self.lanes_with(voice) or [self.primary]
        if usable is not None or now is not None:
            candidates = [ln for ln in candidates
                          if (usable is None or ln in usable)
                          and (now is None or not self.tripped(ln, now))] or candidates
        if len(candidates) == 1:
            lane = candidates[0]
        else:
            lane = place([LaneLoad(self.profile(ln), self._active[ln]) for ln in candidates],
                         llm_decoding)
        self._lanes[owner] = lane
        self._active[lane] += 1
        self.placed[lane] += 1
        return lane

    def profile(self, lane: str) -> LaneProfile:
        """``lane``'s figures as placement uses them now: measured where it has enough
        samples, configured elsewhere."""
        timing = self.timing.get(lane)
        return self.profiles[lane] if timing is None else timing.apply(self.profiles[lane])

    def move(self, owner: Hashable, lane: str) -> None:
        """``owner``'s turn continues on ``lane`` (its engine failed on the old one)."""
        old = self._lanes.get(owner)
        if old is None or old == lane:
            return
        self._active[old] -= 1
        self._active[lane] += 1
        self._lanes[owner] = lane
        self.rerouted[old] += 1

    # ---- breaker: a lane whose engine keeps failing gets no new turns for a while ------

    def failed(self, lane: str, now: float) -> None:
        """A job failed on ``lane``. ``breaker_failures`` in a row trip it: no new turn is
        placed there for ``breaker_reset_s`` (unless no other lane has the voice); then
        the next turn may try it again, and one more failure trips it again."""
        self._failures[lane] += 1
        if self._failures[lane] >= self.breaker_failures:
            if not self.tripped(lane, now):
                self.trips[lane] += 1
            self._tripped_until[lane] = now + self.breaker_reset_s

    def succeeded(self, lane: str, now: float) -> None:
        """A job on ``lane`` ended with its audio: the failures in a row start over, unless
        the lane is tripped. Then it is the job of a turn placed there before (a turn stays
        on its lane): it closed the breaker at once, and new turns went back to a lane
        that had just failed three times, 0.5 s into a 5 s reset (bench/soak.py
        ``--engine-lanes``, SOAK.md). Only the reset lets a turn try it again; after it,
        the next success closes it (and one more failure trips it again)."""
        if self.tripped(lane, now):
            return
        self._failures[lane] = 0
        self._tripped_until.pop(lane, None)

    def tripped(self, lane: str, now: float) -> bool:
        until = self._tripped_until.get(lane)
        return until is not None and now < until

    def lane_of(self, owner: Hashable) -> str | None:
        return self._lanes.get(owner)

    def release(self, owner: Hashable) -> str | None:
        """``owner``'s turn ended: its lane serves one turn fewer. Idempotent."""
        lane = self._lanes.pop(owner, None)
        if lane is not None:
            self._active[lane] -= 1
        return lane

    def active(self, lane: str) -> int:
        """Interactive turns placed on ``lane`` and not yet ended."""
        return self._active[lane]
