"""Pieces shared by the in-process MLX engines (qwen3, chatterbox).

Imported only by those engines, so a gateway that speaks with espeak never imports mlx.

Threading rule (mlx-audio upstream issue: concurrent generations crash Metal with "command
encoder already encoding"): **one MLX worker thread per process.** The gateway runs every
MLX engine on the ``gpu`` lane, whose single worker thread calls ``load``, ``open`` and
``step``. ``LaneThreadGuard`` turns a violation of that rule into a loud error instead of
a Metal crash.
"""

from __future__ import annotations

import os
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from engines.base import EngineError, SynthesisRequest, TtsEngine

INT16_SCALE = 32767.0
"""Full scale for float -> PCM16: +1.0 -> 32767, -1.0 -> -32767 (symmetric, no overflow)."""


def float_to_pcm16(audio: Any) -> bytes:
    """Convert float audio in [-1, 1] to PCM16 little-endian bytes.

    Clips first (an out-of-range sample saturates instead of wrapping around, which is
    the loud click int16 overflow makes), then rounds to nearest instead of truncating
    toward zero (truncation adds a crossover step of one LSB around zero). Non-finite
    samples mean the model is broken: they raise instead of being silenced.
    """
    x = np.asarray(audio, dtype=np.float32).reshape(-1)
    if not np.isfinite(x).all():
        raise EngineError("engine_failed", "model produced non-finite audio samples")
    np.clip(x, -1.0, 1.0, out=x)
    return np.rint(x * INT16_SCALE).astype("<i2").tobytes()


def resolve_model_path(model: str | os.PathLike[str]) -> Path:
    """A local model directory, or an HF repo id resolved from the local cache only.

    Never downloads: a repo id not already in the HF cache is an ``engine_failed`` error
    that says so (``HF_HUB_OFFLINE`` or not).
    """
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if path.exists() or str(model).startswith((".", "/", "~")) or str(model).count("/") != 1:
        raise EngineError("engine_failed", f"model directory {str(model)!r} does not exist")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(model), local_files_only=True))
    except Exception as exc:
        raise EngineError(
            "engine_failed",
            f"model {str(model)!r} is not in the local Hugging Face cache "
            "(the gateway never downloads; fetch it beforehand with `hf download`)",
        ) from exc


def process_memory() -> dict[str, int | None]:
    """MLX active/peak bytes and the process's resident/peak RSS bytes."""
    import mlx.core as mx

    rss: int | None = None
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: the current RSS needs mach calls; the peak below is enough
        pass
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss_peak = maxrss if sys.platform == "darwin" else maxrss * 1024
    return {
        "mlx_active_bytes": int(mx.get_active_memory()),
        "mlx_peak_bytes": int(mx.get_peak_memory()),
        "rss_bytes": rss,
        "rss_peak_bytes": int(rss_peak),
    }


class LaneThreadGuard:
    """Remembers the thread that loaded an MLX engine and rejects MLX work from any other."""

    def __init__(self) -> None:
        self._owner: int | None = None

    def claim(self) -> None:
        self._owner = threading.get_ident()

    def check(self) -> None:
        if self._owner is not None and threading.get_ident() != self._owner:
            raise EngineError(
                "engine_failed",
                "MLX engine used from a thread other than the one that loaded it: "
                "all MLX work must run on the gpu lane's single worker thread",
            )


def warm_up(engine: TtsEngine, text: str) -> float:
    """Speak ``text`` once (4 tokens at most) so the first real request pays no compile or
    allocation cost; returns the seconds it took."""
    started = time.perf_counter()
    stream = engine.open(SynthesisRequest(text, options={"max_tokens": 4}))
    try:
        while stream.step() is not None:
            pass
    finally:
        stream.close()
    return time.perf_counter() - started


def mlx_failure(exc: BaseException, what: str) -> EngineError:
    """Map a library error (mlx, mlx-audio, transformers) to ``engine_failed``."""
    if isinstance(exc, EngineError):
        return exc
    return EngineError("engine_failed", f"{what}: {type(exc).__name__}: {exc}")


def quiet_tqdm() -> None:
    """Stop tqdm from starting its ``tqdm_monitor`` thread.

    mlx-audio wraps every generation in a (disabled) tqdm bar; the first bar starts a
    process-wide monitor thread that only tunes progress-bar refresh and outlives every
    engine. A gateway has no progress bars to tune.
    """
    try:
        import tqdm
    except ImportError:
        return
    tqdm.tqdm.monitor_interval = 0
