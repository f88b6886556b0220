"""A pytest plugin: a handle that a uvloop loop finds open at its close fails the test in
which it shows, at once, naming the handle.

pyproject's filterwarnings make a ResourceWarning an error. uvloop (0.23) warns of a handle
still open at its loop's close (``unclosed resource <TCPServer closed=False 0x...>``)
BEFORE it closes the handle, in a callback that can only print an exception
(``__uv_walk_close_all_handles_cb``, handles/handle.pyx): as an error, the warning skipped
the close, ``loop.close()`` then ran the loop until its handles were closed, which was never,
and the test hung until pytest-timeout ended the run 300 s later. So here that warning stays
a warning (uvloop closes the handle and the close returns), and every test phase it shows
in fails: ``Leaked: ...`` with uvloop's message. Other warnings go on to pytest as before.
Registered in ``tests/conftest.py`` (``pytest_plugins``); tests/test_warnings_policy.py
shows it."""

from __future__ import annotations

import warnings
from collections.abc import Generator
from typing import Any

import pytest

UVLOOP_UNCLOSED = "unclosed resource <"
"""The start of uvloop's warning of a handle open at its loop's close (or dropped open):
``UVHandle._warn_unclosed``. CPython's own say ``unclosed <socket...>``, ``unclosed
transport <...>``, ``unclosed event loop <...>``, and stay errors."""


class Leaked(AssertionError):
    """What a uvloop loop found open at its close (or dropped open) in a test phase."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _failing_on_uvloop_leaks())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _failing_on_uvloop_leaks())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _failing_on_uvloop_leaks())


def _failing_on_uvloop_leaks() -> Generator[None, object, object]:
    leaks: list[str] = []
    with warnings.catch_warnings():  # (restores the filters and showwarning after)
        warnings.filterwarnings("always", message=UVLOOP_UNCLOSED, category=ResourceWarning)
        passed_on = warnings.showwarning

        def showwarning(message: Warning | str, category: type[Warning], filename: str,
                        lineno: int, file: Any = None, line: str | None = None) -> None:
            if issubclass(category, ResourceWarning) and \
                    str(message).startswith(UVLOOP_UNCLOSED):
                leaks.append(str(message))
            else:
                passed_on(message, category, filename, lineno, file, line)

        warnings.showwarning = showwarning
        try:
            result = yield
        except BaseException as exc:
            if leaks:  # (the phase's own failure stays the one reported)
                exc.add_note(_said(leaks))
            raise
    if leaks:
        raise Leaked(_said(leaks))
    return result


def _said(leaks: list[str]) -> str:
    return (f"Leaked: a uvloop loop found {len(leaks)} handle(s) open (closing them): "
            + "; ".join(leaks))
