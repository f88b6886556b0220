"""The gateway under capacity load: the real server, the synthetic engine at zero cost.

    python bench/capacity_server.py [--port 0] [--max-lead-ms 1000] [--replies FILE]

Prints ``PORT <n>`` once it is serving, then serves until SIGTERM/SIGINT. Built for
bench/capacity.py, which runs it as its own process and reads its CPU time and RSS from
/proc: ``Gateway(load_config(...), engine=SyntheticEngine(rtf=0, ttfa_ms=0, lane="cpu"))``
under uvloop, like ``voice-gateway serve``, and like it freezes the start-up heap out of
garbage collection (``--no-freeze``: not, the baseline). The engine renders its tones
before the gateway starts (``prerender``), as the peers' servers do.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.capacity import raise_nofile  # noqa: E402
from engines.synthetic import SyntheticEngine  # noqa: E402
from gateway.config import load_config  # noqa: E402
from gateway.io.aio import stop_signal  # noqa: E402
from gateway.io.server import Gateway, freeze_startup_heap  # noqa: E402


async def main(args: argparse.Namespace) -> None:
    server = {"port": args.port, "max_sessions": args.max_sessions}
    if args.outbox_bytes:
        server["outbox_bytes"] = args.outbox_bytes
    config = load_config(server=server, session={"max_lead_ms": args.max_lead_ms},
                         llm={"replies": args.replies} if args.replies else {})
    engine = SyntheticEngine(rtf=0, ttfa_ms=0, lane="cpu")
    engine.prerender()  # the stand-in's own rendering is not the gateway's cost
    stop = stop_signal()
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
    a = p.parse_args()
    raise_nofile()
    import uvloop

    uvloop.run(main(a))
