"""Gateway configuration: small frozen dataclasses with defaults that serve, and the one
place that turns a TOML file and command-line flags into them (flags win over the file).

TOML layout (every key optional; the README's Configuration table has each key, its flag
and default, and a test keeps that table complete; see examples/hub.toml)::

    [server]   host, port, http_port, max_sessions, max_speech_requests, tokens,
               insecure_bind, origins, allowed_hosts, tls_cert, tls_key, turns_per_minute,
               resume_window_s, outbox_bytes, lane_policy
    [llm]      url, model, models, api_key, temperature, max_tokens, stall_timeout_s, thinking,
               replies (replay file), tokens_per_s
    [llm.chat_template_kwargs]   sent with each request (e.g. enable_thinking = false)
    [tts]      engine, model, voice, voice_ref, voice_ref_text, url, fallback, also,
               step_timeout_s, max_open_streams, interactive_reserved_streams
    [tts.options]            more options of the primary engine
    [tts.fallback_options]   options of the fallback engine
    [tts.fallback_policy]    first_chunk_timeout_s, breaker_failures, breaker_reset_s
    [tts.also_options]       options of the second engine (``also``, its own lane)
    [tts.profiles.<lane>]    first_s, rtf, first_s_llm, rtf_llm: timing for turn placement
    [session]  instructions, frame_ms, max_lead_ms, history_turns, max_reply_chars

Values are checked when the dataclasses are built: a bad one raises ``ValueError`` naming
its key, and ``voice-gateway serve`` exits 2 with it before serving.
"""

from __future__ import annotations

import logging
import re
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, get_type_hints
from urllib.parse import urlsplit

from engines.base import THINKING_MODES, http_url_fault
from engines.options import describe, mismatch
from engines.registry import TTS_ENGINES
from gateway.core.codec import (
    FRAME_MS_CHOICES,
    LEAD_BELOW_FRAME,
    MAX_INSTRUCTIONS_CHARS,
    MAX_LEAD_MS_RANGE,
)
from gateway.core.session import DEFAULT_INSTRUCTIONS
from gateway.io.auth import SENDABLE_TOKEN, UNSENDABLE_TOKEN

log = logging.getLogger("gateway")


def _check_types(obj: Any, section: str) -> None:
    """Refuse a value of the wrong type with a message naming its key. TOML has types, and
    a wrong one used to pass: ``tokens = "secret"`` made each of its letters a token, and
    ``insecure_bind = "false"`` was true."""
    hints = get_type_hints(type(obj))
    for f in fields(obj):
        found = mismatch(getattr(obj, f.name), hints[f.name], f"{section}.{f.name}")
        if found is not None:
            where, hint, value = found
            if isinstance(value, tuple):  # (a TOML list, kept as a tuple: said as written)
                value = list(value)
            raise ValueError(f"{where} must be {describe(hint)}, not {value!r}")


def _check_int(where: str, value: int, lo: int, hi: int | None = None) -> None:
    """Refuse a configured number outside [lo, hi] with a message naming the key (its type
    was checked by ``_check_types``)."""
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        raise ValueError(f"{where} must be an integer {bound}, not {value!r}")


def _check_seconds(where: str, value: float, lo: float, hi: float, *,
                   above: bool = False) -> None:
    """Refuse a configured duration outside [lo, hi] (``above``: (lo, hi]), naming the key
    (its type was checked by ``_check_types``; NaN is outside any range)."""
    if not (lo < value <= hi if above else lo <= value <= hi):
        bound = f"more than {lo:g} and at most {hi:g}" if above else f"{lo:g}-{hi:g}"
        raise ValueError(f"{where} must be {bound} seconds, not {value!r}")


