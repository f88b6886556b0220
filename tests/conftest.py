"""Shared fixtures. Servers live in tests/servers.py; tiny models in tests/tiny_models/."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator

import pytest
from hypothesis import HealthCheck, settings

from tests.servers import ScriptedLlmServer, TinyLlamaServer

pytest_plugins = ["tests.fixtures_mlx", "tests.no_skips", "tests.uvloop_leaks",
                  "tests.leaks_by_module"]

# Property tests judge what the code does, never how fast: Hypothesis's default 200 ms
# deadline per example, and its too_slow health check, failed the codec's property tests
# whenever the shared 2-core machine stalled the process for a moment ("Unreliable test
# timings! ... took 320.00ms"). Loaded here, before any test module builds its @settings,
# which inherit it (tests/test_property_settings.py holds every one to it).
settings.register_profile("no_wall_clock", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("no_wall_clock")


@pytest.fixture
async def scripted_llm_server() -> AsyncIterator[ScriptedLlmServer]:
    """A scripted OpenAI-compatible streaming server (test double) on 127.0.0.1:0."""
    server = ScriptedLlmServer()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A 127.0.0.1 port that refuses connections for the whole test: bound, never listening,
    and held. (A port found free and let go may be another process's listener by the time
    the test connects: other test runs share the machine.)"""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@pytest.fixture(scope="module")
def espeak_engine():
    """A loaded espeak engine, one per test module."""
    from engines.espeak import EspeakEngine

    engine = EspeakEngine()
    engine.load()
    yield engine
    engine.close()


def synthesized(engine, text: str, voice: str | None = None) -> bytes:
    """All the audio ``engine`` makes for ``text`` in ``voice``, stepped to its end."""
    from engines.base import SynthesisRequest

    stream = engine.open(SynthesisRequest(text=text, voice=voice))
    chunks = []
    while (chunk := stream.step()) is not None:
        chunks.append(chunk)
    return b"".join(chunks)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory):
    """A tiny random-weight llama built locally, once per session."""
    from tests.tiny_models.llama import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_llama_server(
    tiny_llama_dir, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TinyLlamaServer]:
    """A real mlx_lm.server serving the tiny llama, offline, on a free port."""
    server = TinyLlamaServer(tiny_llama_dir, tmp_path_factory.mktemp("hf-cache"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def start_gateway(tmp_path):
    """Start real gateways on 127.0.0.1:0 (espeak and the replay LLM by default); every one
    started is closed at teardown.

    ``await start_gateway(replies, tokens_per_s=400, server={...}, ...)``: ``replies`` are
    ``{"transcript", "reply"}`` dicts written to a JSONL file for the replay backend; other
    keyword arguments are config sections merged over the defaults; ``engine=`` passes a
    ready engine object."""
    import orjson

    from gateway.config import load_config
    from gateway.io.server import Gateway

    started: list[Gateway] = []

    async def start(replies=(), *, tokens_per_s: float = 400.0, engine=None,
                    **sections) -> Gateway:
        llm = {"tokens_per_s": tokens_per_s, **sections.pop("llm", {})}
        if replies:
            path = tmp_path / f"replies-{len(started)}.jsonl"
            path.write_text("".join(orjson.dumps(r).decode() + "\n" for r in replies))
            llm["replies"] = str(path)
        config = load_config(server={"port": 0, **sections.pop("server", {})},
                             tts={"engine": "espeak", **sections.pop("tts", {})},
                             llm=llm, **sections)
        gw = Gateway(config, engine=engine)
        started.append(gw)
        await gw.start()
        return gw

    yield start
    for gw in reversed(started):
        await gw.aclose()
