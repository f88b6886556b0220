"""Engines and LLM backends by short name, imported only when chosen (uvicorn's habit).

A gateway that speaks with espeak never imports mlx.
"""

from __future__ import annotations

import importlib
from typing import Any

from engines.base import LlmBackend, TtsEngine

TTS_ENGINES: dict[str, str] = {
    "espeak": "engines.espeak:EspeakEngine",
    "synthetic": "engines.synthetic:SyntheticEngine",
    "qwen3": "engines.qwen3:Qwen3Engine",
    "chatterbox": "engines.chatterbox:ChatterboxEngine",
    "http": "engines.http_tts:HttpTtsEngine",
    "ane": "engines.ane:AneEngine",
}

LLM_BACKENDS: dict[str, str] = {
    "openai": "engines.llm_openai:OpenAiLlm",
    "replay": "engines.llm_replay:ReplayLlm",
}


def _import(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def create_engine(name: str, **options: Any) -> TtsEngine:
    """Build the TTS engine called ``name`` with its options (not yet loaded)."""
    try:
        target = TTS_ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown TTS engine {name!r}; known: {', '.join(TTS_ENGINES)}") from None
    engine: TtsEngine = _import(target)(**options)
    return engine


def create_llm(name: str, **options: Any) -> LlmBackend:
    try:
        target = LLM_BACKENDS[name]
    except KeyError:
        raise ValueError(
            f"unknown LLM backend {name!r}; known: {', '.join(LLM_BACKENDS)}"
        ) from None
    backend: LlmBackend = _import(target)(**options)
    return backend