_TOKENS_FROM = "(--token, VOICE_GATEWAY_TOKENS)"
"""Where tokens come from besides ``[server] tokens``: a refusal names them, as one set in
the environment alone was refused as "server.tokens", a key no file of the user's had."""
_HOST_NAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_.])?")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin_of(value: str) -> str | None:
    """The Origin a browser sends for a page at ``value`` (``scheme://host[:port]``, lower
    case, no default port, no path), or None when ``value`` names no host."""
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:  # a port out of range or not a number, a broken [IPv6]
        return None
    if not parts.scheme or not parts.hostname:
        return None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    scheme = parts.scheme.lower()
    return f"{scheme}://{host}" + ("" if port in (None, _DEFAULT_PORTS.get(scheme))
                                  else f":{port}")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8780
    max_sessions: int = 10_000
    max_speech_requests: int = 64
    """HTTP speech requests open at once (being spoken or sent); past it a request gets 503
    ``server_full`` with ``Retry-After``, as a voice socket past ``max_sessions`` does,
    rather than queueing on the lane without bound (each holds a socket, and a whole file
    all of its audio, up to minutes of it)."""
    tokens: tuple[str, ...] = ()
    """Accepted bearer tokens. Empty: no auth, and only a loopback address may be bound."""
    insecure_bind: bool = False
    """Allow binding a non-loopback address without tokens (say you mean it)."""
    origins: tuple[str, ...] | None = None
    """Allowed browser ``Origin`` values; ``"*"``: any. None: any when tokens are set, else
    only the voice port's own pages (``gateway.io.auth.origin_allowlist``). Clients without
    ``Origin`` pass."""
    allowed_hosts: tuple[str, ...] = ()
    """Without tokens, the ``Host`` names both ports answer besides IP addresses,
    ``localhost`` (and names under it) and the names of ``origins`` (``"*"``: any):
    another name could be an attacker's pointed at this machine (DNS rebinding;
    ``gateway.io.auth.host_allowed``)."""
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
        _check_types(self, "server")
        if self.tls_key is not None and self.tls_cert is None:
            raise ValueError("server.tls_key needs server.tls_cert (--tls-cert)")
        if any(not token.strip() for token in self.tokens):
            # (`--token "$UNSET"`: every client refused, yet a public bind allowed)
            raise ValueError(f"server.tokens {_TOKENS_FROM}: a token cannot be empty")
        if any(not SENDABLE_TOKEN.fullmatch(token) for token in self.tokens):
            # headers arrive as ISO-8859-1 and stripped: 'pässwort' (curl sends UTF-8) was
            # 'pÃ¤sswort' to both ports, a 401 for the right token (httpx cannot send it)
            raise ValueError(f"server.tokens {_TOKENS_FROM}: {UNSENDABLE_TOKEN}")
        for origin in self.origins or ():
            # compared as the browser sends it: 'https://hub.example/' (a page's address)
            # started a gateway that refused that page with forbidden_origin
            if origin not in ("*", "null") and (form := _origin_of(origin)) != origin:
                raise ValueError(f"server.origins: {origin!r} is not an origin as a browser "
                                 "sends it (scheme://host[:port], lower case, without path "
                                 "or default port): " + (f"write {form!r}" if form else
                                 "such as https://hub.example or http://hub.local:3000"))
        for name in self.allowed_hosts:
            if name != "*" and not _HOST_NAME.fullmatch(name):
                raise ValueError(f"server.allowed_hosts: {name!r} is not a host name (a name "
                                 "such as hub.local, without scheme or port; '*': any)")
        _check_int("server.port", self.port, 0, 65535)
        if self.http_port is not None:
            _check_int("server.http_port", self.http_port, 0, 65535)
            if self.http_port == self.port != 0:
                raise ValueError(f"server.http_port and server.port are both {self.port}: the "
                                 "HTTP API needs a port of its own (--http-port)")
        elif self.port == 65535:
            raise ValueError("server.port 65535 leaves no port + 1 for the HTTP API: set "
                             "server.http_port (--http-port)")
        _check_int("server.max_sessions", self.max_sessions, 1)
        _check_int("server.max_speech_requests", self.max_speech_requests, 1)
        _check_int("server.turns_per_minute", self.turns_per_minute, 0)
        _check_int("server.outbox_bytes", self.outbox_bytes, 64 * 1024)
        _check_seconds("server.resume_window_s", self.resume_window_s, 0, 24 * 3600)
        if self.lane_policy not in ("scheduler", "fifo"):
            raise ValueError(f"server.lane_policy must be 'scheduler' or 'fifo', not "
                             f"{self.lane_policy!r}")


