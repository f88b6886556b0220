"""ChatterboxEngine on tiny random-weight models loaded through mlx-audio's real loader:
Chatterbox and Chatterbox-Turbo.

A 0.2 s reference (Turbo: its built-in 0.2 s voice), 4 speech tokens and one flow-matching
step (Turbo: its fixed 2, without guidance: the same cost) keep a synthesis to seconds on
mlx-cpu (see ``tests/tiny_models/chatterbox.py`` for where the time goes).
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from engines.base import EngineError, SynthesisRequest, TtsEngine
from tests.tiny_models.chatterbox import TINY_ENGINE_OPTIONS
from tests.tiny_models.chatterbox_turbo import TINY_TURBO_OPTIONS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["chatterbox", "chatterbox_turbo"])
def engine(request, short_reference_wav):
    """Chatterbox cloned from the 0.2 s reference; Chatterbox-Turbo with its built-in voice
    (it refuses a reference of 5 s or less).

    ``load``'s warm-up is left out: it is one more synthesis through the same ``generate``
    every test here makes (~10 s of CPU for Turbo's), and ``tests/test_mlx_conformance.py``
    loads both kinds with it. Once loaded, the model refuses to encode a reference again, so
    every synthesis in this module checks that the voice conditioning is reused, not
    recomputed per sentence."""
    import engines.mlx_common
    from engines.chatterbox import ChatterboxEngine

    if request.param == "chatterbox":
        model = request.getfixturevalue("tiny_chatterbox")
        eng = ChatterboxEngine(
            str(model), ref_audio=str(short_reference_wav), **TINY_ENGINE_OPTIONS
        )
    else:
        model = request.getfixturevalue("tiny_chatterbox_turbo")
        eng = ChatterboxEngine(str(model), **TINY_TURBO_OPTIONS)

    def recompute(*args, **kwargs):
        raise AssertionError("reference re-encoded per sentence")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engines.mlx_common, "warm_up", lambda engine, text: 0.0)
        eng.load()
        patch.setattr(eng._model, "prepare_conditionals", recompute)
        assert eng.turbo == (request.param == "chatterbox_turbo")
        yield eng
    eng.close()


def refused_at_load(engine) -> EngineError:
    """The ``engine_failed`` error ``engine.load()`` raises (the engine closed after)."""
    try:
        with pytest.raises(EngineError) as err:
            engine.load()
    finally:
        engine.close()
    assert err.value.code == "engine_failed"
    return err.value


def test_whole_segment_in_one_step_then_none(engine):
    assert isinstance(engine, TtsEngine)
    assert (engine.lane, engine.streams) == ("gpu", False)
    assert engine.voices() == [engine.voice_name]
    stream = engine.open(SynthesisRequest("Hello there.", seed=3))
    pcm = stream.step()
    assert pcm and len(pcm) % 2 == 0
    assert np.frombuffer(pcm, "<i2").any()
    assert stream.step() is None
    stream.close()


def test_the_same_seed_gives_the_same_audio(engine):
    first = engine.open(SynthesisRequest("Hi.", seed=9)).step()
    assert first and engine.open(SynthesisRequest("Hi.", seed=9)).step() == first


def test_a_sentence_prints_nothing_and_warns_nothing(engine, capfd, caplog):
    """Turbo's ``generate`` logged "CFG, min_p and exaggeration are not supported" (the
    engine passed Chatterbox's 0.5 for both), printed "S3 Token -> Mel Inference..." and
    drew two tqdm bars on stderr, on every sentence: an operator's log, per sentence."""
    capfd.readouterr()
    with caplog.at_level(logging.INFO):
        assert engine.open(SynthesisRequest("Hi.", seed=6)).step()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO] == []
    assert capfd.readouterr() == ("", "")


def test_closed_before_its_step_a_stream_makes_nothing(engine, monkeypatch):
    def generate(*args, **kwargs):
        raise AssertionError("a closed stream generated")

    monkeypatch.setattr(engine._model, "generate", generate)
    stream = engine.open(SynthesisRequest("Hi."))
    stream.close()
    assert stream.step() is None


