"""Qwen3Engine on tiny random-weight models loaded through mlx-audio's real loader."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from engines.base import EngineError, SynthesisRequest, SynthesisStream, TtsEngine

pytestmark = pytest.mark.slow

CHUNK_BYTES = 7680 * 2  # 4 codec frames at 12.5 Hz -> 320 ms at 24 kHz, PCM16


@pytest.fixture(scope="module")
def cv_engine(tiny_qwen3_custom_voice):
    from engines.qwen3 import Qwen3Engine

    engine = Qwen3Engine(str(tiny_qwen3_custom_voice), voice="aria", max_tokens=8)
    engine.load()
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def clone_engine(tiny_qwen3_base, reference_wav):
    from engines.qwen3 import Qwen3Engine

    engine = Qwen3Engine(str(tiny_qwen3_base), ref_audio=str(reference_wav), max_tokens=4)
    engine.load()
    yield engine
    engine.close()


def run(stream: SynthesisStream) -> list[bytes]:
    chunks = []
    while (chunk := stream.step()) is not None:
        chunks.append(chunk)
    return chunks


def test_loading_prints_nothing_and_logs_what_the_libraries_said(tiny_qwen3_custom_voice,
                                                                 capsys, caplog):
    """mlx-audio prints "Loaded speech tokenizer from ..." and transformers warns that a
    ``qwen3_tts`` config "can yield errors" on every start: to the log at DEBUG instead."""
    import logging

    from engines.qwen3 import Qwen3Engine

    warned: list[logging.LogRecord] = []
    transformers_log = logging.getLogger("transformers")  # (its own handler, no propagation)
    handler = logging.Handler()
    handler.emit = warned.append  # type: ignore[method-assign]
    transformers_log.addHandler(handler)
    engine = Qwen3Engine(str(tiny_qwen3_custom_voice), voice="aria", max_tokens=4)
    try:
        with caplog.at_level(logging.DEBUG, logger="engines"):
            engine.load()
    finally:
        transformers_log.removeHandler(handler)
        engine.close()
    assert capsys.readouterr().out == ""
    assert not [r.getMessage() for r in warned if r.levelno >= logging.WARNING]
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert f"Loaded speech tokenizer from {tiny_qwen3_custom_voice / 'speech_tokenizer'}" \
        in debug
    assert any("model of type `qwen3_tts`" in line for line in debug)


def test_is_a_tts_engine_on_the_gpu_lane(cv_engine):
    assert isinstance(cv_engine, TtsEngine)
    assert (cv_engine.lane, cv_engine.streams) == ("gpu", True)
    assert cv_engine.voices() == ["aria", "bram", "serena"]
    assert cv_engine.warmup_s is not None


def test_streams_320_ms_pcm16_chunks_then_none(cv_engine):
    stream = cv_engine.open(SynthesisRequest("Hello there.", seed=1))
    chunks = run(stream)
    assert [len(c) for c in chunks] == [CHUNK_BYTES, CHUNK_BYTES]  # max_tokens=8
    assert stream.step() is None
    stream.close()
    stream.close()
    assert any(np.frombuffer(c, "<i2").any() for c in chunks)


def test_same_seed_same_audio_other_seed_other_audio(cv_engine):
    a = run(cv_engine.open(SynthesisRequest("Hi.", seed=7, options={"max_tokens": 4})))
    b = run(cv_engine.open(SynthesisRequest("Hi.", seed=7, options={"max_tokens": 4})))
    c = run(cv_engine.open(SynthesisRequest("Hi.", seed=8, options={"max_tokens": 4})))
    assert a == b
    assert a != c


def test_other_builtin_speaker_and_unknown_voice(cv_engine):
    assert (
        len(run(cv_engine.open(SynthesisRequest("Hi.", voice="bram", options={"max_tokens": 4}))))
        == 1
    )
    with pytest.raises(EngineError) as err:
        cv_engine.open(SynthesisRequest("Hi.", voice="nobody"))
    assert err.value.code == "voice_unknown"


def test_close_mid_stream_stops_at_the_next_step(cv_engine):
    stream = cv_engine.open(SynthesisRequest("Hello there."))
    assert len(stream.step()) == CHUNK_BYTES
    stream.close()
    assert stream.step() is None


def decoder_state(engine) -> list:
    """What mlx-audio's codec decoder holds of a stream: conv tails and its KV cache."""
    modules = dict(engine._model.speech_tokenizer.decoder.named_modules())
    held = [getattr(m, a, None) for m in modules.values() if hasattr(m, "reset_state")
            for a in ("_buffer", "_overflow")]
    held.append(getattr(modules[""], "_transformer_cache", None))
    return [x for x in held if x is not None]


