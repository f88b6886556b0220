"""The gateway under capacity load: the real server, the synthetic engine at zero cost.

    python bench/capacity_server.py [--port 0] [--max-lead-ms 1000] [--replies FILE]
                                    [--llm-url URL] [--engine-fail-rate P]

Prints ``PORT <n>`` once it is serving, then serves until SIGTERM/SIGINT. Built for
bench/capacity.py, which runs it as its own process and reads its CPU time and RSS from
/proc: ``Gateway(load_config(...), engine=SyntheticEngine(rtf=0, ttfa_ms=0, lane="cpu"))``
under uvloop, like ``voice-gateway serve``, and like it freezes the start-up heap out of
garbage collection (``--no-freeze``: not, the baseline). The engine renders its tones
before the gateway starts (``prerender``), as the peers' servers do.

For bench/soak.py ``--faults``: ``--llm-url`` takes the LLM from an OpenAI-compatible
server instead of the replay LLM in process, and ``--engine-fail-rate`` makes each engine
step fail with that chance (``SyntheticEngine``'s ``fail_rate``: ``engine_failed``,
mid-sentence or at its start). SIGUSR1 turns the engine's failures off (the soak's
recovery check). ``--engine-fallback``: that engine is the primary of a ``FallbackEngine``
(engines/fallback.py) whose fallback is another synthetic engine (``synthetic-fallback``),
its breaker reset after 5 s: a failure is then the fallback's to take over, not an error,
and the breaker opens and closes. ``--engine-lanes``: a second synthetic engine on a lane
of its own (``[tts] also``: ``synthetic-ane`` on lane ``ane``, failing each step with the
chance ``--also-fail-rate``), among which voice turns are placed (``ane`` first while
its breaker is closed: ``LANES_PROFILES``): a failure there moves the turn to the primary
lane, and three in a row trip that lane's breaker (README, "Failures"), reset here after
5 s. At exit the log says how many failures each engine injected (``injected failures:
<name> <n>``). ``--log FILE``: the gateway's log (INFO and up) goes
there, where the soak reads when the LLM and the engine were said to fail and to be back.

``--heap-dumps DIR`` (bench/soak.py ``--heap-dumps``: is the memory a leak or a plateau?):
each SIGUSR2 collects the garbage, then writes ``DIR/heap-<n>.json``: the live objects'
count by type name (``gc.get_objects``: not the start-up heap, frozen out of it), the RSS,
and the RSS after ``malloc_trim(0)`` (what the C allocator kept of memory freed, given back
to the system: from then on the RSS is lower than it would have been); with
``--heap-trace`` tracemalloc traces from the start (8 frames; it slows the Python code
about twice) and the dump writes ``DIR/heap-<n>.snap`` too. Each dump says glibc's
``mallinfo2`` too (``malloc``: free bytes the allocator keeps, ``fordblks``) and Python's
allocated blocks. ``--heap-no-trim``: SIGUSR2's dumps leave the allocator alone (the RSS
steps as it would without dumps), and a SIGHUP writes one that trims (the soak's last,
once idle: what the trim gives back then). bench/heap_diff.py compares two dumps. Nothing
of it runs without the flag.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import json
import logging
import os
import signal
import sys
import tracemalloc
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import process_stats  # noqa: E402
from bench.capacity import raise_nofile  # noqa: E402
from engines.base import TtsEngine  # noqa: E402
from engines.fallback import FallbackEngine  # noqa: E402
from engines.synthetic import SyntheticEngine  # noqa: E402
from gateway.config import load_config  # noqa: E402
from gateway.io.aio import stop_signal  # noqa: E402
from gateway.io.server import Gateway, freeze_startup_heap  # noqa: E402

FALLBACK_RESET_S = 5.0
"""``--engine-fallback``: the breaker's ``breaker_reset_s`` (the gateway's default is 30 s);
``--engine-lanes``: the second lane's (``TurnPlacer.breaker_reset_s``, 30 s too): a soak of a
few minutes sees it open and close many times."""


LANES_PROFILES = {"cpu": {"first_s": 0.002, "rtf": 0.0}, "ane": {"first_s": 0.001, "rtf": 0.0}}
"""``--engine-lanes``: the lanes' figures for placement, kept (the steps' measures are not
used): ``ane`` answers first and never fills, so every turn goes there unless its breaker
is open. With the measures, two free engines tied up to noise and the primary took most
turns (ties go to it), so a turn placed on ``ane`` while it was open would have been
rare, and the soak's check of it (``placed_while_open``) could hardly fail."""


