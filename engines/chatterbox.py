"""Chatterbox through mlx-audio, in process: the fallback voice, cloned from a reference WAV.

Chatterbox does not stream: one ``step`` synthesizes the whole segment and returns it (the
gateway cuts it into frames); the next ``step`` returns ``None``. ``streams = False`` tells
the scheduler that a step here is as long as the sentence.

The voice conditioning (S3 speech tokens, S3Gen reference embedding, voice-encoder
x-vector) is computed once at ``load`` with ``Model.prepare_conditionals`` and passed to
every ``generate`` call as ``conds=`` (mlx-audio's own parameter for exactly this), so the
reference is never re-encoded per sentence. Without ``ref_audio`` the checkpoint's built-in
``conds.safetensors`` voice is used.

Note: mlx-audio's ``post_load_hook`` fetches ``mlx-community/S3TokenizerV2`` with
``snapshot_download``; fetch it once beforehand (``hf download mlx-community/S3TokenizerV2``)
and run with ``HF_HUB_OFFLINE=1`` so loading never touches the network.

Speed: after T3 writes the speech tokens, S3Gen's flow matching runs ``flow_steps`` Euler
steps (the checkpoint's 10 by default), each a full pass of its 71M-parameter estimator over
the reference prompt's mel frames *plus* the new ones, twice (classifier-free guidance);
then HiFi-GAN. So the reference's length (S3Gen keeps up to 10 s of it, 50 mel frames per
second) is paid on every sentence, and ``flow_steps`` scales S3Gen's time linearly. Fewer
steps trade mel quality for latency (the distilled Chatterbox-Turbo gets away with 2); keep
the default unless the fallback's time to audio matters more and the voice was listened to.

``reads_digits = False``: its English text frontend is a character tokenizer with only
punctuation normalisation; "$5" or "3:30" come out badly, so the gateway spells them out.
Threading as for every MLX engine: see ``engines.mlx_common``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from engines.base import EngineError, Lane, SynthesisRequest, Uninterruptible
from engines.mlx_common import (
    MlxLifecycle,
    float_to_pcm16,
    load_tts_model,
    mlx_failure,
    process_memory,
    reference_audio,
    resolve_model_path,
    runaway_budget_s,
    seed_sampling,
    unseed_sampling,
)

log = logging.getLogger(__name__)

SAMPLE_RATE = 24_000
SPEECH_TOKENS_HZ = 25


class ChatterboxEngine(Uninterruptible):
    name = "chatterbox"
    lane: Lane = "gpu"
    streams = False
    reads_digits = False
    speed_range = None  # not passed to mlx-audio's Chatterbox: it speaks at its own pace

    def __init__(
        self,
        model: str,
        ref_audio: str | None = None,
        voice: str | None = None,
        exaggeration: float = 0.5,
        cfg_weight: float = 0.5,
        temperature: float = 0.8,
        top_p: float = 1.0,
        max_tokens: int | None = None,
        runaway_factor: float = 0.25,
        runaway_min_s: float = 3.0,
        language: str = "en",
        warmup_text: str = "Hello.",
        flow_steps: int | None = None,
    ) -> None:
        self.model_ref = model
        self.ref_audio = reference_audio(ref_audio)
        self.voice_name = voice or (Path(ref_audio).stem if ref_audio else "default")
        self.exaggeration = exaggeration
        self.cfg_weight = cfg_weight
        self.temperature = temperature
        self.top_p = top_p
        self.max_tokens = max_tokens
        self.runaway_factor = runaway_factor
        self.runaway_min_s = runaway_min_s
        self.language = language
        self.warmup_text = warmup_text
        if flow_steps is not None and (not isinstance(flow_steps, int) or flow_steps < 1):
            raise ValueError(f"flow_steps must be a positive int, got {flow_steps!r}")
        self.flow_steps = flow_steps
        self.warmup_s: float | None = None
        self.conditioning_s: float | None = None
        self._model: Any = None
        self._conds: Any = None
        self._lifecycle = MlxLifecycle(self.name, log)

    def voices(self) -> list[str]:
        return [self.voice_name]

    def load(self) -> None:
        if self._model is not None:
            return
        self._lifecycle.claim_thread()
        path = resolve_model_path(self.model_ref)
        t0 = time.perf_counter()
        model = load_tts_model(path, ("chatterbox", "chatterbox_turbo"), "Chatterbox")
        if (
            getattr(model, "tokenizer", None) is None
            and getattr(model, "mtl_tokenizer", None) is None
        ):
            raise EngineError("engine_failed", f"{path}: Chatterbox text tokenizer did not load")
        if self.flow_steps is not None:
            flow: Any = getattr(getattr(model, "s3gen", None), "flow", None)
            if not isinstance(getattr(flow, "n_timesteps", None), int):
                raise EngineError(
                    "engine_failed", f"{path}: this mlx-audio has no S3Gen flow steps to set"
                )
            flow.n_timesteps = self.flow_steps  # read by every flow.inference() call
        t1 = time.perf_counter()
        if self.ref_audio is not None:
            try:
                conds = model.prepare_conditionals(
                    str(self.ref_audio), SAMPLE_RATE, self.exaggeration
                )
            except Exception as exc:
                raise mlx_failure(exc, f"reference audio {self.ref_audio}") from exc
        elif model._conds is not None:
            conds = model._conds
        else:
            raise EngineError("engine_failed", f"{path} has no built-in voice: give ref_audio")
        self.conditioning_s = time.perf_counter() - t1
        self._model, self._conds = model, conds
        load_s = time.perf_counter() - t0
        self.warmup_s = self._lifecycle.warm_up_and_log(
            self,
            self.warmup_text,
            "chatterbox loaded %s in %.2f s (voice conditioning %.2f s)",
            path,
            load_s,
            self.conditioning_s,
        )

    def open(self, request: SynthesisRequest) -> ChatterboxStream:
        self._lifecycle.admit(self._model)
        if request.voice is not None and request.voice != self.voice_name:
            raise EngineError("voice_unknown", f"chatterbox has no voice {request.voice!r}")
        return self._lifecycle.track(ChatterboxStream(self, request))

    def close(self) -> None:
        self._lifecycle.close(self._unload)

    def memory(self) -> dict[str, int | None]:
        return process_memory()

    def runaway_budget_s(self, text: str) -> float:
        return runaway_budget_s(text, self.runaway_factor, self.runaway_min_s)

    def _unload(self) -> bool:
        loaded = self._model is not None
        self._model = self._conds = None
        return loaded


class ChatterboxStream(Uninterruptible):
    """One Chatterbox synthesis: the first ``step`` returns the whole segment."""

    def __init__(self, engine: ChatterboxEngine, request: SynthesisRequest) -> None:
        self._engine = engine
        self._request = request
        self._text = " ".join(request.text.split())
        self._done = False

    def step(self) -> bytes | None:
        if self._done:
            return None
        engine, req = self._engine, self._request
        engine._lifecycle.check_thread()
        self._done = True
        budget_s = engine.runaway_budget_s(self._text)
        max_tokens = req.options.get("max_tokens", engine.max_tokens)
        if max_tokens is None:  # one second of speech tokens past the budget
            max_tokens = int((budget_s + 1) * SPEECH_TOKENS_HZ)
        import mlx.core as mx

        if req.seed is not None:
            seed_sampling(req.seed)  # (one step: the whole segment)
        try:
            results = engine._model.generate(
                self._text,
                conds=engine._conds,
                exaggeration=engine.exaggeration,
                cfg_weight=engine.cfg_weight,
                temperature=req.temperature if req.temperature is not None else engine.temperature,
                top_p=req.top_p if req.top_p is not None else engine.top_p,
                max_tokens=max_tokens,
                lang_code=req.options.get("language", engine.language),
                verbose=False,
            )
            audio = [r.audio for r in results]
            if not audio:
                return None
            wav = audio[0] if len(audio) == 1 else mx.concatenate(audio)
            if wav.shape[0] > budget_s * SAMPLE_RATE:
                raise EngineError(
                    "engine_runaway",
                    f"chatterbox produced {wav.shape[0] / SAMPLE_RATE:.1f} s of audio for "
                    f"{len(self._text)} characters (budget {budget_s:.1f} s)",
                )
            return float_to_pcm16(wav)
        except Exception as exc:
            raise mlx_failure(exc, "chatterbox generation failed") from exc
        finally:
            if req.seed is not None:
                unseed_sampling()
            mx.clear_cache()

    def close(self) -> None:
        self._done = True
