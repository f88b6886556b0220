"""A TTS engine with calibrated timing and no model, for load tests and scheduler experiments.

**It is not a voice.** It speaks no words: it returns a deterministic buzzing tone shaped
into syllable-like bursts, as long as the text would take to say, and it *occupies its
worker thread* for as long as the modelled engine would. That makes a lane full of
synthetic sessions behave, for the scheduler and the pacer, like a lane full of Qwen3-TTS
sessions, on a machine without the model.

Timing model (defaults: Qwen3-TTS 0.6B bf16 on an idle M5 Max, from
``bench/data/calibration.json`` → ``tts.qwen3_0.6b_bf16.idle``):

* audio length = ``len(text) / chars_per_second / speed`` seconds, with
  ``chars_per_second = 14`` (about 150 words per minute of English prose), at least one
  syllable (0.25 s) for any non-blank text;
* step 1 returns the first ``step_ms`` of audio and costs ``ttfa_ms``;
* every later step returns the next ``step_ms`` of audio (a request's own
  ``SynthesisRequest.step_ms`` if it asks for one) and costs ``rtf * step_ms`` (pro rata
  for the shorter last chunk), plus ``step_overhead_ms`` for steps shorter than the
  engine's ``step_ms``: ``rtf`` is measured at ``step_ms``, where the overhead is already
  in it, so a step of ``s`` ms costs ``rtf * s + step_overhead_ms * (1 - s / step_ms)``
  (the per-step cost of a codec-decoder call and a host sync that smaller steps pay more
  often; bench/SCHEDULER.md);
* ``streams=False`` models a non-streaming engine (Chatterbox): one step returns the whole
  segment and costs ``ttfa_ms + rtf * duration``.

Fault injection, for soaks (bench/soak.py ``--faults``): ``fail_rate`` is the chance that a
step raises ``EngineError("engine_failed")`` instead of returning its audio, as an engine
that crashes mid-sentence does (a step after the first: audio of that sentence already went
out; the first: none did). The draws come from ``random.Random(fail_seed)``, one per step,
in the order the steps run; ``fail_rate`` may be set to 0 at any time (the faults stop).
Each failure is numbered (``failures`` counts them) and its message says which it was, the
engine's ``name`` and ``#n`` ("synthetic engine: injected failure #3 at step 2 ..."): the
soak ties each ``engine_failed`` a client gets to the one failure that caused it.

The cost is spent by calling ``sleep`` (``time.sleep`` by default) on the calling thread, the
lane worker, exactly where a real model would compute; tests inject a fake ``sleep`` to
check the model without waiting. ``rtf=0`` and ``ttfa_ms=0`` make every step free: the
signal is rendered once per pitch (``LOOP_S`` seconds, then it repeats) and each step is a
slice of it, so a step costs microseconds, not the ~0.9 ms that computing 320 ms of
harmonics takes.
"""

from __future__ import annotations

import math
import random
import threading
import time
import zlib
from collections.abc import Callable

import numpy as np

from engines.base import OUTPUT_RATE, EngineError, Lane, SynthesisRequest, Uninterruptible

DEFAULT_RTF = 0.44
DEFAULT_TTFA_MS = 107.0
DEFAULT_STEP_MS = 320.0
CHARS_PER_SECOND = 14.0
SYLLABLE_S = 0.25
VOICES: dict[str, float] = {"low": 110.0, "mid": 150.0, "high": 220.0}
"""Voice name → fundamental frequency in Hz."""
DEFAULT_VOICE = "mid"
_LANES = ("gpu", "ane", "cpu", "remote")
LOOP_S = 8.0
"""The rendered signal repeats after this long (a whole number of syllables)."""
_LOOP_CACHE = 32
"""Rendered loops kept per engine (one per pitch; ~384 KB each)."""
PITCHES = 17
"""Each text is spoken at one of this many pitches around its voice's (±8 %)."""


def text_pitch(f0: float, text: str) -> float:
    """The pitch ``text`` is spoken at in a voice of fundamental ``f0``: one of ``PITCHES``
    steps of 1 %, chosen by the text, so that consecutive sentences sound apart."""
    return _pitch_step(f0, zlib.crc32(text.encode()) % PITCHES)


