"""One conformance suite every TTS engine passes (trio's ``check_one_way_stream`` idea).

Usage from an engine's test module::

    from tests.conformance import check_engine

    def test_espeak_conforms():
        check_engine(lambda: EspeakEngine())

``check_engine`` drives the engine the way the gateway's lane worker does: every engine call
(``load``, ``open``, ``step``, stream and engine ``close``) runs on **one** dedicated worker
thread, and each call must return within ``call_timeout_s`` or the check fails with "hung"
instead of hanging the test run. It checks, in order:

1. the engine declares the ``TtsEngine`` attributes (``name``, ``lane``, ``streams``,
   ``reads_digits``) and ``voices()`` is a non-empty list of strings;
2. ``load()`` returns;
3. a full synthesis: ``open()`` returns a ``SynthesisStream``; every ``step()`` returns
   ``bytes`` of even length (PCM16) or ``None``; a streaming engine's chunks stay under
   ``max_chunk_s``; the stream ends within ``max_steps`` and keeps returning ``None``; the
   audio is not silent; its duration fits the text (``audio_seconds``) and, unless told
   otherwise, a longer text gives more audio;
4. ``close()`` mid-stream: the next ``step()`` returns ``None`` or raises ``EngineError``;
   ``close()`` is idempotent and safe after the end;
5. an unknown voice is refused with an ``EngineError`` carrying a code (at ``open()`` or at
   the first ``step()``);
6. ``engine.close()`` ends the streams it opened, is idempotent, refuses ``open()`` with an
   ``EngineError`` afterwards, and leaves no thread behind that it started.

It cannot check the sample rate from bytes alone; engine-specific tests do that (for
example by synthesising a known tone, or by comparing with the resampler's own output).
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from engines.base import OUTPUT_RATE, EngineError, SynthesisRequest, SynthesisStream, TtsEngine

T = TypeVar("T")

DEFAULT_TEXT = "The quick brown fox jumps over the lazy dog, then naps in the afternoon sun."
UNKNOWN_VOICE = "no-such-voice-7f3a"
LANES = ("gpu", "ane", "cpu", "remote")


class ConformanceError(AssertionError):
    """An engine broke the contract; the message says which check and why."""


@dataclass
class StreamResult:
    """What one full synthesis produced: the chunks as returned and the joined samples."""

    chunks: list[bytes] = field(default_factory=list)
    ended: bool = False

    @property
    def samples(self) -> np.ndarray:
        return np.frombuffer(b"".join(self.chunks), dtype="<i2")

    @property
    def seconds(self) -> float:
        return len(self.samples) / OUTPUT_RATE

    @property
    def rms(self) -> float:
        s = self.samples.astype(np.float64)
        return float(np.sqrt(np.mean(s * s))) if len(s) else 0.0


@dataclass
class ConformanceReport:
    """Returned by ``check_engine`` so engine-specific tests can look further."""

    engine_name: str
    full: StreamResult
    longer: StreamResult | None


class _Worker:
    """The lane worker thread: one thread, every engine call on it, each call bounded."""

    def __init__(self, call_timeout_s: float) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="conformance")
        self._timeout = call_timeout_s
        self.hung = False

    def call(self, what: str, fn: Callable[[], T]) -> T:
        future = self._pool.submit(fn)
        try:
            return future.result(timeout=self._timeout)
        except concurrent.futures.TimeoutError:
            self.hung = True
            raise ConformanceError(f"{what} hung (> {self._timeout} s)") from None

    def shutdown(self) -> None:
        # A hung call cannot be interrupted: leave its thread behind rather than hang too.
        self._pool.shutdown(wait=not self.hung, cancel_futures=True)


def _default_seconds(text: str) -> tuple[float, float]:
    """Speech runs at roughly 2-4 words per second; allow a wide margin either way."""
    words = max(1, len(text.split()))
    return 0.12 * words, 1.0 * words + 2.0


def _drain(
    worker: _Worker,
    stream: SynthesisStream,
    *,
    max_steps: int,
    max_chunk_s: float | None,
    label: str,
) -> StreamResult:
    result = StreamResult()
    for _ in range(max_steps):
        chunk = worker.call(f"{label}: step()", stream.step)
        if chunk is None:
            result.ended = True
            break
        if not isinstance(chunk, bytes):
            raise ConformanceError(f"{label}: step() returned {type(chunk).__name__}, not bytes")
        if len(chunk) % 2:
            raise ConformanceError(f"{label}: chunk of odd length {len(chunk)} is not PCM16")
        if max_chunk_s is not None and len(chunk) / 2 / OUTPUT_RATE > max_chunk_s:
            raise ConformanceError(
                f"{label}: streaming chunk of {len(chunk) / 2 / OUTPUT_RATE:.3f} s "
                f"exceeds {max_chunk_s} s"
            )
        result.chunks.append(chunk)
    if not result.ended:
        raise ConformanceError(f"{label}: stream did not end within {max_steps} steps")
    for i in range(2):
        again = worker.call(f"{label}: step() after end", stream.step)
        if again is not None:
            raise ConformanceError(f"{label}: step() #{i + 1} after the end returned {again!r:.40}")
    return result


def _expect_engine_error(what: str, fn: Callable[[], Any]) -> EngineError:
    try:
        fn()
    except EngineError as exc:
        if not isinstance(exc.code, str) or not exc.code:
            raise ConformanceError(f"{what}: EngineError without a code") from exc
        return exc
    except ConformanceError:
        raise
    except Exception as exc:  # noqa: BLE001 - the point is to report the wrong type
        raise ConformanceError(f"{what}: raised {type(exc).__name__}, not EngineError") from exc
    raise ConformanceError(f"{what}: no EngineError raised")


def check_engine(
    make_engine: Callable[[], TtsEngine],
    *,
    request: SynthesisRequest | None = None,
    max_steps: int = 1000,
    audio_seconds: tuple[float, float] | None | str = "auto",
    check_text_scaling: bool = True,
    max_chunk_s: float = 2.0,
    min_rms: float = 30.0,
    call_timeout_s: float = 60.0,
    unknown_voice: str | None = UNKNOWN_VOICE,
    thread_exit_s: float | None = None,
) -> ConformanceReport:
    """Run every check against a fresh engine from ``make_engine``; raise on the first failure.

    ``request`` is the synthesis to check (default: one English sentence, default voice).
    ``audio_seconds`` bounds its duration: ``"auto"`` derives loose bounds from the word
    count, ``None`` skips the check (engines whose length does not follow the text, such as
    random-weight test models capped by ``max_tokens``). ``check_text_scaling`` also checks
    that the same text said twice gives more audio. ``unknown_voice=None`` skips the
    unknown-voice check (an engine that accepts any voice name). ``thread_exit_s``: how
    long a thread the engine started may take to end after ``close()`` (default
    ``call_timeout_s``).
    """
    request = request or SynthesisRequest(text=DEFAULT_TEXT)
    threads_before = set(threading.enumerate())
    worker = _Worker(call_timeout_s)
    engine: TtsEngine | None = None
    passed = False
    try:
        engine = make_engine()
        name = _check_attributes(engine)
        voices = worker.call("voices()", engine.voices)
        if not (isinstance(voices, list) and voices and all(isinstance(v, str) for v in voices)):
            raise ConformanceError(f"voices() must be a non-empty list of str, got {voices!r:.80}")
        worker.call("load()", engine.load)

        # 3. A full synthesis.
        stream = worker.call("open()", lambda: engine.open(request))
        if not isinstance(stream, SynthesisStream):
            raise ConformanceError(f"open() returned {type(stream).__name__}, not SynthesisStream")
        chunk_bound = max_chunk_s if engine.streams else None
        full = _drain(worker, stream, max_steps=max_steps, max_chunk_s=chunk_bound, label="full")
        worker.call("close() after the end", stream.close)
        worker.call("second close() after the end", stream.close)
        if full.rms < min_rms:
            raise ConformanceError(f"audio is silent: RMS {full.rms:.1f} < {min_rms}")
        bounds = _default_seconds(request.text) if audio_seconds == "auto" else audio_seconds
        if isinstance(bounds, tuple):
            lo, hi = bounds
            if not lo <= full.seconds <= hi:
                raise ConformanceError(
                    f"{full.seconds:.2f} s of audio for {len(request.text.split())} words; "
                    f"expected {lo:.2f}-{hi:.2f} s"
                )
        longer = None
        if check_text_scaling:
            doubled = SynthesisRequest(
                text=f"{request.text} {request.text}",
                voice=request.voice,
                speed=request.speed,
                temperature=request.temperature,
                top_p=request.top_p,
                seed=request.seed,
                options=dict(request.options),
            )
            s2 = worker.call("open() longer text", lambda: engine.open(doubled))
            longer = _drain(
                worker, s2, max_steps=2 * max_steps, max_chunk_s=chunk_bound, label="longer"
            )
            worker.call("close()", s2.close)
            if not longer.seconds > full.seconds * 1.3:
                raise ConformanceError(
                    f"text said twice gave {longer.seconds:.2f} s vs {full.seconds:.2f} s once"
                )

        # 4. close() mid-stream stops it at the next step.
        s3 = worker.call("open() for mid-stream close", lambda: engine.open(request))
        first = worker.call("first step() before close", s3.step)
        if first is None:
            raise ConformanceError("stream ended before its first chunk")
        worker.call("close() mid-stream", s3.close)
        _check_stopped(worker, s3, "after close() mid-stream")
        worker.call("second close() mid-stream", s3.close)
        _check_stopped(worker, s3, "after second close()")

        # 5. Errors are EngineError with a code.
        if unknown_voice is not None:
            bad = SynthesisRequest(text=request.text, voice=unknown_voice)

            def open_and_step() -> None:
                s = engine.open(bad)
                try:
                    s.step()
                finally:
                    s.close()

            _expect_engine_error(
                "unknown voice", lambda: worker.call("unknown voice", open_and_step)
            )

        # 6. engine.close() ends open streams, frees, refuses new work.
        s4 = worker.call("open() before engine.close()", lambda: engine.open(request))
        worker.call("engine.close()", engine.close)
        _check_stopped(worker, s4, "stream after engine.close()")
        worker.call("second engine.close()", engine.close)
        worker.call("stream close() after engine.close()", s4.close)
        _expect_engine_error(
            "open() after engine.close()",
            lambda: worker.call("open() after close", lambda: engine.open(request)),
        )
        passed = True
        return ConformanceReport(engine_name=name, full=full, longer=longer)
    finally:
        if engine is not None and not worker.hung:
            try:
                worker.call("engine.close() in cleanup", engine.close)
            except Exception:  # noqa: BLE001 - the first failure is the one worth reporting
                pass
        worker.shutdown()
        if passed:  # never mask the first failure with a second one
            _check_no_leaked_threads(
                threads_before, call_timeout_s if thread_exit_s is None else thread_exit_s
            )


def _check_attributes(engine: TtsEngine) -> str:
    if not isinstance(engine, TtsEngine):
        raise ConformanceError(f"{type(engine).__name__} does not implement TtsEngine")
    if not isinstance(engine.name, str) or not engine.name:
        raise ConformanceError("engine.name must be a non-empty str")
    if engine.lane not in LANES:
        raise ConformanceError(f"engine.lane {engine.lane!r} not one of {LANES}")
    for attr in ("streams", "reads_digits"):
        if not isinstance(getattr(engine, attr), bool):
            raise ConformanceError(f"engine.{attr} must be a bool")
    return engine.name


def _check_stopped(worker: _Worker, stream: SynthesisStream, label: str) -> None:
    try:
        chunk = worker.call(f"step() {label}", stream.step)
    except EngineError as exc:
        if not exc.code:
            raise ConformanceError(f"step() {label}: EngineError without a code") from exc
        return
    if chunk is not None:
        raise ConformanceError(f"step() {label} returned audio instead of None / EngineError")


def _check_no_leaked_threads(before: set[threading.Thread], timeout_s: float) -> None:
    new = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    for t in new:
        t.join(timeout_s)  # an engine thread told to stop may need a moment to exit
    leaked = [t.name for t in new if t.is_alive()]
    if leaked:
        raise ConformanceError(f"threads left running after engine.close(): {leaked}")
