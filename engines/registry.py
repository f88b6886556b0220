"""Engines and LLM backends by short name, imported only when chosen (uvicorn's habit).

A gateway that speaks with espeak never imports mlx.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

from engines.base import LlmBackend, TtsEngine
from engines.options import check_options

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


@contextlib.contextmanager
def refused_as(what: str) -> Iterator[None]:
    """A refusal (``ValueError``) raised inside names ``what`` it is about: the fallback's
    and the second engine's options are tables of their own, and their refusals read as
    the primary's."""
    try:
        yield
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None


def _import(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def create_engine(name: str, /, names: dict[str, str] | None = None,
                  **options: Any) -> TtsEngine:
    """Build the TTS engine called ``name`` with its options (not yet loaded); ``names``:
    what the operator calls the options the config renamed (``check_options``)."""
    try:
        target = TTS_ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown TTS engine {name!r}; known: {', '.join(TTS_ENGINES)}") from None
    cls = _import(target)
    check_options(cls, options, f"TTS engine {name!r}", names=names)
    engine: TtsEngine = cls(**options)
    return engine


def create_voice(engine: str, options: dict[str, Any], fallback: str | None = None,
                 fallback_options: dict[str, Any] | None = None,
                 fallback_policy: dict[str, Any] | None = None,
                 names: dict[str, str] | None = None,
                 fallback_names: dict[str, str] | None = None) -> TtsEngine:
    """The configured voice: ``engine``, wrapped with ``fallback`` when one is named;
    ``names``, ``fallback_names``: what the operator calls the primary's and the fallback's
    options (``check_options``)."""
    primary = create_engine(engine, names=names, **options)
    if not fallback:
        return primary
    from engines.fallback import FallbackEngine

    with refused_as("the fallback ([tts] fallback, [tts.fallback_options])"):
        backup = create_engine(fallback, names=fallback_names, **(fallback_options or {}))
    policy = fallback_policy or {}
    what = "the fallback policy ([tts.fallback_policy])"
    check_options(FallbackEngine, {"primary": primary, "fallback": backup, **policy}, what,
                  given=("primary", "fallback"))
    with refused_as(what):
        wrapped: TtsEngine = FallbackEngine(primary, backup, **policy)
    return wrapped


def create_llm(name: str, **options: Any) -> LlmBackend:
    try:
        target = LLM_BACKENDS[name]
    except KeyError:
        known = ", ".join(LLM_BACKENDS)
        raise ValueError(f"unknown LLM backend {name!r}; known: {known}") from None
    backend: LlmBackend = _import(target)(**options)
    return backend
