"""A bound on waits that only a hang reaches, failing with what hung."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

T = TypeVar("T")

HANG_S = 120.0
"""How long a wait for something that comes promptly when the code is right may take before
it counts as hung: far beyond what a starved 2-core machine takes (CI's), so a slow run never
fails, while a test whose awaited event never comes still ends, saying so."""


@contextlib.asynccontextmanager
async def hang_guard(what: str, seconds: float = HANG_S) -> AsyncIterator[None]:
    """Fail with ``AssertionError("hung: <what> ...")`` when the block has not ended within
    ``seconds``. Not an assertion on speed: the test's own assertions are elsewhere (its
    event came, and came first); this only ends a test that would wait for ever."""
    bound = asyncio.timeout(seconds)
    try:
        async with bound:
            yield
    except TimeoutError:
        if not bound.expired():
            raise  # (a TimeoutError of the block's own)
        raise AssertionError(f"hung: {what} had not happened {seconds:g} s later") from None


async def unless_hung(awaitable: Awaitable[T], seconds: float = HANG_S) -> T:
    """``await awaitable`` under ``hang_guard``, which names it (``Event.wait``,
    ``Gateway.wait_no_sessions``): a drop-in for ``asyncio.wait_for`` where the bound was only
    ever meant to end a hang."""
    name = getattr(awaitable, "__qualname__", None) or type(awaitable).__name__
    async with hang_guard(f"{name} returning", seconds):
        return await awaitable