def test_runaway_and_unknown_voice(engine, monkeypatch):
    monkeypatch.setattr(engine, "runaway_min_s", 0.05)
    monkeypatch.setattr(engine, "runaway_factor", 0.0)
    with pytest.raises(EngineError) as err:
        engine.open(SynthesisRequest("Hi.", seed=5)).step()
    assert err.value.code == "engine_runaway"
    with pytest.raises(EngineError) as err:
        engine.open(SynthesisRequest("Hi.", voice="someone"))
    assert err.value.code == "voice_unknown"


@pytest.mark.parametrize("engine", ["chatterbox"], indirect=True)  # (Turbo refuses flow_steps)
def test_flow_steps_reach_the_solver(engine, monkeypatch):
    cfm = engine._model.s3gen.flow.decoder
    solve = cfm.solve_euler
    spans = []

    def spy(x, t_span, **kwargs):
        spans.append(t_span.shape[0])
        return solve(x, t_span, **kwargs)

    monkeypatch.setattr(cfm, "solve_euler", spy)
    assert engine.open(SynthesisRequest("Hi.", seed=4, options={"max_tokens": 3})).step()
    assert spans == [TINY_ENGINE_OPTIONS["flow_steps"] + 1]  # n Euler steps span n+1 times


@pytest.mark.parametrize("engine", ["chatterbox"], indirect=True)
def test_unless_set_max_tokens_is_a_second_of_speech_tokens_past_the_runaway_budget(
    engine, monkeypatch
):
    """The production default (``max_tokens`` unset; every other test here sets the tiny
    model's 4) and a request without a seed: T3 may write one second of speech tokens
    past the runaway budget, so a sentence that runs away is stopped and refused, not
    generated on. (The spy passes the tiny model's 4 on: 100 random-weight tokens would
    take minutes of CPU.)"""
    monkeypatch.setattr(engine, "max_tokens", None)
    generate = engine._model.generate
    asked: list[int] = []

    def spy(text, **kwargs):
        asked.append(kwargs["max_tokens"])
        return generate(text, **{**kwargs, "max_tokens": TINY_ENGINE_OPTIONS["max_tokens"]})

    monkeypatch.setattr(engine._model, "generate", spy)
    text = "Hello there, how are you today?"
    assert engine.open(SynthesisRequest(text)).step()
    budget_s = engine.runaway_budget_s(text)
    assert budget_s >= engine.runaway_min_s
    assert asked == [int((budget_s + 1) * 25)]


@pytest.mark.parametrize("engine", ["chatterbox"], indirect=True)
def test_a_second_load_keeps_the_model_and_its_voice(engine):
    """``load`` once loaded does nothing: the voice is not conditioned again (the fixture's
    model refuses that) and the model is the same. ``memory`` reports the process's."""
    model, conds = engine._model, engine._conds
    engine.load()
    assert (engine._model, engine._conds) == (model, conds)
    memory = engine.memory()
    assert memory and all(v is None or (isinstance(v, int) and v >= 0) for v in memory.values())


def test_a_checkpoint_with_no_built_in_voice_and_no_reference_is_refused_at_load(
    tiny_chatterbox, monkeypatch
):
    """A Chatterbox checkpoint without ``conds.safetensors`` (the tiny one has none) and no
    ``ref_audio``: nothing to speak with, said at load with what to do."""
    import engines.mlx_common
    from engines.chatterbox import ChatterboxEngine

    monkeypatch.setattr(engines.mlx_common, "warm_up", lambda engine, text: 0.0)
    engine = ChatterboxEngine(str(tiny_chatterbox), **TINY_ENGINE_OPTIONS)
    error = refused_at_load(engine)
    assert error.message == f"{tiny_chatterbox} has no built-in voice: give ref_audio"


