"""bench/gc_pause.py runs end to end: both variants, the freeze one with objects frozen."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.servers import assert_no_leaks, leak_checked_env

ROOT = Path(__file__).resolve().parents[1]


def test_gc_pause_bench_measures_both_variants(tmp_path):
    out = tmp_path / "gc.json"
    run = subprocess.run([sys.executable, "-m", "bench.gc_pause", "--engine", "espeak",
                          "--sessions", "4", "--collections", "2", "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=leak_checked_env())
    assert run.returncode == 0, run.stderr
    assert_no_leaks(run.stderr, "a variant's gateway")
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
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=leak_checked_env())
    assert run.returncode == 0, run.stderr
    assert_no_leaks(run.stderr, "a variant's gateway")
    _, against, now = json.loads(out.read_text())["rows"]
    assert (against["code"], now["code"]) == (str(other), str(ROOT))
    assert against["freeze"] and now["freeze"]
    assert against["tracked_per_session"] > 0 and now["tracked_per_session"] > 0
    assert f"against {other}:" in run.stdout


def test_a_leak_in_a_variants_gateway_is_said_on_the_benchs_stderr(tmp_path):
    """Each variant runs in a process of its own, whose stderr the bench captured and
    dropped: a leak there (or the traceback of a variant that failed) was never seen. Here
    the gateway code of ``--against`` drops a socket open as it is imported."""
    other = tmp_path / "other"
    for package in ("gateway", "engines"):
        shutil.copytree(ROOT / package, other / package)
    with (other / "gateway" / "io" / "server.py").open("a") as server:
        server.write("\n__import__(\"socket\").socket()  # (the leak)\n")
    run = subprocess.run([sys.executable, "-m", "bench.gc_pause", "--engine", "espeak",
                          "--sessions", "1", "--collections", "1", "--against", str(other)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=leak_checked_env())
    assert run.returncode == 0, run.stderr
    with pytest.raises(AssertionError, match=r"leaked \(1\):\n.*/other/gateway/io/server\.py:"
                                             r"\d+: ResourceWarning: unclosed <socket\.socket"):
        assert_no_leaks(run.stderr, "a variant's gateway")
