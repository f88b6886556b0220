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
and the breaker opens and closes. ``--log FILE``: the gateway's log (INFO and up) goes
there, where the soak reads when the LLM and the engine were said to fail and to be back.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.capacity import raise_nofile  # noqa: E402
from engines.base import TtsEngine  # noqa: E402
from engines.fallback import FallbackEngine  # noqa: E402
from engines.synthetic import SyntheticEngine  # noqa: E402
from gateway.config import load_config  # noqa: E402
from gateway.io.aio import stop_signal  # noqa: E402
from gateway.io.server import Gateway, freeze_startup_heap  # noqa: E402

FALLBACK_RESET_S = 5.0
"""``--engine-fallback``: the breaker's ``breaker_reset_s`` (the gateway's default is 30 s)."""


async def main(args: argparse.Namespace) -> None:
    server = {"port": args.port, "max_sessions": args.max_sessions}
    if args.outbox_bytes:
        server["outbox_bytes"] = args.outbox_bytes
    llm: dict[str, object] = {"replies": args.replies} if args.replies else {}
    if args.llm_url:
        llm["url"] = args.llm_url
    if args.llm_stall_s:
        llm["stall_timeout_s"] = args.llm_stall_s
    config = load_config(server=server, session={"max_lead_ms": args.max_lead_ms}, llm=llm)
    primary = SyntheticEngine(rtf=0, ttfa_ms=0, lane="cpu", fail_rate=args.engine_fail_rate,
                              fail_seed=args.seed)
    primary.prerender()  # the stand-in's own rendering is not the gateway's cost
    engine: TtsEngine = primary
    if args.engine_fallback:
        fallback = SyntheticEngine(rtf=0, ttfa_ms=0, lane="cpu", name="synthetic-fallback")
        fallback.prerender()
        engine = FallbackEngine(primary, fallback, breaker_reset_s=FALLBACK_RESET_S)
    stop = stop_signal()
    asyncio.get_running_loop().add_signal_handler(
        signal.SIGUSR1, lambda: setattr(primary, "fail_rate", 0.0))
    gateway = Gateway(config, engine=engine)
    await gateway.start()
    if not args.no_freeze:
        freeze_startup_heap()  # as voice-gateway serve does
    print(f"PORT {gateway.port}", flush=True)
    await stop.wait()
    await gateway.aclose()


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
    p.add_argument("--seed", type=int, default=0, help="of the engine's failures")
    p.add_argument("--log", help="write the gateway's log (INFO and up) to this file")
    a = p.parse_args()
    if a.log:
        logging.basicConfig(filename=a.log, level=logging.INFO,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        for noisy in ("httpx", "websockets.server"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    raise_nofile()
    import uvloop

    uvloop.run(main(a))
