"""Small asyncio helpers the shell shares."""

from __future__ import annotations

import asyncio


async def cancel_and_wait(task: asyncio.Task[object] | None) -> None:
    """Cancel ``task`` and wait until it has finished. Its own cancellation is swallowed;
    a cancellation of the caller while waiting is not."""
    if task is None or task.done():
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