@dataclass(frozen=True, slots=True)
class LlmConfig:
    url: str | None = None
    """OpenAI-compatible base URL (``.../v1``). None: the scripted ``replay`` backend."""
    model: str | None = None
    models: tuple[str, ...] = ()
    """The models a client may ask for (``session.llm.model``) besides ``model``; ``"*"``:
    any. The LLM server loads the model asked for, for every session (oMLX swaps its
    loaded model), so by default a client gets ``model`` only."""
    api_key: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    replies: str | None = None
    """JSONL of {transcript, reply} for the replay backend (default: the shipped set)."""
    tokens_per_s: float = 51.5
    """Pace of the replay backend (oMLX's measured decode rate); 0 = no delay."""
    stall_timeout_s: float = 60.0
    """An LLM stream with no data event for this long (keep-alive comments do not count)
    fails the turn with ``llm_unavailable``."""
    thinking: str = "tagged"
    """How a reasoning model's thoughts show in its content, which are never spoken nor kept
    in the history: ``tagged``, between ``<think>`` and ``</think>``; ``opened``, its chat
    template opens ``<think>`` in the prompt (DeepSeek-R1 distills, QwQ), so all before the
    first ``</think>`` is thought (``engines.llm_openai.ThinkFilter``)."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Sent with each request when set; mlx_lm.server, oMLX, vLLM and llama.cpp pass them to
    the chat template (``{enable_thinking = false}`` turns a Qwen3's thinking off)."""

    def __post_init__(self) -> None:
        _check_types(self, "llm")
        if self.url is not None and (wrong := http_url_fault(self.url)) is not None:
            # (the backend's own refusal, "LLM url must be ...", named neither key nor flag)
            raise ValueError(f"llm.url must be http(s)://host[:port]/base, not {wrong} "
                             "(--llm-url)")
        if any(not m.strip() for m in self.models):
            raise ValueError("llm.models: a model name cannot be empty")
        _check_seconds("llm.stall_timeout_s", self.stall_timeout_s, 0, 3600, above=True)
        if self.thinking not in THINKING_MODES:
            raise ValueError(f"llm.thinking must be one of {', '.join(THINKING_MODES)}, not "
                             f"{self.thinking!r}")
        if self.thinking == "opened" and \
                self.chat_template_kwargs.get("enable_thinking") is False:
            # (the template then writes an empty thought itself: no </think> ever comes)
            raise ValueError('llm.thinking = "opened" takes all before the first </think> '
                             "for a thought, and chat_template_kwargs.enable_thinking = false "
                             "leaves none in the reply: every reply would be silent; set "
                             'thinking = "tagged"')
        if self.temperature is not None and not 0 <= self.temperature <= 2:
            raise ValueError(f"llm.temperature must be 0-2, not {self.temperature!r}")
        if self.max_tokens is not None:
            _check_int("llm.max_tokens", self.max_tokens, 1)
        if not self.tokens_per_s >= 0:  # (NaN too: it paced nothing, as 0 does, unsaid)
            raise ValueError(f"llm.tokens_per_s must be 0 or more, not {self.tokens_per_s!r}")


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
    max_open_streams: int | None = None
    """Streams open at once on each lane (``gateway.core.scheduler`` rule 6); None: the
    engine's own ``max_open_streams`` (qwen3's 16; none for the others), 0: no limit."""
    interactive_reserved_streams: int | None = None
    """Of ``max_open_streams``, streams only voice sessions may open (rule 6b: background
    requests never hold them); None: ``gateway.core.scheduler.default_reserve`` (an eighth,
    at least 1: 2 of 16; none with 1)."""
    also: str | None = None
    """A second engine on its own lane (it must declare another lane than the primary, e.g.
    ``ane`` next to ``qwen3`` on ``gpu``). Each turn then speaks on the lane that serves it
    best among those whose engine has the turn's voice (``gateway.core.placement``)."""
    also_options: dict[str, Any] = field(default_factory=dict)
    """Constructor options of the ``also`` engine."""
    profiles: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per lane, timing figures that override the engine's own ``timing`` (``first_s``,
    ``rtf``, ``first_s_llm``, ``rtf_llm``), used to place turns between lanes."""

    def __post_init__(self) -> None:
        _check_types(self, "tts")
        if self.engine not in TTS_ENGINES:  # (it said "unknown TTS engine", naming no key)
            raise ValueError(f"tts.engine must be one of {', '.join(TTS_ENGINES)}, not "
                             f"{self.engine!r} (--tts)")
        if self.step_timeout_s is not None:
            _check_seconds("tts.step_timeout_s", self.step_timeout_s, 0, 3600, above=True)
        if self.max_open_streams is not None:
            _check_int("tts.max_open_streams", self.max_open_streams, 0)
        if self.interactive_reserved_streams is not None:
            _check_int("tts.interactive_reserved_streams", self.interactive_reserved_streams, 0)

    def engine_options(self) -> dict[str, Any]:
        """Keyword arguments for the primary engine's constructor."""
        named = {"model": self.model, "ref_audio": self.voice_ref,
                 "ref_text": self.voice_ref_text, "url": self.url}
        out = {k: v for k, v in named.items() if v is not None}
        if self.voice is not None:
            out["voice"] = self.voice
        return {**out, **self.options}


