"""pyproject's filterwarnings: a deprecation raised from our code fails the test that reaches
it; one raised inside a dependency stays a warning."""

from __future__ import annotations

import warnings

import pytest


def test_a_deprecated_api_our_code_calls_fails_the_test():
    with pytest.raises(DeprecationWarning, match="gone next release"):
        warnings.warn("gone next release", DeprecationWarning, stacklevel=1)
    with pytest.raises(PendingDeprecationWarning, match="going"):
        warnings.warn_explicit("going", PendingDeprecationWarning, "connection.py", 1,
                               module="gateway.io.connection")


@pytest.mark.parametrize("module", ["websockets.asyncio.server", "gateways", "testsuite"])
def test_a_deprecation_inside_a_dependency_stays_a_warning(module):
    with pytest.warns(DeprecationWarning, match="their own"):
        warnings.warn_explicit("their own", DeprecationWarning, "x.py", 1, module=module)
