"""A bound on waits that only a hang reaches, failing with what hung."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

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
