"""FallbackEngine with scripted test-double engines and a fake clock."""

from __future__ import annotations

import pytest

from engines.base import EngineError, SynthesisRequest, TtsEngine, Uninterruptible
from engines.fallback import BreakerState, FallbackEngine


class FakeClock:
    """Test double: a clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class ScriptedEngine(Uninterruptible):
    """Test double: each ``open`` plays the next script; a script item is bytes, an
    exception to raise (an ``EngineError``, or another: a bug), ``("slow", seconds,
    bytes)`` which advances the clock, or a function whose result the step returns."""

    lane = "gpu"
    streams = True
    reads_digits = True

    def __init__(
        self,
        name: str,
        clock: FakeClock,
        scripts: list[list] | None = None,
        default: list | None = None,
    ) -> None:
        self.name = name
        self.clock = clock
        self.scripts = list(scripts or [])
        self.default = default if default is not None else [b"\x01\x00" * 4]
        self.opened: list[SynthesisRequest] = []
        self.closed_streams = 0
        self.close_raises: Exception | None = None
        """What each stream's ``close`` raises, once it has closed (None: nothing)."""

    def voices(self) -> list[str]:
        return [f"{self.name}-voice"]

    def load(self) -> None:
        pass

    def close(self) -> None:
        pass

    def open(self, request: SynthesisRequest):
        self.opened.append(request)
        script = self.scripts.pop(0) if self.scripts else list(self.default)
        engine = self

        class Stream(Uninterruptible):
            def __init__(self) -> None:
                self.items = list(script)

            def step(self):
                if not self.items:
                    return None
                item = self.items.pop(0)
                if isinstance(item, Exception):
                    raise item
                if isinstance(item, tuple):
                    engine.clock.now += item[1]
                    return item[2]
                if callable(item):
                    return item()
                return item

            def close(self) -> None:
                engine.closed_streams += 1
                self.items = []
                if engine.close_raises is not None:
                    raise engine.close_raises

        return Stream()


def fail(code="engine_failed"):
    return EngineError(code, "scripted")


def setup(primary_scripts=None, **kw):
    clock = FakeClock()
    primary = ScriptedEngine("qwen3", clock, primary_scripts)
    fallback = ScriptedEngine("chatterbox", clock, default=[b"\x09\x00" * 8])
    engine = FallbackEngine(
        primary,
        fallback,
        first_chunk_timeout_s=1.0,
        breaker_failures=2,
        breaker_reset_s=30,
        clock=clock,
        **kw,
    )
    engine.load()
    return engine, primary, fallback, clock


def drain(stream):
    out = []
    while (c := stream.step()) is not None:
        out.append(c)
    return out


def test_primary_speaks_when_healthy():
    engine, primary, fallback, _ = setup([[b"\x01\x00", b"\x02\x00"]])
    assert isinstance(engine, TtsEngine)
    stream = engine.open(SynthesisRequest("Hi.", voice="qwen3-voice"))
    assert drain(stream) == [b"\x01\x00", b"\x02\x00"]
    assert stream.engine_name == "qwen3" and not fallback.opened
    assert engine.counters()["switches"] == 0


def test_failure_before_audio_switches_to_fallback_for_the_whole_segment():
    engine, primary, fallback, _ = setup([[fail()]])
    stream = engine.open(SynthesisRequest("Hi.", voice="qwen3-voice"))
    assert drain(stream) == [b"\x09\x00" * 8]
    assert stream.engine_name == "chatterbox"
    assert fallback.opened[0].text == "Hi." and fallback.opened[0].voice is None
    assert engine.switches == 1 and primary.closed_streams == 1


