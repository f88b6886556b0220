"""Gateway configuration: small frozen dataclasses with defaults that serve, and the one
place that turns a TOML file and command-line flags into them (flags win over the file).

TOML layout (every key optional; see examples/hub.toml)::

    [server]   host, port, max_sessions, http_port, lane_policy
    [llm]      url, model, api_key, temperature, max_tokens, replies (replay file), tokens_per_s
    [tts]      engine, model, voice, voice_ref, voice_ref_text, url, fallback
    [tts.options]            more options of the primary engine
    [tts.fallback_options]   options of the fallback engine
    [tts.fallback_policy]    first_chunk_timeout_s, breaker_failures, breaker_reset_s
    [tts] also               a second engine, on its own lane (e.g. "ane" next to qwen3)
    [tts.also_options]       its options
    [tts.profiles.<lane>]    first_s, rtf, first_s_llm, rtf_llm: timing for turn placement
    [session]  instructions, frame_ms, max_lead_ms, history_turns
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from gateway.core.session import DEFAULT_INSTRUCTIONS


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8780
    max_sessions: int = 10_000
    tokens: tuple[str, ...] = ()
    """Accepted bearer tokens. Empty: no auth, and only a loopback address may be bound."""
    insecure_bind: bool = False
    """Allow binding a non-loopback address without tokens (say you mean it)."""
    origins: tuple[str, ...] | None = None
    """Allowed browser ``Origin`` values (None: any). Clients without ``Origin`` pass."""
    tls_cert: str | None = None
    tls_key: str | None = None
    turns_per_minute: int = 60
    """Per session; 0 disables the limit."""
    resume_window_s: float = 30.0
    """How long a session whose socket dropped waits for ``session.resume``."""
    outbox_bytes: int = 1024 * 1024
    """Per session: unread output past this closes the session (``slow_consumer``); also
    what a resume can replay."""
    http_port: int | None = None
    """HTTP API (speech, health, metrics). None: ``port + 1`` (8781), or a free port when
    ``port`` is 0; 0: a free port."""
    lane_policy: str = "scheduler"
    """How the engine lane shares its steps: ``scheduler`` (interactive first, by deadline,
    just in time) or ``fifo`` (whole generations, first come first served: the old sidecar,
    a baseline). See ``gateway.core.scheduler``."""

    def __post_init__(self) -> None:
        if self.lane_policy not in ("scheduler", "fifo"):
            raise ValueError(f"lane_policy must be 'scheduler' or 'fifo', not "
                             f"{self.lane_policy!r}")


@dataclass(frozen=True, slots=True)
class LlmConfig:
    url: str | None = None
    """OpenAI-compatible base URL (``.../v1``). None: the scripted ``replay`` backend."""
    model: str | None = None
    api_key: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    replies: str | None = None
    """JSONL of {transcript, reply} for the replay backend (default: the shipped set)."""
    tokens_per_s: float = 51.5
    """Pace of the replay backend (oMLX's measured decode rate); 0 = no delay."""

    @property
    def backend(self) -> str:
        return "openai" if self.url else "replay"


@dataclass(frozen=True, slots=True)
class TtsConfig:
    engine: str = "espeak"
    model: str | None = None
    voice: str | None = None
    voice_ref: str | None = None
    voice_ref_text: str | None = None
    url: str | None = None
    fallback: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    """Further constructor options of the primary engine (e.g. ``temperature``, ``rtf``)."""
    fallback_options: dict[str, Any] = field(default_factory=dict)
    """Constructor options of the fallback engine (its own ``model``, ``ref_audio``, ...)."""
    fallback_policy: dict[str, Any] = field(default_factory=dict)
    """``first_chunk_timeout_s``, ``breaker_failures``, ``breaker_reset_s``."""
    step_timeout_s: float | None = 30.0
    """An engine call running longer marks the lane unhealthy (``engine_timeout``)."""
    also: str | None = None
    """A second engine on its own lane (it must declare another lane than the primary, e.g.
    ``ane`` next to ``qwen3`` on ``gpu``). Each turn then speaks on the lane that serves it
    best among those whose engine has the turn's voice (``gateway.core.placement``)."""
    also_options: dict[str, Any] = field(default_factory=dict)
    """Constructor options of the ``also`` engine."""
    profiles: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per lane, timing figures that override the engine's own ``timing`` (``first_s``,
    ``rtf``, ``first_s_llm``, ``rtf_llm``), used to place turns between lanes."""

    def engine_options(self) -> dict[str, Any]:
        """Keyword arguments for the primary engine's constructor."""
        named = {"model": self.model, "ref_audio": self.voice_ref,
                 "ref_text": self.voice_ref_text, "url": self.url}
        out = {k: v for k, v in named.items() if v is not None}
        if self.voice is not None:
            out["voice"] = self.voice
        return {**out, **self.options}


@dataclass(frozen=True, slots=True)
class SessionDefaults:
    instructions: str = DEFAULT_INSTRUCTIONS
    frame_ms: int = 40
    max_lead_ms: int = 1000
    history_turns: int = 20


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    server: ServerConfig = field(default_factory=ServerConfig)
    llm: LlmConfig = field(default_factory=LlmConfig)
    tts: TtsConfig = field(default_factory=TtsConfig)
    session: SessionDefaults = field(default_factory=SessionDefaults)


_SECTIONS = {"server": ServerConfig, "llm": LlmConfig, "tts": TtsConfig,
             "session": SessionDefaults}


def _section(cls: type, values: dict[str, Any], where: str) -> Any:
    names = {f.name for f in fields(cls)}
    unknown = set(values) - names
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; "
                         f"known: {', '.join(sorted(names))}")
    for f in fields(cls):  # TOML arrays arrive as lists; the dataclasses hold tuples
        if isinstance(values.get(f.name), list):
            values = {**values, f.name: tuple(values[f.name])}
    return cls(**values)


def load_config(path: str | Path | None = None, **overrides: dict[str, Any]) -> GatewayConfig:
    """Read ``path`` (TOML) if given, then apply ``overrides`` ({section: {key: value}},
    ``None`` values ignored)."""
    data: dict[str, Any] = {}
    if path is not None:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    unknown = set(data) - set(_SECTIONS)
    if unknown:
        raise ValueError(f"{path}: unknown section(s) {', '.join(sorted(unknown))}")
    parts = {}
    for name, cls in _SECTIONS.items():
        section = _section(cls, data.get(name, {}), f"{path}[{name}]")
        changes = {k: v for k, v in overrides.get(name, {}).items() if v is not None}
        for key, value in changes.items():  # option tables merge, flags win
            if isinstance(value, dict):
                changes[key] = {**getattr(section, key), **value}
        parts[name] = replace(section, **changes)
    return GatewayConfig(**parts)
