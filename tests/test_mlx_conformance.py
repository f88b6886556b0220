"""The shared conformance suite against qwen3 (custom voice, clone), http (SSE, PCM), chatterbox
(and Chatterbox-Turbo).

Random-weight models never stop by themselves: lengths follow ``max_tokens``, not the text,
so the duration and text-scaling checks are off for them.
"""

from __future__ import annotations

import pytest

from engines.base import SynthesisRequest
from engines.http_tts import HttpTtsEngine
from tests.conformance import check_engine
from tests.tts_servers.sse_tts_double import DONE, ScriptedSseServer, delta

# A random-weight codec decoder is quiet (RMS ~20 of 32767), not silent.
TINY = dict(
    audio_seconds=None, check_text_scaling=False, max_chunk_s=0.5, call_timeout_s=300, min_rms=5.0
)


@pytest.mark.slow
def test_qwen3_custom_voice_conforms(tiny_qwen3_custom_voice):
    from engines.qwen3 import Qwen3Engine

    check_engine(
        lambda: Qwen3Engine(str(tiny_qwen3_custom_voice), voice="aria", max_tokens=8), **TINY
    )


@pytest.mark.slow
def test_qwen3_clone_conforms(tiny_qwen3_base, reference_wav):
    from engines.qwen3 import Qwen3Engine

    check_engine(
        lambda: Qwen3Engine(str(tiny_qwen3_base), ref_audio=str(reference_wav), max_tokens=8),
        **TINY,
    )


@pytest.mark.slow
def test_chatterbox_conforms(tiny_chatterbox, short_reference_wav):
    """The production code path with a short reference and one flow step (~5 s a synthesis)."""
    from engines.chatterbox import ChatterboxEngine
    from tests.tiny_models.chatterbox import TINY_ENGINE_OPTIONS

    check_engine(
        lambda: ChatterboxEngine(
            str(tiny_chatterbox), ref_audio=str(short_reference_wav), **TINY_ENGINE_OPTIONS
        ),
        **TINY,
    )


@pytest.mark.slow
def test_chatterbox_turbo_conforms(tiny_chatterbox_turbo):
    """Chatterbox-Turbo through the same engine, with its built-in voice."""
    from engines.chatterbox import ChatterboxEngine
    from tests.tiny_models.chatterbox_turbo import TINY_TURBO_OPTIONS

    check_engine(lambda: ChatterboxEngine(str(tiny_chatterbox_turbo), **TINY_TURBO_OPTIONS), **TINY)


def test_http_sse_conforms():
    """Against the scripted SSE test double: a 0.4 s tone in 4 deltas, then done."""
    import numpy as np

    tone = (3000 * np.sin(np.arange(9600) * 0.05)).astype("<i2").tobytes()
    server = ScriptedSseServer()
    server.script = [delta(tone[i : i + 4800]) for i in range(0, len(tone), 4800)] + [DONE]
    url = server.start()
    try:
        check_engine(lambda: HttpTtsEngine(url, voice="serena"), unknown_voice=None, **TINY)
    finally:
        server.stop()


@pytest.mark.slow
def test_http_pcm_conforms_against_real_mlx_audio_server(mlx_audio_server):
    url, model = mlx_audio_server
    request = SynthesisRequest("Hello there.", options={"http_body": {"max_tokens": 8}})
    check_engine(
        lambda: HttpTtsEngine(url, model=model, voice="aria", format="pcm", read_timeout_s=120),
        request=request,
        **{**TINY, "max_chunk_s": 2.0},
    )
