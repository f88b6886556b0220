"""Qwen3-TTS through mlx-audio, in process: the production voice.

One ``step`` is one streaming chunk of mlx-audio's ``Model.generate(..., stream=True)``:
with ``streaming_interval=0.32`` that is 4 codec frames (12.5 Hz) = 7,680 samples =
320 ms of audio. A step in flight cannot be interrupted, so this size bounds how long
newly arrived interactive work waits for the gpu lane.

Voices
    * a ``custom_voice`` model speaks its built-in speakers (``voice="vivian"``);
    * a ``base`` model clones the voice of ``ref_audio`` (a WAV). With ``ref_audio`` only it
      uses the x-vector speaker embedding (what the hub uses); with ``ref_text`` too and a
      speech tokenizer that has an encoder, mlx-audio's ICL mode (reference codes prefixed).

Per-voice conditioning is computed once. mlx-audio's ``_prepare_generation_inputs`` (and
the ICL variant) call ``self.extract_speaker_embedding(ref_audio)`` on *every* generation,
running the ECAPA speaker encoder over the whole reference each time. The engine loads
the reference once into one ``mx.array``, computes its embedding once at ``load``, and
shadows ``extract_speaker_embedding`` on the model *instance* with
``PrecomputedSpeakerEmbeddings``: called with that very array object (mlx-audio's
``load_audio`` returns an ``mx.array`` unchanged, so identity survives the call chain) it
returns the stored embedding; called with anything else it delegates to the original
method. This is the narrowest hook: no copy of mlx-audio's 300-line generation loop, no
change to its outputs, and it covers the x-vector and ICL paths alike. ICL reference codes
are already memoised by mlx-audio in ``Model._icl_cache``; the warm-up fills it.

Threading: load, open and step run on the gpu lane's single worker thread (see
``engines.mlx_common``); a step from another thread raises ``engine_failed``.

Streams take turns on one codec decoder. mlx-audio keeps the streaming state of the codec
decoder (its causal convolutions' input tails, the overlap-add tails of its upsamplers, its
transformer's KV cache) on the one model, resets it when a generation starts and ends, and
assumes one generation at a time. The gpu lane interleaves the steps of several streams
(two sessions speaking, background work between a voice's steps), so ``DecoderStreams``
parks a stream's decoder state when another stream steps and puts it back before its own
next step; without it each decoded its codes with another's state (wrong audio). A stream
closed mid-sentence (a barge-in) takes its state with it: mlx-audio only resets it at the
end of a generation, and those tails are slices that keep whole chunk tensors alive. For
the same reason a stream's tails are parked as copies: parked as the slices they are, each
stream waiting for its turn kept its last step's chunk tensors (11.6 MB a stream on the tiny
test model, 0.3 MB copied).

``instructions``: true once a CustomVoice checkpoint that takes style instructions is loaded
(mlx-audio passes ``instruct`` to the 1.7B ones and drops it for ``tts_model_size`` "0b6").
The HTTP speech API then hands OpenAI's ``instructions`` ("speak cheerfully") through as
``request.options["instructions"]``; with any other checkpoint it is ignored, with a note.

``language``: "auto" (the default: the text decides, so a session may switch language
from one turn to the next) or one the checkpoint speaks, by the name its config uses
("german") or its code ("de", "de-DE"); a request may name one in
``request.options["language"]``. mlx-audio took a code, or any name it does not know, for
"auto" without a word; the engine refuses one the model does not speak.

``reads_digits = True``: Qwen3-TTS's talker reads text through the Qwen tokenizer and was
trained on ordinary multilingual text, so it speaks "3:30", "$5" or "Dr." itself; an
English-only number normaliser in front of it would be wrong for its other languages.
"""

from __future__ import annotations

import logging
import math
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
    quiet_tqdm,
    reference_audio,
    require_mlx_audio,
    resolve_model_path,
    runaway_budget_s,
    seed_sampling,
    unseed_sampling,
)

log = logging.getLogger(__name__)