def test_interleaved_streams_each_sound_as_alone(cv_engine):
    # The gpu lane interleaves the steps of two sessions' streams on the one model. Greedy
    # sampling: only state the two streams share could make them differ from alone.
    def request(text: str, voice: str) -> SynthesisRequest:
        return SynthesisRequest(text, voice=voice, temperature=0.0, step_ms=80,
                                options={"max_tokens": 4})

    a = request("Hello there, how are you today?", "aria")
    b = request("The quick brown fox jumps over the lazy dog.", "bram")
    alone = run(cv_engine.open(a)), run(cv_engine.open(b))
    streams = cv_engine.open(a), cv_engine.open(b)
    together: tuple[list[bytes], list[bytes]] = ([], [])
    for _ in range(5):  # a step of one, a step of the other (then None twice)
        for stream, chunks in zip(streams, together, strict=True):
            if (chunk := stream.step()) is not None:
                chunks.append(chunk)
    assert [len(c) for c in alone[0]] == [1920 * 2] * 4
    assert together == alone


def test_a_seed_gives_the_same_audio_when_other_streams_step_between(cv_engine):
    # The streams share MLX's one random generator: a seed set once at the start did not
    # survive another stream sampling between two steps (different audio for one seed).
    def request(text: str, seed: int | None) -> SynthesisRequest:
        return SynthesisRequest(text, seed=seed, temperature=1.0, step_ms=80,
                                options={"max_tokens": 4})

    seeded = request("Hello there, how are you today?", 7)
    alone = run(cv_engine.open(seeded))
    streams = cv_engine.open(seeded), cv_engine.open(request("Another sentence.", None))
    together: list[bytes] = []
    for _ in range(5):
        if (chunk := streams[0].step()) is not None:
            together.append(chunk)
        streams[1].step()
    assert len(alone) == 4 and together == alone


@pytest.mark.parametrize("seed", [-1, 2**64, 10**30])
def test_any_integer_is_a_seed(cv_engine, seed):
    # MLX takes 0 to 2**64 - 1 only: another integer (the HTTP API lets any through) failed
    # the synthesis as an engine failure
    a = run(cv_engine.open(SynthesisRequest("Hi.", seed=seed, options={"max_tokens": 4})))
    assert a == run(cv_engine.open(SynthesisRequest("Hi.", seed=seed,
                                                    options={"max_tokens": 4})))


def test_a_stream_closed_mid_sentence_leaves_nothing_on_the_decoder(cv_engine):
    # A barge-in closes a stream after a step. mlx-audio resets the decoder's streaming state
    # only at the end of a generation, and its tails keep whole chunk tensors alive.
    stream = cv_engine.open(SynthesisRequest("Hello there.", options={"max_tokens": 8}))
    assert stream.step() and decoder_state(cv_engine)
    stream.close()
    assert decoder_state(cv_engine) == []
    # nor what a stream parked while another stepped
    sa = cv_engine.open(SynthesisRequest("Hello there.", options={"max_tokens": 8}))
    sb = cv_engine.open(SynthesisRequest("How are you?", options={"max_tokens": 8}))
    assert sa.step() and sb.step()
    sa.close()
    sb.close()
    assert decoder_state(cv_engine) == []
    assert getattr(sa, "_decoder_state", None) is None


