"""A primary engine with a fallback and a circuit breaker (qwen3, falling back to chatterbox).

When the fallback takes over
    * ``open()`` or the first ``step()`` of the primary raises ``EngineError`` (including
      ``engine_runaway`` before any audio): the fallback speaks the whole segment, in the
      same ``step()`` call, so the caller sees no gap and no error.
    * The breaker is open: the segment goes straight to the fallback.

Mid-segment failure (the primary already produced audio, then raised, e.g. the runaway
guard): the two engines share no alignment between text and audio, so the fallback cannot
say "the rest"; saying the whole segment again would repeat words the listener just heard.
The rule is therefore: **the segment ends where the primary stopped** (``step()`` returns
``None``), the frames already sent stay gapless and are never duplicated, the failure is
recorded in ``stream.error`` / ``stream.truncated`` and opens the breaker at once, so the
*next* segments go to the fallback (until the breaker's probe finds the primary well).

"Too slow": a step in flight cannot be interrupted, so slowness is measured, not
pre-empted. If the primary's first step takes longer than ``first_chunk_timeout_s``
(``clock()`` before and after), its chunk is still used (the fallback would only be later
still) but the slowness counts as a breaker failure. A lane worker that knows a deadline
has already passed may open with ``request.options["deadline_passed"] = True`` to skip the
primary for this segment.

Circuit breaker: ``breaker_failures`` consecutive failures open it (a mid-segment one at
once); while open, segments go to the fallback; after ``breaker_reset_s`` one segment probes
the primary (half-open): a clean segment closes the breaker, a failure re-opens it for
another ``breaker_reset_s``. Only the probe closes it. The probe asks its first audio within
``first_chunk_timeout_s`` (``SynthesisRequest.options["first_audio_timeout_s"]``; an engine
that waits on a server honours it): later it would count as a failure anyway, and a remote
primary that takes requests and never answers held the probe's sentence, and on a lane
that runs one step at a time every session, until its read timeout (20 s) at every
``breaker_reset_s`` (30 s); now the fallback speaks it after ``first_chunk_timeout_s``.

``stream.engine_name`` names the engine that produced the audio (updated on a switch) for
the gateway's ``sentence`` event. Both engines run on the *primary's* lane thread (the
stream's steps run there): two MLX engines share the gpu lane as they must; espeak as the
fallback of qwen3 is safe there too (it serialises its own calls). A primary that runs
several steps at once (``parallel_steps``: ``http``) keeps doing so behind a
``thread_safe`` fallback (espeak), and runs one at a time behind any other.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from enum import Enum

from engines.base import (
    SPEED_ANY,
    EngineError,
    RequestRefused,
    SynthesisRequest,
    SynthesisStream,
    TtsEngine,
)
from engines.spell import spell_out

log = logging.getLogger(__name__)


class BreakerState(Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class FallbackEngine:
    name = "fallback"

    def __init__(
        self,
        primary: TtsEngine,
        fallback: TtsEngine,
        first_chunk_timeout_s: float = 1.0,
        breaker_failures: int = 3,
        breaker_reset_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not (isinstance(breaker_failures, int) and breaker_failures >= 1):
            raise ValueError(f"breaker_failures must be an integer at least 1, not "
                             f"{breaker_failures!r}")
        for key, value in (("first_chunk_timeout_s", first_chunk_timeout_s),
                           ("breaker_reset_s", breaker_reset_s)):
            if not value > 0:
                raise ValueError(f"{key} must be more than 0 seconds, not {value!r}")
        self.primary = primary
        self.fallback = fallback
        # what /v1/models, /health and the logs show: the voice and what stands behind it
        self.name = f"{primary.name}+{fallback.name}"
        self.lane = primary.lane
        timing = getattr(primary, "timing", None)
        if timing is not None:
            self.timing = timing  # placement plans with the primary; the fallback is rare
        streams = getattr(primary, "max_open_streams", None)
        if streams is not None:  # (each segment opens the one engine's stream or the other's)
            self.max_open_streams = streams
        if getattr(fallback, "thread_safe", False):
            # both engines' steps may then run at once on the primary's lane (engines.base)
            self.parallel_steps = getattr(primary, "parallel_steps", 1)
        self.first_chunk_timeout_s = first_chunk_timeout_s
        self.breaker_failures = breaker_failures
        self.breaker_reset_s = breaker_reset_s
        self.clock = clock
        self.state = BreakerState.CLOSED
        self.consecutive_failures = 0
        self.opened_at: float | None = None
        self.switches = 0
        """Segments the fallback spoke after the primary failed at their start."""
        self.fallback_segments = 0
        """Segments the fallback spoke, for whatever reason: a switch, an open breaker, a
        primary that did not load, a passed deadline. A turn the fallback spoke alone is
        not one spoken by two engines (``gateway_fallbacks_total``): with the breaker open,
        that counter stood still while the fallback spoke everything."""
        self.truncations = 0
        self.breaker_opens = 0
        self._probing = False
        self._lock = threading.RLock()
        """The breaker's: segments' steps may run at once (``parallel_steps``)."""
        self.primary_load_error: str | None = None
        """Why the primary did not load: the fallback speaks everything (``/health`` says
        ``degraded``)."""

    # -- TtsEngine -------------------------------------------------------------------

    @property
    def speaker(self) -> TtsEngine:
        """The engine that speaks when all is well: the primary, or the fallback when the
        primary did not load."""
        return self.fallback if self.primary_load_error else self.primary

    @property
    def streams(self) -> bool:
        """The speaker's (/v1/models): the fallback speaks a segment now and then only."""
        return self.speaker.streams

    @property
    def streams_always(self) -> bool:
        """False when either engine makes a segment in one step: the fallback may take any
        segment over (``engines.base.streams_always``)."""
        return self.primary.streams and self.fallback.streams

    @property
    def reads_digits(self) -> bool:
        """The speaker's: the gateway writes text for it. A segment the fallback takes over
        gets its numbers spelled out here when the fallback needs them so
        (``FallbackStream``): qwen3 was given "one hundred eighty-four dollars" whenever
        chatterbox stood behind it."""
        return self.speaker.reads_digits

    @property
    def instructions(self) -> bool:
        """The speaker's: a segment the fallback speaks otherwise goes without them."""
        return bool(getattr(self.speaker, "instructions", False))

    @property
    def speed_range(self) -> tuple[float, float] | None:
        """The speaker's, as for instructions."""
        return getattr(self.speaker, "speed_range", SPEED_ANY)

    @property
    def default_voice(self) -> str | None:
        return getattr(self.speaker, "default_voice", None)

    def voices(self) -> list[str]:
        """The speaker's (a session may choose only among voices that can be spoken)."""
        return self.speaker.voices()

    def load(self) -> None:
        """The fallback first: it must be there, the primary may fail (its breaker opens).
        When the fallback fails, the primary is tried too, so one start names every model
        that is missing (hub.toml with neither model cached named only the fallback's)."""
        try:
            self.fallback.load()
        except EngineError as exc:
            message = f"the fallback {self.fallback.name} did not load: {exc.message}"
            try:
                self.primary.load()
            except EngineError as primary:
                message += f"; the primary {self.primary.name} did not load either: " \
                           f"{primary.message}"
            else:
                self.primary.close()
            raise EngineError(exc.code, message) from exc
        try:
            self.primary.load()
        except EngineError as exc:
            log.error(
                "primary engine %s failed to load (%s); using %s",
                self.primary.name,
                exc.message,
                self.fallback.name,
            )
            self.primary_load_error = f"{self.primary.name} failed to load: {exc.message}"
            self.consecutive_failures = self.breaker_failures - 1
            self.record_failure(exc)

    def open(self, request: SynthesisRequest) -> FallbackStream:
        with self._lock:
            # (a passed deadline asks for no probe: one granted and not run never ended, so
            # no other ever came)
            use_primary = not request.options.get("deadline_passed") and self._allow_primary()
            probe = use_primary and self.state is BreakerState.HALF_OPEN
        return FallbackStream(self, request, use_primary, probe)

    def close(self) -> None:
        try:
            self.primary.close()
        finally:
            self.fallback.close()

    def interrupt(self) -> None:
        """Both engines' ``interrupt`` (``engines.base``)."""
        self.primary.interrupt()
        self.fallback.interrupt()

    @property
    def degraded(self) -> str | None:
        """Why the fallback speaks instead of the primary (``/health`` says "degraded"),
        None while the primary speaks: an open breaker left /health "ok" while chatterbox
        spoke every sentence."""
        if self.primary_load_error:
            return self.primary_load_error
        if self.state is BreakerState.CLOSED:
            return None
        return (f"{self.primary.name} is failing (breaker {self.state.value}): "
                f"{self.fallback.name} speaks every sentence until a probe finds "
                f"{self.primary.name} well")

    # -- breaker -----------------------------------------------------------------------

    def counters(self) -> dict[str, object]:
        return {
            "breaker_state": self.state.value,
            "consecutive_failures": self.consecutive_failures,
            "breaker_opens": self.breaker_opens,
            "switches": self.switches,
            "fallback_segments": self.fallback_segments,
            "truncations": self.truncations,
            "primary_load_error": self.primary_load_error,
        }

    def _allow_primary(self) -> bool:
        if self.primary_load_error:  # never loaded: probing it would only fail again
            return False
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.OPEN:
            assert self.opened_at is not None
            if self.clock() - self.opened_at < self.breaker_reset_s:
                return False
            self.state = BreakerState.HALF_OPEN
            self._probing = False
        if self._probing:  # one probe at a time
            return False
        self._probing = True
        return True

    def record_success(self, *, probe: bool = False) -> None:
        """A segment the primary spoke whole. Only the probe (``probe``) closes an open
        breaker: a stream opened before the breaker tripped and ending well afterwards
        closed it 13 s into a 30 s reset and let the failing primary back."""
        with self._lock:
            if probe:
                self._probing = False
                if self.state is not BreakerState.CLOSED:
                    log.info("primary engine %s recovered; breaker closed", self.primary.name)
                    self.state = BreakerState.CLOSED
            if self.state is BreakerState.CLOSED:
                self.consecutive_failures = 0

    def record_failure(self, exc: EngineError) -> None:
        with self._lock:
            self.consecutive_failures += 1
            self._probing = False
            if (
                self.state is BreakerState.HALF_OPEN
                or self.consecutive_failures >= self.breaker_failures
            ):
                self.trip(exc)

    def trip(self, exc: EngineError) -> None:
        """Open the breaker now: after ``breaker_failures``, or at a failure mid-segment
        (the next segment must not start on the primary only to be cut too)."""
        with self._lock:
            self._probing = False
            if self.state is not BreakerState.OPEN:
                self.breaker_opens += 1
                log.warning("breaker open for %s after %s: %s", self.primary.name, exc.code,
                            exc.message)
            self.state = BreakerState.OPEN
            self.opened_at = self.clock()

    def count(self, counter: str) -> None:
        """One more of ``counter`` (``switches``, ``fallback_segments``, ``truncations``),
        from any lane thread."""
        with self._lock:
            setattr(self, counter, getattr(self, counter) + 1)

    def probe_abandoned(self) -> None:
        """A probe closed before it ended (cancelled): another may run."""
        with self._lock:
            self._probing = False