CODEC_HZ = 12.5
SAMPLE_RATE = 24_000
LANGUAGE_CODES = {
    "en": "english", "zh": "chinese", "de": "german", "fr": "french", "es": "spanish",
    "it": "italian", "pt": "portuguese", "ja": "japanese", "ko": "korean", "ru": "russian",
}
"""ISO 639-1 codes of the languages Qwen3-TTS speaks, to the names its config keys them by
(``codec_language_id``): mlx-audio took any other ``lang_code`` ("de") for "auto"."""


class PrecomputedSpeakerEmbeddings:
    """Stands in for ``Model.extract_speaker_embedding`` on one model instance.

    Returns the embedding computed at registration for a registered reference array
    (matched by identity), and delegates anything else to the original method.
    ``computed`` counts how many times the speaker encoder actually ran.
    """

    def __init__(self, original: Any) -> None:
        self._original = original
        self._by_id: dict[int, tuple[Any, Any]] = {}
        self.computed = 0

    def register(self, audio: Any) -> Any:
        embedding = self._compute(audio)
        self._by_id[id(audio)] = (audio, embedding)  # holding `audio` keeps its id unique
        return embedding

    def __call__(self, audio: Any, sr: int = SAMPLE_RATE) -> Any:
        hit = self._by_id.get(id(audio))
        if hit is not None and hit[0] is audio and sr == SAMPLE_RATE:
            return hit[1]
        return self._compute(audio, sr)

    def _compute(self, audio: Any, sr: int = SAMPLE_RATE) -> Any:
        self.computed += 1
        return self._original(audio, sr)


DECODER_STATE = ("_buffer", "_overflow")
"""Where the streaming modules of mlx-audio's codec decoder keep their state (the ones with a
``reset_state``); the decoder itself keeps its transformer's in ``_transformer_cache``."""


def window_codec_attention(decoder: Any) -> None:
    """Make the codec decoder's transformer attend to its checkpoint's ``sliding_window`` of
    frames only, as Qwen3-TTS's own tokenizer does (every layer of its decoder transformer is
    a sliding-window one: 72 frames, 5.76 s, in the public checkpoints). mlx-audio reads the
    window into its config and never applies it: past 72 frames a sentence was decoded by
    attention over spans the codec never saw in training (and frames a minute back still
    shaped the audio). A mask is built when the caller passes none (every streaming step and
    the whole-sequence decode alike); the KV cache's offset is the position of the first new
    frame, as for mlx-audio's own causal mask."""
    import mlx.core as mx

    pre = dict(decoder.named_modules())[""].pre_transformer
    window = getattr(getattr(pre, "config", None), "sliding_window", None)
    if not window:
        return
    base = type(pre)

    def __call__(self: Any, inputs_embeds: Any, mask: Any = None, cache: Any = None) -> Any:
        if mask is None:
            n = inputs_embeds.shape[1]
            start = cache[0].offset if cache is not None else 0
            query = mx.arange(start, start + n)[:, None]
            key = mx.arange(start + n)[None, :]
            mask = (key <= query) & (key > query - window)  # True: attended
        return base.__call__(self, inputs_embeds, mask, cache)

    pre.__class__ = type(base.__name__, (base,), {"__call__": __call__})