def test_the_codec_decoder_attends_to_its_window_of_frames_only(cv_engine):
    # Qwen3-TTS's codec decodes with sliding-window attention (72 frames, 5.76 s, in the
    # public checkpoints); mlx-audio ignored the window: every frame of a long sentence
    # attended to all the frames before it. Two code sequences that differ in their first
    # frame only: past the window (and the convolutions' few frames) the audio is the same.
    import mlx.core as mx

    decoder = dict(cv_engine._model.speech_tokenizer.decoder.named_modules())[""]
    window = decoder.pre_transformer.config.sliding_window
    frames = 2 * window + 8
    mx.random.seed(3)
    codes = mx.random.randint(1, 2048, (1, 4, frames))
    other = mx.concatenate([mx.random.randint(1, 2048, (1, 4, 1)), codes[..., 1:]], axis=-1)

    def audio(c):
        decoder.reset_streaming_state()
        wav = [np.array(decoder.streaming_step(c[..., i:i + 4]))[0, 0]
               for i in range(0, frames, 4)]
        decoder.reset_streaming_state()
        return np.concatenate(wav).reshape(frames, 1920)

    a, b = audio(codes), audio(other)
    assert not np.array_equal(a[0], b[0])
    assert np.array_equal(a[2 * window:], b[2 * window:])


def held_by_streams(engine, count: int) -> tuple[int, int]:
    """MLX memory held by ``count`` open streams, each stepped twice in turn (all but the
    last then parked while another stepped), and what is still held once they are closed
    (one stepped once more, as the lane does with a finished sentence; the rest cancelled),
    over what was held before they opened."""
    import mlx.core as mx

    mx.clear_cache()
    before = mx.get_active_memory()
    streams = [engine.open(SynthesisRequest("The quick brown fox jumps over the lazy dog.",
                                            seed=i)) for i in range(count)]
    for _ in range(2):
        for stream in streams:
            assert stream.step()
    mx.clear_cache()
    held = mx.get_active_memory() - before
    assert streams[0].step() is None  # (max_tokens=8: two steps, then the end)
    for stream in streams:
        stream.close()
    mx.clear_cache()
    return held, mx.get_active_memory() - before


def test_a_stream_waiting_for_its_turn_holds_a_fraction_of_one_stepping(cv_engine):
    # Parked as the slices they are, a stream's decoder tails kept its last chunk's tensors
    # alive: each stream waiting for its turn held what a stepping one does (11.6 MB on
    # this tiny model, 0.3 MB copied); on the hub that is per speaking session.
    one, left_one = held_by_streams(cv_engine, 1)
    four, left_four = held_by_streams(cv_engine, 4)
    assert (four - one) / 3 < one / 4
    assert left_one <= 0 and left_four <= 0  # all of it back once they end


def test_runaway_guard_stops_generation(tiny_qwen3_custom_voice):
    from engines.qwen3 import Qwen3Engine

    engine = Qwen3Engine(
        str(tiny_qwen3_custom_voice), max_tokens=8, runaway_factor=0.01, runaway_min_s=0.5
    )
    engine.load()  # warm-up is 4 tokens = 0.32 s, within the 0.5 s budget
    try:
        # seeded: unseeded, what it samples depends on MLX's one generator as the tests
        # before left it, and a CI run once saw the second step end without a runaway
        # (40 other generator states here all ran away); a seed fixes the draws
        stream = engine.open(SynthesisRequest("Hi.", seed=1))
        assert len(stream.step()) == CHUNK_BYTES  # 0.32 s
        with pytest.raises(EngineError) as err:
            stream.step()  # would reach 0.64 s
        assert err.value.code == "engine_runaway"
        assert stream.step() is None
    finally:
        engine.close()


def test_a_chinese_sentence_is_given_the_time_its_syllables_take(cv_engine, monkeypatch):
    """A CJK character is a syllable (~0.2 s), not a letter (~0.07 s): the runaway budget
    counts it as three letters. At one letter each, the guard stopped a Chinese sentence
    read at a slow pace in the middle. Scaled down: 0.02 s a letter, 24 characters."""
    monkeypatch.setattr(cv_engine, "runaway_factor", 0.02)
    monkeypatch.setattr(cv_engine, "runaway_min_s", 0.1)
    text = "我们明天早上八点在公司门口见面，然后一起去机场。"
    stream = cv_engine.open(SynthesisRequest(text, seed=1, options={"max_tokens": 8}))
    assert [len(c) for c in run(stream)] == [CHUNK_BYTES, CHUNK_BYTES]  # 0.64 s < 1.44 s


