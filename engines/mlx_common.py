"""Pieces shared by the in-process MLX engines (qwen3, chatterbox).

Imported only by those engines, so a gateway that speaks with espeak never imports mlx.

Threading rule (mlx-audio upstream issue: concurrent generations crash Metal with "command
encoder already encoding"): **one MLX worker thread per process.** The gateway runs every
MLX engine on the ``gpu`` lane, whose single worker thread calls ``load``, ``open`` and
``step``. ``LaneThreadGuard`` turns a violation of that rule into a loud error instead of
a Metal crash.

``MlxLifecycle`` is the bookkeeping the MLX engines share around their model (that thread
rule, the streams they handed out, closing in the right order, the warm-up and its log
line). Each engine *holds* one instead of inheriting it: engines are a ``typing.Protocol``,
not a class tower, and each engine module keeps only what is specific to its model.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import logging
import os
import re
import resource
import sys
import threading
import time
import unicodedata
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from engines.base import EngineError, SynthesisRequest, SynthesisStream, TtsEngine

S = TypeVar("S", bound=SynthesisStream)

log = logging.getLogger(__name__)

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


def reference_audio(path: str | None) -> str | None:
    """A voice's reference WAV as configured, ``~`` expanded: ``"~/voices/me.wav"`` in a
    config file (no shell expands it there), as the model path may be written."""
    return None if path is None else str(Path(path).expanduser())


MLX_EXTRA = 'pip install -e ".[mlx]"'
"""What installs mlx-audio and MLX: the ``mlx`` extra, which ``pip install -e .`` leaves out."""


def require_mlx_audio(engine: str) -> None:
    """Raise ``engine_failed`` naming the ``mlx`` extra when mlx-audio is not installed.

    Checked before the model is looked for: without the extra the first refusal was the
    Hugging Face cache's ("fetch it beforehand with `hf download`", a command mlx-audio
    brings too), or, for a model directory, "ModuleNotFoundError: No module named
    'mlx_audio'", and neither said what to install. Imports nothing."""
    if importlib.util.find_spec("mlx_audio") is None:
        raise EngineError("engine_failed", f"the {engine} engine needs mlx-audio, which "
                          f"`pip install -e .` leaves out: install the mlx extra, {MLX_EXTRA}")


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


class MlxLifecycle:
    """Load, open and close bookkeeping for one in-process MLX engine, held by the engine.

    * ``claim_thread`` at the start of ``load`` makes the calling thread (the gpu lane's
      worker) the only one allowed MLX work; ``check_thread`` refuses any other.
    * ``admit`` at the start of ``open`` refuses an engine that is not loaded (or closed)
      and a wrong thread; ``track`` remembers the stream ``open`` hands out.
    * ``warm_up_and_log`` ends ``load``: one short synthesis, then the load log line.
    * ``close`` drops the engine's model first (so nothing new opens), closes every stream
      still open, then returns MLX's cached buffers to the system. Like all MLX work it
      belongs on the lane's thread (``gateway.io.lanes`` closes there): from another thread
      it would race a step in flight (a generator cannot be closed while it runs, and the
      step would go on with a cleared cache), which nothing here can prevent.
    """

    def __init__(self, name: str, log: logging.Logger) -> None:
        self.name = name
        self._log = log
        self._guard = LaneThreadGuard()
        self._lock = threading.Lock()  # two close() calls unload once
        self._streams: weakref.WeakSet[SynthesisStream] = weakref.WeakSet()

    def claim_thread(self) -> None:
        self._guard.claim()

    def check_thread(self) -> None:
        self._guard.check()

    def admit(self, model: Any) -> None:
        """Raise ``engine_failed`` unless ``model`` is loaded and this is the lane's thread."""
        if model is None:
            raise EngineError("engine_failed", f"{self.name} engine used before load()")
        self._guard.check()

    def track(self, stream: S) -> S:
        self._streams.add(stream)
        return stream

    def warm_up_and_log(self, engine: TtsEngine, text: str, loaded: str, *args: Any) -> float:
        """Warm ``engine`` up with ``text``, then log ``loaded % args`` followed by the
        warm-up time and MLX memory; returns the warm-up seconds."""
        warmup_s = warm_up(engine, text)
        mem = process_memory()
        self._log.info(
            loaded + "; warm-up took %.2f s; mlx active %.0f MB, peak %.0f MB",
            *args,
            warmup_s,
            (mem["mlx_active_bytes"] or 0) / 1e6,
            (mem["mlx_peak_bytes"] or 0) / 1e6,
        )
        return warmup_s

    def close(self, unload: Callable[[], bool]) -> None:
        """``unload`` drops the engine's references to its model and per-voice state and
        says whether a model was loaded; it runs under a lock, before the streams close.
        The MLX cache is cleared only after a loaded model, so closing an engine that never
        loaded does not import mlx."""
        with self._lock:
            was_loaded = unload()
        for stream in list(self._streams):
            stream.close()
        if was_loaded:
            import mlx.core as mx

            mx.clear_cache()