class DecoderStreams:
    """The codec decoder's streaming state, one per stream (see the module docstring).

    ``switch_to(stream)`` before a stream's step: parks the state of the stream that stepped
    last on that stream and puts ``stream``'s back (a new stream starts from a reset state).
    ``release(stream)`` when a stream ends: drops what it parked, and resets the decoder when
    the state on it is that stream's. Lane thread only, like every step.
    """

    def __init__(self, decoder: Any) -> None:
        self._decoder = decoder
        # the decoder is mx.compile'd by mlx-audio's loader: its own module is the root of
        # named_modules() (the compiled wrapper does not show the module's array attributes)
        modules = dict(decoder.named_modules())
        self._root = modules[""]
        self._holders = [
            (m, [a for a in DECODER_STATE if hasattr(m, a)])
            for m in modules.values() if hasattr(m, "reset_state")
        ]
        if (not hasattr(self._root, "_transformer_cache")
                or not all(attrs for _, attrs in self._holders)):
            raise EngineError("engine_failed", "this mlx-audio's Qwen3-TTS codec decoder keeps "
                              "its streaming state where the qwen3 engine does not expect it")
        self.owner: Qwen3Stream | None = None

    def switch_to(self, stream: Qwen3Stream) -> None:
        if self.owner is stream:
            return
        if self.owner is not None:
            self.owner._decoder_state = self._save()
        state, stream._decoder_state = stream._decoder_state, None
        if state is None:
            self._decoder.reset_streaming_state()
        else:
            self._restore(state)
        self.owner = stream

    def release(self, stream: Qwen3Stream) -> None:
        stream._decoder_state = None
        if self.owner is stream:
            self._decoder.reset_streaming_state()
            self.owner = None

    def _save(self) -> tuple[Any, list[list[Any]]]:
        """The state on the decoder, its tails copied out of the chunk tensors they are
        slices of (``mx.contiguous`` copies a view): a parked slice kept its whole chunk's
        tensor alive: 97 % of what a parked stream held on the tiny test model."""
        import mlx.core as mx

        tails = [[None if (v := getattr(m, a, None)) is None else mx.contiguous(v)
                  for a in attrs] for m, attrs in self._holders]
        mx.eval([v for held in tails for v in held if v is not None])
        return getattr(self._root, "_transformer_cache", None), tails

    def _restore(self, state: tuple[Any, list[list[Any]]]) -> None:
        cache, values = state
        self._root._transformer_cache = cache
        for (m, attrs), vs in zip(self._holders, values, strict=True):
            for a, v in zip(attrs, vs, strict=True):
                setattr(m, a, v)