TTS_OPTION_NAMES = {"model": "model ([tts] model, --tts-model)",
                    "ref_audio": "voice_ref ([tts] voice_ref, --voice-ref)",
                    "ref_text": "voice_ref_text ([tts] voice_ref_text, --voice-ref-text)",
                    "url": "url ([tts] url, --tts-url)"}
"""``TtsConfig.engine_options``' keys as the operator sets them, for a refusal: espeak
given a voice_ref said "unexpected keyword argument 'ref_audio'"."""


def table_option_names(table: str) -> dict[str, str]:
    """The options an engine cannot start without (its model, an ``http`` engine's url) as
    the operator sets them for the fallback or the second engine: in their own table
    (``table``: ``tts.fallback_options``, ``tts.also_options``), no flag. Without them,
    qwen3 as the fallback said "missing a required argument: 'model'", the constructor's
    argument, where the primary's names ``[tts] model, --tts-model``."""
    return {key: f"{key} ([{table}] {key})" for key in ("model", "url")}


@dataclass(frozen=True, slots=True)
class SessionDefaults:
    instructions: str = DEFAULT_INSTRUCTIONS
    frame_ms: int = 40
    max_lead_ms: int = 1000
    history_turns: int = 20
    max_reply_chars: int = 32_000
    """Longest LLM reply a turn takes (``gateway.core.session.SessionLimits``)."""

    def __post_init__(self) -> None:
        _check_types(self, "session")
        # A client's session.update is held to the same frame sizes and smallest lead
        # (protocol.md). The server's own lead may go past a client's 30 s: a lead of hours
        # turns pacing off, for load scripts and tests that want every frame at once.
        if self.frame_ms not in FRAME_MS_CHOICES:
            raise ValueError(f"session.frame_ms must be one of {FRAME_MS_CHOICES}, not "
                             f"{self.frame_ms!r}")
        _check_int("session.max_lead_ms", self.max_lead_ms, MAX_LEAD_MS_RANGE[0])
        if self.max_lead_ms <= self.frame_ms:
            raise ValueError(f"session.max_lead_ms ({self.max_lead_ms}) must be more than "
                             f"session.frame_ms ({self.frame_ms}) (--max-lead-ms, "
                             f"--frame-ms): {LEAD_BELOW_FRAME}")
        if len(self.instructions) > MAX_INSTRUCTIONS_CHARS:
            # (session.created shows them, and a client may send that back as it is)
            raise ValueError(f"session.instructions are {len(self.instructions):,} characters; "
                             f"at most {MAX_INSTRUCTIONS_CHARS:,}, as a session.update may "
                             "send (a client sends the server's own back)")
        _check_int("session.history_turns", self.history_turns, 0)
        _check_int("session.max_reply_chars", self.max_reply_chars, 100)


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    server: ServerConfig = field(default_factory=ServerConfig)
    llm: LlmConfig = field(default_factory=LlmConfig)
    tts: TtsConfig = field(default_factory=TtsConfig)
    session: SessionDefaults = field(default_factory=SessionDefaults)


_SECTIONS = {"server": ServerConfig, "llm": LlmConfig, "tts": TtsConfig,
             "session": SessionDefaults}


def _section(cls: type, values: Any, where: str) -> Any:
    if not isinstance(values, dict):
        raise ValueError(f"{where} must be a table, not {values!r}")
    names = {f.name for f in fields(cls)}
    unknown = set(values) - names
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; "
                         f"known: {', '.join(sorted(names))}")
    for f in fields(cls):  # TOML arrays arrive as lists; the dataclasses hold tuples
        if isinstance(values.get(f.name), list):
            values = {**values, f.name: tuple(values[f.name])}
    return cls(**values)


_ENGINE_SETTINGS = {
    "engine": ("model", "voice", "voice_ref", "voice_ref_text", "url", "options"),
    "fallback": ("fallback_options",),
    "also": ("also_options",),
}
"""For each engine key of ``[tts]``, the settings that belong to the engine it names."""