def test_a_bug_in_the_primary_is_a_failure_the_fallback_speaks_for(caplog):
    """An exception from the primary that is not an engine error (a bug, a library's own
    error) went past the wrapper: the turn failed, although the fallback was there to
    speak. It is a failure like any other now, logged with its traceback."""
    engine, primary, fallback, _ = setup([[RuntimeError("a bug before audio")],
                                          [b"\x01\x00", KeyError("a bug mid-segment")]])
    first = engine.open(SynthesisRequest("Hi.", voice="qwen3-voice"))
    assert drain(first) == [b"\x09\x00" * 8] and first.engine_name == "chatterbox"
    second = engine.open(SynthesisRequest("Again.", voice="qwen3-voice"))
    assert drain(second) == [b"\x01\x00"]  # cut where it stopped: no word twice
    assert second.truncated and second.error.code == "engine_failed"
    assert "KeyError" in second.error.message
    assert engine.switches == 1 and primary.closed_streams == 2
    bugs = [r for r in caplog.records if r.levelname == "ERROR"]
    assert [r.exc_info[0] for r in bugs] == [RuntimeError, KeyError]


def test_failure_mid_segment_ends_the_segment_without_duplicating_audio():
    engine, _, fallback, _ = setup([[b"\x01\x00", fail("engine_runaway")]])
    stream = engine.open(SynthesisRequest("Hi."))
    assert drain(stream) == [b"\x01\x00"]
    assert stream.truncated and stream.error.code == "engine_runaway"
    assert stream.engine_name == "qwen3" and not fallback.opened
    assert engine.counters()["truncations"] == 1
    # and the next sentence goes to the fallback: the primary stopping mid-word once is
    # enough (it went back to it until the breaker's count was reached, cut again each time)
    assert engine.state is BreakerState.OPEN
    after = engine.open(SynthesisRequest("Next."))
    assert drain(after) == [b"\x09\x00" * 8] and after.engine_name == "chatterbox"


def test_only_the_probe_closes_an_open_breaker():
    """A primary stream opened before the breaker tripped and ending well afterwards closed
    it 13 s into a 30 s reset (production-topology probe)."""
    engine, primary, fallback, clock = setup([[b"\x01\x00", b"\x02\x00"], [fail()], [fail()]])
    long_one = engine.open(SynthesisRequest("A long HTTP request."))
    assert long_one.step() == b"\x01\x00"
    for _ in range(2):
        drain(engine.open(SynthesisRequest("a")))
    assert engine.state is BreakerState.OPEN
    assert drain(long_one) == [b"\x02\x00"]  # it ends well, but it was no probe
    assert engine.state is BreakerState.OPEN
    assert engine.open(SynthesisRequest("b")).engine_name == "chatterbox"
    clock.now += 30
    probe = engine.open(SynthesisRequest("c"))
    assert drain(probe) and probe.engine_name == "qwen3"
    assert engine.state is BreakerState.CLOSED


def test_one_probe_at_a_time_even_when_an_older_primary_stream_ends_during_it():
    """A stream opened before the breaker tripped, closed while the half-open probe speaks
    (its normal end, or a barge-in), cleared the one-probe flag: a second probe went to the
    failing primary at once (I/O review)."""
    engine, primary, fallback, clock = setup([[b"\x01\x00", b"\x02\x00"], [fail()], [fail()],
                                              [b"\x03\x00", b"\x04\x00"]])
    older = engine.open(SynthesisRequest("A long HTTP request."))
    assert older.step() == b"\x01\x00"
    for _ in range(2):
        drain(engine.open(SynthesisRequest("a")))
    clock.now += 30
    probe = engine.open(SynthesisRequest("the probe"))
    assert probe.step() == b"\x03\x00" and probe.engine_name == "qwen3"
    for end in (lambda: drain(older), older.close):  # its end, then its close by the lane
        end()
        assert engine.open(SynthesisRequest("meanwhile")).engine_name == "chatterbox"
    probe.close()  # an abandoned probe proves nothing: the next segment probes again
    assert engine.open(SynthesisRequest("next")).engine_name == "qwen3"


def test_a_fallback_that_reads_digits_badly_gets_them_spelled_out_itself():
    """The gateway writes text for the speaker (qwen3 reads "$184.50"); chatterbox behind
    it made the gateway spell out numbers for qwen3 too, in every language."""
    engine, primary, fallback, _ = setup([[fail()]])
    fallback.reads_digits = False
    assert engine.reads_digits is True  # qwen3's
    drain(engine.open(SynthesisRequest("Hosting came to $184.50 at 3:30.")))
    assert primary.opened[0].text == "Hosting came to $184.50 at 3:30."
    assert fallback.opened[0].text == ("Hosting came to one hundred eighty-four dollars and "
                                       "fifty cents at three thirty.")
    engine.primary_load_error = "qwen3 failed to load"  # the fallback speaks everything:
    assert engine.reads_digits is False  # the gateway spells for it, not twice


