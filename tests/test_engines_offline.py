"""The offline engines (espeak, synthetic) against the shared conformance suite, plus checks
specific to each engine."""

from __future__ import annotations

import math
import os
import sys
import threading

import numpy as np
import pytest

from engines import espeak, synthetic
from engines.base import OUTPUT_RATE, EngineError, SynthesisRequest
from engines.synthetic import SyntheticEngine
from tests.conformance import check_engine
from tests.hang_guard import HANG_S

# --- synthetic ------------------------------------------------------------------------------


class FakeSleep:
    """Test double for ``time.sleep``: records the modelled cost of each step, waits for nothing."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def test_synthetic_free_conforms() -> None:
    check_engine(lambda: SyntheticEngine(rtf=0, ttfa_ms=0))


def test_synthetic_timed_conforms() -> None:
    check_engine(lambda: SyntheticEngine(rtf=0.01, ttfa_ms=2, step_ms=320))


def test_synthetic_non_streaming_conforms() -> None:
    report = check_engine(lambda: SyntheticEngine(rtf=0, ttfa_ms=0, streams=False))
    assert len(report.full.chunks) == 1


def _run(stream) -> list[bytes]:
    chunks = []
    while (chunk := stream.step()) is not None:
        chunks.append(chunk)
    return chunks


def test_synthetic_timing_model_first_step_ttfa_then_rtf() -> None:
    sleep = FakeSleep()
    engine = SyntheticEngine(rtf=0.5, ttfa_ms=100, step_ms=320, sleep=sleep)
    engine.load()
    text = "x" * 28  # 28 chars at 14 chars/s = 2.0 s of audio
    chunks = _run(engine.open(SynthesisRequest(text=text)))
    sizes = [len(c) // 2 for c in chunks]
    assert sum(sizes) == 2 * OUTPUT_RATE
    assert sizes[:-1] == [7680] * (len(sizes) - 1)  # 320 ms per step
    assert len(sleep.calls) == len(chunks)
    assert sleep.calls[0] == pytest.approx(0.100)
    assert sleep.calls[1:-1] == [pytest.approx(0.5 * 0.320)] * (len(chunks) - 2)
    assert sleep.calls[-1] == pytest.approx(0.5 * sizes[-1] / OUTPUT_RATE)  # pro rata


def test_synthetic_non_streaming_costs_ttfa_plus_whole_segment() -> None:
    sleep = FakeSleep()
    engine = SyntheticEngine(rtf=0.97, ttfa_ms=216, streams=False, sleep=sleep)
    chunks = _run(engine.open(SynthesisRequest(text="y" * 42)))  # 3.0 s
    assert [len(c) // 2 for c in chunks] == [3 * OUTPUT_RATE]
    assert sleep.calls == [pytest.approx(0.216 + 0.97 * 3.0)]


def test_synthetic_free_engine_never_sleeps_and_speed_shortens_audio() -> None:
    sleep = FakeSleep()
    engine = SyntheticEngine(rtf=0, ttfa_ms=0, sleep=sleep)
    normal = b"".join(_run(engine.open(SynthesisRequest(text="z" * 28))))
    fast = b"".join(_run(engine.open(SynthesisRequest(text="z" * 28, speed=2.0))))
    assert sleep.calls == []
    assert len(normal) // 2 == 2 * OUTPUT_RATE
    assert len(fast) // 2 == OUTPUT_RATE


def test_synthetic_defaults_come_from_calibration() -> None:
    import json
    from pathlib import Path

    cal = Path(__file__).resolve().parents[1] / "bench" / "data" / "calibration.json"
    idle = json.loads(cal.read_text())["tts"]["qwen3_0.6b_bf16"]["idle"]
    engine = SyntheticEngine()
    assert (engine.rtf, engine.ttfa_ms, engine.step_ms) == (idle["rtf"], idle["ttfa_ms"], 320)


def test_synthetic_is_deterministic_and_continuous_across_steps() -> None:
    a = SyntheticEngine(rtf=0, ttfa_ms=0, step_ms=50)
    b = SyntheticEngine(rtf=0, ttfa_ms=0, step_ms=320)
    text = "Deterministic audio, whatever the step size."
    pcm_a = b"".join(_run(a.open(SynthesisRequest(text=text))))
    pcm_b = b"".join(_run(b.open(SynthesisRequest(text=text))))
    assert pcm_a == pcm_b  # same signal however it is cut: no seams at chunk boundaries
    other = b"".join(_run(a.open(SynthesisRequest(text=text, voice="low"))))
    assert other != pcm_a


def test_synthetic_prerender_leaves_no_rendering_for_any_text_of_the_voice(monkeypatch) -> None:
    engine = SyntheticEngine(rtf=0, ttfa_ms=0)
    engine.prerender()
    rendered: list[float] = []
    real = synthetic.render_loop
    monkeypatch.setattr(synthetic, "render_loop",
                        lambda f0, syllable: rendered.append(f0) or real(f0, syllable))
    texts = [f"This is sentence number {k} of a long reply." for k in range(60)]
    pitches = {synthetic.text_pitch(synthetic.VOICES["mid"], t) for t in texts}
    assert len(pitches) == synthetic.PITCHES  # the texts use every pitch the voice has
    for text in texts:
        assert _run(engine.open(SynthesisRequest(text=text)))
    assert rendered == []
    _run(engine.open(SynthesisRequest(text=texts[0], voice="low")))  # another voice: not
    assert len(rendered) == 1


def test_synthetic_close_from_another_thread_during_a_step_drops_the_chunk() -> None:
    engine = SyntheticEngine(rtf=0, ttfa_ms=50)
    stream = engine.open(SynthesisRequest(text="Closed while the model works."))

    def sleep_and_get_closed(seconds: float) -> None:
        stream.close()  # what the gateway's canceller does while the lane thread is busy

    engine._sleep = sleep_and_get_closed
    assert stream.step() is None
    assert stream.step() is None


def test_synthetic_fail_rate_fails_steps_mid_sentence_by_seed_until_set_to_0() -> None:
    """bench/soak.py --faults: an engine that crashes at random steps, the same ones for
    the same seed, and stops when told (the soak's recovery check)."""

    def run(engine: SyntheticEngine) -> list[str]:
        said = []
        for i in range(40):
            stream = engine.open(SynthesisRequest(text=f"Sentence {i} takes a few steps."))
            try:
                while stream.step() is not None:
                    said.append("step")
            except EngineError as exc:
                assert exc.code == "engine_failed" and "injected failure" in exc.message
                said.append("failed")
            assert not engine._streams  # (a failed stream is forgotten)
        return said

    first = run(SyntheticEngine(rtf=0, ttfa_ms=0, fail_rate=0.2, fail_seed=3))
    assert first == run(SyntheticEngine(rtf=0, ttfa_ms=0, fail_rate=0.2, fail_seed=3))
    failed = [i for i, x in enumerate(first) if x == "failed"]
    assert failed and any(i and first[i - 1] == "step" for i in failed)  # mid-sentence too
    engine = SyntheticEngine(rtf=0, ttfa_ms=0, fail_rate=1.0, name="synthetic-ane")
    assert run(engine) == ["failed"] * 40 and engine.failures == 40
    with pytest.raises(EngineError) as failure:  # numbered, named: the soak ties each one
        engine.open(SynthesisRequest(text="The 41st.")).step()  # to the error it made
    assert failure.value.message.startswith("synthetic-ane engine: injected failure #41 at "
                                            "step 1 ")
    engine.fail_rate = 0.0
    assert "failed" not in run(engine)
    with pytest.raises(ValueError, match="fail_rate"):
        SyntheticEngine(fail_rate=1.5)


def test_synthetic_rejects_bad_options() -> None:
    with pytest.raises(ValueError):
        SyntheticEngine(lane="tpu")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        SyntheticEngine(step_ms=0)
    engine = SyntheticEngine(rtf=0, ttfa_ms=0)
    with pytest.raises(EngineError) as err:
        engine.open(SynthesisRequest(text="hi", speed=0))
    assert err.value.code == "bad_request"


# --- espeak ---------------------------------------------------------------------------------


def test_espeak_conforms() -> None:
    report = check_engine(lambda: espeak.EspeakEngine())
    assert report.engine_name == "espeak"


def test_espeak_conforms_with_another_voice_and_speed() -> None:
    check_engine(
        lambda: espeak.EspeakEngine(voice="en-gb", step_ms=100),
        request=SynthesisRequest(text="Good evening. It is 9:30 p.m. on the 3rd.", speed=1.3),
    )


@pytest.mark.parametrize("speed", [0.0, -1.0, math.nan])
def test_espeak_refuses_a_speed_that_is_not_positive_and_opens_nothing(speed: float) -> None:
    """No client reaches this (a voice session speaks at 1.0; the HTTP API takes 0.25 to
    4.0): it guards the engine API itself, which bench scripts and peers call directly.
    Without it espeak spoke 0 and -1 at its slowest rate, and NaN raised a ValueError."""
    engine = espeak.EspeakEngine()
    try:
        with pytest.raises(EngineError) as err:
            engine.open(SynthesisRequest(text="hi", speed=speed))
        assert err.value.code == "bad_request"
        assert err.value.message == f"speed must be > 0, got {speed}"
        assert not engine._streams
    finally:
        engine.close()


def test_espeak_voices_include_english_variants_and_others() -> None:
    engine = espeak.EspeakEngine()
    voices = engine.voices()
    assert {"en-us", "en-gb", "fr", "de", "es"} <= set(voices)
    engine.load()
    for voice in ("en-gb", "fr", "en-us+f3"):
        assert _run(engine.open(SynthesisRequest(text="Bonjour hello", voice=voice)))
    for bad in ("klingon", "en-us+nosuchvariant", ""):
        with pytest.raises(EngineError) as err:
            engine.open(SynthesisRequest(text="hi", voice=bad or "+"))
        assert err.value.code == "unknown_voice"


def test_every_espeak_voice_listed_has_its_dictionary(capfd: pytest.CaptureFixture[str]) -> None:
    # the wheel lists fo, kaa and xex without their dictionaries: libespeak-ng printed
    # "Can't read dictionary file" and spelled every word
    engine = espeak.EspeakEngine()
    engine.load()
    capfd.readouterr()
    for voice in engine.voices():
        assert _run(engine.open(SynthesisRequest(text="ok", voice=voice)))
    assert "dictionary" not in capfd.readouterr().err


def test_espeak_resamples_to_24k_seamlessly(monkeypatch: pytest.MonkeyPatch) -> None:
    import soxr

    fed: list[np.ndarray] = []

    class RecordingResampleStream(soxr.ResampleStream):
        """Test double around soxr's stream: records the 22,050 Hz input, then delegates."""

        def resample_chunk(self, x: np.ndarray, last: bool = False) -> np.ndarray:
            fed.append(np.array(x, copy=True))
            return super().resample_chunk(x, last)

    monkeypatch.setattr(espeak.soxr, "ResampleStream", RecordingResampleStream)
    text = "Resampling must not click at the seams between chunks."
    engine = espeak.EspeakEngine(step_ms=20)  # many small steps: many seams
    engine.load()
    fed.clear()  # forget the warm-up
    out = np.frombuffer(b"".join(_run(engine.open(SynthesisRequest(text=text)))), "<i2")
    raw = np.concatenate(fed)
    assert len(fed) > 10  # espeak delivered many buffers, each resampled as it came
    # Length follows the rate change 22,050 -> 24,000 (the resampler's delay is flushed).
    assert abs(len(out) - len(raw) * OUTPUT_RATE / espeak.ESPEAK_RATE) <= 1
    # Same signal as resampling the whole utterance at once: nothing added at the seams.
    whole = soxr.resample(raw, espeak.ESPEAK_RATE, OUTPUT_RATE)
    assert len(whole) == len(out)
    # (a seam click would be hundreds of LSB; rounding to int16 gives a couple)
    assert np.max(np.abs(out.astype(np.int32) - whole.astype(np.int32))) <= 4


@pytest.mark.parametrize(("in_process", "most"), [(True, 5), (False, 40)],
                         ids=["in process", "worker"])
def test_espeak_close_aborts_synthesis_within_one_buffer(in_process: bool, most: int) -> None:
    """In process, the callback sees the stream closed at the next buffer. A worker stops at
    the next buffer after the abort reaches it, but may have run ahead of the reader by what
    the pipe holds (64 KiB: ~29 buffers of 50 ms): out of ~1,300 for the whole text."""
    engine = espeak.EspeakEngine(in_process=in_process)
    engine.load()
    text = "This sentence is long enough to need many buffers of audio. " * 20
    full = engine.open(SynthesisRequest(text=text))
    _run(full)
    assert full.callbacks > 50

    stream = engine.open(SynthesisRequest(text=text))
    real_push = stream._push
    pushes = 0

    def push_then_close(samples: np.ndarray) -> None:
        nonlocal pushes
        pushes += 1
        real_push(samples)
        if pushes == 3:
            stream.close()  # as if the canceller closed it from another thread mid-synthesis

    stream._push = push_then_close
    assert stream.step() is None
    assert stream.callbacks <= most  # espeak stopped, not at the end
    assert stream.step() is None
    engine.close()


def test_espeak_speed_changes_duration() -> None:
    engine = espeak.EspeakEngine()
    engine.load()
    text = "Speed maps onto the espeak rate in words per minute."
    slow = len(b"".join(_run(engine.open(SynthesisRequest(text=text, speed=0.75)))))
    fast = len(b"".join(_run(engine.open(SynthesisRequest(text=text, speed=1.5)))))
    assert fast < slow * 0.7


DETERMINISM_CASES = [
    SynthesisRequest(text="It speaks a second sentence, a little longer."),
    SynthesisRequest(text="Two meetings. The first is at ten.", voice="en-us+f3"),  # breath noise
    SynthesisRequest(text="Bonjour, il est neuf heures.", voice="fr", speed=1.3),
    SynthesisRequest(text="Klatt keeps its own flutter.", voice="en-gb+klatt"),
    SynthesisRequest(text="And its breath from rand.", voice="en-us+Reed"),  # klatt 6, breath
]


def _other_lane(stop: threading.Event, done: threading.Semaphore) -> None:
    """Another engine on another thread: varied texts, every third one closed mid-synthesis
    (as a cancel does), releasing ``done`` after each."""
    engine = espeak.EspeakEngine(voice="en-gb", step_ms=50)
    engine.load()
    i = 0
    while not stop.is_set():
        i += 1
        text = f"Other lane, turn number {i}. " * (1 + i % 4)
        stream = engine.open(SynthesisRequest(text=text))
        if i % 3 == 0:
            push, pushes = stream._push, [0]

            def push_then_close(samples, push=push, pushes=pushes, stream=stream, at=1 + i % 5):
                push(samples)
                pushes[0] += 1
                if pushes[0] == at:
                    stream.close()

            stream._push = push_then_close
        _run(stream)
        done.release()
    engine.close()


@pytest.mark.skipif(sys.platform != "linux", reason="the counters are found in ELF symbols")
def test_espeak_same_text_same_bytes_whatever_ran_before_or_alongside() -> None:
    engine = espeak.EspeakEngine()
    assert engine.deterministic
    engine.load()
    first = [b"".join(_run(engine.open(r))) for r in DETERMINISM_CASES]
    stop, done = threading.Event(), threading.Semaphore(0)
    other = threading.Thread(target=_other_lane, args=(stop, done))
    other.start()
    try:
        for round_ in range(12):
            for request, expected in zip(DETERMINISM_CASES, first, strict=True):
                assert done.acquire(timeout=HANG_S)  # (the other lane synthesised meanwhile)
                assert b"".join(_run(engine.open(request))) == expected, (round_, request)
    finally:
        stop.set()
        other.join(30)
    assert not other.is_alive()


HEAP_SENSITIVE_CASES = [
    SynthesisRequest(text="O João vai visitar a avó em Coimbra.", voice="pt"),
    SynthesisRequest(text="De manager deelt een meeting met het team.", voice="nl"),
    SynthesisRequest(text="The weather is nice today, and we will go for a walk.", voice="as"),
    SynthesisRequest(text="The weather is nice today, and we will go for a walk.", voice="om"),
]
"""Outputs that took soxr's int16 path into heap memory it never initialised: the same
22,050 Hz samples came out of the resampler 1-2 LSB apart on every call."""


@pytest.mark.skipif(sys.platform != "linux", reason="the counters are found in ELF symbols")
def test_espeak_same_bytes_whatever_the_heap_held_before() -> None:
    engine = espeak.EspeakEngine()
    assert engine.deterministic
    engine.load()
    for request in HEAP_SENSITIVE_CASES:
        outputs = set()
        for _ in range(3):
            # leave other bytes in the blocks malloc hands out next, as any other work would
            junk = [os.urandom(size) for size in range(1_000, 70_000, 997)]
            del junk
            outputs.add(b"".join(_run(engine.open(request))))
        distinct = len(outputs)
        assert distinct == 1, (request.voice, request.text)


def test_espeak_without_the_reset_history_moves_a_sentences_length(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Why the reset exists: libespeak-ng's flutter phase outlives a synthesis. (In process,
    where the test can take the reset away: a worker runs the same ``_Library``.)"""
    engine = espeak.EspeakEngine(in_process=True)
    engine.load()
    monkeypatch.setattr(espeak._Library, "reset", lambda self: None)
    request = DETERMINISM_CASES[0]
    lengths = set()
    for i in range(8):
        _run(engine.open(SynthesisRequest(text="A different history. " * (1 + i))))
        lengths.add(len(b"".join(_run(engine.open(request)))))
    assert len(lengths) > 1


def test_espeak_two_engines_on_two_threads_do_not_crash_the_process() -> None:
    """The library is not thread-safe; the process-wide lock must serialise two lanes."""
    results: dict[str, list[int]] = {"en-us": [], "en-gb": []}
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def lane(voice: str) -> None:
        try:
            engine = espeak.EspeakEngine(voice=voice, step_ms=50)
            engine.load()
            start.wait()
            for i in range(5):
                pcm = b"".join(_run(engine.open(SynthesisRequest(text=f"Lane {voice} turn {i}."))))
                results[voice].append(len(pcm))
            engine.close()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=lane, args=(v,)) for v in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert all(len(r) == 5 and min(r) > 0 for r in results.values())


@pytest.mark.parametrize(("step_ms", "sizes", "later_cost"), [
    (None, [7680, 7680, 7680, 960], 0.5 * 0.320),  # the engine's own step
    (80.0, [1920] * 12 + [960], 0.5 * 0.080 + 0.010 * 0.75),  # smaller: pays the overhead
])
def test_synthetic_honours_a_requested_step_and_charges_its_overhead(step_ms, sizes,
                                                                     later_cost) -> None:
    sleep = FakeSleep()
    engine = SyntheticEngine(rtf=0.5, ttfa_ms=100, step_ms=320, step_overhead_ms=10,
                             sleep=sleep)
    chunks = _run(engine.open(SynthesisRequest(text="x" * 14, step_ms=step_ms)))  # 1.0 s
    assert [len(c) // 2 for c in chunks] == sizes
    assert sleep.calls[0] == pytest.approx(0.100)
    assert sleep.calls[1:-1] == [pytest.approx(later_cost)] * (len(chunks) - 2)


@pytest.mark.parametrize(("step_ms", "interval"), [
    (None, 0.32), (80.0, 0.08), (100.0, 0.08), (160.0, 0.16), (10.0, 0.08),
])
def test_qwen3_step_ms_becomes_whole_codec_frames(step_ms, interval) -> None:
    from engines.qwen3 import Qwen3Engine

    engine = Qwen3Engine(model="unused", streaming_interval=0.32)  # nothing loaded
    assert engine.interval_for(SynthesisRequest("x", step_ms=step_ms)) == pytest.approx(interval)


def test_espeak_honours_a_requested_step() -> None:
    engine = espeak.EspeakEngine(step_ms=320)
    engine.load()
    try:
        chunks = _run(engine.open(SynthesisRequest(text="Hello there.", step_ms=80)))
        assert {len(c) // 2 for c in chunks[:-1]} == {1920}
    finally:
        engine.close()


@pytest.mark.parametrize(("text", "given"), [
    ("It's 23°F (-5°C) in Oslo.", "It's 23°F (\u22125°C) in Oslo."),
    ("so x = -1.", "so x = \u22121."),
    ("lows of \u20135°C", "lows of \u22125°C"),
    ("-2°C tonight", "\u22122°C tonight"),
    # a hyphen or dash between digits or after a letter is no sign
    ("On 2024-05-01, 9am-5pm, 10\u201315 km, I-95, 1-800-555-0199, a - 5.",
     "On 2024-05-01, 9am-5pm, 10\u201315 km, I-95, 1-800-555-0199, a - 5."),
])
def test_espeak_is_given_minus_signs_it_says(text, given) -> None:
    assert espeak.espeak_text(text) == given


def test_espeak_is_given_no_more_than_20_dotted_letters_on_a_line() -> None:
    # (more in a row overflow a stack buffer in libespeak-ng: the test below)
    assert espeak.espeak_text("a." * 45) == "a." * 20 + "\n" + "a." * 20 + "\n" + "a." * 5
    assert espeak.espeak_text("x.\u00ad" * 21) == "x." * 20 + "\nx."  # (soft hyphens go)
    ordinary = "The U.S.A. and the U.K., e.g. in 3.5 s, i.e. now... v1.2.3 at 10 a.m."
    assert espeak.espeak_text(ordinary) == ordinary


def test_espeak_is_given_a_space_after_a_hyphen_between_a_mark_and_a_letter():
    # (some voices crash on one where a clause starts: the test below)
    assert espeak.espeak_text('(-a, x. (-i, "-b, \u2460-a, _-a, )-\u3042 and a-b, (-1, 1-a') \
        == '(- a, x. (- i, "- b, \u2460- a, _- a, )- \u3042 and a-b, (\u22121, 1-a'


# letters joined by dots, read by libespeak-ng as abbreviations whose letters it gathers in
# a stack buffer: past ~190 bytes of them it crashed (SIGSEGV or SIGABRT), each of these
DOTTED_LETTERS = ["a." * 300, "\U0001d4b6." * 60, "a.b. " * 120, "a.\u00ad" * 300,
                  ", ".join(["a." * 20] * 12)]


def test_text_that_crashed_libespeak_ng_does_not_crash_the_gateway() -> None:
    """One speech request, or one ``say``, of "a." 200 times killed the gateway (libespeak-
    ng's stack overflow, exit 139), every session with it; so did "(-a" to a Vietnamese
    voice, ")-あ" to a Malayalam one. A process: the crash would take the test run down too."""
    import asyncio

    import httpx
    import orjson
    from websockets.asyncio.client import connect

    from tests.servers import ServeProcess

    async def say_all(port: int) -> list[str]:
        async with connect(f"ws://127.0.0.1:{port}/v1/voice", max_size=None) as ws:
            await ws.recv()  # session.created
            statuses = []
            for text in DOTTED_LETTERS:
                await ws.send(orjson.dumps({"type": "say", "text": text}).decode())
                while not isinstance(m := await ws.recv(), str) or \
                        (event := orjson.loads(m))["type"] != "turn.done":
                    pass
                statuses.append(event["status"])
            return statuses

    # (pacing off: a turn's audio, minutes of spelled letters, comes as fast as it is made)
    with ServeProcess("--port", "0", "--http-port", "0", "--max-lead-ms", "36000000") as gw:
        with httpx.Client(base_url=f"http://127.0.0.1:{gw.http_port}", timeout=HANG_S) as http:
            for text in DOTTED_LETTERS:
                answer = http.post("/v1/audio/speech", json={
                    "input": text, "response_format": "pcm", "stream": False})
                assert answer.status_code == 200 and len(answer.content) > 0
            # voices crashed on a hyphen between a mark and a letter where a clause starts
            for voice, text in [("vi", "(-a"), ("vi-vn-x-south", "Xin chào. (-i"),
                                ("vi", "\u2460-\u0131"), ("ml", ")-\u3042"), ("hi", "(-\u3042")]:
                answer = http.post("/v1/audio/speech", json={
                    "input": text, "voice": voice, "response_format": "pcm", "stream": False})
                assert answer.status_code == 200 and len(answer.content) > 0
            assert asyncio.run(asyncio.wait_for(say_all(gw.port), HANG_S)) == \
                ["completed"] * len(DOTTED_LETTERS)
            assert http.get("/health").status_code == 200


@pytest.mark.parametrize(("text", "english", "other"), [
    ("Highs of 20\u201322\u00b0C, 1 \u2013 2 hrs, 5.25%\u20135.50%, \u20ac5\u2013\u20ac8.",
     "Highs of 20 to 22\u00b0C, 1 to 2 hrs, 5.25% to 5.50%, 5 euros to 8 euros.",
     "Highs of 20\u201322\u00b0C, 1 \u2013 2 hrs, 5.25%\u20135.50%, \u20ac5\u2013\u20ac8."),
    # a minus after a range's dash stays a minus
    ("from \u20135 to \u20132\u00b0C", "from \u22125 to \u22122\u00b0C",
     "from \u22125 to \u22122\u00b0C"),
])
def test_espeak_reads_a_range_as_to_in_english_only(text, english, other) -> None:
    # espeak skipped the dash: "20–22°C" was "twenty twenty-two degrees", a year
    assert espeak.espeak_text(text, english=True) == english
    assert espeak.espeak_text(text) == other




@pytest.mark.parametrize(("text", "without"), [
    ("It is 23°F (-5°C).", "It is 23°F (5°C)."),  # "(-5°C)" was as long as "(5°C)"
    ("Highs of 20\u201322.", "Highs of 20 22."),  # an English voice says "to"
], ids=["minus after a bracket", "range"])
def test_espeak_says_the_word_it_skipped(text, without) -> None:
    engine = espeak.EspeakEngine()
    engine.load()
    try:
        size = {t: len(b"".join(_run(engine.open(SynthesisRequest(text=t)))))
                for t in (text, without)}
    finally:
        engine.close()
    assert size[text] > size[without] * 1.05


def test_espeak_load_after_close_is_refused_and_opens_nothing() -> None:
    """A gateway closed while its lane thread had yet to load the engine (stopped during
    start): the load is refused, as ``open`` is, rather than loading the library for an
    engine that is gone."""
    engine = espeak.EspeakEngine()
    engine.close()
    for call in (engine.load, lambda: engine.open(SynthesisRequest(text="hi"))):
        with pytest.raises(EngineError) as err:
            call()
        assert err.value.code == "engine_closed"
    assert engine._lib is None and not engine._streams


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
def test_espeak_blank_text_gives_no_audio_and_never_calls_espeak(text: str) -> None:
    engine = espeak.EspeakEngine()
    engine.load()
    try:
        stream = engine.open(SynthesisRequest(text=text))
        assert stream.step() is None and stream.callbacks == 0
        assert not engine._streams  # the stream that ended is forgotten
    finally:
        engine.close()


@pytest.mark.parametrize("in_process", [True, False], ids=["in process", "worker"])
def test_espeak_a_failure_inside_its_callback_fails_the_segment_and_spares_the_next(
    monkeypatch: pytest.MonkeyPatch, in_process: bool,
) -> None:
    """An exception in the audio callback (here injected into the int16 rounding: a
    MemoryError would do the same) cannot unwind through libespeak-ng's C frames: the
    callback keeps it, aborts the synthesis and the step raises it as ``engine_failed``
    with the cause chained. The library is left as it was: the next segment speaks. (With a
    worker, the sink runs in the gateway on the worker's buffers: it aborts the worker's
    synthesis, which may have run ahead by a few buffers.)"""
    engine = espeak.EspeakEngine(in_process=in_process)
    engine.load()
    try:
        request = SynthesisRequest(text="This sentence never reaches the listener.")
        whole = b"".join(_run(engine.open(request)))
        real = espeak._pcm16
        calls = 0

        def fail_on_the_second(samples: np.ndarray) -> np.ndarray:
            nonlocal calls
            calls += 1
            if calls == 2:
                raise MemoryError("injected")
            return real(samples)

        monkeypatch.setattr(espeak, "_pcm16", fail_on_the_second)
        stream = engine.open(request)
        with pytest.raises(EngineError) as err:
            stream.step()
        assert err.value.code == "engine_failed"
        assert err.value.message == "espeak callback failed: injected"
        assert isinstance(err.value.__cause__, MemoryError)
        if in_process:
            assert stream.callbacks == 2  # aborted at the failing buffer, not run to the end
        monkeypatch.setattr(espeak, "_pcm16", real)
        assert b"".join(_run(engine.open(request))) == whole
    finally:
        engine.close()


@pytest.mark.skipif(sys.platform != "linux", reason="the wheel's library is ELF on Linux only")
def test_espeak_counters_are_not_reset_in_a_library_whose_symbols_cannot_be_read(
    tmp_path,
) -> None:
    """``deterministic`` is False, and nothing is written into the library, where its
    file names no counters: a stripped build (no ``.symtab``) or a file that is not ELF
    (the wheel's Mach-O on macOS). Read here from a stripped copy and a text file beside
    the loaded library, whose own file does name them."""
    import shutil
    import subprocess

    import espeakng_loader

    real = espeakng_loader.get_library_path()
    with espeak._Library.lock:
        lib = espeak._Library.get().lib
    assert espeak._find_counters(lib, real)  # (the loaded library's own file)
    stripped = tmp_path / "libespeak-ng-stripped.so"
    shutil.copyfile(real, stripped)
    subprocess.run(["strip", "--strip-all", str(stripped)], check=True, timeout=HANG_S)
    assert espeak._elf_symbols(stripped) == {}
    text = tmp_path / "not-elf.dylib"
    text.write_text("not a library")
    for path in (stripped, text, tmp_path / "missing.so"):
        assert espeak._find_counters(lib, path) is None


def test_espeak_a_library_that_cannot_be_loaded_fails_the_load_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A broken install (the wheel's ``libespeak-ng`` missing or for another machine): the
    load fails ``engine_failed`` with the loader's reason, as the engine API promises (a
    bare ``OSError`` otherwise), which the gateway says at start in one line. The
    process's library is set aside for the test (``_Library._instance``) and put back
    after it."""
    import espeakng_loader

    monkeypatch.setattr(espeak._Library, "_instance", None)
    monkeypatch.setattr(espeakng_loader, "get_library_path",
                        lambda: "/nonexistent/libespeak-ng.so.1")
    engine = espeak.EspeakEngine()
    with pytest.raises(EngineError) as err:
        engine.load()
    assert err.value.code == "engine_failed"
    message = err.value.message
    assert message.startswith("cannot load libespeak-ng: ") and (
        "/nonexistent/libespeak-ng.so.1" in message), message
    assert espeak._Library._instance is None and engine._lib is None