class Qwen3Engine(Uninterruptible):
    """Qwen3-TTS (mlx-audio) on the gpu lane. See the module docstring."""

    name = "qwen3"
    lane: Lane = "gpu"
    streams = True
    reads_digits = True
    speed_range = None  # mlx-audio's Qwen3-TTS has no speed: it speaks at its own pace
    max_open_streams = 16
    """Streams its lane keeps open at once (``[tts] max_open_streams``; the scheduler's rule
    6): each holds its KV caches and decoder state in the memory the LLM shares, 52 MB for
    a sentence of up to 17 s with the public 0.6B and 1.7B checkpoints, 266 MB at the
    runaway budget of a 400-character one (bench/qwen3_memory.py). 16: at most 0.83 GB
    (4.3 GB), while the lane feeds about two listeners in real time (RTF 0.44; one while the
    LLM decodes), so a 17th session speaking at once was starved anyway."""
    timing = {"first_s": 0.107, "rtf": 0.44, "first_s_llm": 0.216, "rtf_llm": 0.97}
    """For placing turns between lanes (``engines.base``): the 0.6B bf16 model on the hub
    (M5 Max), idle and with Gemma 4 26B-A4B decoding (calibration.json, medians). Override
    with ``[tts.profiles.gpu]`` for another model or machine (1.7B: 0.108/0.56, 0.251/1.13)."""

    def __init__(
        self,
        model: str,
        voice: str | None = None,
        ref_audio: str | None = None,
        ref_text: str | None = None,
        temperature: float = 0.7,
        top_p: float | None = None,
        max_tokens: int | None = None,
        streaming_interval: float = 0.32,
        runaway_factor: float = 0.25,
        runaway_min_s: float = 3.0,
        language: str = "auto",
        warmup_text: str = "Hello.",
    ) -> None:
        """``runaway_factor`` is seconds of audio allowed per character of text (a CJK one
        counts as three: ``engines.mlx_common.runaway_budget_s``); a synthesis longer than
        ``max(runaway_min_s, len(text) * runaway_factor)`` is a runaway (normal speech is
        ~0.07 s per letter)."""
        self.model_ref = model
        self.default_voice = voice
        self.ref_audio = reference_audio(ref_audio)
        self.ref_text = ref_text
        self.temperature = temperature
        self.top_p = top_p
        self.max_tokens = max_tokens
        self.streaming_interval = streaming_interval
        self.runaway_factor = runaway_factor
        self.runaway_min_s = runaway_min_s
        self.language = language
        self.warmup_text = warmup_text
        self.warmup_s: float | None = None
        self._model: Any = None
        self._kind: str | None = None
        self._ref_array: Any = None
        self._embeddings: PrecomputedSpeakerEmbeddings | None = None
        self._decoder: DecoderStreams | None = None
        self._lifecycle = MlxLifecycle(self.name, log)

    # -- TtsEngine -------------------------------------------------------------------

    @property
    def instructions(self) -> bool:
        """Whether ``request.options["instructions"]`` reaches the model (see above)."""
        model = self._model
        return (model is not None and self._kind == "custom_voice"
                and getattr(model.config, "tts_model_size", "0b6") != "0b6")

    def voices(self) -> list[str]:
        if self._model is None:
            if self.default_voice:
                return [self.default_voice]
            return [self._clone_name()] if self.ref_audio else []
        if self._kind == "custom_voice":
            return list(self._model.get_supported_speakers())
        return [self._clone_name()]

    def load(self) -> None:
        if self._model is not None:
            return
        self._lifecycle.claim_thread()
        quiet_tqdm()
        require_mlx_audio(self.name)
        path = resolve_model_path(self.model_ref)
        t0 = time.perf_counter()
        model = load_tts_model(path, ("qwen3_tts",), "Qwen3-TTS")
        # mlx-audio's post_load_hook prints a warning and carries on when the tokenizers
        # fail to load; a half-loaded model must not pass for a loaded one.
        if getattr(model, "model_type", None) != "qwen3_tts":
            raise EngineError("engine_failed", f"{path} is not a Qwen3-TTS model")
        if model.tokenizer is None or model.speech_tokenizer is None:
            raise EngineError("engine_failed", f"{path}: text or speech tokenizer did not load")
        kind = getattr(model.config, "tts_model_type", "base")
        self._kind = kind
        if kind == "custom_voice":
            listed = list(model.get_supported_speakers())
            speakers = [s.lower() for s in listed]
            if not speakers:
                raise EngineError("engine_failed", f"{path}: custom_voice model without speakers")
            if self.ref_audio is not None:  # (it was ignored: the gateway spoke speakers[0])
                raise EngineError(
                    "engine_failed", f"{path} is a CustomVoice model: it speaks its built-in "
                    f"speakers ({', '.join(speakers)}) and cannot clone ref_audio "
                    f"{self.ref_audio} ([tts] voice_ref, --voice-ref): choose a speaker with "
                    "voice, or use a Base model to clone")
            named = (self.default_voice or speakers[0]).lower()
            if named not in speakers:
                raise EngineError(
                    "voice_unknown", f"voice {self.default_voice!r} not in {speakers}"
                )
            # spelt as voices() lists it: the model card writes "Serena", the checkpoint
            # "serena", and the default the gateway announces (/v1/audio/voices) must be
            # one of the voices it lists
            self.default_voice = listed[speakers.index(named)]
        elif kind == "base":
            if self.ref_audio is None:
                raise EngineError("engine_failed", f"{path} is a Base model: it clones a voice "
                                  "and needs ref_audio, a reference WAV ([tts] voice_ref, "
                                  "--voice-ref)")
            if model.speaker_encoder is None:
                raise EngineError("engine_failed", f"{path}: base model has no speaker encoder")
            try:
                import mlx.core as mx
                from mlx_audio.utils import load_audio

                self._ref_array = load_audio(str(self.ref_audio), sample_rate=SAMPLE_RATE)
                self._embeddings = PrecomputedSpeakerEmbeddings(model.extract_speaker_embedding)
                self._embeddings.register(self._ref_array)
                mx.eval(self._ref_array)
            except Exception as exc:
                raise mlx_failure(exc, f"reference audio {self.ref_audio}") from exc
            model.extract_speaker_embedding = self._embeddings
            # the one voice it speaks has a name, as a built-in speaker's (the sessions'
            # default_voice and the HTTP API's voices list said null)
            self.default_voice = self._clone_name()
            if self.ref_text is not None and not model.speech_tokenizer.has_encoder:
                log.warning(
                    "qwen3: ref_text given but the speech tokenizer has no encoder; "
                    "using x-vector cloning (ref_audio only)"
                )
        else:
            raise EngineError("engine_failed", f"unsupported Qwen3-TTS model type {kind!r}")
        if kind == "custom_voice" or self.ref_text is None:
            # the codec's encoder serves ICL cloning only (ref_audio with ref_text); the
            # public checkpoints ship it to every kind: ~0.2 GB of float32 held for nothing
            # in the memory the LLM shares (the warm-up's clear_cache returns it)
            model.speech_tokenizer.encoder_model = None
        self.language = self._language_of(model, self.language, "engine_failed")
        window_codec_attention(model.speech_tokenizer.decoder)
        self._decoder = DecoderStreams(model.speech_tokenizer.decoder)
        self._model = model
        load_s = time.perf_counter() - t0
        self.warmup_s = self._lifecycle.warm_up_and_log(
            self, self.warmup_text, "qwen3 loaded %s (%s) in %.2f s", path, kind, load_s
        )

    def open(self, request: SynthesisRequest) -> Qwen3Stream:
        self._lifecycle.admit(self._model)
        language = self.language if "language" not in request.options else (
            self._language_of(self._model, request.options["language"], "bad_request"))
        return self._lifecycle.track(
            Qwen3Stream(self, request, self._voice_for(request.voice), language))

    def close(self) -> None:
        self._lifecycle.close(self._unload)

    # -- extras ------------------------------------------------------------------------

    def memory(self) -> dict[str, int | None]:
        """MLX active and peak bytes, process RSS and peak RSS."""
        return process_memory()

    @property
    def conditioning_computations(self) -> int:
        """How many times the speaker encoder ran (1 per cloned voice when all is well)."""
        return 0 if self._embeddings is None else self._embeddings.computed

    def runaway_budget_s(self, text: str) -> float:
        return runaway_budget_s(text, self.runaway_factor, self.runaway_min_s)

    # -- internals ---------------------------------------------------------------------

    def _unload(self) -> bool:
        model = self._model
        if model is not None and self._embeddings is not None:
            # the shadow holds the model's own bound method: model -> shadow -> model, a
            # cycle only the collector breaks (never, for a heap frozen after start-up), so
            # the weights outlived close() and their MLX buffers missed its clear_cache()
            del model.extract_speaker_embedding
        self._model = self._ref_array = self._embeddings = self._decoder = None
        return model is not None

    def _clone_name(self) -> str:
        return self.default_voice or Path(str(self.ref_audio)).stem

    def interval_for(self, request: SynthesisRequest) -> float:
        """mlx-audio's ``streaming_interval`` for ``request``: its ``step_ms`` in whole codec
        frames (at least one, 80 ms), or the engine's own interval."""
        if request.step_ms is None:
            return self.streaming_interval
        frames = max(1, round(request.step_ms / 1000 * CODEC_HZ))
        return frames / CODEC_HZ

    @staticmethod
    def _language_of(model: Any, language: str, code: str) -> str:
        """``language`` as the model's config names it ("de", "de-DE", "German" ->
        "german"); EngineError ``code`` for one it does not speak. mlx-audio itself took an
        unknown name for "auto" without a word."""
        name = language.strip().lower()
        name = LANGUAGE_CODES.get(name.partition("-")[0].partition("_")[0], name)
        supported = [lang.lower() for lang in model.get_supported_languages()]
        if name not in supported:
            codes = [k for k, v in LANGUAGE_CODES.items() if v in supported]
            raise EngineError(code, f"qwen3 does not speak language {language!r}: it speaks "
                              f"{', '.join(supported)} (or {', '.join(codes)})")
        return name

    def _voice_for(self, requested: str | None) -> str | None:
        """The speaker to pass to mlx-audio (None for a clone)."""
        if self._kind == "custom_voice":
            voice = (requested or self.default_voice or "").lower()
            if voice not in [s.lower() for s in self._model.get_supported_speakers()]:
                raise EngineError("voice_unknown", f"qwen3 has no voice {requested!r}")
            return voice
        if requested is not None and requested != self._clone_name():
            raise EngineError("voice_unknown", f"qwen3 has no voice {requested!r}")
        return None