_ENGINE_FLAGS = {"engine": "--tts", "fallback": "--fallback", "also": "--tts-also"}

_ARRANGEMENT_SETTINGS = {"fallback": ("fallback_policy",), "also": ("profiles",)}
"""The settings of a fallback or second engine that are not the engine's own (another
engine named keeps them) but have no use without one: ``none`` drops them too, else the
gateway warns that the file's tables are ignored, as though the operator had not asked."""


def _without_other_engines_settings(tts: TtsConfig, flags: dict[str, Any],
                                    written: dict[str, Any], path: str | Path | None
                                    ) -> TtsConfig:
    """A flag naming another engine than the file's (``--tts espeak`` over a qwen3 file)
    leaves the file's settings of that engine behind: they are its model, voice and
    constructor options, which the other engine would refuse or misread; ``none`` leaves
    its breaker policy or lane profiles behind too. The file's other settings stand, and so
    do settings given by flags. A file that names no engine (``written``: its ``[tts]``)
    has its settings taken as the default's, so ``--tts http`` left its ``[tts.options]``
    behind, unsaid: a WARNING names them."""
    defaults = TtsConfig()
    reset: dict[str, Any] = {}
    for key, settings in _ENGINE_SETTINGS.items():
        named = flags.get(key)
        if named is not None and named != getattr(tts, key):
            dropped = settings + (_ARRANGEMENT_SETTINGS.get(key, ()) if named == "" else ())
            reset.update((s, getattr(defaults, s)) for s in dropped)
            if named and key not in written and (lost := [s for s in dropped if s in written]):
                log.warning("%s: %s not used: %s %s names an engine the file does not (write "
                            "[tts] %s = \"%s\" in it to give %s to %s)", path, ", ".join(
                                f"[tts.{s}]" if isinstance(getattr(tts, s), dict)
                                else f"[tts] {s}" for s in lost), _ENGINE_FLAGS[key], named,
                            key, named, "it" if len(lost) == 1 else "them", named)
    return replace(tts, **reset) if reset else tts


def _home_of(key: str) -> str:
    """Where a key found outside any table goes: ``port = 8780`` above ``[server]`` was
    refused as "unknown section(s) port"."""
    homes = [f"[{name}]" for name, cls in _SECTIONS.items()
             if key in {f.name for f in fields(cls)}]
    if homes:
        return f"write it under {' or '.join(homes)}"
    *first, last = (f"[{name}]" for name in _SECTIONS)
    return f"keys go under {', '.join(first)} or {last}"


def load_config(path: str | Path | None = None, **overrides: dict[str, Any]) -> GatewayConfig:
    """Read ``path`` (TOML) if given, then apply ``overrides`` ({section: {key: value}},
    ``None`` values ignored). An override naming another engine than the file's drops the
    file's settings of that engine (``_ENGINE_SETTINGS``)."""
    data: dict[str, Any] = {}
    if path is not None:
        with open(path, "rb") as f:
            try:
                data = tomllib.load(f)
            except tomllib.TOMLDecodeError as exc:
                raise ValueError(f"{path}: {exc}") from None
            except UnicodeDecodeError as exc:  # (TOML is UTF-8; this named no file)
                raise ValueError(f"{path} is not UTF-8 text: {exc}") from None
    for key, value in data.items():  # (a key written above the first table lands here)
        if key not in _SECTIONS and not isinstance(value, dict):
            raise ValueError(f"{path}: {key} is outside any table; {_home_of(key)}")
    unknown = set(data) - set(_SECTIONS)
    if unknown:
        raise ValueError(f"{path}: unknown section(s) {', '.join(sorted(unknown))}; known: "
                         f"{', '.join(sorted(_SECTIONS))}")
    parts = {}
    for name, cls in _SECTIONS.items():
        section = _section(cls, data.get(name, {}), f"{path}[{name}]")
        if name == "tts":
            section = _without_other_engines_settings(section, overrides.get("tts", {}),
                                                      data.get("tts", {}), path)
        changes = {k: tuple(v) if isinstance(v, list) else v  # (as from TOML)
                   for k, v in overrides.get(name, {}).items() if v is not None}
        for key, value in changes.items():  # option tables merge, flags win
            if isinstance(value, dict):
                changes[key] = {**getattr(section, key), **value}
        parts[name] = replace(section, **changes)
    return GatewayConfig(**parts)
