"""Pytest fixtures for the MLX engines: tiny Qwen3-TTS models built once per test session.

Register with ``pytest_plugins = ["tests.fixtures_mlx"]`` in the root ``tests/conftest.py``.
Each fixture skips (with the reason) when mlx-audio is not installed, so the plain test
suite runs without the ``mlx`` extra.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hang_guard import HANG_S

# Before anything imports huggingface_hub (it reads these at import time).
os.environ["HF_HUB_OFFLINE"] = "1"

NO_STEP_DEADLINE = 3600
"""``[tts] step_timeout_s`` for a gateway speaking with a tiny model: its most, past the
test's own time limit (pytest-timeout). A tiny qwen3 step of 4 codec frames costs ~2.4 s
of CPU, and on a starved machine (2 cores shared with other runs) passed the 30 s
default: the turn failed ``engine_timeout``, a slow machine taken for a stuck engine. No
test of a tiny model holds the deadline; test_faults does, with engines that hang."""


def _require_mlx_audio() -> None:
    pytest.importorskip("mlx.core", reason="needs the mlx extra (mlx[cpu] on Linux)")
    pytest.importorskip("mlx_audio", reason="needs the mlx extra (mlx-audio)")


@pytest.fixture(scope="session")
def offline_hf_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty, existing HF cache with the hub switched off, so nothing can be fetched."""
    cache = tmp_path_factory.mktemp("hf-cache")
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_HUB_CACHE"] = str(cache)
    try:  # already imported by an earlier test: update its import-time constants too
        import huggingface_hub.constants as hf_constants

        hf_constants.HF_HUB_CACHE = str(cache)
        hf_constants.HF_HUB_OFFLINE = True
    except ImportError:
        pass
    return cache


@pytest.fixture(scope="session")
def tiny_qwen3_custom_voice(
    tmp_path_factory: pytest.TempPathFactory, offline_hf_cache: Path
) -> Path:
    """Directory of a tiny ``custom_voice`` Qwen3-TTS model (speakers ``aria``, ``bram``,
    ``serena``)."""
    _require_mlx_audio()
    from tests.tiny_models.qwen3 import build_tiny_qwen3

    return build_tiny_qwen3(tmp_path_factory.mktemp("qwen3-cv"), "custom_voice")


@pytest.fixture(scope="session")
def tiny_qwen3_base(tmp_path_factory: pytest.TempPathFactory, offline_hf_cache: Path) -> Path:
    """Directory of a tiny ``base`` Qwen3-TTS model with a speaker encoder (x-vector clone)."""
    _require_mlx_audio()
    from tests.tiny_models.qwen3 import build_tiny_qwen3

    return build_tiny_qwen3(tmp_path_factory.mktemp("qwen3-base"), "base")


@pytest.fixture(scope="session")
def reference_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1.5 s, 24 kHz, 16-bit mono reference WAV (a gliding tone plus noise)."""
    from tests.tiny_models.qwen3 import write_reference_wav

    return write_reference_wav(tmp_path_factory.mktemp("ref") / "ref.wav")


@pytest.fixture(scope="session")
def short_reference_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 0.2 s reference WAV: S3Gen re-runs its flow over every reference mel frame on every
    sentence, so on mlx-cpu a 1.5 s reference makes one tiny Chatterbox synthesis ~7x slower."""
    from tests.tiny_models.qwen3 import write_reference_wav

    return write_reference_wav(tmp_path_factory.mktemp("ref-short") / "short.wav", seconds=0.2)


@pytest.fixture(scope="session")
def tiny_chatterbox(tmp_path_factory: pytest.TempPathFactory, offline_hf_cache: Path) -> Path:
    """Directory of a tiny Chatterbox (1-layer T3), with a tiny S3TokenizerV2 seeded in the
    HF cache.

    Registers the tiny T3 size in mlx-audio's ``LLAMA_CONFIGS``, and the tiny speech
    tokenizer's, for this process.
    """
    _require_mlx_audio()
    from tests.tiny_models.chatterbox import (
        build_tiny_chatterbox,
        register_tiny_llama,
        register_tiny_s3_tokenizer,
        seed_s3_tokenizer_cache,
    )

    register_tiny_llama()
    register_tiny_s3_tokenizer()
    seed_s3_tokenizer_cache(offline_hf_cache)
    return build_tiny_chatterbox(tmp_path_factory.mktemp("chatterbox"))


@pytest.fixture(scope="session")
def tiny_chatterbox_turbo(tmp_path_factory: pytest.TempPathFactory, offline_hf_cache: Path) -> Path:
    """Directory of a tiny Chatterbox-Turbo (1-layer GPT-2 T3, a built-in 0.2 s voice), with
    a tiny S3TokenizerV2 seeded in the HF cache.

    Swaps the tiny GPT-2 size into mlx-audio's turbo T3 module, and the tiny speech
    tokenizer's, for this process.
    """
    _require_mlx_audio()
    from tests.tiny_models.chatterbox import register_tiny_s3_tokenizer, seed_s3_tokenizer_cache
    from tests.tiny_models.chatterbox_turbo import build_tiny_chatterbox_turbo, register_tiny_gpt2

    register_tiny_gpt2()
    register_tiny_s3_tokenizer()
    seed_s3_tokenizer_cache(offline_hf_cache)
    return build_tiny_chatterbox_turbo(tmp_path_factory.mktemp("chatterbox-turbo"))


@pytest.fixture(scope="session")
def turbo_reference_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 5.2 s reference WAV: Chatterbox-Turbo refuses one of 5 s or less."""
    from tests.tiny_models.qwen3 import write_reference_wav

    return write_reference_wav(tmp_path_factory.mktemp("ref-turbo") / "turbo.wav", seconds=5.2)


@pytest.fixture(scope="session")
def mlx_audio_server(tiny_qwen3_custom_voice: Path, offline_hf_cache: Path):
    """mlx-audio's real HTTP server in a subprocess on 127.0.0.1:0: (base URL, model path)."""
    pytest.importorskip("mlx_audio.server", reason="needs mlx-audio's server extras")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(offline_hf_cache))
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.tts_servers.mlx_audio_server"],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}/v1", str(tiny_qwen3_custom_voice)
    finally:
        proc.terminate()
        proc.wait(timeout=HANG_S)
        proc.stdout.close()  # (left to the GC: a ResourceWarning at the session's end)