def config_model_type(path: Path) -> str | None:
    """The ``model_type`` a model directory's ``config.json`` names; ``None`` without one
    (none, unreadable or not naming one: mlx-audio's loader then says what it lacks)."""
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    found = config.get("model_type") if isinstance(config, dict) else None
    return found if isinstance(found, str) else None


def load_tts_model(path: Path, kinds: tuple[str, ...], name: str) -> Any:
    """mlx-audio's own loader on a local model directory, its errors mapped to ``engine_failed``.

    A directory whose ``config.json`` names another ``model_type`` than ``kinds`` is refused
    first, naming what it holds (``name``: the engine's model, for the message): mlx-audio
    loads whatever it finds there, and an LLM's directory given as the voice (both are
    mlx-community checkpoints) was loaded as Orpheus, whose codec it then reached for on the
    model hub: the gateway stopped with "Cannot find an appropriate cached snapshot ... set
    HF_HUB_OFFLINE=0", which would have downloaded a codec for a model that is no voice."""
    found = config_model_type(path)
    if found is not None and found not in kinds:
        raise EngineError("engine_failed", f"{path} holds a {found!r} model (model_type in its "
                          f"config.json), not a {name} one")
    try:
        from mlx_audio.tts.utils import load_model

        with library_output_logged(log):
            return load_model(path)
    except Exception as exc:
        raise mlx_failure(exc, f"loading {path}") from exc


@contextlib.contextmanager
def library_output_logged(log: logging.Logger) -> Iterator[None]:
    """Around a model load on this thread: what mlx-audio prints there goes to ``log``, a
    line starting "Warning" at WARNING (the reason a tokenizer did not load), the others
    at DEBUG; and transformers' warning that a config of a model type it does not know was
    read as its base class (how mlx-audio's ``AutoTokenizer`` call reads a Qwen3-TTS
    directory) goes there at DEBUG. Every qwen3 start printed "Loaded speech tokenizer
    from ..." on stdout and "[transformers] You are using a model of type `qwen3_tts` to
    instantiate a model of type ``. ... can yield errors", which operators took for faults.

    Only this thread's prints are taken (``_ThreadOutput``): the gateway's own lines ("stopped
    while starting", printed while a cancelled load runs on), another lane's load and the
    HTTP API go on writing to stdout as before."""
    _quiet_base_config_warning()
    with _ThreadOutput.diverted(log):
        yield


_BASE_CONFIG_MISMATCH = re.compile(r"You are using a model of type `[^`]+` to instantiate a "
                                   r"model of type ``\.")
"""transformers' warning when ``PreTrainedConfig`` itself (model type "") reads a config:
what ``AutoTokenizer`` falls back to for a model type it does not know. It reads the
tokenizer's files as ever; any other mismatch (a real model class) is still warned of."""


def _to_debug(record: logging.LogRecord) -> bool:
    if _BASE_CONFIG_MISMATCH.match(str(record.msg)):
        log.debug("transformers: %s", record.getMessage())
        return False
    return True


