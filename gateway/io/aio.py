"""Small asyncio helpers the shell shares."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Sequence
from typing import TypeVar

T = TypeVar("T")


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


async def unless_stopped(work: Awaitable[T], stop: Awaitable[object]) -> asyncio.Future[T] | None:
    """Run ``work`` until ``stop`` completes. Returns ``work``, done (read its result; it
    wins a tie), or None when ``stop`` came first: then ``work`` has been cancelled and has
    finished (its cleanup ran). What ``stop`` returns or raises is dropped; it is cancelled
    and finished on the way out, and so is ``work`` when the caller is cancelled. The
    caller's cancellation is never swallowed (``asyncio.wait`` raises nothing of theirs)."""
    working = asyncio.ensure_future(work)
    stopping = asyncio.ensure_future(stop)
    try:
        await asyncio.wait({working, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        pending = {task for task in (working, stopping) if not task.done()}
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
    if not stopping.cancelled():
        stopping.exception()  # what ``stop`` raised is not the caller's (nor logged unread)
    return None if working in pending else working


def stop_signal(signals: Sequence[signal.Signals] | None = None) -> asyncio.Event:
    """An event set at the first of ``signals``: SIGINT, SIGTERM or SIGHUP by default (the
    process's way of asking to stop; SIGHUP, a closed terminal or a service manager's reload,
    too: the gateway reads its configuration once, so it stops cleanly rather than being
    killed mid-turn). A SIGHUP the process was started ignoring is left ignored: that is
    ``nohup``'s way of saying "keep running when the terminal closes", which a handler here
    overrode (``nohup voice-gateway serve &`` stopped at logout). SIGINT is taken even when
    ignored: a shell ignores it for a job started with ``&``, not to keep it running. Take
    it before starting anything and before saying "serving": a signal sent as soon as that
    line shows must reach the clean shutdown, not the default handler that kills. Where the
    loop takes no signal handlers (Windows), ^C stays a KeyboardInterrupt."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    if signals is None:
        signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    for sig in signals:
        if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
            continue  # (nohup)
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    return stop
