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
* printed: objects tracked, objects frozen, and the full collection's median / max time
  (and its median in CPU time: on a shared machine the wall time also counts the others);
* ``--window S``: first, the collections the load brings by itself over S seconds
  (``gc.callbacks``): how many full and young ones, the longest, all their time, RSS;
* ``--young N ...``: one more freeze variant per generation-0 threshold N (Python's: 700);
* ``--engine synthetic``: the capacity bench's zero-cost engine, so that 1,000-2,000
  sessions fit on a small machine and only the gateway's own objects are walked;
* ``--against DIR``: the freeze variant once more, measured by this same bench on the
  gateway code of another checkout (``git worktree add DIR origin/main``): a change's
  figures against main's, in the same run. ``per session``: the objects tracked once the
  sessions speak, less those tracked before they came, per session.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.process_stats import rss_bytes  # noqa: E402

CLIENT = r"""
import asyncio, json, sys
from websockets.asyncio.client import connect

async def one(url, started):
    # (no open_timeout: on a busy machine 2,000 handshakes outlast websockets' 10 s)
    async with connect(url, max_queue=None, open_timeout=None) as ws:
        await ws.recv()
        await ws.send(json.dumps({"type": "say", "text": "This sentence is spoken. " * SENTENCES}))
        await ws.send(json.dumps({"type": "ping"}))
        async for message in ws:
            if isinstance(message, str) and '"pong"' in message:
                started.set_result(None)

async def main(url, n):
    starts = [asyncio.get_running_loop().create_future() for _ in range(n)]
    tasks = [asyncio.create_task(one(url, s)) for s in starts]
    for task, start in zip(tasks, starts):  # a session that fails stops the bench, not hangs it
        task.add_done_callback(lambda t, s=start: t.cancelled() or s.done() or s.set_exception(
            t.exception() or RuntimeError("the session ended before speaking")))
    await asyncio.gather(*starts)
    print("SPEAKING", flush=True)
    await asyncio.gather(*tasks)

SENTENCES = int(sys.argv[3])
asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def _engine(name: str, tmp: Path):
    if name == "synthetic":  # the capacity bench's: zero cost, only the gateway's objects
        from engines.synthetic import SyntheticEngine

        engine = SyntheticEngine(rtf=0, ttfa_ms=0, lane="cpu")
        engine.prerender()
        return engine
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
        # explicit, whatever the gateway's default: each variant says its own
        gc.set_threshold(args.young or 700, 10, 10)
        before = len(gc.get_objects())
        pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
        began = [0.0]

        def timed(phase: str, info: dict) -> None:
            if phase == "start":
                began[0] = time.perf_counter()
            else:
                pauses[info["generation"]].append((time.perf_counter() - began[0]) * 1000)
        client = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CLIENT, f"ws://127.0.0.1:{gw.port}/v1/voice",
            str(args.sessions), str(args.sentences), stdout=subprocess.PIPE)
        try:
            assert client.stdout is not None
            line = await asyncio.wait_for(client.stdout.readline(), 600)
            if line.strip() != b"SPEAKING":
                raise SystemExit(f"the client's sessions did not start: {line!r}")
            gc.callbacks.append(timed)
            rss_speaking = _rss_mb()
            await asyncio.sleep(args.window)  # the collections the load itself brings
            gc.callbacks.remove(timed)
            rss_window = _rss_mb()
            times: list[float] = []
            cpu: list[float] = []  # the same, in this thread's CPU: a busy machine's share
            for _ in range(args.collections):
                await asyncio.sleep(0.1)
                t0, c0 = time.perf_counter(), time.thread_time()
                gc.collect()
                times.append((time.perf_counter() - t0) * 1000)
                cpu.append((time.thread_time() - c0) * 1000)
            tracked = len(gc.get_objects())
            sessions = len(gw.runners)
        finally:
            client.kill()
            await client.wait()
            await gw.aclose()
    return {"freeze": args.freeze, "young": args.young or 700, "engine": args.engine,
            "sessions": sessions, "sentences": args.sentences,
            "tracked": tracked, "frozen": frozen, "window_s": args.window,
            "tracked_per_session": round((tracked - before) / max(sessions, 1), 1),
            "full_gcs_in_window": len(pauses[2]),
            "full_gc_ms_max_in_window": round(max(pauses[2], default=0.0), 1),
            "gc_ms_total_in_window": round(sum(map(sum, pauses.values())), 1),
            "young_gcs_in_window": len(pauses[0]) + len(pauses[1]),
            "young_gc_ms_max_in_window": round(max(pauses[0] + pauses[1], default=0.0), 1),
            "rss_mb_speaking": rss_speaking, "rss_mb_after_window": rss_window,
            "full_gc_ms_median": round(statistics.median(times), 1),
            "full_gc_ms_max": round(max(times), 1),
            "full_gc_cpu_ms_median": round(statistics.median(cpu), 1)}


def _rss_mb() -> float:
    return round(rss_bytes(os.getpid()) / 2**20, 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", choices=["qwen3", "espeak", "synthetic"], default="qwen3")
    p.add_argument("--sessions", type=int, default=200, help="the hub's max_sessions")
    p.add_argument("--sentences", type=int, default=2,
                   help="each session's turn (a typical reply: 1-2, calibration.json)")
    p.add_argument("--collections", type=int, default=15)
    p.add_argument("--window", type=float, default=0.0,
                   help="seconds to record the collections the load brings by itself "
                        "(gc.callbacks) before forcing any; give the turns enough "
                        "--sentences to speak all through it")
    p.add_argument("--young", type=int, nargs="*", default=[],
                   help="also run the freeze with each of these generation-0 thresholds "
                        "(Python's default: 700)")
    p.add_argument("--against", metavar="DIR",
                   help="also run the freeze variant on the gateway code of this checkout")
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--one", choices=["freeze", "no-freeze"], help=argparse.SUPPRESS)
    p.add_argument("--code", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:  # a variant, in its own process
        if args.code:  # its gateway (and engines) from that checkout, measured by this bench
            sys.path.insert(0, args.code)
        args.freeze = args.one == "freeze"
        args.young = args.young[0] if args.young else None
        import uvloop

        import gateway

        row = uvloop.run(_measure(args))
        row["code"] = str(Path(gateway.__file__).resolve().parents[1])  # the one measured
        print(json.dumps(row))
        return
    rows = []
    variants: list[tuple[str, list[str]]] = [("no-freeze", []), ("freeze", [])]
    variants += [("freeze", ["--young", str(n)]) for n in args.young]
    if args.against:
        variants.insert(1, ("freeze", ["--code", str(Path(args.against).resolve())]))
    for variant, extra in variants:
        out = subprocess.run([sys.executable, "-m", "bench.gc_pause", "--one", variant,
                              "--engine", args.engine, "--sessions", str(args.sessions),
                              "--sentences", str(args.sentences),
                              "--collections", str(args.collections),
                              "--window", str(args.window), *extra],
                             cwd=ROOT, stdout=subprocess.PIPE, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{'variant':16} {'engine':9} {'sessions':>8} {'tracked':>8} {'per session':>11} "
          f"{'frozen':>8} {'full GC median ms':>17} {'max ms':>7} {'CPU median ms':>13}")
    for r in rows:
        print(f"{_name(r):16} {r['engine']:9} "
              f"{r['sessions']:>8} {r['tracked']:>8} {r['tracked_per_session']:>11} "
              f"{r['frozen']:>8} {r['full_gc_ms_median']:>17} {r['full_gc_ms_max']:>7} "
              f"{r['full_gc_cpu_ms_median']:>13}")
    base, new = rows[0], rows[2 if args.against else 1]
    print(f"full collection: {base['full_gc_ms_median']} → {new['full_gc_ms_median']} ms median "
          f"({base['full_gc_ms_median'] / max(new['full_gc_ms_median'], 0.05):.0f}× shorter)")
    if args.against:
        main, now = rows[1:3]
        print(f"against {main['code']}: {main['tracked_per_session']} → "
              f"{now['tracked_per_session']} objects per session, full collection "
              f"{main['full_gc_ms_median']} → {now['full_gc_ms_median']} ms median "
              f"(CPU {main['full_gc_cpu_ms_median']} → {now['full_gc_cpu_ms_median']} ms), "
              f"max {main['full_gc_ms_max']} → {now['full_gc_ms_max']} ms")
    if args.window:
        print(f"\nover {args.window:g} s of the load (no collection forced):")
        print(f"{'variant':16} {'full GCs':>8} {'longest ms':>10} {'young GCs':>9} "
              f"{'longest ms':>10} {'all GC ms':>9} {'RSS MB':>13}")
        for r in rows:
            print(f"{_name(r):16} {r['full_gcs_in_window']:>8} "
                  f"{r['full_gc_ms_max_in_window']:>10} {r['young_gcs_in_window']:>9} "
                  f"{r['young_gc_ms_max_in_window']:>10} {r['gc_ms_total_in_window']:>9} "
                  f"{r['rss_mb_speaking']:>6}→{r['rss_mb_after_window']:<6}")
    if args.json:
        Path(args.json).write_text(json.dumps({"argv": sys.argv[1:], "rows": rows}, indent=1))


def _name(row: dict) -> str:
    if not row["freeze"]:
        return "no freeze"
    name = "freeze" if row["young"] == 700 else f"freeze, young {row['young']}"
    return name if row["code"] == str(ROOT) else f"{name} ({Path(row['code']).name})"


if __name__ == "__main__":
    main()