def test_step_from_another_thread_is_refused(cv_engine):
    stream = cv_engine.open(SynthesisRequest("Hi.", options={"max_tokens": 4}))
    errors = []

    def other():
        try:
            stream.step()
        except EngineError as exc:
            errors.append(exc.code)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert errors == ["engine_failed"]
    stream.close()


def test_library_errors_are_mapped(cv_engine, monkeypatch):
    def broken(*args, **kwargs):  # stands in for a failing mlx kernel
        raise RuntimeError("[metal] command encoder already encoding")

    monkeypatch.setattr(cv_engine._model, "_sample_token", broken)
    stream = cv_engine.open(SynthesisRequest("Hi."))
    with pytest.raises(EngineError, match="command encoder") as err:
        stream.step()
    assert err.value.code == "engine_failed"
    assert stream.step() is None


def test_memory_report(cv_engine):
    mem = cv_engine.memory()
    assert mem["mlx_peak_bytes"] >= mem["mlx_active_bytes"] > 0
    assert mem["rss_peak_bytes"] > 0


def test_clone_voice_conditioning_is_computed_once(clone_engine, reference_wav):
    assert clone_engine.voices() == [reference_wav.stem]
    assert clone_engine.default_voice == reference_wav.stem  # (it was None: "voice null")
    assert clone_engine.conditioning_computations == 1  # at load, before the warm-up
    for seed in (1, 2):
        chunks = run(clone_engine.open(SynthesisRequest("Hello.", seed=seed)))
        assert [len(c) for c in chunks] == [CHUNK_BYTES]
    assert clone_engine.conditioning_computations == 1


def test_cached_embedding_equals_a_fresh_one(clone_engine):
    import mlx.core as mx

    cache = clone_engine._embeddings
    cached = cache(clone_engine._ref_array)
    fresh = cache(mx.array(np.asarray(clone_engine._ref_array)))  # another array: recomputed
    assert cache.computed == 2
    assert mx.allclose(cached, fresh).item()


def test_closing_a_clone_engine_frees_its_model_at_once(tiny_qwen3_base, reference_wav):
    # Its embedding shadow holds the model's own method: a cycle only the collector breaks
    # (and a serving gateway freezes its start-up heap out of it) kept the weights past
    # close(), then left their buffers in MLX's cache, cleared before they were freed.
    import gc
    import weakref

    from engines.qwen3 import Qwen3Engine

    engine = Qwen3Engine(str(tiny_qwen3_base), ref_audio=str(reference_wav), max_tokens=4)
    engine.load()
    model = weakref.ref(engine._model)
    gc.disable()
    try:
        engine.close()
        assert model() is None
    finally:
        gc.enable()


def test_base_model_without_reference_is_refused(tiny_qwen3_base):
    from engines.qwen3 import Qwen3Engine

    with pytest.raises(EngineError) as err:
        Qwen3Engine(str(tiny_qwen3_base)).load()
    assert err.value.message == (
        f"{tiny_qwen3_base} is a Base model: it clones a voice and needs ref_audio, a "
        "reference WAV ([tts] voice_ref, --voice-ref)")


def test_custom_voice_model_with_a_reference_is_refused(tiny_qwen3_custom_voice,
                                                         reference_wav):
    """A CustomVoice model cannot clone: its reference WAV was ignored without a word, and
    the gateway spoke the first built-in speaker to an operator who had set voice_ref."""
    from engines.qwen3 import Qwen3Engine

    with pytest.raises(EngineError) as err:
        Qwen3Engine(str(tiny_qwen3_custom_voice), ref_audio=str(reference_wav)).load()
    assert err.value.message == (
        f"{tiny_qwen3_custom_voice} is a CustomVoice model: it speaks its built-in speakers "
        f"(aria, bram, serena) and cannot clone ref_audio {reference_wav} ([tts] voice_ref, "
        "--voice-ref): choose a speaker with voice, or use a Base model to clone")