def test_breaker_opens_after_consecutive_failures_then_probes_and_closes():
    engine, primary, fallback, clock = setup([[fail()], [fail()]])
    for _ in range(2):
        drain(engine.open(SynthesisRequest("a")))
    assert engine.state is BreakerState.OPEN and engine.breaker_opens == 1
    stream = engine.open(SynthesisRequest("b"))  # primary not tried while open
    assert drain(stream) and stream.engine_name == "chatterbox" and len(primary.opened) == 2
    clock.now += 30
    probe = engine.open(SynthesisRequest("c"))
    assert engine.state is BreakerState.HALF_OPEN
    other = engine.open(SynthesisRequest("d"))  # one probe at a time
    assert other.engine_name == "chatterbox"
    assert drain(probe) == [b"\x01\x00" * 4] and probe.engine_name == "qwen3"
    assert engine.state is BreakerState.CLOSED and engine.consecutive_failures == 0


def test_failed_probe_reopens_for_another_reset_period():
    engine, primary, _, clock = setup([[fail()], [fail()], [fail()]])
    for _ in range(2):
        drain(engine.open(SynthesisRequest("a")))
    clock.now += 30
    assert drain(engine.open(SynthesisRequest("probe"))) == [b"\x09\x00" * 8]
    assert engine.state is BreakerState.OPEN and engine.opened_at == clock.now
    clock.now += 29
    assert engine.open(SynthesisRequest("x")).engine_name == "chatterbox"
    assert len(primary.opened) == 3


def test_slow_first_chunk_is_kept_but_counts_against_the_primary():
    slow = [("slow", 1.5, b"\x01\x00"), b"\x02\x00"]
    engine, _, fallback, _ = setup([list(slow), list(slow)])
    assert drain(engine.open(SynthesisRequest("a"))) == [b"\x01\x00", b"\x02\x00"]
    assert engine.consecutive_failures == 1 and engine.state is BreakerState.CLOSED
    drain(engine.open(SynthesisRequest("b")))
    assert engine.state is BreakerState.OPEN
    assert engine.open(SynthesisRequest("c")).engine_name == "chatterbox"
    assert not fallback.opened  # no audio was thrown away or re-spoken


def test_deadline_passed_skips_the_primary_for_one_segment():
    engine, primary, _, _ = setup()
    stream = engine.open(SynthesisRequest("a", options={"deadline_passed": True}))
    assert stream.engine_name == "chatterbox" and drain(stream)
    assert not primary.opened and engine.state is BreakerState.CLOSED


def test_a_passed_deadline_while_half_open_leaves_the_probe_to_the_next_segment():
    """A segment whose deadline passed, opened when a probe was due, was granted the probe
    and then skipped the primary: the probe never ran nor ended, so no other came, and the
    fallback spoke every sentence for good."""
    engine, primary, _, clock = setup([[fail()], [fail()]])
    drain(engine.open(SynthesisRequest("a")))
    drain(engine.open(SynthesisRequest("b")))
    clock.now += 31
    late = engine.open(SynthesisRequest("late", options={"deadline_passed": True}))
    assert late.engine_name == "chatterbox" and drain(late)
    probe = engine.open(SynthesisRequest("probe"))
    assert probe.engine_name == "qwen3" and drain(probe)
    assert engine.state is BreakerState.CLOSED


def test_fallback_failure_is_raised():
    engine, _, fallback, _ = setup([[fail()]])
    fallback.scripts = [[fail("engine_timeout")]]
    stream = engine.open(SynthesisRequest("a"))
    with pytest.raises(EngineError) as err:
        stream.step()
    assert err.value.code == "engine_timeout"
    assert stream.step() is None


