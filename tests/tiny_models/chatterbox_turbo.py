"""Build a tiny random-weight Chatterbox-Turbo that ``mlx_audio.tts.utils.load_model`` loads.

Turbo is plain Chatterbox's three parts with other insides: T3 is a GPT-2 (``model_type``
``chatterbox_turbo``) that writes speech tokens without classifier-free guidance, S3Gen is
the distilled "meanflow" one (2 flow steps, no guidance), plus the same voice encoder and
S3TokenizerV2 (fetched by ``post_load_hook`` with ``hf_hub_download``: seed the offline
cache with ``tests.tiny_models.chatterbox.seed_s3_tokenizer_cache``).

What is tiny and what is not:
  * T3's GPT-2 size comes from ``create_gpt2_config()`` in mlx-audio's turbo ``t3`` module
    and its text vocabulary from ``T3Config.turbo()`` (the config file reaches neither).
    ``register_tiny_gpt2()`` swaps in 1 layer (1024 wide: the conditioning encoder takes its
    width from a module constant) and 704 text tokens; it must run in the process that
    loads the model (the test fixture does it). The speech vocabulary and positions stay
    (~20M parameters of embeddings and heads, drawn at load, not written to the file).
  * S3TokenizerV2 is made tiny as for the plain model (``register_tiny_s3_tokenizer``):
    conditioning on a reference of over 5 s, which Turbo wants, then takes seconds.
  * S3Gen and the voice encoder have fixed sizes. Every component loads
    with ``strict=False``: the file holds the 1-layer T3's block (without its embeddings and
    heads) and the voice encoder; the rest keeps the random values the constructors drew.
  * ``post_load_hook`` refuses a directory without ``conds.safetensors`` (the built-in
    voice): the builder writes one from a 0.2 s tone, so a synthesis with the built-in voice
    runs S3Gen over 10 prompt mel frames, not seconds of them.
  * The text tokenizer is a Hugging Face one (``AutoTokenizer``): a word-level vocabulary of
    single characters, as for the plain tiny model.
Random weights never emit the stop token: cap ``max_tokens``. The engine's ``flow_steps``
does not apply to Turbo (its 2 steps are fixed in mlx-audio): one Turbo flow step costs
half a plain one (no guidance), so the 2 cost what the plain tiny model's 1 step does.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

TINY_GPT2_LAYERS = 1
TINY_TEXT_VOCAB = 704  # as the plain tiny model's; the tokenizer's ids stay below it
# ChatterboxEngine options that keep a tiny Turbo synthesis to seconds: Turbo's T3 keeps its
# first token and S3Gen appends 3 silence ones, so 1 makes 5 tokens, 10 mel frames, 0.2 s;
# HiFi-GAN's full-size vocoder (~0.33 s a frame on one core) costs the most of it.
TINY_TURBO_OPTIONS = {"max_tokens": 1}


def register_tiny_gpt2() -> None:
    from mlx_audio.tts.models.chatterbox_turbo.models.t3 import gpt2, t3_config
    from mlx_audio.tts.models.chatterbox_turbo.models.t3 import t3 as t3_module

    def tiny_config() -> gpt2.GPT2Config:
        config = gpt2.create_gpt2_config()
        config.n_layer = TINY_GPT2_LAYERS
        config.vocab_size = TINY_TEXT_VOCAB  # its wte is never used: T3 has its own embeddings
        return config

    def tiny_turbo(cls: type[t3_config.T3Config]) -> t3_config.T3Config:
        return cls(text_tokens_dict_size=TINY_TEXT_VOCAB)  # the defaults are turbo()'s

    t3_module.create_gpt2_config = tiny_config  # type: ignore[attr-defined]
    t3_config.T3Config.turbo = classmethod(tiny_turbo)  # type: ignore[assignment,method-assign]


def _write_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    specials = ["<|endoftext|>", "[UNK]"]
    letters = list(" abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'-:;\"")
    vocab = {t: i for i, t in enumerate(specials + letters)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.add_special_tokens(["<|endoftext|>", "[UNK]"])
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": "<|endoftext|>",
                "unk_token": "[UNK]",
                "model_max_length": 1024,
            }
        )
    )


def _write_conds(out: Path, model: object, seconds: float = 0.2) -> None:
    """The built-in voice, as mlx-audio's checkpoints store it: T3's speaker embedding and
    prompt tokens, S3Gen's reference dict under ``gen.``."""
    import mlx.core as mx

    rate = 24_000
    t = np.arange(int(seconds * rate)) / rate
    wav = (0.4 * np.sin(2 * np.pi * 160 * t)).astype(np.float32)
    tokens = mx.array(np.arange(int(seconds * 25))[None, :] % 6561, dtype=mx.int32)
    gen = model.s3gen.embed_ref(  # type: ignore[attr-defined]
        ref_wav=mx.array(wav)[None, :],
        ref_sr=rate,
        ref_speech_tokens=tokens,
        ref_speech_token_lens=mx.array([tokens.shape[1]]),
    )
    conds = {"t3.speaker_emb": mx.zeros((1, 256)), "t3.cond_prompt_speech_tokens": tokens}
    conds |= {f"gen.{k}": v for k, v in gen.items()}
    mx.save_safetensors(str(out / "conds.safetensors"), conds)


def build_tiny_chatterbox_turbo(directory: str | Path) -> Path:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_audio.tts.models.chatterbox_turbo import Model

    register_tiny_gpt2()
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    mx.random.seed(0)
    (out / "config.json").write_text(json.dumps({"model_type": "chatterbox_turbo"}))
    model = Model()
    model.eval()  # as load_model leaves it (BatchNorm in the x-vector)
    big = ("tfmr.wte.", "tfmr.wpe.", "text_emb.", "text_head.", "speech_emb.", "speech_head.")
    weights = {
        f"t3.{k}": v for k, v in tree_flatten(model.t3.parameters()) if not k.startswith(big)
    }
    weights |= {f"ve.{k}": v for k, v in tree_flatten(model.ve.parameters())}
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    _write_tokenizer(out)
    _write_conds(out, model)
    return out
