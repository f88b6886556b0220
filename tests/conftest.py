"""Shared fixtures. Servers live in tests/servers.py; tiny models in tests/tiny_models/."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from tests.servers import ScriptedLlmServer, TinyLlamaServer

pytest_plugins = ["tests.fixtures_mlx"]


@pytest.fixture
async def scripted_llm_server() -> AsyncIterator[ScriptedLlmServer]:
    """A scripted OpenAI-compatible streaming server (test double) on 127.0.0.1:0."""
    server = ScriptedLlmServer()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


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