def test_when_both_fail_the_error_and_the_log_give_the_primarys_reason(caplog):
    """The primary failed before audio, then its fallback failed too: the turn's error gave
    only the fallback's reason, and the primary's was in no log line either (the switch's
    WARNING named its code alone; only a breaker that trips says why)."""
    engine, _, fallback, _ = setup([[EngineError("engine_failed", "Metal ran out of memory")]])
    fallback.scripts = [[EngineError("engine_timeout", "no answer in 30 s")]]
    stream = engine.open(SynthesisRequest("a"))
    with pytest.raises(EngineError) as err:
        stream.step()
    assert err.value.code == "engine_timeout"
    assert err.value.message == ("qwen3 failed (engine_failed: Metal ran out of memory), and "
                                 "the fallback chatterbox failed too: no answer in 30 s")
    assert "Metal ran out of memory" in caplog.text


def test_primary_that_fails_to_load_opens_the_breaker():
    clock = FakeClock()

    class Broken(ScriptedEngine):
        def load(self) -> None:
            raise EngineError("engine_failed", "no model")

    engine = FallbackEngine(
        Broken("qwen3", clock), ScriptedEngine("chatterbox", clock), breaker_failures=3, clock=clock
    )
    assert engine.voices() == ["qwen3-voice"]
    engine.load()
    assert engine.state is BreakerState.OPEN
    assert engine.open(SynthesisRequest("a")).engine_name == "chatterbox"
    # said, not hidden: /health reports it, and only voices that can be spoken are offered
    assert engine.primary_load_error == "qwen3 failed to load: no model"
    assert engine.counters()["primary_load_error"] == engine.primary_load_error
    assert engine.degraded == engine.primary_load_error  # (/health: "degraded", and why)
    assert engine.voices() == ["chatterbox-voice"]
    # and it is not probed again (it would fail, and count, every breaker_reset_s for ever)
    clock.now += 3600
    assert engine.open(SynthesisRequest("b")).engine_name == "chatterbox"
    assert (engine.breaker_opens, engine.switches) == (1, 0)


@pytest.mark.parametrize("primary_loads", [True, False])
def test_a_fallback_that_fails_to_load_is_named_and_so_is_a_primary_that_fails(primary_loads):
    """A missing fallback fails the start, saying it is the fallback; the primary is tried
    too, so one start names every missing model (and a primary that loaded is closed)."""
    clock = FakeClock()
    events = []

    class Missing(ScriptedEngine):
        def load(self) -> None:
            events.append(f"load {self.name}")
            if self.name == "chatterbox" or not primary_loads:
                raise EngineError("engine_failed", f"model {self.name}-model is not cached")

        def close(self) -> None:
            events.append(f"close {self.name}")

    engine = FallbackEngine(Missing("qwen3", clock), Missing("chatterbox", clock), clock=clock)
    with pytest.raises(EngineError) as err:
        engine.load()
    assert err.value.code == "engine_failed"
    if primary_loads:
        assert err.value.message == (
            "the fallback chatterbox did not load: model chatterbox-model is not cached")
        assert events == ["load chatterbox", "load qwen3", "close qwen3"]
    else:
        assert err.value.message == (
            "the fallback chatterbox did not load: model chatterbox-model is not cached; "
            "the primary qwen3 did not load either: model qwen3-model is not cached")
        assert events == ["load chatterbox", "load qwen3"]


def test_runs_on_the_primary_lane():
    clock = FakeClock()
    other = ScriptedEngine("espeak", clock)
    other.lane = "cpu"
    assert FallbackEngine(ScriptedEngine("qwen3", clock), other).lane == "gpu"


def test_the_wrapper_honours_speed_as_its_primary_does():
    # what the HTTP API tells a client of its speed follows the voice it asked for
    from engines.base import SPEED_ANY

    clock = FakeClock()
    primary = ScriptedEngine("qwen3", clock)
    wrapped = FallbackEngine(primary, ScriptedEngine("espeak", clock), clock=clock)
    assert wrapped.speed_range == SPEED_ANY  # not declared: any speed
    primary.speed_range = None
    assert wrapped.speed_range is None


