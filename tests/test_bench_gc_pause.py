"""bench/gc_pause.py runs end to end: both variants, the freeze one with objects frozen."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gc_pause_bench_measures_both_variants(tmp_path):
    out = tmp_path / "gc.json"
    run = subprocess.run([sys.executable, "-m", "bench.gc_pause", "--engine", "espeak",
                          "--sessions", "4", "--collections", "2", "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    base, frozen = json.loads(out.read_text())["rows"]
    assert (base["freeze"], frozen["freeze"]) == (False, True)
    assert base["sessions"] == frozen["sessions"] == 4
    assert base["frozen"] == 0 and frozen["frozen"] > 10_000
    assert frozen["tracked"] < base["tracked"]  # the frozen ones are out of the walk
    assert "full collection:" in run.stdout
