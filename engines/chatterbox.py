"""Chatterbox through mlx-audio, in process: the fallback voice, cloned from a reference WAV.

Chatterbox does not stream: one ``step`` synthesizes the whole segment and returns it (the
gateway cuts it into frames); the next ``step`` returns ``None``. ``streams = False`` tells
the scheduler that a step here is as long as the sentence.

The voice conditioning (S3 speech tokens, S3Gen reference embedding, voice-encoder
x-vector) is computed once at ``load`` with ``Model.prepare_conditionals`` and passed to
every ``generate`` call as ``conds=`` (mlx-audio's own parameter for exactly this), so the
reference is never re-encoded per sentence. Without ``ref_audio`` the checkpoint's built-in
``conds.safetensors`` voice is used.

Note: mlx-audio's ``post_load_hook`` fetches the speech tokenizer that turns a reference
into speech tokens, ``mlx-community/S3TokenizerV2``, from the Hugging Face hub; fetch it once
beforehand (``hf download mlx-community/S3TokenizerV2``) and run with ``HF_HUB_OFFLINE=1`` so
loading never touches the network. Where it does not find the tokenizer's weights it warns
and goes on with random ones (Turbo always; Chatterbox when the cached snapshot lacks the
file), and a voice cloned through them is another voice, with no error: so a ``ref_audio``
without them in the cache is refused at load, naming the repo and the cache looked in
(the built-in voice never uses the tokenizer).

Speed: after T3 writes the speech tokens, S3Gen's flow matching runs ``flow_steps`` Euler
steps (the checkpoint's 10 by default), each a full pass of its 71M-parameter estimator over
the reference prompt's mel frames *plus* the new ones, twice (classifier-free guidance);
then HiFi-GAN. So the reference's length (S3Gen keeps up to 10 s of it, 50 mel frames per
second) is paid on every sentence, and ``flow_steps`` scales S3Gen's time linearly. Fewer
steps trade mel quality for latency (the distilled Chatterbox-Turbo gets away with 2); keep
the default unless the fallback's time to audio matters more and the voice was listened to.

Chatterbox-Turbo (``model_type`` ``chatterbox_turbo``) loads through the same engine; what
differs in mlx-audio's ``ChatterboxTurboTTS``, and what the engine does about it:
  * ``prepare_conditionals`` returns nothing and keeps the voice on the model (``_conds``),
    and ``generate`` takes no ``conds=``: it always speaks the model's. The engine conditions
    once at load as for Chatterbox and leaves the voice there.
  * It wants a reference longer than 5 s (an ``assert``): a shorter ``ref_audio`` is refused
    at load, before the model loads, naming the key and the length. The reference is read
    once, for both kinds: the samples checked are the ones conditioned on.
  * Its S3Gen is distilled (meanflow: 2 Euler steps without guidance, fixed in
    mlx-audio's ``generate``), so ``flow_steps`` does not apply and is refused; so is a
    ``language`` other than English (its tokenizer is GPT-2's; ``lang_code`` is ignored).
  * It has no emotion exaggeration and no classifier-free guidance: the engine passes 0 for
    both (any other value made mlx-audio log a WARNING on every sentence), and says once at
    load that a configured ``exaggeration`` or ``cfg_weight`` is not used.
  * Its ``generate`` prints "S3 Token -> Mel Inference..." and draws two tqdm progress bars
    on every sentence: the print goes to this module's log at DEBUG, the bars are turned
    off (``_quiet_turbo_progress``).
  * It splits a text at sentence ends into chunks of ``max_tokens // 2`` characters, each
    with its own ``max_tokens``: the engine passes ``split_pattern=None`` so one segment is
    one generation and ``max_tokens`` caps the whole of it, as with Chatterbox.
  * Its sampling defaults differ (``top_p`` 0.95, ``top_k`` 1000): ``top_p`` left unset
    keeps each model's own default.

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
    config_model_type,
    float_to_pcm16,
    library_output_logged,
    load_tts_model,
    mlx_failure,
    process_memory,
    quiet_tqdm,
    reference_audio,
    require_mlx_audio,
    resolve_model_path,
    runaway_budget_s,
    seed_sampling,
    unseed_sampling,
)

log = logging.getLogger(__name__)

SAMPLE_RATE = 24_000
SPEECH_TOKENS_HZ = 25
TURBO = "chatterbox_turbo"
TURBO_MIN_REF_S = 5.0
"""mlx-audio's ``ChatterboxTurboTTS.prepare_conditionals`` asserts a reference longer than this."""
S3_TOKENIZER_REPO = "mlx-community/S3TokenizerV2"
"""Where mlx-audio's ``post_load_hook`` (both kinds) takes the speech tokenizer's
``model.safetensors`` from."""
# Chatterbox's emotion exaggeration and guidance weight by default; Turbo uses neither, and
# another value set there is said at load to be unused.
EXAGGERATION = 0.5
CFG_WEIGHT = 0.5


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
        exaggeration: float = EXAGGERATION,
        cfg_weight: float = CFG_WEIGHT,
        temperature: float = 0.8,
        top_p: float | None = None,
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
        self.turbo = False  # set at load: the model is Chatterbox-Turbo
        self._model: Any = None
        self._conds: Any = None
        self._lifecycle = MlxLifecycle(self.name, log)

    def voices(self) -> list[str]:
        return [self.voice_name]

    def load(self) -> None:
        if self._model is not None:
            return
        self._lifecycle.claim_thread()
        require_mlx_audio(self.name)
        path = resolve_model_path(self.model_ref)
        t0 = time.perf_counter()
        self.turbo = config_model_type(path) == TURBO
        reference = None if self.ref_audio is None else _read_reference(self.ref_audio)
        if self.turbo:
            self._check_turbo_settings(path, reference)
        if reference is not None:
            _require_speech_tokenizer(path)
        model = load_tts_model(path, ("chatterbox", TURBO), "Chatterbox")
        if not self.turbo and type(model).__name__ == "ChatterboxTurboTTS":
            self.turbo = True  # (no model_type in config.json: mlx-audio went by the name)
            self._check_turbo_settings(path, reference)
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
        if reference is not None:
            try:  # (the samples read above: the length Turbo's check passed)
                conds = model.prepare_conditionals(reference, SAMPLE_RATE, self.exaggeration)
            except Exception as exc:
                raise mlx_failure(exc, f"reference audio {self.ref_audio}") from exc
            if self.turbo:  # Turbo's returns None: the voice is the model's own now
                conds = model._conds
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

    def _check_turbo_settings(self, path: Path, reference: Any) -> None:
        """Refuse, before the model loads, what Chatterbox-Turbo cannot do (``reference``:
        ``ref_audio``'s samples at ``SAMPLE_RATE``, or None); say once what it does not use."""
        if self.flow_steps is not None:
            raise EngineError(
                "engine_failed",
                f"{path} is a Chatterbox-Turbo model: flow_steps "
                "applies to Chatterbox only (Turbo's distilled S3Gen runs its 2 "
                "steps, fixed in mlx-audio); remove flow_steps",
            )
        if self.language != "en":
            raise EngineError(
                "engine_failed",
                f"{path} is a Chatterbox-Turbo model, which "
                f"speaks English only: language {self.language!r} is not one",
            )
        if reference is not None:
            seconds = reference.shape[0] / SAMPLE_RATE
            if seconds <= TURBO_MIN_REF_S:
                raise EngineError(
                    "engine_failed",
                    f"ref_audio {self.ref_audio} is {seconds:.2f} "
                    f"s long: Chatterbox-Turbo ({path}) needs a reference longer "
                    f"than {TURBO_MIN_REF_S:g} s",
                )
        unused = [
            f"{key} = {value}"
            for key, value, default in (
                ("exaggeration", self.exaggeration, EXAGGERATION),
                ("cfg_weight", self.cfg_weight, CFG_WEIGHT),
            )
            if value != default
        ]
        if unused:
            log.warning(
                "chatterbox: %s is a Chatterbox-Turbo model, which has no emotion "
                "exaggeration or guidance: %s not used",
                path,
                ", ".join(unused),
            )
        _quiet_turbo_progress()

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
        kwargs: dict[str, Any] = {
            "temperature": req.temperature if req.temperature is not None else engine.temperature,
            "max_tokens": max_tokens,
        }
        top_p = req.top_p if req.top_p is not None else engine.top_p
        if top_p is not None:
            kwargs["top_p"] = top_p
        if engine.turbo:  # speaks the model's own conds; none of exaggeration, guidance
            kwargs |= {"exaggeration": 0.0, "cfg_weight": 0.0, "split_pattern": None}
        else:
            kwargs |= {
                "conds": engine._conds,
                "exaggeration": engine.exaggeration,
                "cfg_weight": engine.cfg_weight,
                "lang_code": req.options.get("language", engine.language),
                "verbose": False,
            }
        try:
            with library_output_logged(log):
                audio = [r.audio for r in engine._model.generate(self._text, **kwargs)]
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