def test_a_segment_counts_once_against_the_breaker_however_it_failed():
    # a slow first chunk and then a failure mid-sentence are one bad segment, not two: a
    # breaker of 3 opened after two sentences
    clock = FakeClock()
    primary = ScriptedEngine("qwen3", clock, scripts=[[("slow", 2.0, b"\x01\x00" * 4), fail()]])
    engine = FallbackEngine(primary, ScriptedEngine("espeak", clock), breaker_failures=3,
                            first_chunk_timeout_s=1.0, clock=clock)
    stream = engine.open(SynthesisRequest("a"))
    assert stream.step()
    assert stream.step() is None and stream.truncated
    assert engine.consecutive_failures == 1
    assert engine.state is BreakerState.OPEN  # (cut mid-sentence: open at once)


def test_degraded_says_why_the_fallback_speaks():
    # /health said "ok" while the breaker was open and chatterbox spoke every sentence
    engine, _, _, clock = setup([[fail()], [fail()]])
    assert engine.degraded is None
    for _ in range(2):
        drain(engine.open(SynthesisRequest("a")))
    assert engine.degraded == ("qwen3 is failing (breaker open): chatterbox speaks every "
                               "sentence until a probe finds qwen3 well")
    clock.now += 30
    drain(engine.open(SynthesisRequest("probe")))  # the default script: it speaks whole
    assert engine.degraded is None


async def test_a_sentence_the_fallback_speaks_after_an_empty_chunk_is_named_as_the_fallbacks(
        start_gateway):
    """The primary's first step made no audio (an empty chunk), then it failed: the fallback
    spoke the whole sentence, but its ``sentence`` event and the turn's ``engines`` named
    the primary, which made none of it."""
    from websockets.asyncio.client import connect

    from tests.wsclient import gapless, read_turn, recv_event, send

    clock = FakeClock()
    primary = ScriptedEngine("qwen3", clock, scripts=[[b"", fail()]])
    fallback = ScriptedEngine("espeak", clock, default=[b"\x02\x00" * 2400])
    gw = await start_gateway(engine=FallbackEngine(primary, fallback, clock=clock),
                             session={"max_lead_ms": 30_000})
    async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws:
        await recv_event(ws, "session.created")
        await send(ws, type="say", text="Only this sentence.")
        result = await read_turn(ws)
    assert result.done["status"] == "completed" and result.of("error") == []
    assert [s["engine"] for s in result.of("sentence")] == ["espeak"]
    assert result.done["metrics"]["engine"] == "espeak"
    assert result.done["metrics"]["engines"] == ["espeak"]
    gapless(result)


def test_an_interrupted_probe_proves_nothing():
    """A probe cut by a barge-in (``interrupt`` while its step runs: the step then fails,
    or ends) neither re-opens nor closes the breaker, and the fallback does not speak."""
    probes = []

    def cut(then):
        def step():
            probes[-1].interrupt()
            if isinstance(then, Exception):
                raise then
            return then
        return step

    engine, primary, fallback, clock = setup(
        [[fail()], [fail()], [cut(fail())], [b"", cut(None)], [b"\x01\x00"]])
    drain(engine.open(SynthesisRequest("a")))
    drain(engine.open(SynthesisRequest("b")))
    assert engine.state is BreakerState.OPEN
    clock.now += 31
    opened = len(fallback.opened)
    for outcome in ("failed", "ended"):
        probes.append(engine.open(SynthesisRequest("probe")))
        assert drain(probes[-1]) in ([], [b""])
        probes[-1].close()
        assert engine.state is BreakerState.HALF_OPEN, outcome
        assert engine.consecutive_failures == 2, outcome
    assert len(fallback.opened) == opened
    assert drain(engine.open(SynthesisRequest("c"))) == [b"\x01\x00"]  # the next probe ran
    assert engine.state is BreakerState.CLOSED


