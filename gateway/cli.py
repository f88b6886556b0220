"""``voice-gateway`` command line."""

from __future__ import annotations

import argparse
import gc
import logging
import math
import os
import sys

from gateway import version
from gateway.config import GatewayConfig, load_config
from gateway.io.auth import configured_tokens


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="voice-gateway",
                                     description="Realtime voice gateway for a local assistant.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve voice sessions on a WebSocket")
    s.add_argument("--host", help="address to bind (default 127.0.0.1)")
    s.add_argument("--port", type=int, help="port (default 8780; 0 picks a free one)")
    s.add_argument("--http-port", type=int, help="HTTP API port: /v1/audio/speech, /health, "
                   "/metrics (default: --port + 1, i.e. 8781; 0 picks a free one)")
    s.add_argument("--llm-url", help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8081/v1 "
                   "(default: the scripted replay backend)")
    s.add_argument("--llm-model", help="model name sent to the LLM server")
    s.add_argument("--replies", help="JSONL of {transcript, reply} for the replay backend")
    s.add_argument("--tts", help="TTS engine: espeak (default), synthetic, qwen3, chatterbox, "
                   "http, ane")
    s.add_argument("--tts-model", help="model path or cached Hugging Face id")
    s.add_argument("--voice", help="voice name")
    s.add_argument("--voice-ref", help="reference WAV to clone the voice from")
    s.add_argument("--voice-ref-text", help="transcript of the reference WAV")
    s.add_argument("--tts-url", help="URL of a remote TTS server (engine http)")
    s.add_argument("--fallback", type=_engine_or_none,
                   help="fallback TTS engine (its options: [tts.fallback_options] in --config; "
                   "none: no fallback, whatever the config file says)")
    s.add_argument("--tts-also", type=_engine_or_none,
                   help="a second TTS engine on its own lane, e.g. ane next to "
                   "qwen3: each turn speaks on the lane that serves it best among those with "
                   "its voice (its options: [tts.also_options] in --config; none: no second "
                   "engine)")
    s.add_argument("--synthetic-rtf", type=float, help="synthetic engine: seconds of work per "
                   "second of audio (default 0.44; 0 = free)")
    s.add_argument("--synthetic-ttfa-ms", type=float, help="synthetic engine: first-step cost "
                   "(default 107)")
    s.add_argument("--synthetic-step-ms", type=float, help="synthetic engine: audio per step "
                   "(default 320)")
    s.add_argument("--frame-ms", type=int, help="audio frame duration (default 40)")
    s.add_argument("--max-lead-ms", type=int, help="audio sent ahead of playback (default 1000)")
    s.add_argument("--max-sessions", type=int, help="live sessions at once; more are refused "
                   "with HTTP 503 server_full (default 10000)")
    s.add_argument("--lane-policy", choices=("scheduler", "fifo"),
                   help="how jobs share the engine lane (default scheduler; fifo: the old "
                   "sidecar, whole generations in arrival order)")
    s.add_argument("--token", action="append", help="accepted bearer token (repeatable; "
                   "also VOICE_GATEWAY_TOKENS=a,b). Without any, only loopback may be bound")
    s.add_argument("--insecure-bind", action=argparse.BooleanOptionalAction, default=None,
                   help="allow a non-loopback --host without tokens (--no-insecure-bind "
                   "overrides a config file's true)")
    s.add_argument("--origin", action="append", help="allowed browser Origin, e.g. "
                   "http://hub.local:3000 (repeatable; '*': any). Default: any with tokens; "
                   "without, only the gateway's own console")
    s.add_argument("--allowed-host", action="append", help="without tokens, a Host name "
                   "both ports answer besides IP addresses, localhost (and *.localhost) and "
                   "--origin's names, e.g. hub.local (repeatable; '*': any). Another name "
                   "could be a site's pointed at this machine (DNS rebinding)")
    s.add_argument("--tls-cert", help="serve wss:// (and https:// on the HTTP port) with this "
                   "certificate (PEM)")
    s.add_argument("--tls-key", help="private key for --tls-cert")
    s.add_argument("--config", help="TOML config file (flags override it)")
    s.add_argument("--log-level", default="INFO", type=str.upper,
                   choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                   help="DEBUG, INFO, WARNING or ERROR (default: %(default)s)")
    return parser


def _tokens(args: argparse.Namespace) -> tuple[str, ...] | None:
    return configured_tokens(args.token, "VOICE_GATEWAY_TOKENS") or None


def _synthetic_options(args: argparse.Namespace) -> dict[str, float] | None:
    named = {"rtf": args.synthetic_rtf, "ttfa_ms": args.synthetic_ttfa_ms,
             "step_ms": args.synthetic_step_ms}
    options = {k: v for k, v in named.items() if v is not None}
    for key, value in options.items():
        # (the engine's own refusal names its option, not the flag; written so NaN fails)
        above = key == "step_ms"  # (a step of no audio never ends a sentence)
        if not (0 < value < math.inf if above else 0 <= value < math.inf):
            flag = "--synthetic-" + key.replace("_", "-")
            bound = "above 0" if above else "at least 0"
            raise ValueError(f"{flag} must be a finite number {bound}, not {value}")
    if options and (args.tts or "espeak") != "synthetic":
        raise ValueError("--synthetic-* options need --tts synthetic")
    return options or None


def _engine_or_none(name: str) -> str:
    """``none`` turns off an engine the config file names (an empty name is no engine)."""
    return "" if name.lower() == "none" else name