def _bug(name: str, exc: Exception | SystemExit) -> EngineError:
    """A primary's exception that is not an engine error (a bug, a library's own error),
    logged with its traceback and then handled as a failure: the fallback speaks for it, as
    for any failure, rather than the turn failing. The breaker bounds the lines logged."""
    log.error("%s raised %s: %s", name, type(exc).__name__, exc, exc_info=exc)
    return EngineError("engine_failed", f"{type(exc).__name__}: {exc}")


class FallbackStream:
    """One segment: the primary's stream, or the fallback's after a switch."""

    def __init__(self, owner: FallbackEngine, request: SynthesisRequest, use_primary: bool,
                 probe: bool = False):
        self._owner = owner
        self._request = request
        self._inner: SynthesisStream | None = None
        self._on_primary = use_primary
        self.engine_name = owner.primary.name if use_primary else owner.fallback.name
        self._probe = probe
        self.error: EngineError | None = None
        self._primary_error: EngineError | None = None
        """Why the primary gave this segment to the fallback (None: it did not)."""
        self.truncated = False
        self.notes: tuple[str, ...] = ()
        """The ``notes`` of the engine's stream that spoke the segment (an ``http``
        engine's: what its server said it did not do as asked), kept as it closes."""
        self._produced = False
        self._first_step_done = False
        self._slow = False
        self._done = False
        self._interrupted = False

    def interrupt(self) -> None:
        """The engine's stream's ``interrupt`` (``engines.base``). What the cut step does
        then proves nothing of the primary: no failure, no success."""
        self._interrupted = True
        if (inner := self._inner) is not None:  # (the lane thread may close it meanwhile)
            inner.interrupt()

    def step(self) -> bytes | None:
        if self._done or self._interrupted:
            return None
        owner = self._owner
        if not self._on_primary:
            return self._step_fallback()
        t0 = owner.clock()
        try:
            if self._inner is None:
                request = self._request
                if self._probe:  # a server that took it and says nothing fails it fast
                    request = dataclasses.replace(request, options={
                        **request.options, "first_audio_timeout_s": owner.first_chunk_timeout_s})
                self._inner = owner.primary.open(request)
                if self._interrupted:  # (before ``interrupt`` saw this stream)
                    self.close()
                    return None
            chunk = self._inner.step()
        except (Exception, SystemExit) as raised:  # (a library's sys.exit: a failure too)
            if self._interrupted:
                self.close()
                return None
            exc = raised if isinstance(raised, EngineError) else _bug(owner.primary.name, raised)
            if isinstance(exc, RequestRefused):  # (this request's fault, not the primary's)
                if self._probe:
                    owner.probe_abandoned()
            elif not self._slow:  # (a slow first chunk counted this segment's failure already)
                owner.record_failure(exc)
            if self._produced:
                owner.trip(exc)
            self._close_inner()
            if self._produced:
                self.error, self.truncated = exc, True
                owner.count("truncations")
                self._done = True
                return None
            owner.count("switches")
            log.warning(
                "%s failed before audio (%s: %s); %s speaks the segment",
                owner.primary.name,
                exc.code,
                exc.message,
                owner.fallback.name,
            )
            self._primary_error = exc
            self._on_primary = False
            self.engine_name = owner.fallback.name
            return self._step_fallback()
        if self._interrupted:  # (its None or chunk came of the cut: nobody wants it)
            self.close()
            return None
        if not self._first_step_done:
            self._first_step_done = True
            elapsed = owner.clock() - t0
            if elapsed > owner.first_chunk_timeout_s:
                self._slow = True
                owner.record_failure(
                    EngineError(
                        "engine_timeout",
                        f"first chunk took {elapsed:.2f} s > {owner.first_chunk_timeout_s:.2f} s",
                    )
                )
        if chunk is None:
            self._done = True
            self._close_inner()
            if not self._slow:  # (a slow one was a failure: record_failure ended a probe)
                owner.record_success(probe=self._probe)
            return None
        if chunk:
            self._produced = True
        return chunk

    def close(self) -> None:
        self._done = True
        self._close_inner()
        if self._probe and self._on_primary:  # an abandoned probe proves nothing
            self._owner.probe_abandoned()

    def _step_fallback(self) -> bytes | None:
        if self._inner is None:
            self._owner.count("fallback_segments")
            request = self._request
            if self._owner.fallback.voices() and request.voice not in self._owner.fallback.voices():
                request = dataclasses.replace(request, voice=None)
            if self._owner.speaker.reads_digits and not self._owner.fallback.reads_digits:
                request = dataclasses.replace(request, text=spell_out(request.text))
            self._inner = self._owner.fallback.open(request)
        try:
            chunk = self._inner.step()
        except EngineError as exc:
            self._done = True
            self._close_inner()
            first = self._primary_error
            if first is None:
                raise
            # the turn's error says why the fallback had to speak, as well as why it failed
            raise EngineError(exc.code, f"{self._owner.primary.name} failed ({first.code}: "
                                        f"{first.message}), and the fallback "
                                        f"{self._owner.fallback.name} failed too: "
                                        f"{exc.message}") from exc
        if chunk is None:
            self._done = True
            self._close_inner()
        return chunk

    def _close_inner(self) -> None:
        """Close the engine's stream; one whose ``close`` raises is logged, as the lane
        logs its own streams': the close runs inside ``step`` here, and its error took the
        place of the segment's outcome (no fallback after a primary failed, a whole
        segment failed at its end, a probe that never ended kept the breaker from probing
        again)."""
        inner, self._inner = self._inner, None
        if inner is not None:
            self.notes = tuple(getattr(inner, "notes", ()))
            try:
                inner.close()
            except Exception:
                log.exception("closing a synthesis stream failed")