def test_a_primary_stream_that_fails_to_close_changes_no_outcome(caplog):
    """The wrapper closes the primary's stream inside its own ``step``: a ``close`` that
    raised (an MLX engine clearing its cache on a GPU that just failed the step) left
    the segment as it stood, so the fallback never spoke for a primary that failed
    before audio (the turn failed with the close's error), a segment whose audio was
    all sent failed its turn at its end, and a probe that spoke whole never closed the
    breaker (``_probing`` stayed set: the primary was never tried again). As the lane
    does for its own streams, such a close is logged and the segment goes on."""
    engine, primary, fallback, clock = setup([[fail()], [fail()], [b"\x01\x00"] * 2,
                                              [b"\x02\x00"]])
    primary.close_raises = RuntimeError("clearing the cache failed")
    first = engine.open(SynthesisRequest("a"))
    assert drain(first) == [b"\x09\x00" * 8] and first.engine_name == "chatterbox"
    drain(engine.open(SynthesisRequest("b")))
    assert engine.state is BreakerState.OPEN
    clock.now += 31
    cut = engine.open(SynthesisRequest("probe"))
    assert cut.step() == b"\x01\x00"
    cut.close()  # a barge-in: another probe may run
    probe = engine.open(SynthesisRequest("probe again"))
    assert drain(probe) == [b"\x02\x00"] and not probe.truncated
    assert probe.engine_name == "qwen3" and engine.state is BreakerState.CLOSED
    assert primary.closed_streams == 4
    closes = [r for r in caplog.records if r.exc_info and r.exc_info[0] is RuntimeError]
    assert len(closes) == 4


