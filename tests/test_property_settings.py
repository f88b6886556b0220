"""Every property test runs without a wall-clock limit: a test never fails because the
machine is slow (tests/conftest.py loads the profile)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings


def property_test_settings() -> dict[str, settings]:
    """The settings each Hypothesis test of tests/ runs with, by name."""
    found = {}
    for path in sorted(Path(__file__).parent.glob("test_*.py")):
        module = importlib.import_module(f"tests.{path.stem}")
        for name, obj in vars(module).items():
            if getattr(obj, "is_hypothesis_test", False):
                found[f"{path.stem}::{name}"] = obj._hypothesis_internal_use_settings
            elif isinstance(getattr(obj, "settings", None), settings):  # a state machine
                found[f"{path.stem}::{name}"] = obj.settings
    return found


ALL = property_test_settings()


def test_the_property_tests_were_found():
    assert "test_codec_properties::test_valid_messages_decode_to_their_dataclass" in ALL
    assert "test_session_properties::TestSessionProperties" in ALL


@pytest.mark.parametrize("name", sorted(ALL))
def test_a_property_test_has_no_deadline_and_no_too_slow_check(name):
    assert ALL[name].deadline is None
    assert HealthCheck.too_slow in ALL[name].suppress_health_check