def test_style_instructions_reach_a_checkpoint_that_takes_them(tmp_path, offline_hf_cache,
                                                               cv_engine):
    """OpenAI's ``instructions`` ("speak cheerfully") become mlx-audio's ``instruct`` for a
    CustomVoice checkpoint that takes them (1.7B); a 0.6B one ignores them, as mlx-audio
    does, and says so (``instructions`` false: the HTTP API then adds a note)."""
    from engines.qwen3 import Qwen3Engine
    from tests.tiny_models.qwen3 import build_tiny_qwen3

    big = Qwen3Engine(str(build_tiny_qwen3(tmp_path / "1b7", size="1b7")), voice="aria",
                      max_tokens=4)
    assert big.instructions is False  # not loaded yet: nothing is known
    big.load()
    assert big.instructions is True

    def speak(engine, **options):
        options = {"max_tokens": 4, **options}  # (cv_engine's own is 8)
        return run(engine.open(SynthesisRequest("Hi.", seed=7, options=options)))

    plain, happy = speak(big), speak(big, instructions="Very happy.")
    assert happy != plain and happy == speak(big, instructions="Very happy.")
    big.close()

    small = cv_engine  # the module's loaded 0.6B one (tts_model_size "0b6")
    assert small.instructions is False
    assert speak(small, instructions="Very happy.") == speak(small)


def test_a_language_is_known_by_its_code_as_by_its_name(cv_engine):
    """mlx-audio looks ``lang_code`` up in the model's ``codec_language_id`` ("english",
    "german"...) and took anything else, such as the code "en" or "de" an operator or a
    client writes, for "auto" without a word: the voice spoke without its language."""
    def said(**options) -> list[bytes]:
        return run(cv_engine.open(SynthesisRequest("Hi.", seed=3,
                                                   options={"max_tokens": 4, **options})))

    auto, by_name = said(), said(language="English")
    assert by_name != auto
    assert said(language="en") == said(language="en-US") == by_name


def test_a_language_the_model_does_not_speak_is_refused(cv_engine, tiny_qwen3_custom_voice):
    from engines.qwen3 import Qwen3Engine

    with pytest.raises(EngineError) as err:
        cv_engine.open(SynthesisRequest("Hi.", options={"language": "de"}))
    assert (err.value.code, err.value.message) == (
        "bad_request", "qwen3 does not speak language 'de': it speaks auto, english, chinese "
        "(or en, zh)")
    with pytest.raises(EngineError) as err:
        Qwen3Engine(str(tiny_qwen3_custom_voice), voice="aria", language="klingon").load()
    assert err.value.code == "engine_failed"
    assert err.value.message.startswith("qwen3 does not speak language 'klingon'")


def test_the_default_voice_is_spelt_as_the_checkpoint_lists_it(tiny_qwen3_custom_voice):
    """"Serena" (the model card's spelling) is the checkpoint's "serena": the engine took
    it and kept it as written, so its default voice was not one of its ``voices()``."""
    from engines.qwen3 import Qwen3Engine

    engine = Qwen3Engine(str(tiny_qwen3_custom_voice), voice="Serena", max_tokens=4)
    engine.load()
    try:
        assert engine.default_voice == "serena" and engine.default_voice in engine.voices()
        assert run(engine.open(SynthesisRequest("Hi.", voice="SERENA", seed=1))) == run(
            engine.open(SynthesisRequest("Hi.", seed=1)))
    finally:
        engine.close()


def in_turn(*streams: SynthesisStream) -> list[list[bytes]]:
    """Step ``streams`` one after the other, as the gpu lane does, until all have ended."""
    chunks: list[list[bytes]] = [[] for _ in streams]
    live = dict(enumerate(streams))
    while live:
        for i, stream in list(live.items()):
            if (chunk := stream.step()) is None:
                del live[i]
            else:
                chunks[i].append(chunk)
    return chunks


def sound_as_alone_in_turn(engine: TtsEngine, first: str, second: str) -> list[list[bytes]]:
    """Two sentences of four 80 ms steps (temperature 0) run alone, then stepped in turn:
    the same audio either way. What they said alone."""

    def request(text: str) -> SynthesisRequest:
        return SynthesisRequest(text, temperature=0.0, step_ms=80, options={"max_tokens": 4})

    a, b = request(first), request(second)
    alone = [run(engine.open(a)), run(engine.open(b))]
    assert [len(c) for c in alone[0]] == [1920 * 2] * 4
    assert in_turn(engine.open(a), engine.open(b)) == alone
    return alone


