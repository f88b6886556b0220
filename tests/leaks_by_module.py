"""A pytest plugin: garbage is collected at the end of each test module, so a leak held in a
reference cycle (a socket, a pipe, a transport) fails a test of the module that made it.

A leak's ResourceWarning is an error (pyproject), but it shows only when its object is
freed: for an object in a reference cycle, when the garbage collector next runs, which may be
in any later test of any later module (stop 42: a capacity test's unclosed pipes failed a
chatterbox test's setup). Collecting at each module's end bounds that: the warning shows at
the teardown of the module's last test, and the failure names it. Per test would name the
test itself but costs a full collection per test: 74-300 ms each in this suite's process
(measured on a loaded 2-core machine), minutes over three thousand tests; per module costs one
per file, seconds over the suite. Registered in ``tests/conftest.py``
(``pytest_plugins``); tests/test_warnings_policy.py shows it."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module", autouse=True)
def _garbage_collected_at_module_end() -> Iterator[None]:
    # (autouse, so set up before the module's other fixtures and torn down after them:
    # what they closed is closed by then)
    yield
    gc.collect()
