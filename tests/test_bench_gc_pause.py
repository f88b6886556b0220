"""bench/gc_pause.py runs end to end: both variants, the freeze one with objects frozen."""

from __future__ import annotations

import json
import shutil
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


def test_gc_pause_bench_measures_another_checkouts_code_too(tmp_path):
    """``--against DIR``: the same bench measures the gateway code of DIR (here a copy of
    this one) as one more row, and compares the two."""
    other = tmp_path / "other"
    for package in ("gateway", "engines"):
        shutil.copytree(ROOT / package, other / package)
    out = tmp_path / "gc.json"
    run = subprocess.run([sys.executable, "-m", "bench.gc_pause", "--engine", "espeak",
                          "--sessions", "4", "--collections", "2", "--against", str(other),
                          "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    _, against, now = json.loads(out.read_text())["rows"]
    assert (against["code"], now["code"]) == (str(other), str(ROOT))
    assert against["freeze"] and now["freeze"]
    assert against["tracked_per_session"] > 0 and now["tracked_per_session"] > 0
    assert f"against {other}:" in run.stdout