def rss_kb() -> int:
    return process_stats.rss_bytes(os.getpid()) // 1024


def malloc_info() -> dict[str, int] | None:
    """glibc's ``mallinfo2`` in bytes (None off Linux): ``arena`` from the heap (brk),
    ``hblkhd`` in mmapped chunks, ``uordblks`` in use, ``fordblks`` free but kept (what
    ``malloc_trim`` may give back), ``keepcost`` at the heap's top. Python's own small-object
    arenas (pymalloc, mmapped apart) are outside it: ``sys.getallocatedblocks`` counts those."""
    if sys.platform != "linux":
        return None

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = Mallinfo2
    info = libc.mallinfo2()
    return {name: getattr(info, name)
            for name in ("arena", "hblkhd", "uordblks", "fordblks", "keepcost")}


def dump_heap(folder: Path, n: int, trim: bool) -> None:
    """``--heap-dumps``: the live objects by type and the RSS (then trimmed, if ``trim``),
    as ``heap-<n>``; with ``--heap-trace`` the traced heap too."""
    gc.collect()
    counts = Counter(type(o).__qualname__ for o in gc.get_objects())
    rss = rss_kb()
    before = malloc_info()
    blocks = sys.getallocatedblocks()
    trimmed = None
    if trim and sys.platform == "linux":  # glibc's; macOS's allocator has no such call
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        trimmed = rss_kb()
    traced = tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else None
    if tracemalloc.is_tracing():
        tracemalloc.take_snapshot().dump(str(folder / f"heap-{n}.snap"))
    (folder / f"heap-{n}.json").write_text(json.dumps({
        "rss_kb": rss, "rss_trimmed_kb": trimmed, "malloc": before,
        "malloc_trimmed": None if trimmed is None else malloc_info(),
        "pymalloc_blocks": blocks, "traced_bytes": traced,
        "objects": sum(counts.values()), "by_type": dict(counts.most_common())}))


