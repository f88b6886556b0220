"""Qwen3-TTS on the Apple Neural Engine through its Core ML port (``qwen3_tts_ane``).

Leaves the GPU to the LLM: lane ``ane``. The port's API as used here::

    from qwen3_tts_ane import Qwen3TTSANE
    tts = Qwen3TTSANE(...)             # loads the Core ML models
    voice = tts.voice("Serena")        # English "Serena" is the only voice
    for chunk in voice.stream(text):   # 80 ms chunks of 24 kHz PCM16: chunk.pcm_s16le
        ...

It runs one synthesis at a time: the lane runs one step at a time, and ``open`` refuses a
second synthesis while another is still open (``engine_busy``), because interleaving two
generators on the port is not supported. One ``step`` = one 80 ms chunk.
macOS only: importing it elsewhere raises ``EngineError("engine_unavailable", ...)``.
"""

from __future__ import annotations

from typing import Any

from engines.base import EngineError, SynthesisRequest, Uninterruptible

VOICE = "Serena"


class AneEngine(Uninterruptible):
    name = "ane"
    lane = "ane"
    streams = True
    timing = {"first_s": 0.045, "rtf": 0.705}
    """For placing turns between lanes (``engines.base``): first PCM 44.9 ms, 0.705 s per
    audio second (M4 MacBook Air, calibration.json, medians). The ANE is not shared with the
    LLM: no contention figures."""
    reads_digits = True  # the same Qwen3-TTS talker as the qwen3 engine
    speed_range = None
    one_stream_at_a_time = True  # its lane runs whole jobs, never two streams at once

    def __init__(self, voice: str = VOICE, **model_options: Any) -> None:
        if voice != VOICE:
            raise ValueError(f"the ANE port speaks only {VOICE!r}")
        self.voice_name = voice
        self.model_options = model_options
        self._tts: Any = None
        self._voice: Any = None
        self._active: AneStream | None = None

    def voices(self) -> list[str]:
        return [self.voice_name]

    def load(self) -> None:
        if self._voice is not None:
            return
        try:
            from qwen3_tts_ane import Qwen3TTSANE
        except ImportError as exc:
            raise EngineError(
                "engine_unavailable",
                "the ane engine needs the qwen3_tts_ane package (Qwen3-TTS Core ML port, "
                "macOS on Apple Silicon only)",
            ) from exc
        try:
            self._tts = Qwen3TTSANE(**self.model_options)
            self._voice = self._tts.voice(self.voice_name)
        except Exception as exc:
            raise EngineError("engine_failed", f"ANE model load: {exc!r}") from exc

    def open(self, request: SynthesisRequest) -> AneStream:
        if self._voice is None:
            raise EngineError("engine_failed", "ane engine used before load() or after close()")
        if request.voice is not None and request.voice.lower() != self.voice_name.lower():
            raise EngineError("voice_unknown", f"ane has no voice {request.voice!r}")
        if self._active is not None and not self._active.done:
            raise EngineError("engine_busy", "the ANE port runs one synthesis at a time")
        self._active = AneStream(self, request.text)
        return self._active

    def close(self) -> None:
        if self._active is not None:
            self._active.close()
        self._voice = None
        tts, self._tts = self._tts, None
        if tts is not None and hasattr(tts, "close"):
            tts.close()


class AneStream(Uninterruptible):
    def __init__(self, engine: AneEngine, text: str) -> None:
        self._engine = engine
        self._text = text
        self._chunks: Any = None
        self._carry = b""
        self.done = False

    def step(self) -> bytes | None:
        if self.done:
            return None
        try:
            if self._chunks is None:
                self._chunks = iter(self._engine._voice.stream(self._text))
            chunk = next(self._chunks, None)
            if chunk is None:
                self.close()
                return None
            data = self._carry + bytes(chunk.pcm_s16le)
        except EngineError:
            self.close()
            raise
        except Exception as exc:
            self.close()
            raise EngineError("engine_failed", f"ANE synthesis: {exc!r}") from exc
        cut = len(data) & ~1
        self._carry = data[cut:]
        return data[:cut]

    def close(self) -> None:
        if self.done:
            return
        self.done = True
        chunks, self._chunks = self._chunks, None
        if chunks is not None and hasattr(chunks, "close"):
            chunks.close()  # a generator: runs the port's cleanup (finally blocks)