class Qwen3Stream(Uninterruptible):
    """One Qwen3-TTS synthesis; ``step`` = ``next()`` of mlx-audio's streaming generator."""

    def __init__(self, engine: Qwen3Engine, request: SynthesisRequest, speaker: str | None,
                 language: str = "auto"):
        self._engine = engine
        self._request = request
        self._speaker = speaker
        self._language = language
        # The gateway hands over one sentence; mlx-audio would otherwise split on "\n"
        # and restart its streaming decoder per line.
        self._text = " ".join(request.text.split())
        self._budget_samples = int(engine.runaway_budget_s(self._text) * SAMPLE_RATE)
        self._samples = 0
        self._gen: Any = None
        self._done = False
        self._steps = 0
        self._decoder_state: Any = None
        """This stream's codec-decoder state while another stream steps (``DecoderStreams``)."""

    @property
    def samples(self) -> int:
        return self._samples

    def step(self) -> bytes | None:
        if self._done:
            return None
        engine = self._engine
        engine._lifecycle.check_thread()
        try:
            if self._gen is None:
                self._gen = self._start()
            decoder = engine._decoder
            if decoder is not None:
                decoder.switch_to(self)
            seed = self._request.seed
            if seed is not None:
                seed_sampling(seed, self._steps)
            try:
                result = next(self._gen)
            finally:
                self._steps += 1
                if seed is not None:
                    unseed_sampling()
            audio = result.audio
            n = int(audio.shape[0])
            if self._samples + n > self._budget_samples:
                raise EngineError(
                    "engine_runaway",
                    f"qwen3 produced more than {self._budget_samples / SAMPLE_RATE:.1f} s of "
                    f"audio for {len(self._text)} characters; generation stopped",
                )
            pcm = float_to_pcm16(audio)
        except StopIteration:
            self._finish()
            return None
        except Exception as exc:
            self._finish()
            raise mlx_failure(exc, "qwen3 generation failed") from exc
        self._samples += n
        return pcm

    def close(self) -> None:
        self._finish()

    def _start(self) -> Any:
        engine, req = self._engine, self._request
        max_tokens = req.options.get("max_tokens", engine.max_tokens)
        interval = engine.interval_for(req)
        if max_tokens is None:
            # One chunk past the runaway budget is enough to detect a runaway.
            chunk = max(1, int(interval * CODEC_HZ))
            max_tokens = math.ceil(self._budget_samples / SAMPLE_RATE * CODEC_HZ) + chunk
        kwargs: dict[str, Any] = dict(
            text=self._text,
            temperature=req.temperature if req.temperature is not None else engine.temperature,
            top_p=req.top_p if req.top_p is not None else engine.top_p,
            max_tokens=max_tokens,
            lang_code=self._language,
            stream=True,
            streaming_interval=interval,
            split_pattern="",
        )
        if self._speaker is not None:
            kwargs["voice"] = self._speaker
            if req.options.get("instructions") and engine.instructions:
                kwargs["instruct"] = req.options["instructions"]
        else:
            kwargs["ref_audio"] = engine._ref_array
            if engine.ref_text is not None:
                kwargs["ref_text"] = engine.ref_text
        return engine._model.generate(**kwargs)

    def _finish(self) -> None:
        if self._done:
            return
        self._done = True
        gen, self._gen = self._gen, None
        try:
            if gen is not None:
                gen.close()
        finally:
            decoder = self._engine._decoder
            if decoder is not None:
                decoder.release(self)
            import mlx.core as mx

            mx.clear_cache()  # upstream leak: GBs per request without it