def _read_reference(ref_audio: str) -> Any:
    """``ref_audio``'s samples at ``SAMPLE_RATE`` (an ``mx.array``), as mlx-audio's
    ``prepare_conditionals`` reads a path itself: read once, before the model loads, so a
    missing or unreadable file is refused first and Turbo's length check sees what it will
    be conditioned on."""
    try:
        from mlx_audio.utils import load_audio

        return load_audio(ref_audio, sample_rate=SAMPLE_RATE)
    except Exception as exc:
        raise mlx_failure(exc, f"reference audio {ref_audio}") from exc


def _require_speech_tokenizer(path: Path) -> None:
    """Refuse to clone a voice without the speech tokenizer's weights in the Hugging Face
    cache (fetched there, as mlx-audio would, when the hub is not switched off).

    mlx-audio's ``post_load_hook`` reads ``S3_TOKENIZER_REPO``'s ``model.safetensors`` into
    the tokenizer that turns the reference into speech tokens; where it finds none, Turbo's
    logs a WARNING and Chatterbox's (a cached snapshot without the file) prints one, and both
    go on with the tokenizer's random weights: every sentence then speaks another voice than
    the reference's, with no error. The lookup is the one mlx-audio makes (``hf_hub_download``
    honours ``HF_HUB_OFFLINE`` and ``HF_HUB_CACHE``), so what passes here is what it loads."""
    from huggingface_hub import constants, hf_hub_download

    try:
        hf_hub_download(S3_TOKENIZER_REPO, "model.safetensors")
    except Exception as exc:
        offline = " (HF_HUB_OFFLINE: nothing is downloaded)" if constants.is_offline_mode() else ""
        raise EngineError(
            "engine_failed",
            f"{path}: cloning ref_audio needs the speech tokenizer {S3_TOKENIZER_REPO} "
            f"(model.safetensors), not found in the Hugging Face cache "
            f"{constants.HF_HUB_CACHE}{offline}: fetch it once with "
            f"`hf download {S3_TOKENIZER_REPO}` (without it the cloned voice would be "
            f"another one)",
        ) from exc


def _quiet_turbo_progress() -> None:
    """Turn off the tqdm bars mlx-audio's Chatterbox-Turbo draws on stderr on every sentence
    (T3's "Generating speech tokens", S3Gen's flow steps): an operator's log got four bar
    lines a sentence. Their modules' ``tqdm`` becomes a disabled one (nothing else uses
    those modules); a later mlx-audio that moves them leaves the bars on, and
    ``tests/test_chatterbox_engine.py`` says so. A disabled bar still starts tqdm's monitor
    thread: ``quiet_tqdm`` stops that, as for qwen3."""
    import functools

    quiet_tqdm()

    from tqdm import tqdm

    try:
        from mlx_audio.tts.models.chatterbox_turbo.models.s3gen import flow_matching
        from mlx_audio.tts.models.chatterbox_turbo.models.t3 import t3
    except ImportError:
        return
    quiet = functools.partial(tqdm, disable=True)
    modules: tuple[Any, ...] = (flow_matching, t3)
    for module in modules:
        if getattr(module, "tqdm", None) is tqdm:
            module.tqdm = quiet