def test_a_primary_ending_its_thread_is_a_failure_the_fallback_speaks_for(caplog):
    """A library calling ``sys.exit`` inside the primary's step (``SystemExit``, which the
    lane turns into a failed job) is a failure like any other here: before audio the
    fallback speaks the segment, instead of the turn failing with the engine's exit."""

    def exits() -> bytes:
        raise SystemExit(3)

    engine, _primary, _fallback, _clock = setup([[exits]])
    stream = engine.open(SynthesisRequest("a"))
    assert drain(stream) == [b"\x09\x00" * 8] and stream.engine_name == "chatterbox"
    assert any("SystemExit" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(("fallback_safe", "expected"), [(True, 8), (False, 1)])
def test_a_primary_runs_steps_at_once_only_behind_a_thread_safe_fallback(fallback_safe,
                                                                         expected):
    """Both engines' steps run on the primary's lane: several at once (an http primary's
    ``parallel_steps``) only when the fallback's calls may come from several threads
    (espeak), not behind an MLX engine."""
    clock = FakeClock()
    primary = ScriptedEngine("http", clock)
    primary.parallel_steps = 8  # type: ignore[attr-defined]
    fallback = ScriptedEngine("espeak" if fallback_safe else "chatterbox", clock)
    if fallback_safe:
        fallback.thread_safe = True  # type: ignore[attr-defined]
    engine = FallbackEngine(primary, fallback)
    assert getattr(engine, "parallel_steps", 1) == expected


def test_the_probe_asks_its_first_audio_within_the_first_chunk_timeout():
    """A remote primary that takes requests and never answers held each probe's sentence
    (and its lane) until its read timeout (20 s) every ``breaker_reset_s``: the probe now
    asks the engine for its first audio within ``first_chunk_timeout_s`` (a slower one
    would count as a failure anyway); other segments ask nothing."""
    engine, primary, _, clock = setup([[fail()], [fail()]])
    drain(engine.open(SynthesisRequest("a", options={"http_body": {"k": 1}})))
    drain(engine.open(SynthesisRequest("b")))
    clock.now += 31
    drain(engine.open(SynthesisRequest("probe", options={"http_body": {"k": 1}})))
    assert [r.options for r in primary.opened] == [
        {"http_body": {"k": 1}}, {},
        {"http_body": {"k": 1}, "first_audio_timeout_s": 1.0}]


@pytest.mark.parametrize(("policy", "message"), [
    ({"breaker_failures": 0}, "breaker_failures must be an integer at least 1, not 0"),
    ({"breaker_failures": 2.0}, "breaker_failures must be an integer at least 1, not 2.0"),
    ({"first_chunk_timeout_s": 0}, "first_chunk_timeout_s must be more than 0 seconds, not 0"),
    ({"breaker_reset_s": -1.0}, "breaker_reset_s must be more than 0 seconds, not -1.0"),
    ({"breaker_reset_s": float("nan")}, "breaker_reset_s must be more than 0 seconds, not nan"),
])
def test_a_policy_out_of_range_is_refused_naming_its_key(policy, message):
    """``[tts.fallback_policy]``: a timeout of 0 would send every first chunk to the
    fallback, a breaker of 0 failures would never let the primary speak."""
    clock = FakeClock()
    with pytest.raises(ValueError) as err:
        FallbackEngine(ScriptedEngine("qwen3", clock), ScriptedEngine("espeak", clock),
                       **policy)
    assert str(err.value) == message


def test_the_wrapper_plans_and_opens_as_its_primary_and_speaks_with_the_speakers_instructions():
    """Placement (``timing``) and the lane's stream bound (``max_open_streams``) are the
    primary's, which speaks nearly always; whether instructions reach the voice is the
    speaker's: the fallback's once the primary did not load."""
    clock = FakeClock()
    primary, fallback = ScriptedEngine("qwen3", clock), ScriptedEngine("espeak", clock)
    primary.timing = {"first_s": 0.2, "rtf": 0.5}
    primary.max_open_streams = 4
    primary.instructions = True
    wrapped = FallbackEngine(primary, fallback, clock=clock)
    assert (wrapped.timing, wrapped.max_open_streams) == (primary.timing, 4)
    assert wrapped.instructions is True
    wrapped.primary_load_error = "qwen3 failed to load: no model"
    assert wrapped.instructions is False


def test_with_the_breaker_open_a_fallback_failure_is_its_own():
    """No primary error stands before it (the breaker sent the segment to the fallback):
    the error is the fallback's, as it said it."""
    engine, _, fallback, _ = setup([[fail()], [fail()]])
    for _ in range(2):
        drain(engine.open(SynthesisRequest("a")))
    assert engine.state is BreakerState.OPEN
    fallback.scripts = [[EngineError("engine_timeout", "no answer in 30 s")]]
    stream = engine.open(SynthesisRequest("b"))
    with pytest.raises(EngineError) as err:
        stream.step()
    assert (err.value.code, err.value.message) == ("engine_timeout", "no answer in 30 s")
    assert stream.step() is None


def test_a_probe_refused_for_its_request_proves_nothing_and_the_next_segment_probes():
    """A probe whose request the primary's server refused (a voice it lacks: this client's
    choice, not the primary's health): the fallback speaks it, the breaker stays half-open
    and does not count it, and the next segment is the probe."""
    from engines.base import RequestRefused

    engine, primary, fallback, clock = setup(
        [[fail()], [fail()], [RequestRefused("bad_request", "no such voice")], [b"\x01\x00"]])
    for _ in range(2):
        drain(engine.open(SynthesisRequest("a")))
    clock.now += 31
    assert drain(engine.open(SynthesisRequest("probe"))) == [b"\x09\x00" * 8]
    assert engine.state is BreakerState.HALF_OPEN and engine.consecutive_failures == 2
    assert drain(engine.open(SynthesisRequest("next"))) == [b"\x01\x00"]
    assert engine.state is BreakerState.CLOSED


def test_a_stream_interrupted_while_its_primary_opens_ends_and_proves_nothing():
    """A barge-in's ``interrupt`` landing while the lane thread is inside the primary's
    ``open`` (the wrapper's stream had no inner stream to pass it to yet): the step ends
    there without stepping the primary (a whole step of a model's work, for nothing), the
    stream it opened is closed, and the breaker counts nothing."""
    stepped = []
    engine, primary, fallback, clock = setup([[lambda: stepped.append(1) or b"\x01\x00"]])
    real_open = primary.open
    streams = []

    def open_then_interrupted(request):
        inner = real_open(request)
        streams[-1].interrupt()  # (from the loop thread, as the open returns)
        return inner

    primary.open = open_then_interrupted
    streams.append(engine.open(SynthesisRequest("a")))
    assert streams[-1].step() is None
    assert primary.closed_streams == 1 and not stepped and not fallback.opened
    assert (engine.state, engine.consecutive_failures) == (BreakerState.CLOSED, 0)
