"""Build a tiny random-weight Qwen3-TTS model that ``mlx_audio.tts.utils.load_model`` loads.

Nothing is downloaded: the text tokenizer is a byte-level BPE trained here with
``tokenizers``; the weights are the random initial parameters of mlx-audio's own
``Model`` / ``Qwen3TTSSpeechTokenizer`` classes, saved with MLX key names.

Shapes respect the loader's traps (see shared/notes/platform-facts.md): every 1x1 conv has
more than 64 input channels (``check_array_shape_qwen3`` would transpose it otherwise), and
the codec's total upsampling is 1920 (12.5 Hz codes -> 24 kHz audio).

Random weights never emit EOS: callers cap ``max_tokens``.
"""

from __future__ import annotations

import json
import wave
from pathlib import Path
from typing import Literal

import numpy as np

from tests.tiny_models.bpe import write_bpe_tokenizer

Kind = Literal["custom_voice", "base"]

SPEAKERS = {"aria": 3000, "bram": 3001, "serena": 3002}
"""``serena``: one of the nine built-in speakers of the public Qwen3-TTS CustomVoice models, and
the ANE port's only voice (the hub's two-lane configuration)."""
"""Speaker names of the tiny ``custom_voice`` model and their codec ids."""

TEXT_VOCAB = 512
_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|tts_pad|>",
    "<|tts_bos|>",
    "<|tts_eos|>",
]
_CORPUS = [
    "Hello there, how are you today? The weather is fine.",
    "The quick brown fox jumps over the lazy dog 0123456789.",
    "assistant user system: a voice gateway speaks sentences aloud!",
]


def _write_tokenizer(out: Path) -> dict[str, int]:
    tok = write_bpe_tokenizer(out, _CORPUS, _SPECIALS, 400, model_max_length=4096,
                              additional_special_tokens=_SPECIALS[3:])
    return {s: tok.token_to_id(s) for s in _SPECIALS}


def _decoder_config() -> dict:
    return {
        "latent_dim": 64,
        "codebook_dim": 160,
        "codebook_size": 2048,
        "decoder_dim": 260,
        "hidden_size": 32,
        "intermediate_size": 64,
        "head_dim": 16,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "num_hidden_layers": 1,
        "num_quantizers": 4,
        "num_semantic_quantizers": 1,
        "semantic_codebook_size": 2048,
        "sliding_window": 10,  # the window test decodes 2 windows + 8 frames
        "upsample_rates": [40, 12],
        "upsampling_ratios": [2, 2],
        "vector_quantization_hidden_dimension": 80,
    }


def _encoder_config() -> dict:
    """The codec's encoder (for ICL cloning): Mimi's SEANet at 24 kHz, 960x down to 25 Hz,
    then 2x to the codec's 12.5 Hz. Its 1x1 convs take ``num_filters`` channels and up,
    and the quantizer's projections ``hidden_size``: all above 64, the loader's trap."""
    return {
        "hidden_size": 72,
        "num_filters": 65,
        "compress": 1,
        "intermediate_size": 64,
        "head_dim": 36,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "num_hidden_layers": 1,
        "sliding_window": 16,
        "codebook_dim": 32,
        "codebook_size": 2048,
        "num_quantizers": 16,
        "upsampling_ratios": [8, 6, 5, 4],
        "vector_quantization_hidden_dimension": 32,
    }


