"""Benchmark the offline engines: time to first chunk, real-time factor, peak memory.

    /work/venv/bin/python bench/engines_offline.py [--repeats 20] [--json]

Rows:

* ``espeak-raw``: the baseline, measured in the same run: ``espeak_Synth`` through the same
  ctypes binding with a callback that only keeps the 22,050 Hz buffers (no resampling, no
  chunking, no engine). "First chunk" is the first callback.
* ``espeak``: ``EspeakEngine`` as the lane drives it (open, step until None); its overhead
  over the baseline is printed as a percentage of total synthesis time.
* ``synthetic rtf=0``: the synthetic engine's own cost (signal generation only).
* ``synthetic default``: the calibrated Qwen3 0.6B timing (sleeps on purpose); its RTF and
  TTFA should come out near 0.44 and 107 ms, which checks the timing model end to end.

Timing and memory are separate passes: tracemalloc slows Python code, so the peak traced
allocation (Python and numpy buffers, not libespeak's C heap) is taken on one extra run per
text. RSS growth over the whole run is printed as well.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from bench.process_stats import peak_rss_bytes  # noqa: E402
from engines import espeak  # noqa: E402
from engines.base import OUTPUT_RATE, SynthesisRequest  # noqa: E402
from engines.synthetic import SyntheticEngine  # noqa: E402

TEXTS = [
    "Hello!",
    "Sure, I can help with that.",
    "The meeting moved to 3:30 p.m. on Thursday, March 12th, in room 4B.",
    "Your flight leaves at 9:15, so you should be at the airport by 7:45 at the latest.",
    "Here is the plan: first we measure, then we change one thing, and then we measure again "
    "to see whether the change helped or only moved the cost somewhere else.",
]

# A run returns (seconds to first chunk, seconds total, seconds of audio).
Run = Callable[[str], tuple[float, float, float]]


def run_engine(engine) -> Run:  # noqa: ANN001 - any TtsEngine
    def run(text: str) -> tuple[float, float, float]:
        t0 = time.perf_counter()
        stream = engine.open(SynthesisRequest(text=text))
        first = None
        samples = 0
        while (chunk := stream.step()) is not None:
            if first is None:
                first = time.perf_counter() - t0
            samples += len(chunk) // 2
        total = time.perf_counter() - t0
        stream.close()
        return first or total, total, samples / OUTPUT_RATE

    return run


def run_espeak_raw() -> Run:
    """The baseline: espeak_Synth with a sink that keeps buffers, nothing else."""

    class RawSink:
        def __init__(self) -> None:
            self.buffers: list[bytes] = []
            self.first: float | None = None
            self.error: BaseException | None = None
            self.calls = 0

        def accept(self, samples: bytes | None) -> int:
            if samples is not None and self.first is None:
                self.first = time.perf_counter()
            if samples is not None:
                self.buffers.append(samples)
            return 0

    with espeak._Library.lock:
        lib = espeak._Library.get()
        voice = lib.voices[espeak.DEFAULT_VOICE].encode()

    def run(text: str) -> tuple[float, float, float]:
        data = text.encode()
        sink = RawSink()
        t0 = time.perf_counter()
        with espeak._Library.lock:
            lib.lib.espeak_SetVoiceByName(voice)
            lib.lib.espeak_SetParameter(espeak._RATE, espeak.RATE_NORMAL, 0)
            lib.sink = sink
            try:
                lib.lib.espeak_Synth(data, len(data) + 1, 0, espeak._POS_CHARACTER, 0,
                                     espeak._CHARS_UTF8 | espeak._ENDPAUSE, None, None)
            finally:
                lib.sink = None
        total = time.perf_counter() - t0
        n = sum(len(b) for b in sink.buffers) // 2
        return (sink.first or t0 + total) - t0, total, n / espeak.ESPEAK_RATE

    return run


def measure(name: str, run: Run, repeats: int, *, sleeps: bool = False) -> dict:
    """``sleeps``: the engine waits on purpose; skip the warm-up and memory passes."""
    for text in [] if sleeps else TEXTS:  # warm caches
        run(text)
    ttfa, rtf, synth_s, audio_s = [], [], 0.0, 0.0
    for _ in range(repeats):
        for text in TEXTS:
            first, total, audio = run(text)
            ttfa.append(first)
            rtf.append(total / audio if audio else float("nan"))
            synth_s += total
            audio_s += audio
    tracemalloc.start()
    peak = 0
    for text in [] if sleeps else TEXTS:
        tracemalloc.reset_peak()
        run(text)
        peak = max(peak, tracemalloc.get_traced_memory()[1])
    tracemalloc.stop()
    q = statistics.quantiles
    return {
        "engine": name,
        "ttfa_ms_p50": 1000 * statistics.median(ttfa),
        "ttfa_ms_p90": 1000 * q(ttfa, n=10)[-1],
        "rtf_p50": statistics.median(rtf),
        "rtf_p90": q(rtf, n=10)[-1],
        "synth_s_total": synth_s,
        "audio_s_total": audio_s,
        "peak_traced_mib": None if sleeps else peak / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20, help="passes over the text set")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()

    rss0 = peak_rss_bytes()
    engine = espeak.EspeakEngine()
    engine.load()
    free = SyntheticEngine(rtf=0, ttfa_ms=0)
    calibrated = SyntheticEngine()
    rows = [
        measure("espeak-raw", run_espeak_raw(), args.repeats),
        measure("espeak", run_engine(engine), args.repeats),
        measure("synthetic rtf=0", run_engine(free), args.repeats),
        measure("synthetic default", run_engine(calibrated), 1, sleeps=True),
    ]
    raw, wrapped = rows[0], rows[1]
    overhead = 100 * (wrapped["synth_s_total"] / wrapped["audio_s_total"]) / (
        raw["synth_s_total"] / raw["audio_s_total"]
    ) - 100
    # (ru_maxrss is KiB on Linux, bytes on macOS: there this said KiB and called them MiB)
    rss_growth = (peak_rss_bytes() - rss0) / 2**20
    engine.close()
    result = {
        "rows": rows,
        "espeak_wrapper_overhead_pct": overhead,
        "max_rss_growth_mib": rss_growth,
        "texts": len(TEXTS),
        "repeats": args.repeats,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    header = f"{'engine':<18} {'ttfa p50':>9} {'ttfa p90':>9} {'rtf p50':>9} {'rtf p90':>9} " \
             f"{'audio s':>8} {'peak MiB':>9}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['engine']:<18} {r['ttfa_ms_p50']:>7.2f}ms {r['ttfa_ms_p90']:>7.2f}ms "
              f"{r['rtf_p50']:>9.4f} {r['rtf_p90']:>9.4f} {r['audio_s_total']:>8.1f} "
              + ("      n/a" if r["peak_traced_mib"] is None else f"{r['peak_traced_mib']:>9.2f}"))
    print(f"\nespeak wrapper overhead over raw espeak_Synth (total time per audio second): "
          f"{overhead:+.1f}%")
    print(f"max RSS growth during the run: {rss_growth:.1f} MiB")


if __name__ == "__main__":
    main()
