"""What libespeak-ng's worker process costs: the espeak engine in process vs in its worker.

    /work/venv/bin/python bench/espeak_worker.py [--calls 200] [--loads 20]

Both engines in the same run, calls interleaved (one in process, one through the worker),
for a short (~45 characters) and a long (~400 characters) sentence: time to first audio
(open to the first step's chunk) and the whole synthesis (open to the last step), p50 and
p99 over ``--calls`` each. Then the worker's start (``load()``: the process, the library,
its voice list and the warm-up), and the resident memory of this process and of a worker
(``bench/process_stats.py``: /proc on Linux, psutil on macOS), each engine loaded in a fresh
interpreter of its own, and of a real gateway (``voice-gateway serve``) given ``--speeches``
long speech requests, each way.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import process_stats  # noqa: E402
from engines.base import SynthesisRequest  # noqa: E402
from engines.espeak import EspeakEngine  # noqa: E402

SHORT = "Your flight leaves at nine fifteen tomorrow."
LONG = (
    "Here is the plan for the week: on Monday we measure what the pipe costs, on Tuesday "
    "we change one thing and measure again, on Wednesday we look at whether the change "
    "helped or only moved the cost somewhere else, on Thursday we write down what we found "
    "with the numbers that show it, and on Friday we read it all once more, slowly, to be "
    "sure that every figure still says what it said when we wrote it, before we call it done."
)


def once(engine: EspeakEngine, text: str) -> tuple[float, float]:
    t0 = time.perf_counter()
    stream = engine.open(SynthesisRequest(text=text))
    first = None
    while stream.step() is not None:
        if first is None:
            first = time.perf_counter() - t0
    total = time.perf_counter() - t0
    return first or total, total


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, round(q * (len(values) - 1)))]


def rss_kib(pid: int | None = None) -> int:
    """``pid``'s resident memory (None: this process's), KiB."""
    return process_stats.rss_bytes(os.getpid() if pid is None else pid) // 1024


RSS_PROBE = """
import sys; sys.path.insert(0, {root!r})
from engines.espeak import EspeakEngine
from bench.espeak_worker import once, rss_kib, LONG
e = EspeakEngine(in_process={in_process})
e.load()
for _ in range(50):
    once(e, LONG)
print(rss_kib(), rss_kib(e.worker_pid) if e.worker_pid else 0)
e.close()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--loads", type=int, default=20)
    parser.add_argument("--speeches", type=int, default=50)
    args = parser.parse_args()
    engines = {"in process": EspeakEngine(in_process=True), "worker": EspeakEngine()}
    for engine in engines.values():
        engine.load()
    print(f"{'text':6} {'engine':11} {'first audio p50/p99 ms':>24} {'total p50/p99 ms':>18}")
    for label, text in (("short", SHORT), ("long", LONG)):
        firsts: dict[str, list[float]] = {k: [] for k in engines}
        totals: dict[str, list[float]] = {k: [] for k in engines}
        for engine in engines.values():  # warm
            for _ in range(10):
                once(engine, text)
        for _ in range(args.calls):
            for name, engine in engines.items():
                first, total = once(engine, text)
                firsts[name].append(first)
                totals[name].append(total)
        for name in engines:
            f, t = firsts[name], totals[name]
            print(
                f"{label:6} {name:11} {1000 * statistics.median(f):11.2f} / "
                f"{1000 * pct(f, 0.99):6.2f} {1000 * statistics.median(t):9.2f} / "
                f"{1000 * pct(t, 0.99):6.2f}   ({len(text)} chars)"
            )
    for engine in engines.values():
        engine.close()
    loads = []
    for _ in range(args.loads):
        engine = EspeakEngine()
        t0 = time.perf_counter()
        engine.load()
        loads.append(time.perf_counter() - t0)
        engine.close()
    print(
        f"worker start at load(): p50 {1000 * statistics.median(loads):.1f} ms, "
        f"max {1000 * max(loads):.1f} ms over {args.loads}"
    )
    root = str(Path(__file__).resolve().parent.parent)
    for in_process in (True, False):
        out = subprocess.run(
            [sys.executable, "-c", RSS_PROBE.format(root=root, in_process=in_process)],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout
        own, worker = (int(x) for x in out.split())
        print(
            f"RSS {'in process' if in_process else 'worker':10}: this process {own / 1024:.1f} "
            f"MiB + worker {worker / 1024:.1f} MiB = {(own + worker) / 1024:.1f} MiB"
        )
    for in_process in (True, False):
        gateway, worker = gateway_rss(in_process, args.speeches)
        print(
            f"RSS gateway {'in process' if in_process else 'worker':10}: gateway "
            f"{gateway / 1024:.1f} MiB + worker {worker / 1024:.1f} MiB = "
            f"{(gateway + worker) / 1024:.1f} MiB (after {args.speeches} long speech requests)"
        )


def gateway_rss(in_process: bool, speeches: int) -> tuple[int, int]:
    """A real gateway (``voice-gateway serve``, espeak, replay LLM) on free ports, given
    ``speeches`` long ``/v1/audio/speech`` requests: its RSS and its worker's, KiB."""
    import re
    import tempfile
    import urllib.request

    with tempfile.NamedTemporaryFile("w", suffix=".toml") as config:
        config.write(f"[tts.options]\nin_process = {str(in_process).lower()}\n")
        config.flush()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gateway.cli",
                "serve",
                "--port",
                "0",
                "--http-port",
                "0",
                "--config",
                config.name,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if m := re.search(r"HTTP: +http://127.0.0.1:(\d+)/", line):
                    port = int(m.group(1))
                    break
            else:
                raise SystemExit("the gateway did not start")
            body = json.dumps({"input": LONG, "response_format": "pcm", "stream": False})
            for _ in range(speeches):
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}/v1/audio/speech",
                    data=body.encode(),
                    headers={"Content-Type": "application/json"},
                )
                with urllib.request.urlopen(request, timeout=60) as answer:
                    answer.read()
            children = process_stats.children(proc.pid)  # (the espeak worker)
            worker = sum(rss_kib(child) for child in children)
            return rss_kib(proc.pid), worker
        finally:
            proc.terminate()
            proc.communicate(timeout=60)


if __name__ == "__main__":
    main()
