"""The gateway speaking with the production engines: qwen3 (tiny random-weight model through
mlx-audio's real loader) and a primary that fails mid-turn with espeak taking over."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect

from engines.base import EngineError, SynthesisRequest
from engines.registry import create_voice
from engines.synthetic import SyntheticEngine
from gateway.config import load_config
from gateway.io.server import Gateway
from tests.fixtures_mlx import NO_STEP_DEADLINE
from tests.hang_guard import HANG_S
from tests.wsclient import gapless, read_turn, recv_event, send


async def say(gw: Gateway, text: str, **session):
    async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws:
        await recv_event(ws, "session.created")
        await send(ws, type="session.update", session={"max_lead_ms": 30000, **session})
        await recv_event(ws, "session.updated")
        await send(ws, type="say", text=text)
        return await read_turn(ws)


async def tiny_qwen3_gateway(model: Path, voice: str, max_tokens: int, **server: Any) -> Gateway:
    """A started gateway speaking with the tiny qwen3 at ``model``, ``max_tokens`` a
    sentence, without a step deadline (``NO_STEP_DEADLINE``: a busy machine's slow step is
    no hung engine)."""
    gw = Gateway(load_config(server={"port": 0, **server},
                             tts={"engine": "qwen3", "model": str(model), "voice": voice,
                                  "options": {"max_tokens": max_tokens},
                                  "step_timeout_s": NO_STEP_DEADLINE}))
    await gw.start()
    return gw


@pytest.mark.slow
async def test_a_turn_spoken_by_tiny_qwen3(tiny_qwen3_custom_voice):
    gw = await tiny_qwen3_gateway(tiny_qwen3_custom_voice, "aria", 6)
    try:
        result = await say(gw, "Hello there. Second sentence.")
    finally:
        await gw.aclose()
    assert result.done["status"] == "completed"
    assert [s["engine"] for s in result.of("sentence")] == ["qwen3", "qwen3"]
    gapless(result)
    # random weights, capped tokens: a few 320 ms steps of quiet noise, but real samples
    assert result.audio_ms >= 320 and result.audio.any()


@pytest.mark.slow
async def test_the_default_voice_spelt_as_the_model_card_does_is_one_it_lists(
        tiny_qwen3_custom_voice):
    """The public CustomVoice checkpoints key their speakers "serena", "vivian"; their model
    card and mlx-audio's README write "Serena", "Vivian", as examples/hub.toml does. The
    gateway listed "serena" and announced "Serena" as its default, then refused the default
    it announced (``unknown_voice``) on the HTTP API."""
    gw = await tiny_qwen3_gateway(tiny_qwen3_custom_voice, "Serena", 4, http_port=0)
    try:
        # no read timeout (httpx's is 5 s): the tiny model's speech took longer on a busy
        # machine; a hang is pytest-timeout's
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gw.http_port}",
                                     timeout=None) as http:
            voices = (await http.get("/v1/audio/voices")).json()
            spoken = await http.post("/v1/audio/speech", json={
                "input": "Hi.", "voice": voices["default"], "response_format": "pcm"})
    finally:
        await gw.aclose()
    assert spoken.status_code == 200 and spoken.content
    assert voices["default"] == "serena" in [v["id"] for v in voices["data"]]


async def test_a_configured_voice_in_other_letter_case_is_shown_as_listed():
    """espeak takes ``--voice En-GB`` (its names are matched in any case), but the gateway
    announced "En-GB" as the default of ``/v1/audio/voices`` and in ``session.created``:
    a default not in its own list, which a client that checks against the list refuses."""
    gw = Gateway(load_config(server={"port": 0, "http_port": 0}, tts={"voice": "En-GB"}))
    await gw.start()
    try:
        async with httpx.AsyncClient(timeout=HANG_S,
                                     base_url=f"http://127.0.0.1:{gw.http_port}") as http:
            voices = (await http.get("/v1/audio/voices")).json()
        async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws:
            created = await recv_event(ws, "session.created")
    finally:
        await gw.aclose()
    assert voices["default"] == "en-gb" in [v["id"] for v in voices["data"]]
    assert created["session"]["voice"] == "en-gb"


@pytest.mark.parametrize(("voice", "set_aside"), [("vivian", True), ("en-gb", False)])
async def test_a_voice_the_fallback_lacks_is_set_aside_with_a_line_that_says_why(
        caplog, voice, set_aside):
    """qwen3 did not load and espeak speaks: ``--voice vivian`` went unused with no line of
    its own (the banner's "voice en-us" was the only trace); a voice espeak has is kept."""
    config = load_config(server={"port": 0, "http_port": 0},
                         tts={"engine": "qwen3", "model": "/nonexistent/qwen3-model",
                              "voice": voice, "fallback": "espeak"})
    gw = Gateway(config)
    with caplog.at_level("WARNING", logger="gateway"):
        await gw.start()
    try:
        async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws:
            created = await recv_event(ws, "session.created")
    finally:
        await gw.aclose()
    lines = [r.getMessage() for r in caplog.records if "set aside" in r.getMessage()]
    if not set_aside:
        assert lines == [] and created["session"]["voice"] == "en-gb"
        return
    assert created["session"]["voice"] is None  # (the engine's default)
    assert lines == ["tts.voice 'vivian' is set aside: espeak has no such voice (it speaks "
                     "because qwen3 failed to load: model directory "
                     "'/nonexistent/qwen3-model' does not exist); sessions and requests "
                     "without a voice get en-us"]


class FailingSynthetic(SyntheticEngine):
    """TEST DOUBLE: the synthetic engine, made to fail on the segments it is told to."""

    name = "flaky"

    def __init__(self, fail_on: str, **options) -> None:
        super().__init__(**options)
        self.fail_on = fail_on

    def open(self, request: SynthesisRequest):
        stream = super().open(request)
        if self.fail_on not in request.text:
            return stream
        steps = 0
        real_step = stream.step

        def step():
            nonlocal steps
            steps += 1
            if steps > 1:  # one chunk of audio, then the "model" breaks mid-sentence
                raise EngineError("engine_failed", "injected failure")
            return real_step()

        stream.step = step
        return stream


async def test_primary_failing_mid_turn_is_finished_by_the_fallback():
    from engines.espeak import EspeakEngine
    from engines.fallback import FallbackEngine

    primary = FailingSynthetic("Second", rtf=0, ttfa_ms=0, lane="cpu", step_ms=80)
    # (a first chunk slower than first_chunk_timeout_s counts as a failure too, and one
    # opens this breaker: not the 1 s default, which a starved machine may pass)
    engine = FallbackEngine(primary, EspeakEngine(), breaker_failures=1, breaker_reset_s=600,
                            first_chunk_timeout_s=3600)
    gw = Gateway(load_config(server={"port": 0}), engine=engine)
    await gw.start()
    try:
        result = await say(gw, "First sentence here. Second sentence breaks. Third one is fine.")
    finally:
        await gw.aclose()
    assert result.done["status"] == "completed"
    engines = [s["engine"] for s in result.of("sentence")]
    # sentence 2 stops where the primary failed (no word said twice); the breaker opens and
    # the fallback speaks the rest
    assert engines == ["flaky", "flaky", "espeak"]
    assert result.done["metrics"]["engines"] == ["flaky", "espeak"]
    per_sentence = {e["index"]: e["audio_ms"] for e in result.of("sentence.done")}
    assert per_sentence[1] == 80  # the one chunk the primary made before failing
    gapless(result)
    counters = engine.counters()
    assert (counters["truncations"], counters["breaker_opens"]) == (1, 1)


def test_create_voice_wraps_the_fallback_by_name():
    voice = create_voice("synthetic", {"rtf": 0}, "espeak", {}, {"breaker_failures": 2})
    assert voice.name == "synthetic+espeak" and voice.lane == "gpu"


@pytest.mark.parametrize(("behind_streams", "longest"), [(False, 150), (True, 400)])
async def test_live_segments_are_short_when_a_voice_may_speak_one_in_one_step(
        behind_streams, longest):
    """Behind chatterbox (one step per segment), a live turn's 400-character sentence held
    the lane, and its listener, for the whole of it: sessions get 150 by default, as the
    HTTP API's requests do, and see it in ``session.created``."""
    from engines.fallback import FallbackEngine

    fast = {"rtf": 0, "ttfa_ms": 0, "lane": "cpu", "chars_per_second": 1000}  # 1 s of audio
    primary = SyntheticEngine(**fast)
    behind = SyntheticEngine(**fast, streams=behind_streams)
    gw = Gateway(load_config(server={"port": 0}), engine=FallbackEngine(primary, behind))
    await gw.start()
    clause = "this clause goes on for a while, "
    text = "One very long sentence, " + clause * 30 + "and then it ends."
    try:
        async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws:
            created = await recv_event(ws, "session.created")
            await send(ws, type="session.update", session={"max_lead_ms": 30000})
            await recv_event(ws, "session.updated")
            await send(ws, type="say", text=text)
            result = await read_turn(ws)
    finally:
        await gw.aclose()
    assert created["session"]["segmenter"]["max_chars"] == longest
    lengths = [len(s["text"]) for s in result.of("sentence")]
    assert max(lengths) <= longest < max(lengths) + len(clause) + 1  # cut near the bound
    assert " ".join(s["text"] for s in result.of("sentence")) == text  # all of it, once