def model_config(kind: Kind, ids: dict[str, int]) -> dict:
    talker = {
        "vocab_size": 3072,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "rope_scaling": {"interleaved": True, "mrope_section": [4, 2, 2], "rope_type": "default"},
        "num_code_groups": 4,
        "text_hidden_size": 32,
        "text_vocab_size": TEXT_VOCAB,
        "codec_language_id": {"english": 2050, "chinese": 2055},
        "spk_id": dict(SPEAKERS) if kind == "custom_voice" else None,
        "code_predictor_config": {
            "vocab_size": 2048,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "num_code_groups": 4,
        },
    }
    cfg = {
        "model_type": "qwen3_tts",
        "tts_model_type": kind,
        "talker_config": talker,
        "im_start_token_id": ids["<|im_start|>"],
        "im_end_token_id": ids["<|im_end|>"],
        "tts_pad_token_id": ids["<|tts_pad|>"],
        "tts_bos_token_id": ids["<|tts_bos|>"],
        "tts_eos_token_id": ids["<|tts_eos|>"],
    }
    if kind == "base":
        cfg["speaker_encoder_config"] = {
            "mel_dim": 128,
            "enc_dim": 32,  # must equal the talker's hidden size (it is a codec-prefix slot)
            "enc_channels": [96, 96, 96, 96, 288],
            "enc_kernel_sizes": [5, 3, 3, 3, 1],
            "enc_dilations": [1, 2, 3, 4, 1],
            "enc_attention_channels": 72,
            "enc_res2net_scale": 4,
            "enc_se_channels": 72,
        }
    return cfg


def build_tiny_qwen3(directory: str | Path, kind: Kind = "custom_voice", seed: int = 0,
                     size: str = "0b6", *, bits: int | None = None,
                     icl: bool = False) -> Path:
    """Write a tiny ``kind`` Qwen3-TTS model to ``directory`` and return its path. ``size``
    is the ``tts_model_size`` it declares: mlx-audio passes style instructions to a
    CustomVoice model only when it is not "0b6" (the public 1.7B ones say "1b7").

    ``bits``: a checkpoint as mlx-community publishes its 4/6/8-bit ones, made the way
    mlx-audio's converter makes them: bf16 weights, then ``quantize_model`` with the model's
    own ``model_quant_predicate`` (linear layers quantized; the text and codec embeddings,
    the speaker encoder and the codec left alone), ``quantization`` in config.json. Groups
    of 32: the tiny layers are 32 or 64 wide (the real ones use 64).

    ``icl``: the speech tokenizer gets an encoder too, as the public Base checkpoints have,
    so ``ref_text`` selects mlx-audio's ICL cloning (reference codes prefixed)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_audio.tts.models.qwen3_tts import Model, ModelConfig
    from mlx_audio.tts.models.qwen3_tts.config import Qwen3TTSTokenizerConfig
    from mlx_audio.tts.models.qwen3_tts.speech_tokenizer import Qwen3TTSSpeechTokenizer

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    mx.random.seed(seed)
    ids = _write_tokenizer(out)
    cfg = model_config(kind, ids)
    cfg["tts_model_size"] = size
    model = Model(ModelConfig.from_dict(cfg))
    if bits is not None:
        from mlx_audio.lm.convert import quantize_model

        model.set_dtype(mx.bfloat16)
        model, cfg = quantize_model(model, cfg, 32, bits,
                                    quant_predicate=model.model_quant_predicate)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())))

    st = out / "speech_tokenizer"
    st.mkdir(exist_ok=True)
    st_cfg = {"decoder_config": _decoder_config(), "decode_upsample_rate": 1920}
    if icl:
        st_cfg["encoder_config"] = _encoder_config()
    (st / "config.json").write_text(json.dumps(st_cfg, indent=1))
    tokenizer = Qwen3TTSSpeechTokenizer(Qwen3TTSTokenizerConfig(
        decoder_config=st_cfg["decoder_config"], encoder_config=st_cfg.get("encoder_config")))
    mx.save_safetensors(str(st / "model.safetensors"), dict(tree_flatten(tokenizer.parameters())))
    (out / "generation_config.json").write_text(
        json.dumps({"temperature": 0.9, "top_k": 50, "top_p": 1.0, "max_new_tokens": 8})
    )
    return out


def write_reference_wav(
    path: str | Path, seconds: float = 1.5, rate: int = 24_000, seed: int = 0
) -> Path:
    """Write a 16-bit mono WAV: a gliding tone with a little noise (a stand-in voice)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    f = 140 + 60 * np.sin(2 * np.pi * 0.7 * t)
    x = 0.4 * np.sin(2 * np.pi * np.cumsum(f) / rate) + 0.03 * rng.standard_normal(t.size)
    pcm = (np.clip(x, -1, 1) * 32767).astype("<i2")
    path = Path(path)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return path
