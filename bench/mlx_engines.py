"""Benchmark the MLX engines on this machine: time to first chunk, RTF, peak memory, and the
overhead of the gateway's engine wrapper over calling mlx-audio's ``generate`` directly.

    python bench/mlx_engines.py [--repeats 5] [--max-tokens 8] [--http] [--chatterbox] [--json]
        [--chatterbox-flow-steps 1] [--chatterbox-ref-s 0.2] [--chatterbox-repeats 3]

Both rows run in the same process on the same tiny random-weight Qwen3-TTS model (built in
a temp dir; nothing downloaded), same text, same seeds, interleaved (direct, engine, direct,
engine, ...) so machine drift hits both equally:

* ``mlx-audio generate``: the baseline: ``model.generate(stream=True)``, each chunk forced
  with ``mx.eval``.
* ``qwen3 engine``: ``Qwen3Engine`` as the lane drives it (open, step until None), which
  adds the PCM16 conversion, the runaway and thread checks, and ``mx.clear_cache()``.

* ``http (mlx-audio server)`` (``--http``): ``HttpTtsEngine`` in raw-PCM mode against
  mlx-audio's own server in a subprocess serving the same model directory: what a remote
  or shared TTS server costs over the in-process engine.
* ``chatterbox generate`` / ``chatterbox engine`` (``--chatterbox``): the tiny Chatterbox
  (1-layer T3 but the full 150M-parameter S3Gen), direct ``Model.generate`` with the same
  conditioning vs ``ChatterboxEngine``, interleaved. It does not stream: TTFC is the whole
  synthesis. Defaults: 4 speech tokens, a 0.2 s reference, 1 flow step (the checkpoint's 10
  multiply the flow's share ~10x; a longer reference adds ~0.1 s per 20 ms of it per step
  here). See ``tests/tiny_models/chatterbox.py`` for where the time goes.

Goal: wrapper overhead <= 2 % of total synthesis time. Peak memory is MLX's peak (reset
before each row) and the process's peak RSS. Random weights never stop: every utterance is
``--max-tokens`` codec frames long.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # engines/, tests/tiny_models


def _timed(stream) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    first = None
    nbytes = 0
    while (chunk := stream.step()) is not None:
        nbytes += len(chunk)
        first = first or time.perf_counter() - t0
    return first or 0.0, time.perf_counter() - t0, nbytes // 2


def _summary(runs: list[tuple[float, float, int]], peak_bytes: int | None) -> dict:
    total = sum(r[1] for r in runs)
    audio = sum(r[2] for r in runs) / 24_000
    return {"ttfc_ms_median": statistics.median(r[0] for r in runs) * 1000,
            "rtf": total / audio if audio else float("nan"), "total_s": total,
            "mlx_peak_mb": float("nan") if peak_bytes is None else peak_bytes / 1e6}


def _http_row(model_dir: Path, text: str, args: argparse.Namespace) -> dict:
    import subprocess

    from engines.base import SynthesisRequest
    from engines.http_tts import HttpTtsEngine

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get(
        "PYTHONPATH", "")]), HF_HUB_CACHE=tempfile.mkdtemp(prefix="bench-hf-"))
    proc = subprocess.Popen([sys.executable, "-m", "tests.tts_servers.mlx_audio_server"],
                            stdout=subprocess.PIPE, env=env, text=True, cwd=root)
    try:
        assert proc.stdout is not None  # (stdout=PIPE)
        port = int(proc.stdout.readline())
        engine = HttpTtsEngine(f"http://127.0.0.1:{port}/v1", model=str(model_dir),
                               voice="aria", format="pcm", read_timeout_s=300)
        engine.load()
        body = {"http_body": {"max_tokens": args.max_tokens}}
        _timed(engine.open(SynthesisRequest(text, options=body)))  # server warm-up
        runs = [_timed(engine.open(SynthesisRequest(text, options=body)))
                for _ in range(args.repeats)]
        engine.close()
        return _summary(runs, None)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _chatterbox_rows(tmp: Path, text: str, args: argparse.Namespace) -> dict:
    """Direct ``Model.generate`` vs ``ChatterboxEngine``, interleaved, same conditioning."""
    import mlx.core as mx

    from engines.base import SynthesisRequest
    from engines.chatterbox import ChatterboxEngine
    from tests.tiny_models.chatterbox import (
        TINY_ENGINE_OPTIONS,
        build_tiny_chatterbox,
        register_tiny_llama,
        seed_s3_tokenizer_cache,
    )
    from tests.tiny_models.qwen3 import write_reference_wav

    cache = tmp / "hf-cache"
    cache.mkdir(exist_ok=True)
    os.environ["HF_HUB_CACHE"] = str(cache)
    import huggingface_hub.constants as hf_constants  # imported already: update it too

    hf_constants.HF_HUB_CACHE = str(cache)
    hf_constants.HF_HUB_OFFLINE = True
    register_tiny_llama()
    seed_s3_tokenizer_cache(cache)
    ref = write_reference_wav(tmp / "ref.wav", seconds=args.chatterbox_ref_s)
    opts = dict(TINY_ENGINE_OPTIONS, flow_steps=args.chatterbox_flow_steps)
    engine = ChatterboxEngine(str(build_tiny_chatterbox(tmp / "cb")), ref_audio=str(ref), **opts)
    engine.load()
    model = engine._model

    def direct(seed: int) -> tuple[float, float, int]:
        mx.random.seed(seed)
        t0 = time.perf_counter()
        samples = 0
        for r in model.generate(text, conds=engine._conds, exaggeration=engine.exaggeration,
                                cfg_weight=engine.cfg_weight, temperature=engine.temperature,
                                max_tokens=opts["max_tokens"], verbose=False):
            mx.eval(r.audio)
            samples += r.audio.shape[0]
        elapsed = time.perf_counter() - t0
        return elapsed, elapsed, samples  # one chunk: the first is the whole

    rows: dict[str, list[tuple[float, float, int]]] = {"chatterbox generate": [],
                                                      "chatterbox engine": []}
    peaks: dict[str, int] = {}
    for i in range(args.chatterbox_repeats):
        for name, fn in (("chatterbox generate", direct),
                         ("chatterbox engine",
                          lambda seed: _timed(engine.open(SynthesisRequest(text, seed=seed))))):
            mx.reset_peak_memory()
            rows[name].append(fn(2000 + i))
            peaks[name] = max(peaks.get(name, 0), mx.get_peak_memory())
    out = {name: _summary(runs, peaks[name]) for name, runs in rows.items()}
    out["chatterbox engine"]["load_s"] = engine.conditioning_s
    out["chatterbox engine"]["warmup_s"] = engine.warmup_s
    engine.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--http", action="store_true", help="add the http engine row")
    ap.add_argument("--chatterbox", action="store_true",
                    help="add chatterbox rows: direct generate vs the engine")
    ap.add_argument("--chatterbox-repeats", type=int, default=3)
    ap.add_argument("--chatterbox-flow-steps", type=int, default=1,
                    help="S3Gen Euler steps (the checkpoint's default is 10: ~10x the flow time)")
    ap.add_argument("--chatterbox-ref-s", type=float, default=0.2,
                    help="reference length; S3Gen re-runs its flow over all of it per sentence")
    args = ap.parse_args()

    import mlx.core as mx

    from engines.base import SynthesisRequest
    from engines.qwen3 import Qwen3Engine
    from tests.tiny_models.qwen3 import build_tiny_qwen3

    text = "The quick brown fox jumps over the lazy dog."
    tmp = tempfile.mkdtemp(prefix="bench-qwen3-")
    path = build_tiny_qwen3(Path(tmp) / "cv", "custom_voice")
    engine = Qwen3Engine(str(path), voice="aria", max_tokens=args.max_tokens)
    engine.load()
    model = engine._model

    def direct(seed: int) -> tuple[float, float, int]:
        mx.random.seed(seed)
        t0 = time.perf_counter()
        first = None
        samples = 0
        for r in model.generate(
            text=text,
            voice="aria",
            temperature=0.7,
            stream=True,
            streaming_interval=0.32,
            max_tokens=args.max_tokens,
            split_pattern="",
        ):
            mx.eval(r.audio)
            samples += r.audio.shape[0]
            first = first or time.perf_counter() - t0
        return first or 0.0, time.perf_counter() - t0, samples

    def wrapped(seed: int) -> tuple[float, float, int]:
        t0 = time.perf_counter()
        stream = engine.open(SynthesisRequest(text, seed=seed))
        first = None
        nbytes = 0
        while (chunk := stream.step()) is not None:
            nbytes += len(chunk)
            first = first or time.perf_counter() - t0
        return first or 0.0, time.perf_counter() - t0, nbytes // 2

    rows: dict[str, list[tuple[float, float, int]]] = {"mlx-audio generate": [], "qwen3 engine": []}
    peaks: dict[str, int] = {}
    for i in range(args.repeats):
        for name, fn in (("mlx-audio generate", direct), ("qwen3 engine", wrapped)):
            mx.reset_peak_memory()
            rows[name].append(fn(1000 + i))
            peaks[name] = max(peaks.get(name, 0), mx.get_peak_memory())

    result = {}
    for name, runs in rows.items():
        total = sum(r[1] for r in runs)
        audio = sum(r[2] for r in runs) / 24_000
        result[name] = {
            "ttfc_ms_median": statistics.median(r[0] for r in runs) * 1000,
            "rtf": total / audio,
            "total_s": total,
            "mlx_peak_mb": peaks[name] / 1e6,
        }
    if args.http:
        result["http (mlx-audio server)"] = _http_row(path, text, args)
    if args.chatterbox:
        result |= _chatterbox_rows(Path(tmp), text, args)
    base, eng = result["mlx-audio generate"], result["qwen3 engine"]
    overhead = (eng["total_s"] - base["total_s"]) / base["total_s"] * 100
    if args.chatterbox:
        cb_base, cb_eng = result["chatterbox generate"], result["chatterbox engine"]
        cb_overhead = (cb_eng["total_s"] - cb_base["total_s"]) / cb_base["total_s"] * 100
    rss_peak = engine.memory()["rss_peak_bytes"]
    assert rss_peak is not None  # (getrusage's: only the current RSS may be unknown)
    out = {
        "rows": result,
        "wrapper_overhead_pct": overhead,
        "chatterbox_wrapper_overhead_pct": cb_overhead if args.chatterbox else None,
        "chatterbox_flow_steps": args.chatterbox_flow_steps if args.chatterbox else None,
        "chatterbox_ref_s": args.chatterbox_ref_s if args.chatterbox else None,
        "warmup_s": engine.warmup_s,
        "rss_peak_mb": rss_peak / 1e6,
        "repeats": args.repeats,
        "max_tokens": args.max_tokens,
        "ld_preload": os.environ.get("LD_PRELOAD", ""),
    }
    engine.close()
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"{'row':<20} {'TTFC ms':>9} {'RTF':>7} {'total s':>8} {'MLX peak MB':>12}")
    for name, r in result.items():
        print(
            f"{name:<20} {r['ttfc_ms_median']:>9.0f} {r['rtf']:>7.2f} {r['total_s']:>8.2f} "
            f"{r['mlx_peak_mb']:>12.1f}"
        )
    print(
        f"wrapper overhead: {overhead:+.2f} % of synthesis time (goal <= 2 %); "
        f"warm-up {engine.warmup_s:.2f} s; process peak RSS {out['rss_peak_mb']:.0f} MB"
    )
    if args.chatterbox:
        cb = result["chatterbox engine"]
        print(
            f"chatterbox wrapper overhead: {cb_overhead:+.2f} % ({args.chatterbox_repeats} runs, "
            f"{args.chatterbox_flow_steps} flow steps, {args.chatterbox_ref_s} s reference); "
            f"voice conditioning {cb['load_s']:.2f} s, warm-up {cb['warmup_s']:.2f} s"
        )


if __name__ == "__main__":
    main()