def _pitch_step(f0: float, k: int) -> float:
    return f0 * (1.0 + (k - PITCHES // 2) / 100.0)


class SyntheticEngine(Uninterruptible):
    """Calibrated timing, tone output, no model. Not a voice; see the module docstring."""

    name = "synthetic"
    reads_digits = True

    def __init__(
        self,
        *,
        rtf: float = DEFAULT_RTF,
        ttfa_ms: float = DEFAULT_TTFA_MS,
        step_ms: float = DEFAULT_STEP_MS,
        step_overhead_ms: float = 0.0,
        lane: Lane = "gpu",
        streams: bool = True,
        chars_per_second: float = CHARS_PER_SECOND,
        voice: str = DEFAULT_VOICE,
        name: str | None = None,
        sleep: Callable[[float], None] = time.sleep,
        fail_rate: float = 0.0,
        fail_seed: int = 0,
    ) -> None:
        """``name``: what ``sentence``/``turn.done`` events report as the engine, instead of
        ``synthetic`` (two synthetic engines on two lanes can be told apart).
        ``fail_rate``: the chance a step fails (``engine_failed``); see the module
        docstring."""
        # (written so that NaN fails too: it passed ``rtf < 0`` and started an engine whose
        # steps slept NaN seconds)
        for key, value in (("rtf", rtf), ("ttfa_ms", ttfa_ms),
                           ("step_overhead_ms", step_overhead_ms)):
            if not 0 <= value < math.inf:
                raise ValueError(f"{key} must be a finite number at least 0, not {value!r}")
        for key, value in (("step_ms", step_ms), ("chars_per_second", chars_per_second)):
            if not 0 < value < math.inf:
                raise ValueError(f"{key} must be a finite number above 0, not {value!r}")
        if not 0 <= fail_rate <= 1:
            raise ValueError(f"fail_rate must be 0-1, not {fail_rate!r}")
        if lane not in _LANES:
            raise ValueError(f"lane must be one of {_LANES}, not {lane!r}")
        if voice not in VOICES:
            raise ValueError(f"unknown synthetic voice {voice!r}; known: {', '.join(VOICES)}")
        if name is not None:
            self.name = name
        self.rtf = float(rtf)
        self.ttfa_ms = float(ttfa_ms)
        self.timing = {"first_s": self.ttfa_ms / 1000.0, "rtf": self.rtf}
        """For placing turns between lanes (``engines.base``): the modelled costs. No
        contention figures: the synthetic engine does not slow down while an LLM decodes."""
        self.blocks = self.rtf > 0 or self.ttfa_ms > 0
        """At zero cost a step is a slice of a cached signal: the gateway may run it inline
        on its event loop instead of paying a thread hop per step."""
        self.step_ms = float(step_ms)
        self.step_overhead_ms = float(step_overhead_ms)
        self.lane: Lane = lane
        self.streams = bool(streams)
        self.chars_per_second = float(chars_per_second)
        self.default_voice = voice
        self._sleep = sleep
        self.fail_rate = float(fail_rate)
        self.failures = 0
        """Steps failed by ``fail_rate``."""
        self._fail_rng = random.Random(fail_seed)
        self._closed = False
        self._lock = threading.Lock()
        self._streams: set[SyntheticStream] = set()
        self._loops: dict[tuple[float, float], np.ndarray] = {}

    def voices(self) -> list[str]:
        return list(VOICES)

    def load(self) -> None:
        if self._closed:
            raise EngineError("engine_closed", "synthetic engine is closed")

    def open(self, request: SynthesisRequest) -> SyntheticStream:
        if self._closed:
            raise EngineError("engine_closed", "synthetic engine is closed")
        voice = request.voice or self.default_voice
        if voice not in VOICES:
            raise EngineError("unknown_voice", f"synthetic voice {voice!r} does not exist")
        if not request.speed > 0:
            raise EngineError("bad_request", f"speed must be > 0, got {request.speed}")
        if request.step_ms is not None and not request.step_ms > 0:
            raise EngineError("bad_request", f"step_ms must be > 0, got {request.step_ms}")
        stream = SyntheticStream(self, request.text, VOICES[voice], request.speed,
                                 request.step_ms or self.step_ms)
        with self._lock:
            self._streams.add(stream)
        return stream

    def close(self) -> None:
        self._closed = True
        with self._lock:
            streams, self._streams = list(self._streams), set()
        for s in streams:
            s.close()

    def audio_seconds(self, text: str, speed: float = 1.0) -> float:
        """How long the synthetic speech for ``text`` lasts (the model, for callers' sums)."""
        if not text.strip():
            return 0.0
        return max(SYLLABLE_S, len(text.strip()) / self.chars_per_second) / speed

    def prerender(self, voice: str | None = None, speed: float = 1.0) -> None:
        """Render every loop ``voice`` can use at ``speed`` now (``PITCHES`` of them, ~20 ms
        each), instead of at the first sentence that needs each. For benchmarks: a
        rendering is this stand-in's own cost, which a real engine does not put on the
        gateway's event loop, and it would otherwise land in a measuring window whenever
        sessions reach a sentence of a new pitch (bench/CAPACITY.md)."""
        f0 = VOICES[voice or self.default_voice]
        for k in range(PITCHES):
            self._loop(_pitch_step(f0, k), SYLLABLE_S / speed)

    def _loop(self, f0: float, syllable: float) -> np.ndarray:
        key = (f0, syllable)
        loop = self._loops.get(key)
        if loop is None:
            loop = render_loop(f0, syllable)
            with self._lock:
                if len(self._loops) >= _LOOP_CACHE:
                    self._loops.pop(next(iter(self._loops)))
                self._loops[key] = loop
        return loop

    def _fails(self) -> int:
        """Whether the step being run fails (``fail_rate``): the failure's number (1 for the
        first), else 0."""
        if not self.fail_rate:
            return 0
        with self._lock:
            if self._fail_rng.random() >= self.fail_rate:
                return 0
            self.failures += 1
            return self.failures

    def _forget(self, stream: SyntheticStream) -> None:
        with self._lock:
            self._streams.discard(stream)


class SyntheticStream(Uninterruptible):
    """One synthetic synthesis; the tone is a function of the absolute sample index."""

    def __init__(self, engine: SyntheticEngine, text: str, f0: float, speed: float,
                 step_ms: float | None = None) -> None:
        self._engine = engine
        self._step_ms = engine.step_ms if step_ms is None else step_ms
        self._total = round(engine.audio_seconds(text, speed) * OUTPUT_RATE)
        self._pos = 0
        self._steps = 0
        self._closed = False
        self._f0 = text_pitch(f0, text)
        self._syllable = SYLLABLE_S / speed

    def step(self) -> bytes | None:
        if self._closed or self._pos >= self._total:
            self._finish()
            return None
        eng = self._engine
        if eng.streams:
            n = min(self._total - self._pos, round(self._step_ms / 1000 * OUTPUT_RATE))
            cost = eng.ttfa_ms / 1000 if self._steps == 0 else eng.rtf * n / OUTPUT_RATE
            if self._steps and self._step_ms < eng.step_ms:
                cost += eng.step_overhead_ms / 1000 * (1 - self._step_ms / eng.step_ms)
        else:
            n = self._total - self._pos
            cost = eng.ttfa_ms / 1000 + eng.rtf * n / OUTPUT_RATE
        if cost > 0:
            eng._sleep(cost)
        if self._closed:  # closed from another thread while the "model" was busy
            return None
        if failure := eng._fails():
            self._finish()
            raise EngineError("engine_failed", f"{eng.name} engine: injected failure "
                                               f"#{failure} at step {self._steps + 1} "
                                               f"(fail_rate {eng.fail_rate})")
        chunk = self._render(self._pos, n)
        self._pos += n
        self._steps += 1
        return chunk

    def close(self) -> None:
        self._closed = True
        self._finish()

    def _finish(self) -> None:
        self._engine._forget(self)

    def _render(self, start: int, n: int) -> bytes:
        loop = self._engine._loop(self._f0, self._syllable)
        size = len(loop)
        start %= size
        if start + n <= size:
            return loop[start:start + n].tobytes()
        return np.concatenate((loop[start:], np.resize(loop, n - (size - start)))).tobytes()


def render_loop(f0: float, syllable: float) -> np.ndarray:
    """``LOOP_S`` seconds of the synthetic signal as int16 (sample 0 = time 0)."""
    n = round(round(LOOP_S / syllable) * syllable * OUTPUT_RATE)
    t = np.arange(n) / OUTPUT_RATE
    # A gently gliding fundamental with three harmonics, voiced in syllable-like bursts.
    # Instantaneous frequency f0 * (1 + 0.04 sin(2 pi 0.7 t)), integrated in closed form.
    phase = 2 * math.pi * f0 * (t + 0.04 / (2 * math.pi * 0.7) * (1 - np.cos(
        2 * math.pi * 0.7 * t)))
    tone = (np.sin(phase) + 0.5 * np.sin(2 * phase) + 0.25 * np.sin(3 * phase)) / 1.75
    envelope = np.sin(math.pi * ((t / syllable) % 1.0)) ** 2
    return (tone * envelope * 0.3 * 32767).astype("<i2")
