"""Build a tiny random-weight Chatterbox model that ``mlx_audio.tts.utils.load_model`` loads.

Chatterbox has three parts: T3 (a Llama that writes speech tokens), S3Gen (flow matching +
HiFi-GAN vocoder) and a voice encoder, plus the S3TokenizerV2 speech tokenizer that its
``post_load_hook`` fetches from ``mlx-community/S3TokenizerV2``. Offline, the hook only
works against a pre-seeded Hugging Face cache, which ``seed_s3_tokenizer_cache`` writes.

What is tiny and what is not:
  * T3's size comes from ``LLAMA_CONFIGS[llama_config_name]`` (a module dict, not the
    config file). ``register_tiny_llama()`` adds a 1-layer entry (1024 wide:
    the conditioning Perceiver hard-codes that width); it must run in
    the process that loads the model (the test fixture does it).
  * S3TokenizerV2's size is its constructor's default ``ModelConfig`` (mlx-audio passes
    none): ``register_tiny_s3_tokenizer()`` makes it 1 layer of 256 (full: 6 of 1280), in
    the process that seeds the cache and loads the model. Full size, each of the two
    passes conditioning makes over a reference took ~22 s of CPU for Turbo's 5.2 s one
    (its shortest); tiny, ~0.2 s. It still writes 25 speech tokens a second.
  * S3Gen and the voice encoder have fixed sizes. Every component loads
    with ``strict=False``, so parameters missing from the files keep the random values
    the constructors drew: the files hold T3 and the voice encoder (small) and one
    S3TokenizerV2 tensor, instead of ~1.1 GB of random S3Gen/tokenizer weights.
Random weights never emit the stop token: cap ``max_tokens``.

Speed on mlx-cpu (one core, ~3 GFLOP/s matmuls): S3Gen cannot shrink, so its cost is set
by how much it runs. Each flow-matching step is one pass of the 71M-parameter estimator over
(reference mel frames + 2 per new token) x 2 (classifier-free guidance), ~0.1 s per frame
here; HiFi-GAN takes ~0.33 s per output mel frame. With the checkpoint's 10 steps, a 1.5 s
reference (75 frames) and 8 tokens that is ~100 s a sentence. ``TINY_ENGINE_OPTIONS`` plus
a 0.2 s reference bring it to ~5 s (T3 ~0.9 s, flow ~2 s, HiFi-GAN ~2 s) through the same
code path: ``flow_steps`` is the engine's production knob, not a test branch.
"""

from __future__ import annotations

import json
from pathlib import Path

TINY_LLAMA = "TinyLlama_test"
S3_REPO = "mlx-community/S3TokenizerV2"
_FAKE_SHA = "0" * 40
# ChatterboxEngine options that keep a tiny synthesis to seconds (see the module docstring).
TINY_ENGINE_OPTIONS = {"max_tokens": 4, "flow_steps": 1}


def register_tiny_llama() -> None:
    from mlx_audio.tts.models.chatterbox import config as cb_config

    cb_config.LLAMA_CONFIGS[TINY_LLAMA] = dict(
        cb_config.LLAMA_520M_CONFIG,
        num_hidden_layers=1,  # hidden stays 1024: the conditioning Perceiver is fixed at 1024
        intermediate_size=1024,
    )


def register_tiny_s3_tokenizer() -> None:
    from mlx_audio.codec.models.s3.model_v2 import ModelConfig, S3TokenizerV2

    tiny = ModelConfig(n_audio_state=256, n_audio_head=4, n_audio_layer=1)
    S3TokenizerV2.__init__.__defaults__ = (tiny,)


def _write_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    specials = ["[STOP]", "[UNK]", "[SPACE]"]
    letters = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'-:;\"")
    vocab = {t: i for i, t in enumerate(specials + letters)}
    vocab["[START]"] = 255  # T3Config.start_text_token
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.add_special_tokens(["[START]", "[STOP]", "[UNK]", "[SPACE]"])
    tok.save(str(out / "tokenizer.json"))


def build_tiny_chatterbox(directory: str | Path) -> Path:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_audio.tts.models.chatterbox.chatterbox import Model
    from mlx_audio.tts.models.chatterbox.config import ModelConfig, T3Config

    register_tiny_llama()
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    mx.random.seed(0)
    t3 = {"llama_config_name": TINY_LLAMA, "text_tokens_dict_size": 704}
    (out / "config.json").write_text(json.dumps({"model_type": "chatterbox", "t3_config": t3}))
    model = Model(ModelConfig(t3_config=T3Config(**t3)))
    weights: dict[str, mx.array] = {}  # "t3.<path>" and "ve.<path>" (the prefix's "." goes)
    tree_flatten(model.t3.parameters(), prefix=".t3", destination=weights)
    tree_flatten(model.ve.parameters(), prefix=".ve", destination=weights)
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    _write_tokenizer(out)
    return out


def seed_s3_tokenizer_cache(hf_cache: str | Path) -> Path:
    """Write ``models--mlx-community--S3TokenizerV2`` into ``hf_cache`` (random weights, of
    the size this process's ``S3TokenizerV2`` has: call ``register_tiny_s3_tokenizer`` first
    for the tiny one)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_audio.tts.models.chatterbox.s3tokenizer import S3TokenizerV2

    repo = Path(hf_cache) / "models--mlx-community--S3TokenizerV2"
    snap = repo / "snapshots" / _FAKE_SHA
    snap.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(_FAKE_SHA)
    (snap / "config.json").write_text(json.dumps({"name": "speech_tokenizer_v2_25hz"}))
    params: dict[str, mx.array] = {}
    tree_flatten(S3TokenizerV2("speech_tokenizer_v2_25hz").parameters(), destination=params)
    name, value = min(params.items(), key=lambda kv: kv[1].size)
    mx.save_safetensors(str(snap / "model.safetensors"), {name: value})
    return snap
