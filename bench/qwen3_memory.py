"""What open Qwen3-TTS streams hold in memory: measured on the tiny random-weight model,
then worked out for the public checkpoints' sizes.

    python bench/qwen3_memory.py [--streams 1 2 4 8] [--steps 1 4 16] [--real-decoder] [--json]

A stream holds, between its steps: the talker's KV cache (mlx-lm's ``KVCache``: blocks of
256 tokens, so a prompt plus up to ~240 frames of 80 ms take one block), the code
predictor's (one block, refilled every frame), the codec decoder's transformer KV cache
(one token a frame) and the decoder's conv tails (``engines.qwen3.DecoderStreams``).

* ``steps``: one stream's MLX active memory (after ``mx.clear_cache``) after that many 320 ms
  steps. Most of it is the last step's chunk tensors, which the decoder's tails (slices)
  keep alive: the decoder holds one stream's at a time (a parked stream's tails are copies),
  so that is once per lane, not per stream.
* ``streams``: what each further stream open at once adds (each stepped twice, in turn, as
  the gpu lane interleaves sessions), beside the arithmetic above for the tiny model's
  sizes, and what is left once all are closed (0: nothing).
* ``real``: the arithmetic for the public 0.6B and 1.7B checkpoints (28 talker layers, 8 KV
  heads of 128, bf16; a float32 codec decoder of 8 layers, 16 KV heads of 64) for a sentence
  of up to 17 s (one block) and for the runaway budget of a 400-character segment (100 s:
  five blocks), and for 8, 32 and 64 sessions speaking at once. ``--real-decoder`` builds
  the real-size codec decoder (random weights, 0.46 GB) to measure its conv tails too.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # engines/, tests/tiny_models

BLOCK = 256
"""Tokens per allocation of mlx-lm's ``KVCache``."""
TEXT = "The quick brown fox jumps over the lazy dog."
PROMPT_TOKENS = 40
"""Tokens the talker holds before a sentence's first frame (fewer for one sentence: any
count up to 256 less its frames fills the same first block)."""


def kv_bytes(layers: int, kv_heads: int, head_dim: int, itemsize: int, tokens: int) -> int:
    """A ``KVCache`` list's keys and values holding ``tokens`` (whole blocks)."""
    return 2 * layers * kv_heads * head_dim * itemsize * math.ceil(tokens / BLOCK) * BLOCK


def stream_bytes(talker, predictor, decoder, frames: int, prompt: int, tails: int,
                 lm_itemsize: int, decoder_itemsize: int) -> int:
    """What one stream holds after ``frames`` codec frames (see the module docstring)."""
    return (kv_bytes(talker.num_hidden_layers, talker.num_key_value_heads, talker.head_dim,
                     lm_itemsize, prompt + frames)
            + kv_bytes(predictor.num_hidden_layers, predictor.num_key_value_heads,
                       predictor.head_dim, lm_itemsize, 1)
            + kv_bytes(decoder.num_hidden_layers, decoder.num_key_value_heads,
                       decoder.head_dim, decoder_itemsize, frames)
            + tails)


def held(fn) -> int:
    import mlx.core as mx

    mx.clear_cache()
    before = mx.get_active_memory()
    fn()
    mx.clear_cache()
    return mx.get_active_memory() - before


def measure_tiny(args: argparse.Namespace) -> dict:
    import mlx.core as mx

    from engines.base import SynthesisRequest
    from engines.qwen3 import Qwen3Engine
    from tests.tiny_models.qwen3 import build_tiny_qwen3

    path = build_tiny_qwen3(Path(tempfile.mkdtemp(prefix="bench-qwen3-mem-")) / "cv")
    engine = Qwen3Engine(str(path), voice="aria", runaway_factor=10.0)
    engine.load()
    decoder = engine._decoder
    assert decoder is not None  # (loaded)
    cfg = engine._model.config.talker_config
    dec_cfg = engine._model.speech_tokenizer.decoder.config
    mx.clear_cache()
    base = mx.get_active_memory()
    out: dict = {"steps": [], "streams": []}

    stream = engine.open(SynthesisRequest(TEXT, seed=1))
    done = 0
    for steps in args.steps:
        while done < steps:
            stream.step()
            done += 1
        mx.clear_cache()
        amount = mx.get_active_memory() - base
        frames = 4 * steps
        tails = sum(v.nbytes for held in decoder._save()[1] for v in held
                    if v is not None)
        out["steps"].append({"steps": steps, "frames": frames, "held_mb": amount / 1e6})
    stream.close()
    out["arithmetic_mb"] = stream_bytes(cfg, cfg.code_predictor_config, dec_cfg, 8,
                                        PROMPT_TOKENS, tails, lm_itemsize=4,
                                        decoder_itemsize=4) / 1e6

    for count in args.streams:
        streams = [engine.open(SynthesisRequest(TEXT, seed=i)) for i in range(count)]

        def step_all(streams=streams) -> None:
            for _ in range(2):
                for s in streams:
                    s.step()

        amount = held(step_all)
        for s in streams:
            s.close()
        mx.clear_cache()
        out["streams"].append({"streams": count, "held_mb": amount / 1e6,
                               "left_after_close_mb": (mx.get_active_memory() - base) / 1e6})
    one = out["streams"][0]
    for r in out["streams"][1:]:
        r["per_further_stream_mb"] = (r["held_mb"] - one["held_mb"]) / (r["streams"] - 1)
    engine.close()
    return out