def test_a_turbo_checkpoint_whose_config_names_no_model_type_is_still_turbo(
    tiny_chatterbox_turbo, tmp_path, monkeypatch
):
    """A Turbo directory whose ``config.json`` has no ``model_type``: mlx-audio picks the
    model by the directory's name, and the engine tells Turbo by the class it got. Its
    settings are then checked as for a config that says Turbo (``flow_steps`` refused), and
    without them it loads as Turbo (which takes no ``conds=`` in ``generate``)."""
    import shutil

    import engines.mlx_common
    from engines.chatterbox import ChatterboxEngine

    monkeypatch.setattr(engines.mlx_common, "warm_up", lambda engine, text: 0.0)
    model = tmp_path / "chatterbox-turbo"
    shutil.copytree(tiny_chatterbox_turbo, model)
    config = json.loads((model / "config.json").read_text())
    del config["model_type"]
    (model / "config.json").write_text(json.dumps(config))

    engine = ChatterboxEngine(str(model), **{**TINY_TURBO_OPTIONS, "flow_steps": 2})
    error = refused_at_load(engine)
    assert error.message.startswith(f"{model} is a Chatterbox-Turbo model: flow_steps ")
    engine = ChatterboxEngine(str(model), **TINY_TURBO_OPTIONS)
    try:
        engine.load()
        assert engine.turbo and engine._conds is engine._model._conds
    finally:
        engine.close()


def test_a_checkpoint_without_its_text_tokenizer_is_refused_at_load(
    tiny_chatterbox, short_reference_wav, tmp_path, monkeypatch
):
    """A download that left ``tokenizer.json`` out: mlx-audio loads the model with no text
    tokenizer (and says why on stdout, which goes to the log), so every sentence would fail;
    the engine refuses it at load instead."""
    import shutil

    import engines.mlx_common
    from engines.chatterbox import ChatterboxEngine

    monkeypatch.setattr(engines.mlx_common, "warm_up", lambda engine, text: 0.0)
    model = tmp_path / "chatterbox"
    shutil.copytree(tiny_chatterbox, model)
    (model / "tokenizer.json").unlink()
    engine = ChatterboxEngine(str(model), ref_audio=str(short_reference_wav),
                              **TINY_ENGINE_OPTIONS)
    error = refused_at_load(engine)
    # (this mlx-audio loads it without one: "Chatterbox text tokenizer did not load"; a
    # later one that raises instead is refused by the loader, naming the directory too)
    assert str(model) in error.message and "tokenizer" in error.message.lower()


def test_a_reference_too_short_to_condition_on_is_refused_at_load(tiny_chatterbox, tmp_path,
                                                                  monkeypatch):
    """A 20 ms ``ref_audio`` reads, but the voice cannot be conditioned on it: refused at
    load naming the file and the library's reason, not a traceback."""
    import engines.mlx_common
    from engines.chatterbox import ChatterboxEngine
    from tests.tiny_models.qwen3 import write_reference_wav

    monkeypatch.setattr(engines.mlx_common, "warm_up", lambda engine, text: 0.0)
    ref = write_reference_wav(tmp_path / "blip.wav", seconds=0.02)
    engine = ChatterboxEngine(str(tiny_chatterbox), ref_audio=str(ref), **TINY_ENGINE_OPTIONS)
    error = refused_at_load(engine)
    assert error.message.startswith(f"reference audio {ref}: "), error.message


@pytest.mark.parametrize("kind", ["missing", "not audio"])
def test_a_reference_that_cannot_be_read_is_refused_before_the_model_loads(kind, tmp_path):
    """A ``ref_audio`` path mistyped, or a file that is no audio: refused at load naming
    the file, before the model (here a directory with only its config) is loaded."""
    pytest.importorskip("mlx_audio", reason="needs the mlx extra (mlx-audio)")
    from engines.chatterbox import ChatterboxEngine

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "chatterbox"}))
    ref = tmp_path / "voice.wav"
    if kind == "not audio":
        ref.write_text("not a WAV file")
    with pytest.raises(EngineError) as err:
        ChatterboxEngine(str(tmp_path), ref_audio=str(ref)).load()
    assert err.value.code == "engine_failed"
    assert err.value.message.startswith(f"reference audio {ref}: "), err.value.message


