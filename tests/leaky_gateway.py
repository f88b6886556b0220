"""TEST-ONLY: ``voice-gateway serve`` that leaks on purpose, to show that a leak in a gateway
process fails the test that started it (tests/test_serve_process.py; ``ServeProcess``).

``python -m tests.leaky_gateway KIND serve ARGS``: the real command line (``gateway.cli.entry``,
its ``os._exit`` included), with ``gateway.io.server.serve_until_signalled`` wrapped so that
as the gateway starts, in its own event loop, it leaks one ``KIND`` of ``LEAKS``; it
serves on as usual until SIGTERM. ``none`` leaks nothing (the wrapper itself is clean)."""

from __future__ import annotations

import asyncio
import gc
import socket
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import gateway.io.server
from gateway.cli import entry

HELD: list[Any] = []
"""What a leak keeps referenced to the end (open at the loop's close, not dropped)."""


async def _socket() -> None:
    socket.socket()  # dropped open: its __del__ warns "unclosed <socket.socket ...>"


async def _transport() -> None:
    # open at the loop's close: uvloop warns ("unclosed resource <TCPTransport ...>") before
    # it closes it; the listener (a plain socket, held) is no loop's
    listener = socket.create_server(("127.0.0.1", 0))
    HELD.append(listener)
    HELD.append(await asyncio.open_connection(*listener.getsockname()))


async def _task() -> None:
    async def forever() -> None:
        await asyncio.get_running_loop().create_future()  # (nobody else holds it)

    asyncio.get_running_loop().create_task(forever())  # noqa: RUF006 (the leak)
    await asyncio.sleep(0)  # (it runs to its await)
    gc.collect()  # "Task was destroyed but it is pending!"


async def _coroutine() -> None:
    asyncio.sleep(0)  # (created, never awaited: a RuntimeWarning when it is dropped)


async def _ignored() -> None:
    class Broken:
        def __del__(self) -> None:
            raise RuntimeError("a finalizer that fails")

    Broken()  # "Exception ignored in: <function ...__del__ ...>"


class _Cycle:
    def __init__(self) -> None:
        self.me = self
        self.socket = socket.socket()


async def _cycle() -> None:
    # at the gateway's end, once its loop is closed (``run`` has returned, ``main``): a
    # socket dropped open in a reference cycle, which only a collection finalizes
    at_the_end.append(_Cycle)


at_the_end: list[Callable[[], object]] = []
"""What ``gateway.io.server.run`` does once it has returned."""


async def _none() -> None:
    pass


LEAKS: dict[str, Callable[[], Awaitable[None]]] = {
    "socket": _socket, "transport": _transport, "task": _task, "coroutine": _coroutine,
    "ignored": _ignored, "cycle": _cycle, "none": _none}


def main() -> None:
    leak = LEAKS[sys.argv.pop(1)]
    serve = gateway.io.server.serve_until_signalled

    async def leaking(*args: Any, **kwargs: Any) -> None:
        async def then_leak() -> None:
            await leak()
            print("leaked", flush=True)

        leaker = asyncio.get_running_loop().create_task(then_leak())
        try:
            await serve(*args, **kwargs)
        finally:
            await leaker

    run = gateway.io.server.run

    def running(*args: Any) -> None:
        run(*args)
        for leak_at_the_end in at_the_end:
            leak_at_the_end()

    gateway.io.server.serve_until_signalled = leaking  # type: ignore[assignment]
    gateway.io.server.run = running
    entry()


if __name__ == "__main__":
    main()