@pytest.mark.parametrize(("kind", "bits"), [("custom_voice", 4), ("base", 8)])
def test_a_quantized_bf16_checkpoint_speaks_as_the_float_one_does(tmp_path, reference_wav,
                                                                  kind, bits):
    """mlx-community's Qwen3-TTS checkpoints are bf16 and 4/6/8-bit (quantized linear
    layers, ``quantization`` in config.json), not the float32 of the other tiny models:
    the same engine code (clone conditioning, per-stream codec state, PCM16) on one."""
    import mlx.nn as nn

    from engines.qwen3 import Qwen3Engine
    from tests.tiny_models.qwen3 import build_tiny_qwen3

    path = build_tiny_qwen3(tmp_path / kind, kind, bits=bits)
    voice = {"voice": "aria"} if kind == "custom_voice" else {"ref_audio": str(reference_wav)}
    engine = Qwen3Engine(str(path), max_tokens=8, **voice)
    engine.load()
    try:
        quantized = [m for _, m in engine._model.talker.named_modules()
                     if isinstance(m, nn.QuantizedLinear)]
        assert quantized and all(m.bits == bits for m in quantized)
        alone = sound_as_alone_in_turn(engine, "Hello there, how are you today?",
                                       "Another sentence.")
        assert any(np.frombuffer(c, "<i2").any() for c in alone[0])
        assert engine.conditioning_computations == (kind == "base")
    finally:
        engine.close()


@pytest.fixture(scope="module")
def icl_model(tmp_path_factory, offline_hf_cache):
    """A tiny Base model whose codec has an encoder, and a 0.4 s reference (the encoder is
    not tiny): (model directory, reference WAV)."""
    from tests.tiny_models.qwen3 import build_tiny_qwen3, write_reference_wav

    tmp = tmp_path_factory.mktemp("qwen3-icl")
    return build_tiny_qwen3(tmp / "model", "base", icl=True), write_reference_wav(
        tmp / "ref.wav", seconds=0.4)


def test_an_icl_clone_encodes_its_reference_once(icl_model):
    """``ref_audio`` with ``ref_text`` and a codec that has an encoder (the public Base
    checkpoints' has one): mlx-audio's ICL cloning, the reference's codes prefixed to every
    sentence. The codes are encoded once (mlx-audio keeps them), the speaker embedding too
    (the engine does), and streams stepped in turn sound as alone."""
    from engines.qwen3 import Qwen3Engine

    path, ref = icl_model
    engine = Qwen3Engine(str(path), ref_audio=str(ref), ref_text="Hello there.", max_tokens=8)
    engine.load()
    try:
        assert engine._model.speech_tokenizer.has_encoder and len(engine._model._icl_cache) == 1
        sound_as_alone_in_turn(engine, "How are you today?", "The weather is fine.")
        assert engine.conditioning_computations == 1
        assert len(engine._model._icl_cache) == 1
    finally:
        engine.close()


def test_a_reference_wav_may_be_written_from_the_home_directory(tiny_qwen3_base, reference_wav,
                                                                tmp_path, monkeypatch):
    """``voice_ref = "~/voices/assistant.wav"`` in a config file (no shell expands it there,
    and the model path may be written so): the gateway stopped at start, file not found."""
    import shutil

    from engines.qwen3 import Qwen3Engine

    shutil.copy(reference_wav, tmp_path / "assistant.wav")
    monkeypatch.setenv("HOME", str(tmp_path))
    engine = Qwen3Engine(str(tiny_qwen3_base), ref_audio="~/assistant.wav", max_tokens=4)
    engine.load()
    try:
        assert engine.voices() == ["assistant"] and engine.conditioning_computations == 1
    finally:
        engine.close()