def build_config(args: argparse.Namespace) -> GatewayConfig:
    """The configuration ``serve`` runs with: the ``--config`` file, then the flags given
    (and ``VOICE_GATEWAY_TOKENS``) over it. Raises ``ValueError``/``OSError``."""
    return load_config(
        args.config,
        server={"host": args.host, "port": args.port, "http_port": args.http_port,
                "lane_policy": args.lane_policy, "max_sessions": args.max_sessions,
                "tokens": _tokens(args), "insecure_bind": args.insecure_bind,
                "origins": tuple(args.origin) if args.origin else None,
                "allowed_hosts": tuple(args.allowed_host) if args.allowed_host else None,
                "tls_cert": args.tls_cert, "tls_key": args.tls_key},
        llm={"url": args.llm_url, "model": args.llm_model, "replies": args.replies},
        tts={"engine": args.tts, "model": args.tts_model, "voice": args.voice,
             "voice_ref": args.voice_ref, "voice_ref_text": args.voice_ref_text,
             "url": args.tts_url, "fallback": args.fallback, "also": args.tts_also,
             "options": _synthetic_options(args)},
        session={"frame_ms": args.frame_ms, "max_lead_ms": args.max_lead_ms},
    )


def main(argv: list[str] | None = None) -> int:
    # Nothing is fetched at run time: models are local directories (or already in the
    # Hugging Face cache). mlx-audio's loaders reach for the hub when given anything else
    # (a model directory of the wrong kind made one import fetch a codec), so the hub is off
    # unless the operator turns it on (HF_HUB_OFFLINE=0). Set before anything imports
    # huggingface_hub, which reads it once.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.log_level != "DEBUG":
        # httpx logs every request at INFO: each /health LLM probe, and a "200 OK" for an
        # LLM answer that then fails (the gateway logs what matters of those itself);
        # websockets says "connection open/closed" per socket with no session or peer: the
        # gateway's own lines (session opened/dropped/resumed/ended) say it with both;
        # uvicorn says "Started server process", "Shutting down" and "Finished server
        # process" at INFO on a logger named "error", three lines before the one that
        # says why an engine did not load (the banner and "stopped" say the rest)
        for noisy in ("httpx", "websockets.server", "uvicorn.error"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        config = build_config(args)
    except OSError as exc:  # (only the --config file is opened here: "[Errno 2] ..." named
        # the file but not the flag)
        print(f"voice-gateway: --config {args.config!r} cannot be read: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"voice-gateway: {exc}", file=sys.stderr)
        return 2
    from gateway.io.lanes import EngineLoadError
    from gateway.io.server import run

    files = raise_open_files_limit()
    if files < config.server.max_sessions + FILES_BESIDE_SESSIONS:
        logging.getLogger(__name__).warning(
            "this process may open %d files (ulimit -n), and each of max_sessions (%d) holds "
            "a socket: past about %d sessions the OS refuses connections (raise the hard "
            "limit, or lower max_sessions)", files, config.server.max_sessions,
            files - FILES_BESIDE_SESSIONS)
    try:
        run(config)
    except ValueError as exc:  # refused configuration (e.g. public bind without a token)
        print(f"voice-gateway: {exc}", file=sys.stderr)
        return 2
    except EngineLoadError as exc:  # a model missing, truncated, of the wrong kind, ...
        logging.getLogger(__name__).debug("engine load failed", exc_info=exc.__cause__)
        print(f"voice-gateway: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a port in use, an address not on this machine
        logging.getLogger(__name__).debug("start failed", exc_info=exc)
        print(f"voice-gateway: cannot serve: {exc}", file=sys.stderr)
        return 1
    return 0


FILES_BESIDE_SESSIONS = 64
"""Files the gateway holds besides sessions' sockets: listeners, LLM and HTTP clients'
connections, model files, the interpreter's own."""
_MACOS_OPEN_MAX = 10_240  # the most setrlimit takes on macOS when the hard limit is unlimited


def raise_open_files_limit() -> int:
    """Raise this process's soft limit of open files to the hard one and return it. Every
    session holds a socket, and a process starts with 1,024 on Linux, and with 256 on macOS
    (fewer than the hub's 200 sessions and their LLM connections)."""
    try:
        import resource
    except ImportError:  # Windows: no such limit
        return 1 << 30
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for target in (hard, _MACOS_OPEN_MAX):
        if target != resource.RLIM_INFINITY and soft >= target:
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            break
        except (ValueError, OSError):  # macOS refuses "unlimited" for the soft limit
            continue
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return 1 << 30 if soft == resource.RLIM_INFINITY else soft


def entry() -> None:
    """The ``voice-gateway`` command: ``main``, then leave without running native
    libraries' teardown. Everything the gateway holds is closed by then (sessions, lanes,
    engines, servers); what is left is MLX's C++ static state, whose destruction raced its
    own worker threads and aborted a SIGTERMed qwen3 gateway (exit -6, "terminate called
    without an active exception") in about 1 run of 15 even after a clean shutdown.

    Before it leaves, one full collection, the start-up heap's frozen objects included
    (``freeze_startup_heap``): ``os._exit`` skips the interpreter's own, so what the gateway
    dropped in a reference cycle was never finalized, and a leak among it (an unclosed
    socket, a task still pending) said nothing; now it says so on stderr, where the tests
    look (tests/servers.py ``leaks_said``)."""
    code = main()
    gc.unfreeze()
    gc.collect()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
