"""How long a full garbage collection stops the gateway, with and without the start-up freeze.

    python -m bench.gc_pause [--engine qwen3|espeak] [--sessions 200] [--sentences 2]

A full collection walks every object the collector tracks while no thread runs Python, so
every session's frames wait behind it (``/metrics`` → ``gateway_gc_pause_seconds``).
``voice-gateway serve`` freezes what is alive once the engines have loaded
(``gateway.io.server.freeze_startup_heap``): the libraries and the models' Python objects,
which never become garbage. This bench measures what that buys, in the same run:

* ``no freeze`` (the baseline) and ``freeze``, each in its own process: the real gateway
  with the engine (qwen3: a tiny random-weight Qwen3-TTS built locally and loaded through
  mlx-audio, so the libraries' objects are the production ones; the model's own are fewer
  than the 0.6B checkpoint's), ``--sessions`` voice sessions from a client process, each
  in a turn of a ``--sentences`` ``say`` (its segments queued on the lane, its audio paced
  out), then ``--collections`` forced full collections 100 ms apart;
* printed: objects tracked, objects frozen, and the full collection's median / max time.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CLIENT = r"""
import asyncio, json, sys
from websockets.asyncio.client import connect

async def one(url, started):
    async with connect(url, max_queue=None) as ws:
        await ws.recv()
        await ws.send(json.dumps({"type": "say", "text": "This sentence is spoken. " * SENTENCES}))
        await ws.send(json.dumps({"type": "ping"}))
        async for message in ws:
            if isinstance(message, str) and '"pong"' in message:
                started.set_result(None)

async def main(url, n):
    starts = [asyncio.get_running_loop().create_future() for _ in range(n)]
    tasks = [asyncio.create_task(one(url, s)) for s in starts]
    await asyncio.gather(*starts)
    print("SPEAKING", flush=True)
    await asyncio.gather(*tasks)

SENTENCES = int(sys.argv[3])
asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def _engine(name: str, tmp: Path):
    if name == "espeak":
        from engines.espeak import EspeakEngine

        return EspeakEngine()
    from engines.qwen3 import Qwen3Engine
    from tests.tiny_models.qwen3 import build_tiny_qwen3

    return Qwen3Engine(model=str(build_tiny_qwen3(tmp / "qwen3")), voice="serena")


async def _measure(args: argparse.Namespace) -> dict:
    from gateway.config import load_config
    from gateway.io.server import Gateway, freeze_startup_heap

    with tempfile.TemporaryDirectory() as tmp:
        engine = _engine(args.engine, Path(tmp))
        # real-time pacing with a long lead: sessions stay open and streaming for the run
        gw = Gateway(load_config(server={"port": 0, "http_port": 0},
                                 session={"max_lead_ms": 5000}), engine=engine)
        await gw.start()
        frozen = freeze_startup_heap() if args.freeze else 0
        client = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CLIENT, f"ws://127.0.0.1:{gw.port}/v1/voice",
            str(args.sessions), str(args.sentences), stdout=subprocess.PIPE)
        try:
            assert client.stdout is not None
            line = await asyncio.wait_for(client.stdout.readline(), 600)
            if line.strip() != b"SPEAKING":
                raise SystemExit(f"the client's sessions did not start: {line!r}")
            times = []
            for _ in range(args.collections):
                await asyncio.sleep(0.1)
                t0 = time.perf_counter()
                gc.collect()
                times.append((time.perf_counter() - t0) * 1000)
            tracked = len(gc.get_objects())
            sessions = len(gw.runners)
        finally:
            client.kill()
            await client.wait()
            await gw.aclose()
    return {"freeze": args.freeze, "engine": args.engine, "sessions": sessions,
            "sentences": args.sentences,
            "tracked": tracked, "frozen": frozen,
            "full_gc_ms_median": round(statistics.median(times), 1),
            "full_gc_ms_max": round(max(times), 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", choices=["qwen3", "espeak"], default="qwen3")
    p.add_argument("--sessions", type=int, default=200, help="the hub's max_sessions")
    p.add_argument("--sentences", type=int, default=2,
                   help="each session's turn (a typical reply: 1-2, calibration.json)")
    p.add_argument("--collections", type=int, default=15)
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--one", choices=["freeze", "no-freeze"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:  # a variant, in its own process
        args.freeze = args.one == "freeze"
        import uvloop

        print(json.dumps(uvloop.run(_measure(args))))
        return
    rows = []
    for variant in ("no-freeze", "freeze"):
        out = subprocess.run([sys.executable, "-m", "bench.gc_pause", "--one", variant,
                              "--engine", args.engine, "--sessions", str(args.sessions),
                              "--sentences", str(args.sentences),
                              "--collections", str(args.collections)],
                             cwd=ROOT, capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{'variant':10} {'engine':7} {'sessions':>8} {'tracked':>8} {'frozen':>8} "
          f"{'full GC median ms':>17} {'max ms':>7}")
    for r in rows:
        print(f"{'freeze' if r['freeze'] else 'no freeze':10} {r['engine']:7} "
              f"{r['sessions']:>8} {r['tracked']:>8} {r['frozen']:>8} "
              f"{r['full_gc_ms_median']:>17} {r['full_gc_ms_max']:>7}")
    base, new = rows
    print(f"full collection: {base['full_gc_ms_median']} → {new['full_gc_ms_median']} ms median "
          f"({base['full_gc_ms_median'] / max(new['full_gc_ms_median'], 0.05):.0f}× shorter)")
    if args.json:
        Path(args.json).write_text(json.dumps({"argv": sys.argv[1:], "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