def real_tails() -> int:
    """The real-size codec decoder's conv tails after two 320 ms steps, as parked."""
    import mlx.core as mx
    from mlx_audio.tts.models.qwen3_tts.config import Qwen3TTSTokenizerConfig
    from mlx_audio.tts.models.qwen3_tts.speech_tokenizer import Qwen3TTSSpeechTokenizer

    from engines.qwen3 import DecoderStreams

    decoder = Qwen3TTSSpeechTokenizer(Qwen3TTSTokenizerConfig()).decoder
    mx.eval(decoder.parameters())
    decoder.reset_streaming_state()
    for _ in range(2):
        mx.eval(decoder.streaming_step(mx.random.randint(0, 2048, (1, 16, 4))))
    tails = DecoderStreams(decoder)._save()[1]
    return sum(v.nbytes for held in tails for v in held if v is not None)


def real(tails: int) -> dict:
    from mlx_audio.tts.models.qwen3_tts.config import (
        Qwen3TTSTalkerCodePredictorConfig,
        Qwen3TTSTalkerConfig,
        Qwen3TTSTokenizerDecoderConfig,
    )

    talker, predictor = Qwen3TTSTalkerConfig(), Qwen3TTSTalkerCodePredictorConfig()
    decoder = Qwen3TTSTokenizerDecoderConfig()
    out = {}
    for name, frames in (("sentence_up_to_17s", 216), ("runaway_budget_400_chars", 1254)):
        one = stream_bytes(talker, predictor, decoder, frames, PROMPT_TOKENS, tails,
                           lm_itemsize=2, decoder_itemsize=4)
        out[name] = {"per_stream_mb": one / 1e6,
                     **{f"sessions_{n}_gb": n * one / 1e9 for n in (8, 16, 32, 64)}}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--steps", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--real-decoder", action="store_true",
                    help="measure the real-size decoder's conv tails (else counted as 0)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tiny = measure_tiny(args)
    tails = real_tails() if args.real_decoder else 0
    out: dict[str, Any] = {"tiny": tiny, "real_tails_mb": tails / 1e6, "real": real(tails)}
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print("tiny model, one stream:  steps  frames  held MB")
    for r in tiny["steps"]:
        print(f"{'':24}{r['steps']:>6} {r['frames']:>7} {r['held_mb']:>8.2f}")
    print("tiny model, streams open at once:  streams  held MB  per further stream  "
          "left after close")
    for r in tiny["streams"]:
        further = r.get("per_further_stream_mb")
        print(f"{'':34}{r['streams']:>8} {r['held_mb']:>8.2f} "
              f"{'' if further is None else f'{further:.2f}':>19} "
              f"{r['left_after_close_mb']:>17.2f}")
    print(f"  (arithmetic for one tiny stream: {tiny['arithmetic_mb']:.2f} MB)")
    print(f"real size (0.6B/1.7B, bf16; decoder conv tails {out['real_tails_mb']:.2f} MB):")
    for name, r in out["real"].items():
        print(f"  {name}: {r['per_stream_mb']:.1f} MB a stream; 8/16/32/64 sessions: "
              + " / ".join(f"{r[f'sessions_{n}_gb']:.2f}" for n in (8, 16, 32, 64)) + " GB")


if __name__ == "__main__":
    main()
