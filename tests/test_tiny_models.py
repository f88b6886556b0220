"""The tiny Qwen3-TTS models load through mlx-audio's real loader and speak 4-frame chunks."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_custom_voice_model_loads_and_streams(tiny_qwen3_custom_voice):
    from mlx_audio.tts.utils import load_model

    model = load_model(tiny_qwen3_custom_voice)
    assert model.tokenizer is not None and model.speech_tokenizer is not None
    assert model.get_supported_speakers() == ["aria", "bram", "serena"]
    chunks = list(
        model.generate("Hi.", voice="aria", stream=True, streaming_interval=0.32, max_tokens=4)
    )
    assert [c.audio.shape[0] for c in chunks] == [7680]


def test_base_model_clones_from_reference_wav(tiny_qwen3_base, reference_wav):
    import mlx.core as mx
    from mlx_audio.tts.utils import load_model
    from mlx_audio.utils import load_audio

    model = load_model(tiny_qwen3_base)
    assert model.speaker_encoder is not None
    emb = model.extract_speaker_embedding(load_audio(str(reference_wav), sample_rate=24_000))
    assert emb.shape == (1, 32) and bool(mx.all(mx.isfinite(emb)))
    chunks = list(
        model.generate(
            "Hi.", ref_audio=str(reference_wav), stream=True, max_tokens=4, streaming_interval=0.32
        )
    )
    assert [c.audio.shape[0] for c in chunks] == [7680]


def test_a_quantized_model_loads_as_mlx_community_checkpoints_do(tmp_path, offline_hf_cache,
                                                                 reference_wav):
    """Linear layers quantized, bf16 elsewhere; the embeddings, the speaker encoder and the
    codec left alone (mlx-audio's ``model_quant_predicate``)."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_audio.tts.utils import load_model

    from tests.tiny_models.qwen3 import build_tiny_qwen3

    model = load_model(build_tiny_qwen3(tmp_path / "q4", "base", bits=4))
    kinds = {name: type(m) for name, m in model.named_modules()}
    quantized = [name for name, kind in kinds.items() if kind is nn.QuantizedLinear]
    assert "talker.codec_head" in quantized
    assert not [name for name in quantized if "speaker_encoder" in name]
    assert kinds["talker.model.codec_embedding"] is nn.Embedding
    assert model.talker.model.codec_embedding.weight.dtype == mx.bfloat16
    chunks = list(model.generate("Hi.", ref_audio=str(reference_wav), stream=True, max_tokens=4,
                                 streaming_interval=0.32))
    assert [c.audio.shape[0] for c in chunks] == [7680]