@pytest.fixture
def turbo_t3_calls(engine, monkeypatch):
    """The keyword arguments of each Turbo T3 generation (Turbo's engine only: the tests
    asking for it take ``engine`` as ``TURBO_ONLY``)."""
    assert engine.turbo
    t3 = engine._model.t3
    infer = t3.inference_turbo
    calls: list[dict] = []

    def spy(**kwargs):
        calls.append(kwargs)
        return infer(**kwargs)

    monkeypatch.setattr(t3, "inference_turbo", spy)
    return calls


TURBO_ONLY = pytest.mark.parametrize("engine", ["chatterbox_turbo"], indirect=True)


@TURBO_ONLY
def test_turbo_runs_t3_once_a_segment_with_its_own_top_p_unless_asked(engine, turbo_t3_calls):
    """Turbo's ``generate`` split a text at each sentence end (into chunks of max_tokens // 2
    characters) and gave every chunk the whole ``max_tokens``: a segment of three short
    sentences ran T3 three times, each up to the runaway budget. And the engine passed
    Chatterbox's default top_p 1.0 to Turbo, whose own is 0.95. (One test: each synthesis
    costs ~10 s of CPU, and both are read off the same T3 calls.)"""
    assert engine.open(SynthesisRequest("Hi. Yes. No.", seed=8)).step()
    assert engine.open(SynthesisRequest("Hi. Yes. No.", seed=8, top_p=0.5)).step()
    cap = TINY_TURBO_OPTIONS["max_tokens"]
    assert [(c["max_gen_len"], c["top_p"]) for c in turbo_t3_calls] == [(cap, 0.95), (cap, 0.5)]


@pytest.fixture
def reference_reads(monkeypatch):
    """The paths read through mlx-audio's ``load_audio``: the engine's call and those of
    both kinds' ``prepare_conditionals`` (each module took its own name for it)."""
    import mlx_audio.utils
    from mlx_audio.tts.models.chatterbox import chatterbox
    from mlx_audio.tts.models.chatterbox_turbo import chatterbox_turbo

    load_audio = mlx_audio.utils.load_audio
    reads: list[str] = []

    def spy(audio, *args, **kwargs):
        if isinstance(audio, str):
            reads.append(audio)
        return load_audio(audio, *args, **kwargs)

    for module in (mlx_audio.utils, chatterbox, chatterbox_turbo):
        monkeypatch.setattr(module, "load_audio", spy)
    return reads


@pytest.mark.timeout(900)  # a load and a conditioning on the 5.2 s reference: ~15 s of CPU
def test_turbo_clones_a_reference_read_once_and_says_once_what_it_does_not_use(
    tiny_chatterbox_turbo, turbo_reference_wav, reference_reads, caplog, monkeypatch
):
    """mlx-audio's Turbo ``prepare_conditionals`` returns None and keeps the voice on the
    model: the engine held None as its voice. The reference was read twice, for the engine's
    5 s check and again by the conditioning. ``load``'s warm-up is left out here: one
    sentence spoken over the 5.2 s reference took 210 s of the tiny model's full-size
    S3Gen and vocoder on a quiet CI machine (its 260 mel frames, every sentence), and it is
    the same ``generate`` the built-in voice's tests speak with."""
    import engines.mlx_common
    from engines.chatterbox import ChatterboxEngine

    monkeypatch.setattr(engines.mlx_common, "warm_up", lambda engine, text: 0.0)

    engine = ChatterboxEngine(
        str(tiny_chatterbox_turbo),
        ref_audio=str(turbo_reference_wav),
        exaggeration=0.7,
        **TINY_TURBO_OPTIONS,
    )
    with caplog.at_level(logging.WARNING):
        engine.load()
    try:
        assert engine.voices() == ["turbo"]
        assert engine._conds is not None and engine._conds is engine._model._conds
        # S3Gen's prompt is the reference's mel frames (50 a second), not the built-in 0.2 s
        assert engine._conds.gen["prompt_feat"].shape[1] == pytest.approx(5.2 * 50, abs=2)
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1 and "exaggeration = 0.7 not used" in warnings[0]
        assert reference_reads == [str(turbo_reference_wav)]
    finally:
        engine.close()


