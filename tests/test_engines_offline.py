"""The offline engines (espeak, synthetic) against the shared conformance suite, plus checks
specific to each engine."""

from __future__ import annotations

from engines.synthetic import SyntheticEngine
from tests.conformance import check_engine

# --- synthetic ------------------------------------------------------------------------------


class FakeSleep:
    """Test double for ``time.sleep``: records the modelled cost of each step, waits for nothing."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def test_synthetic_free_conforms() -> None:
    check_engine(lambda: SyntheticEngine(rtf=0, ttfa_ms=0))


def test_synthetic_timed_conforms() -> None:
    check_engine(lambda: SyntheticEngine(rtf=0.01, ttfa_ms=2, step_ms=320))


def test_synthetic_non_streaming_conforms() -> None:
    report = check_engine(lambda: SyntheticEngine(rtf=0, ttfa_ms=0, streams=False))
    assert len(report.full.chunks) == 1