def _quiet_base_config_warning() -> None:
    """Put ``_to_debug`` on transformers' config logger, once (a filter that passes every
    other record: left on, no thread can race its removal)."""
    config_log = logging.getLogger("transformers.configuration_utils")
    if _to_debug not in config_log.filters:
        config_log.addFilter(_to_debug)


class _ThreadOutput(io.TextIOBase):
    """``sys.stdout`` while a thread's output is diverted: that thread's lines go to its
    logger, every other thread's text to the stream it replaced. Put in place by the first
    ``diverted`` and taken out by the last (loads on two lanes overlap; swapping
    ``sys.stdout`` per load, the second one restored the first one's buffer for good)."""

    _lock = threading.Lock()

    def __init__(self, original: Any) -> None:
        super().__init__()
        self.original = original
        self.threads: dict[int, tuple[logging.Logger, list[str]]] = {}

    @classmethod
    @contextlib.contextmanager
    def diverted(cls, log: logging.Logger) -> Iterator[None]:
        me = threading.get_ident()
        with cls._lock:
            current: Any = sys.stdout
            output: _ThreadOutput = current if isinstance(current, _ThreadOutput) \
                else cls(current)
            sys.stdout = output
            output.threads[me] = (log, [])
        try:
            yield
        finally:
            with cls._lock:
                log, pending = output.threads.pop(me)
                if not output.threads and sys.stdout is output:
                    sys.stdout = output.original  # (replaced since by another: left alone)
            output.log_line(log, "".join(pending))

    def write(self, text: str) -> int:
        diverted = self.threads.get(threading.get_ident())
        if diverted is None:
            return int(self.original.write(text))
        log, pending = diverted
        *lines, rest = "".join((*pending, text)).split("\n")
        pending[:] = [rest]
        for line in lines:
            self.log_line(log, line)
        return len(text)

    @staticmethod
    def log_line(log: logging.Logger, line: str) -> None:
        if line.strip():
            log.log(logging.WARNING if line.lstrip().lower().startswith("warning")
                    else logging.DEBUG, "%s", line.strip())

    def flush(self) -> None:
        if threading.get_ident() not in self.threads:
            self.original.flush()

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return int(self.original.fileno())

    def isatty(self) -> bool:
        return bool(self.original.isatty())

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return str(getattr(self.original, "encoding", "utf-8"))


WIDE_CHARACTER = 3
"""What a Chinese, Japanese or Korean character (East Asian width W or F: a syllable, a mora
or two, or a full-width pause mark) counts for in a runaway budget, in letters: Mandarin is
spoken at 0.15 to 0.3 s a syllable (0.2 medium, 0.25 slow), three letters' time (~0.07 s).
Counted as one letter, a Chinese sentence read slowly was a runaway, stopped mid-sentence."""


def runaway_budget_s(text: str, factor: float, min_s: float) -> float:
    """The most audio ``text`` may become before the synthesis counts as a runaway:
    ``factor`` seconds per letter (normal speech is ~0.07 s; a CJK character counts as
    ``WIDE_CHARACTER`` letters), at least ``min_s``."""
    letters = sum(WIDE_CHARACTER if unicodedata.east_asian_width(c) in ("W", "F") else 1
                  for c in text)
    return max(min_s, letters * factor)


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


def seed_sampling(seed: int, step: int = 0) -> None:
    """Seed MLX's random generator for ``step`` of a request that asked for ``seed``.

    The streams on the lane share MLX's one global generator, and the lane steps them in
    turn: a seed set once at a stream's start would not survive another stream sampling
    between two of its steps. Seeding every step from (seed, step) gives a seed the same
    audio alone or interleaved. Any integer is a seed (MLX itself takes 0 to 2**64 - 1).
    """
    import mlx.core as mx

    mx.random.seed(hash((seed, step)) & 0xFFFF_FFFF_FFFF_FFFF)


def unseed_sampling() -> None:
    """Back to unpredictable sampling, for the streams that asked for no seed, after a
    seeded step."""
    import mlx.core as mx

    mx.random.seed(int.from_bytes(os.urandom(8)))


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