@pytest.mark.parametrize("kind", ["chatterbox", "chatterbox_turbo"])
def test_cloning_without_the_speech_tokenizer_is_refused_at_load(
    kind, request, tmp_path, monkeypatch
):
    """mlx-audio's loader only warned when the S3 speech tokenizer's weights were not in the
    Hugging Face cache (Turbo: not there; Chatterbox: a cached snapshot without its
    ``model.safetensors``) and went on with random ones: the voice cloned from ``ref_audio``
    was another one, with no error. Here the cache holds the snapshot's ``config.json``
    only; the refusal names the repo, the file and the cache looked in."""
    import huggingface_hub.constants as hf_constants

    import engines.mlx_common
    from engines.chatterbox import ChatterboxEngine

    plain = kind == "chatterbox"
    model = request.getfixturevalue("tiny_chatterbox" if plain else "tiny_chatterbox_turbo")
    ref = request.getfixturevalue("short_reference_wav" if plain else "turbo_reference_wav")
    repo = tmp_path / "models--mlx-community--S3TokenizerV2"
    (repo / "snapshots" / ("0" * 40)).mkdir(parents=True)
    (repo / "snapshots" / ("0" * 40) / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path))
    # (were it to load, the warm-up over Turbo's 5.2 s reference would take minutes)
    monkeypatch.setattr(engines.mlx_common, "warm_up", lambda engine, text: 0.0)

    options = TINY_ENGINE_OPTIONS if plain else TINY_TURBO_OPTIONS
    engine = ChatterboxEngine(str(model), ref_audio=str(ref), **options)
    error = refused_at_load(engine)
    message = str(error)
    assert "mlx-community/S3TokenizerV2 (model.safetensors)" in message, message
    assert f"Hugging Face cache {tmp_path}" in message, message
    assert "hf download mlx-community/S3TokenizerV2" in message, message


@pytest.fixture
def turbo_config(tmp_path):
    """A directory that says Chatterbox-Turbo: the refusals come before any model loads."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "chatterbox_turbo"}))
    return tmp_path


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"flow_steps": 2}, ["flow_steps", "Chatterbox only"]),
        ({"language": "de"}, ["English only", "'de'"]),
    ],
)
def test_turbo_refuses_at_load_what_it_cannot_do(turbo_config, options, words):
    from engines.chatterbox import ChatterboxEngine

    with pytest.raises(EngineError) as err:
        ChatterboxEngine(str(turbo_config), **options).load()
    assert err.value.code == "engine_failed"
    assert all(w in str(err.value) for w in words), err.value


def test_turbo_refuses_a_short_reference_at_load(turbo_config, short_reference_wav):
    """mlx-audio's Turbo asserts a reference over 5 s ("Audio prompt must be longer than 5
    seconds!", nothing under ``python -O``): refused before the model loads, naming the key,
    the file's length and the length needed."""
    pytest.importorskip("mlx_audio", reason="needs the mlx extra (mlx-audio)")
    from engines.chatterbox import ChatterboxEngine

    with pytest.raises(EngineError) as err:
        ChatterboxEngine(str(turbo_config), ref_audio=str(short_reference_wav)).load()
    assert err.value.code == "engine_failed"
    message = str(err.value)
    assert f"ref_audio {short_reference_wav} is 0.20 s long" in message
    assert "longer than 5 s" in message


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
    assert (engine.ref_audio, engine.voices()) == (str(tmp_path / "assistant.wav"), ["assistant"])