async def main(args: argparse.Namespace) -> None:
    server = {"port": args.port, "max_sessions": args.max_sessions}
    if args.outbox_bytes:
        server["outbox_bytes"] = args.outbox_bytes
    llm: dict[str, object] = {"replies": args.replies} if args.replies else {}
    if args.llm_url:
        llm["url"] = args.llm_url
    if args.llm_stall_s:
        llm["stall_timeout_s"] = args.llm_stall_s
    tts: dict[str, object] = {}
    if args.engine_lanes:
        tts = {"also": "synthetic", "also_options": {
            "lane": "ane", "rtf": 0, "ttfa_ms": 0, "name": "synthetic-ane",
            "fail_rate": args.also_fail_rate, "fail_seed": args.seed + 1},
            "profiles": LANES_PROFILES}
    config = load_config(server=server, session={"max_lead_ms": args.max_lead_ms}, llm=llm,
                         tts=tts)
    primary = SyntheticEngine(rtf=0, ttfa_ms=0, lane="cpu", fail_rate=args.engine_fail_rate,
                              fail_seed=args.seed)
    primary.prerender()  # the stand-in's own rendering is not the gateway's cost
    engine: TtsEngine = primary
    if args.engine_fallback:
        fallback = SyntheticEngine(rtf=0, ttfa_ms=0, lane="cpu", name="synthetic-fallback")
        fallback.prerender()
        engine = FallbackEngine(primary, fallback, breaker_reset_s=FALLBACK_RESET_S)
    stop = stop_signal()
    gateway = Gateway(config, engine=engine)
    failing = [primary]
    for other in gateway.engines[1:]:  # (--engine-lanes)
        assert isinstance(other, SyntheticEngine)
        other.prerender()
        failing.append(other)

    def calm() -> None:
        for eng in failing:
            eng.fail_rate = 0.0

    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, calm)
    if args.heap_dumps:
        folder = Path(args.heap_dumps)  # (made before the loop runs)
        dumps = iter(range(1_000_000))
        asyncio.get_running_loop().add_signal_handler(
            signal.SIGUSR2, lambda: dump_heap(folder, next(dumps), not args.heap_no_trim))
        asyncio.get_running_loop().add_signal_handler(  # (the soak's last dump: trimmed)
            signal.SIGHUP, lambda: dump_heap(folder, next(dumps), True))
    await gateway.start()
    if gateway.placer is not None:  # (--engine-lanes: made at start)
        gateway.placer.breaker_reset_s = FALLBACK_RESET_S
        gateway.placer.timing.clear()  # (LANES_PROFILES: not what the steps measure)
    if not args.no_freeze:
        freeze_startup_heap()  # as voice-gateway serve does
    print(f"PORT {gateway.port}", flush=True)
    await stop.wait()
    await gateway.aclose()
    for eng in failing:
        if eng.fail_rate or eng.failures:
            logging.getLogger("bench").info("injected failures: %s %d", eng.name, eng.failures)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--max-lead-ms", type=int, default=1000)
    p.add_argument("--max-sessions", type=int, default=100_000)
    p.add_argument("--no-freeze", action="store_true",
                   help="leave the start-up heap to the garbage collector (a baseline)")
    p.add_argument("--outbox-bytes", type=int,
                   help="per-session output buffer (default: server.outbox_bytes, 1 MiB)")
    p.add_argument("--replies", help="the replay LLM's JSONL of {transcript, reply} "
                                     "(default: engines/data/replies.jsonl)")
    p.add_argument("--llm-url", help="an OpenAI-compatible LLM server (.../v1) instead of "
                                     "the replay LLM")
    p.add_argument("--llm-stall-s", type=float,
                   help="[llm] stall_timeout_s (default 60 s)")
    p.add_argument("--engine-fail-rate", type=float, default=0.0,
                   help="the chance each engine step fails with engine_failed")
    p.add_argument("--engine-fallback", action="store_true",
                   help="a second synthetic engine takes over from the failing one")
    p.add_argument("--engine-lanes", action="store_true",
                   help="a second synthetic engine on lane ane ([tts] also)")
    p.add_argument("--also-fail-rate", type=float, default=0.0,
                   help="--engine-lanes: the chance each step of the second engine fails")
    p.add_argument("--seed", type=int, default=0, help="of the engine's failures")
    p.add_argument("--log", help="write the gateway's log (INFO and up) to this file")
    p.add_argument("--heap-dumps", metavar="DIR",
                   help="each SIGUSR2 writes the live objects by type and the RSS here")
    p.add_argument("--heap-trace", action="store_true",
                   help="--heap-dumps: trace allocations (tracemalloc), a snapshot a dump")
    p.add_argument("--heap-no-trim", action="store_true",
                   help="--heap-dumps: SIGUSR2's dumps do not malloc_trim (SIGHUP's do)")
    a = p.parse_args()
    if a.heap_dumps:
        Path(a.heap_dumps).mkdir(parents=True, exist_ok=True)
    if a.heap_trace:
        tracemalloc.start(8)
    if a.log:
        logging.basicConfig(filename=a.log, level=logging.INFO,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        for noisy in ("httpx", "websockets.server"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    raise_nofile()
    import uvloop

    uvloop.run(main(a))