def test_the_codec_encoder_is_let_go_when_no_icl_clone_needs_it(icl_model):
    """mlx-audio uses the codec's encoder only to clone with ``ref_text`` (ICL), and the
    public checkpoints ship it with every kind (their codec: 651 MB of float32, ~215 of it
    the encoder). An x-vector clone (the hub's) or a CustomVoice speaker kept it loaded, in
    the memory the LLM shares."""
    import gc

    import mlx.core as mx
    from mlx.utils import tree_flatten

    from engines.qwen3 import Qwen3Engine

    path, ref = icl_model

    def load(**options) -> tuple[int, int]:
        """(the bytes of the encoder the engine holds, MLX memory the loaded engine holds)"""
        # an earlier test's arrays left in cycles, freed by a collection during the load,
        # would count against it (seen once in a full run: ICL's figure came out short)
        gc.collect()
        before = mx.get_active_memory()
        engine = Qwen3Engine(str(path), ref_audio=str(ref), max_tokens=4, **options)
        engine.load()
        try:
            encoder = engine._model.speech_tokenizer.encoder_model
            held = 0 if encoder is None else sum(
                v.nbytes for _, v in tree_flatten(encoder.parameters()))
            return held, mx.get_active_memory() - before
        finally:
            engine.close()

    (encoder, icl), (kept, xvector) = load(ref_text="Hello there."), load()
    assert encoder > 0 and kept == 0
    assert icl - xvector >= encoder


async def test_its_lane_keeps_no_more_streams_open_than_max_open_streams(
        tiny_qwen3_custom_voice, caplog):
    # Each open stream holds its caches: the lane opened one for every owner at once (every
    # session speaking, every HTTP request), however few it could feed.
    import asyncio

    import mlx.core as mx

    from engines.qwen3 import Qwen3Engine, Qwen3Stream
    from gateway.io.lanes import Lane, SynthesisJob

    class Counted(Qwen3Engine):
        """The real engine; ``open`` notes how many of its streams were open already."""

        most = 0

        def open(self, request: SynthesisRequest) -> Qwen3Stream:
            open_now = sum(not s._done for s in list(self._lifecycle._streams))
            self.most = max(self.most, open_now + 1)
            return super().open(request)

    class Sink:
        def __init__(self) -> None:
            self.chunks: dict[str, int] = {}
            self.ended: dict[str, asyncio.Future[str]] = {}

        def on_audio(self, job, pcm, engine, ready_at) -> None:
            self.chunks[job.owner] = self.chunks.get(job.owner, 0) + 1
            if job.owner == "a":  # a barge-in after its first audio: its stream is closed
                asyncio.get_running_loop().call_soon(cancel, "a")

        def on_done(self, job, truncated=False, notes=()) -> None:
            self.ended[job.owner].set_result("done")

        def on_failed(self, job, code, message) -> None:
            self.ended[job.owner].set_result(code)

    def cancel(owner: str) -> None:
        if lane.cancel(owner):
            sink.ended[owner].set_result("cancelled")

    # two steps a stream, of one codec frame each (80 ms): a frame is most of the cost
    engine = Counted(str(tiny_qwen3_custom_voice), voice="aria", max_tokens=2)
    # no step deadline: a tiny model's step, slow on a starved machine, is not stuck
    lane = Lane("gpu", engine, max_open_streams=2, step_timeout_s=None)
    await lane.load()
    await lane.call(mx.clear_cache)
    before = await lane.call(mx.get_active_memory)
    sink = Sink()
    runner = asyncio.create_task(lane.run())
    try:
        owners = ["a", "b", "c", "d", "e"]
        for owner in owners:
            sink.ended[owner] = asyncio.get_running_loop().create_future()
            request = SynthesisRequest("Hello there.", seed=1, step_ms=80)
            lane.submit(owner, SynthesisJob(request, sink), deadline=0.0)
        ends = await asyncio.gather(*(sink.ended[o] for o in owners))
    finally:
        runner.cancel()
    assert ends == ["cancelled", "done", "done", "done", "done"]
    assert sink.chunks == {"a": 1, "b": 2, "c": 2, "d": 2, "e": 2}
    assert engine.most == 2 and lane.scheduler.open_streams == 0
    assert "lane gpu: 2 streams open (max_open_streams 2, 1 kept for voice sessions)" in \
        caplog.text
    await lane.call(mx.clear_cache)
    assert await lane.call(mx.get_active_memory) <= before  # nothing left of any of them
    await lane.aclose()
