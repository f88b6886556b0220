"""AneEngine's adapter logic against a test double of the ``qwen3_tts_ane`` module."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from engines.ane import AneEngine
from engines.base import EngineError, SynthesisRequest
from tests.conformance import check_engine

CHUNK = 1920  # 80 ms at 24 kHz


def make_double_module(fail_after: int | None = None):
    """Test double of ``qwen3_tts_ane``: a tone in 80 ms chunks, ~70 ms of audio per char."""
    module = types.ModuleType("qwen3_tts_ane")
    state = {"closed_generators": 0, "voices": []}

    class Chunk:
        def __init__(self, pcm: bytes) -> None:
            self.pcm_s16le = pcm

    class Voice:
        def stream(self, text):
            n = max(1, round(len(text) * 0.07 / 0.08))
            t = np.arange(n * CHUNK)
            pcm = (4000 * np.sin(t * 0.06)).astype("<i2").tobytes()
            try:
                for i in range(n):
                    if fail_after is not None and i == fail_after:
                        raise RuntimeError("ANE compute unit error")
                    yield Chunk(pcm[i * CHUNK * 2 : (i + 1) * CHUNK * 2])
            finally:
                state["closed_generators"] += 1

    class Qwen3TTSANE:
        def voice(self, name):
            state["voices"].append(name)
            return Voice()

    module.Qwen3TTSANE = Qwen3TTSANE
    return module, state


@pytest.fixture
def double(monkeypatch):
    module, state = make_double_module()
    monkeypatch.setitem(sys.modules, "qwen3_tts_ane", module)
    return state


def test_conforms_with_the_module_double(double):
    check_engine(lambda: AneEngine(), max_chunk_s=0.1)
    assert double["voices"] == ["Serena"]


def test_missing_module_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "qwen3_tts_ane", None)
    with pytest.raises(EngineError, match="macOS") as err:
        AneEngine().load()
    assert err.value.code == "engine_unavailable"


def test_one_synthesis_at_a_time_and_close_releases_the_generator(double):
    engine = AneEngine()
    engine.load()
    first = engine.open(SynthesisRequest("Hello there, friend."))
    assert len(first.step()) == CHUNK * 2
    with pytest.raises(EngineError) as err:
        engine.open(SynthesisRequest("Another."))
    assert err.value.code == "engine_busy"
    first.close()
    assert double["closed_generators"] == 1
    assert engine.open(SynthesisRequest("Another.")).step()


def test_port_errors_are_mapped(monkeypatch):
    module, _ = make_double_module(fail_after=1)
    monkeypatch.setitem(sys.modules, "qwen3_tts_ane", module)
    engine = AneEngine()
    engine.load()
    stream = engine.open(SynthesisRequest("Hello there, friend."))
    assert stream.step()
    with pytest.raises(EngineError, match="compute unit") as err:
        stream.step()
    assert err.value.code == "engine_failed"
    assert stream.step() is None


async def test_a_gateway_on_the_ane_engine_serves_two_sessions_at_once(double):
    # The port refuses a second open synthesis; interleaving two turns' steps on its lane
    # would fail one of them with engine_busy. Its lane runs whole jobs instead.
    from websockets.asyncio.client import connect

    from gateway.config import load_config
    from gateway.io.server import Gateway
    from tests.wsclient import read_turn, recv_event, send

    gw = Gateway(load_config(server={"port": 0}, llm={"tokens_per_s": 0}),
                 engine=AneEngine())
    await gw.start()
    try:
        url = f"ws://127.0.0.1:{gw.port}/v1/voice"
        async with connect(url) as a, connect(url) as b:
            for ws in (a, b):
                await recv_event(ws, "session.created")
            for ws in (a, b):
                await send(ws, type="say", text="Two sentences for this one. And another here.")
            turns = [await read_turn(ws) for ws in (a, b)]
        assert [t.done["status"] for t in turns] == ["completed", "completed"]
        assert all(t.audio_ms > 0 for t in turns)
        assert gw.metrics.errors["engine_failed"] == 0  # (engine_busy would be told so)
    finally:
        await gw.aclose()
