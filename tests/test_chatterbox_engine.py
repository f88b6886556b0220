"""ChatterboxEngine on a tiny random-weight model loaded through mlx-audio's real loader.

A 0.2 s reference, 4 speech tokens and one flow-matching step keep a synthesis to ~5 s on
mlx-cpu (see ``tests/tiny_models/chatterbox.py`` for where the time goes).
"""

from __future__ import annotations

import numpy as np
import pytest

from engines.base import EngineError, SynthesisRequest, TtsEngine
from tests.tiny_models.chatterbox import TINY_ENGINE_OPTIONS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine(tiny_chatterbox, short_reference_wav):
    from engines.chatterbox import ChatterboxEngine

    eng = ChatterboxEngine(
        str(tiny_chatterbox), ref_audio=str(short_reference_wav), **TINY_ENGINE_OPTIONS
    )
    eng.load()
    yield eng
    eng.close()


def test_whole_segment_in_one_step_then_none(engine, short_reference_wav):
    assert isinstance(engine, TtsEngine)
    assert (engine.lane, engine.streams) == ("gpu", False)
    assert engine.voices() == [short_reference_wav.stem]
    stream = engine.open(SynthesisRequest("Hello there.", seed=3))
    pcm = stream.step()
    assert pcm and len(pcm) % 2 == 0
    assert np.frombuffer(pcm, "<i2").any()
    assert stream.step() is None
    stream.close()


def test_conditioning_is_reused_and_flow_steps_reach_the_solver(engine, monkeypatch):
    def recompute(*args, **kwargs):
        raise AssertionError("reference re-encoded per sentence")

    monkeypatch.setattr(engine._model, "prepare_conditionals", recompute)
    cfm = engine._model.s3gen.flow.decoder
    solve = cfm.solve_euler
    spans = []

    def spy(x, t_span, **kwargs):
        spans.append(t_span.shape[0])
        return solve(x, t_span, **kwargs)

    monkeypatch.setattr(cfm, "solve_euler", spy)
    assert engine.open(SynthesisRequest("Hi.", seed=4, options={"max_tokens": 3})).step()
    assert spans == [TINY_ENGINE_OPTIONS["flow_steps"] + 1]  # n Euler steps span n+1 times


def test_runaway_and_unknown_voice(engine, monkeypatch):
    monkeypatch.setattr(engine, "runaway_min_s", 0.05)
    monkeypatch.setattr(engine, "runaway_factor", 0.0)
    with pytest.raises(EngineError) as err:
        engine.open(SynthesisRequest("Hi.", seed=5)).step()
    assert err.value.code == "engine_runaway"
    with pytest.raises(EngineError) as err:
        engine.open(SynthesisRequest("Hi.", voice="someone"))
    assert err.value.code == "voice_unknown"


@pytest.mark.parametrize("steps", [0, -1, 2.5])
def test_flow_steps_must_be_a_positive_int(steps):
    from engines.chatterbox import ChatterboxEngine

    with pytest.raises(ValueError):
        ChatterboxEngine("unused", flow_steps=steps)


def test_a_reference_wav_may_be_written_from_the_home_directory(tmp_path, monkeypatch):
    """As qwen3's (tests/test_qwen3_engine.py): ``~`` is the home directory, not a folder
    named "~" under the working directory."""
    from engines.chatterbox import ChatterboxEngine

    monkeypatch.setenv("HOME", str(tmp_path))
    engine = ChatterboxEngine("unused", ref_audio="~/assistant.wav")
    assert (engine.ref_audio, engine.voices()) == (str(tmp_path / "assistant.wav"),
                                                  ["assistant"])
