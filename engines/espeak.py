"""espeak-ng, the offline default voice: libespeak-ng from the ``espeakng-loader`` wheel.

Where the library runs: in a worker process of its own (``engines.espeak_worker``, one per
engine, started at ``load()``), because a memory bug of libespeak-ng reached by some text
(two such inputs are guarded below: ``_dotted_letters_parted``, ``_hyphen_parted``) took the
whole gateway down with it, every session. A worker that dies (a crash, a kill) fails the
synthesis in flight with ``engine_failed`` ("espeak worker died (signal SIGSEGV) ...") and
the next synthesis starts a new one; the guards stay here, in the gateway, so a guarded
input never reaches it. It is started with ``subprocess`` (``python -m``), not forked: the
gateway has threads and an event loop; nor with multiprocessing's spawn, whose pickled
messages, resource tracker and helper threads buy nothing here: a frame is five bytes of
header around the samples, and the worker's death is the EOF of its stdout and its exit
status. It imports ``engines.espeak_library`` alone (no numpy: ~20 MiB, ~90 ms to start,
warm-up included). The frames on its pipes are described in its module;
the worker sends each 22,050 Hz buffer as espeak makes it, and resampling stays here. The
engine's ``in_process`` option runs the same ``_Library`` code (``engines.espeak_library``)
in the gateway's process instead, as before: a crash is then the gateway's.

The library is driven with ctypes in synchronous mode: ``espeak_Synth`` runs on the calling
thread and hands 22,050 Hz int16 audio to a callback every ``buffer_ms``; the callback
returns 1 to abort (espeak stops within about a millisecond). The audio is resampled to
24 kHz with one streaming ``soxr.ResampleStream`` per synthesis, so chunk boundaries carry
no clicks; the stream works in float32 and this module rounds its output to int16.

libespeak-ng keeps global state and is **not thread-safe** (two threads crashed the process
in tests). A worker runs one synthesis at a time; in process, this module guards every
library call with one process-wide lock, and initialises the library once per process (it
is never terminated: another engine instance may still use it).

Determinism: the same text and voice give the same bytes on every call, whatever ran before
and however busy the machine is. libespeak-ng does not promise this by itself: two
function-local statics in its ``wavegen.c`` outlive a synthesis and are reset by no API. The
pitch-flutter phase (``Flutter_ix`` in ``AdvanceParameters``) shifts the pitch of every glottal
cycle, and a voiced stretch runs on to the end of its cycle, so the phase left behind by the
previous synthesis moved a sentence's length by up to a few pitch periods (~200 samples each;
one 45-character sentence varied over 800 samples). ``cycle_count`` in ``Wavegen`` (the
roughness modulation) changed the waveform without changing its length, and the breath noise
of voices such as ``+f3`` comes from espeak's own random generator. Before every synthesis
this module zeroes both counters, found by name in the library's ELF symbol table (read
with pyelftools, a dependency on Linux only), and
reseeds the generator with ``espeak_ng_SetRandSeed``. Where the symbols cannot be found (a
stripped or non-ELF build) ``deterministic`` is False and the output varies as before.
The Klatt variants (the ``!v`` files that say ``klatt``: ``+klatt`` to ``+klatt6``, ``+Reed``,
``+edward``...) keep state of their own, which changed their waveform but not their length
(13 of the 19 varied): ``klatt.c`` has its own F0 flutter phase (``time_count`` in
``flutter()``), zeroed with the two above when this build names it, and ``klatt 6`` voices
with breath (``+Reed``, ``+caleb``) draw their noise from the C library's ``rand()``, which
this module reseeds with ``srand(1)`` (the C library's state at start-up) before every
synthesis. Other code in the process that relies on ``rand()``'s sequence sees it restart.

The resampler needs no reset (a new stream per synthesis) but must not be asked for int16:
the int16 output stage of the ``soxr`` 1.1.0 wheel (which dithers by ±1 LSB) let heap
memory that ``soxr_create`` allocates and never initialises into the samples (valgrind:
"uninitialised value ... created by a heap allocation" in ``_soxr_init``; with
``MALLOC_PERTURB_`` set, which fills that memory with a fixed byte, the variation vanished).
Whether an output was hit depended on its samples, not on the voice: with one sentence per
voice and three calls, 6 to 9 of the 144 voices (``as``, ``om``, ``piqd``...; ``pt`` and
``nl`` with other sentences) gave the same length and the same 22,050 Hz samples, but 24 kHz
bytes that differed by 1-2 LSB from some point to the end, on every call. The float32 stream
reads no such memory, and ``_pcm16`` rounds without dither.

Streaming: espeak is about 700x faster than real time, so the first ``step()`` synthesises
the whole segment (a sentence takes ~4 ms) and every step hands out ``step_ms`` of it. A
``close()`` from another thread aborts a long synthesis and never waits for it: in process,
the callback sees the stream closed at the next buffer; a worker is sent an abort, which it
reads at its next buffer (having run ahead of the gateway by at most what the pipe holds),
and one that stays silent for ``ABORT_GRACE_S`` after it (hung) is killed by the step's
thread, which then ends the stream as closed; the next synthesis starts a new worker. A
worker silent for ``SILENT_S`` while its stream is open (hung, nobody closing it) is killed
too, failing that synthesis (``engine_failed``) before the lane's step timeout would find
its thread stuck for good.
``close()`` of the engine ends its worker (EOF on its stdin, SIGKILL if it has not exited
within ``ABORT_GRACE_S``); an engine never closed ends it when collected.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import weakref
from collections import deque
from pathlib import Path
from typing import Protocol

import numpy as np
import soxr

from engines.base import OUTPUT_RATE, EngineError, Lane, SynthesisRequest, Uninterruptible
from engines.espeak_languages import for_language
from engines.espeak_library import (  # noqa: F401 - re-exported: tests and bench use them
    _CHARS_UTF8,
    _EE_OK,
    _ENDPAUSE,
    _POS_CHARACTER,
    _RATE,
    BUFFER_MS,
    DEFAULT_STEP_MS,
    DEFAULT_VOICE,
    ESPEAK_RATE,
    RATE_MAX,
    RATE_MIN,
    RATE_NORMAL,
    _elf_symbols,
    _find_counters,
    _Library,
)
from engines.espeak_worker import HEADER, SYNTH, write_frame
from engines.spell import amounts_in_words, english_readings

_SIGN = re.compile(r"(?:(?<=^)|(?<=[\s(\[=/]))[-\u2013](?=\d)")
"""A minus sign written as a hyphen or an en dash, before a digit and after a space, an
opening bracket, ``=`` or ``/``. espeak says "minus" for ``-5`` after a space but drops
the sign after a bracket or ``=`` ("23°F (-5°C)" was "five degrees C", "x = -1" was "x
equals one") and after a space when it is an en dash ("lows of –5°C"); it says U+2212
"minus" everywhere. A hyphen between digits ("2024-05-01", "9-5") is left alone."""


_RANGE = re.compile(r"(?<=[\d%])\s?\u2013\s?(?=[$\u20ac\u00a3]?\d)")
"""An en dash between two numbers, a range: espeak skips it ("20–22°C" was "twenty
twenty-two degrees", a year). In English it is "to"; German, French, Spanish, Italian and
Portuguese get their own word from ``engines.espeak_languages`` (``_EN_DASH_RANGE``)."""


DOTTED_LETTERS_PER_LINE = 20
"""The most letters followed by a dot that espeak is given on one line
(``_dotted_letters_parted``)."""
_DOTTED_LETTER = re.compile(r"[^\W\d_]\.")


def _dotted_letters_parted(text: str) -> str:
    """``text`` with a line break after every ``DOTTED_LETTERS_PER_LINE`` letters followed
    by a dot, when more follow, and without soft hyphens (U+00AD, which espeak skips
    anyway). libespeak-ng (1.52 included) reads single letters joined by dots as an
    abbreviation ("U.S.A.") and gathers the letters of abbreviations that follow one
    another in a stack buffer it overflows past ~190 bytes: "a." 192 times, a letter of
    four bytes in UTF-8 51 times, abbreviations of two letters between spaces ("a.b. c.d.
    ...") 97 times, also with a comma or a soft hyphen between them. It crashed the process
    (SIGSEGV, or "stack smashing detected"), every session with it: one speech request or
    one ``say`` did it. A line break (or a word, which an attacker chooses not to send)
    ends what it gathered: 20 letters are 80 bytes at most, and none of these crashed so
    parted, up to 4,096 characters. Only ASCII ``.`` joins such letters (``．``, ``。``,
    ``․`` do not)."""
    text = text.replace("\u00ad", "")
    ends = [m.end() for m in _DOTTED_LETTER.finditer(text)]
    if len(ends) <= DOTTED_LETTERS_PER_LINE:
        return text
    parts, start = [], 0
    for cut in ends[DOTTED_LETTERS_PER_LINE - 1:-1:DOTTED_LETTERS_PER_LINE]:
        parts += [text[start:cut], "\n"]
        start = cut
    return "".join(parts) + text[start:]


_HYPHEN_AFTER_A_MARK = re.compile(r"(?<=(.))-(?=[^\W\d_])", re.DOTALL)
"""A hyphen between a letter and what is neither a letter, an ASCII digit nor a space:
``(-a``, ``"-i``, ``①-a``, ``_-a``, ``)-あ``. libespeak-ng (1.52 included) crashes on one
where a clause starts in several voices (SIGSEGV): Vietnamese (``vi`` and its variants) on
any of these, Malayalam and Hindi with a letter of another script (``(-あ``); one turn's
or one speech request's text did it (found by fuzzing; other voices may have more). It
never crashed on ``(- a``, read the same: a space goes after such a hyphen, in every
voice (``1-a``, ``3-D``, ``a-b`` keep theirs)."""


def _hyphen_parted(match: re.Match[str]) -> str:
    before = match.group(1)
    return "-" if before.isalpha() or before.isspace() or before in "0123456789" else "- "


def espeak_text(text: str, *, english: bool = False) -> str:
    """``text`` as espeak should be given it: in ``english`` voices the notations it
    misreads in words (``engines.spell.english_readings``: "7 > 5" was "seven five"),
    ranges read "to" (``_RANGE``) and amounts with their unit after the number
    (``engines.spell.amounts_in_words``: "$5.50" was "dollar five point five zero"); minus
    signs as U+2212 (``_SIGN``); in every voice, a line break after every 20 letters
    followed by a dot (``_dotted_letters_parted``) and a space after a hyphen between a
    mark and a letter (``_HYPHEN_AFTER_A_MARK``): both crashed libespeak-ng."""
    if english:
        text = amounts_in_words(_RANGE.sub(" to ", english_readings(text)))
    return _HYPHEN_AFTER_A_MARK.sub(_hyphen_parted,
                                    _dotted_letters_parted(_SIGN.sub("\u2212", text)))


class _Synthesis:
    """The sink of one synthesis's 22,050 Hz buffers (from the library's callback in
    process, from the worker's frames otherwise): resamples into the stream.

    The resampler works in float32 and this class rounds to int16 itself: soxr's own int16
    output dithers, and in the soxr wheel that dither read heap memory soxr never
    initialised, so the same samples came out differently from call to call (see the
    module doc)."""

    def __init__(self, stream: EspeakStream) -> None:
        self.stream = stream
        self.resampler = soxr.ResampleStream(ESPEAK_RATE, OUTPUT_RATE, 1, dtype="float32")
        self.error: BaseException | None = None
        self.calls = 0

    def accept(self, samples: bytes | None) -> int:
        self.calls += 1
        if self.stream.closed:
            return 1
        if samples:
            pcm = np.frombuffer(samples, np.int16).astype(np.float32)
            self.stream._push(_pcm16(self.resampler.resample_chunk(pcm)))
        return 0

    def flush(self) -> None:
        self.stream._push(_pcm16(self.resampler.resample_chunk(np.zeros(0, np.float32),
                                                               last=True)))


def _pcm16(samples: np.ndarray) -> np.ndarray:
    """Float samples on the int16 scale (soxr's float32 output) as int16: rounded to the
    nearest integer, clipped to the int16 range. Overwrites ``samples``."""
    np.rint(samples, out=samples)
    np.clip(samples, -32768, 32767, out=samples)
    return samples.astype(np.int16)


class _Backend(Protocol):
    """Where the library runs: in this process (``_InProcess``) or in a worker
    (``_Worker``)."""

    voices: dict[str, str]
    variants: frozenset[str]
    deterministic: bool

    @property
    def alive(self) -> bool: ...

    def synthesise(self, text: bytes, voice: bytes, rate: int, sink: _Synthesis) -> tuple[int, int]:
        """espeak_Synth's result and how many buffers espeak delivered."""
        ...

    def abort(self, sink: _Synthesis) -> None: ...

    def close(self) -> None: ...


class _InProcess:
    """The library in the gateway's own process (``in_process=True``): a crash of it is the
    gateway's. The callback checks the stream's ``closed`` flag at every buffer."""

    alive = True

    def __init__(self) -> None:
        with _Library.lock:
            try:
                self.lib = _Library.get()
            except OSError as exc:
                raise EngineError("engine_failed", f"cannot load libespeak-ng: {exc}") from exc
        self.voices = self.lib.voices
        self.variants = self.lib.variants
        self.deterministic = self.lib.deterministic

    def synthesise(self, text: bytes, voice: bytes, rate: int, sink: _Synthesis) -> tuple[int, int]:
        with _Library.lock:
            err = self.lib.synthesise(text, voice, rate, sink)
        return err, sink.calls

    def abort(self, sink: _Synthesis) -> None:
        pass  # the callback sees the stream closed at its next buffer

    def close(self) -> None:
        pass  # initialised once per process, never terminated: another engine may use it


ABORT_GRACE_S = 1.0
"""How long a worker may stay silent once the stream it speaks for is closed (it was sent an
abort, which a working one answers within a buffer) before it is taken for hung and killed."""
SILENT_S = 10.0
"""How long a worker speaking for a stream still open may send nothing before it is taken
for hung and killed, failing that synthesis: espeak makes a buffer in a fraction of a
millisecond, and the lane's ``step_timeout_s`` (30 s) would otherwise find its thread stuck
in the step for good (``gateway.io.lanes``: the lane unhealthy until the call returns)."""
START_TIMEOUT_S = 30.0
"""How long a worker may take to load the library and list its voices (~0.1 s here)."""


class _Worker:
    """libespeak-ng in a process of its own (``engines.espeak_worker``, whose doc gives the
    frames): one synthesis at a time (``lock``); ``abort`` may be called from any thread."""

    def __init__(self) -> None:
        import espeakng_loader

        library, data = espeakng_loader.get_library_path(), espeakng_loader.get_data_path()
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parent.parent)  # the worker imports these engines
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engines.espeak_worker", str(library), str(data)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, env=env)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._in, self._out = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        self.lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._in_flight: _Synthesis | None = None
        self._aborted = False
        self._dead = False
        try:
            kind, payload = self._frame(None, START_TIMEOUT_S)
        except EngineError as exc:
            self.close()
            raise EngineError(exc.code, f"cannot start the espeak worker: {exc.message}") from None
        if kind != b"H":
            self.close()
            message = payload.decode("utf-8", "replace")
            raise EngineError("engine_failed", f"cannot load libespeak-ng: {message}")
        hello = json.loads(payload)
        self.voices: dict[str, str] = hello["voices"]
        self.variants = frozenset(hello["variants"])
        self.deterministic: bool = hello["deterministic"]

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return not self._dead and self.proc.poll() is None

    def synthesise(self, text: bytes, voice: bytes, rate: int, sink: _Synthesis) -> tuple[int, int]:
        with self.lock:
            if not self.alive:
                raise self._death(len(text))
            with self._write_lock:
                self._aborted = False
                self._in_flight = sink
                try:
                    self._send(b"S", SYNTH.pack(rate, len(voice)) + voice + text)
                    sent = True
                except OSError:  # it died since it was found alive: its exit says how
                    self._in_flight, sent = None, False
            if not sent:
                raise self._death(len(text))
            try:
                while True:
                    kind, payload = self._frame(sink, None, len(text))
                    if kind == b"E":
                        break
                    if kind == b"P" and sink.error is None and not self._aborted:
                        try:
                            stop = sink.accept(payload)
                        except BaseException as exc:  # noqa: BLE001 - re-raised by the stream
                            sink.error, stop = exc, 1
                        if stop:
                            self.abort(sink)
            finally:
                with self._write_lock:
                    self._in_flight = None
        end = json.loads(payload)
        if "refused" in end:
            raise EngineError("unknown_voice", end["refused"])
        return end["err"], end["callbacks"]

    def abort(self, sink: _Synthesis) -> None:
        """Stop ``sink``'s synthesis if it is the one in flight (at once, from any thread)."""
        with self._write_lock:
            if self._in_flight is sink and not self._aborted and not self._dead:
                self._aborted = True
                try:
                    self._send(b"A", b"")
                except OSError:
                    pass  # the worker is gone: the reader sees its EOF

    def close(self) -> None:
        """End the worker (EOF on its stdin, then SIGKILL if it has not exited within
        ``ABORT_GRACE_S``) and wait for it; its pipes closed."""
        with self._write_lock:
            self._dead = True
            self.proc.stdin.close()  # type: ignore[union-attr]
        try:
            self.proc.wait(ABORT_GRACE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        with self.lock:  # a reader in flight sees EOF now and lets go
            self.proc.stdout.close()  # type: ignore[union-attr]

    def _send(self, kind: bytes, payload: bytes) -> None:
        write_frame(self._in, kind, payload)

    def _frame(self, sink: _Synthesis | None, timeout: float | None,
               text_len: int | None = None) -> tuple[bytes, bytes]:
        header = self._read(HEADER.size, sink, timeout, text_len)
        kind, n = HEADER.unpack(header)
        return kind, self._read(n, sink, timeout, text_len) if n else b""

    def _read(self, n: int, sink: _Synthesis | None, timeout: float | None,
              text_len: int | None) -> bytes:
        buf = bytearray()
        silent = 0.0
        while len(buf) < n:
            wait = timeout if timeout is not None else ABORT_GRACE_S
            if not select.select([self._out], [], [], wait)[0]:
                silent += wait
                if timeout is not None or silent >= SILENT_S or (
                        sink is not None and sink.stream.closed):
                    # not started in time, silent too long, or closed and silent after an
                    # abort: hung
                    self._kill()
                    raise EngineError("engine_failed", f"espeak worker silent for "
                                      f"{silent:g} s (hung): killed")
                continue  # speaking a long text, or hung: SILENT_S tells
            silent = 0.0
            chunk = os.read(self._out, n - len(buf))
            if not chunk:
                raise self._death(text_len)
            buf += chunk
        return bytes(buf)

    def _kill(self) -> None:
        with self._write_lock:
            self._dead = True
        self.proc.kill()
        self.proc.wait()

    def _death(self, text_len: int | None) -> EngineError:
        """The error that says how the worker ended, speaking ``text_len`` bytes of text
        (None: as it started)."""
        with self._write_lock:
            self._dead = True
        try:
            code = self.proc.wait(ABORT_GRACE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        if code < 0:
            try:
                how = f"signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"signal {-code}"
        else:
            how = f"exit code {code}"
        if text_len is None:
            return EngineError("engine_failed", f"espeak worker died ({how}) as it started")
        return EngineError("engine_failed", f"espeak worker died ({how}) speaking "
                           f"{text_len} bytes of text; the next sentence starts a new one")


class EspeakEngine(Uninterruptible):
    """libespeak-ng on the cpu lane; reads digits itself; ~700x faster than real time."""

    name = "espeak"
    lane: Lane = "cpu"
    streams = True
    reads_digits = True
    thread_safe = True
    """One synthesis at a time in the worker (or, in process, under one lock) (``engines.base``)."""
    speed_range = (RATE_MIN / RATE_NORMAL, RATE_MAX / RATE_NORMAL)
    """0.46-2.57: the rates espeak speaks at (``RATE_MIN``, ``RATE_MAX``)."""
    timing = {"first_s": 0.001, "rtf": 0.0013}
    """For placing turns between lanes (``engines.base``): measured on a 2-core Linux box."""

    def __init__(self, *, voice: str = DEFAULT_VOICE, step_ms: int = DEFAULT_STEP_MS,
                 in_process: bool = False) -> None:
        if step_ms <= 0:
            raise ValueError(f"step_ms must be an integer above 0, not {step_ms!r}")
        self.default_voice = voice
        self.step_samples = round(step_ms / 1000 * OUTPUT_RATE)
        self.in_process = in_process
        """libespeak-ng in the gateway's process instead of a worker: a crash of the library
        is then the gateway's (the module doc)."""
        self._lib: _Backend | None = None
        self._lib_lock = threading.Lock()
        self._finalizer: weakref.finalize | None = None
        self._closed = False
        self._streams: set[EspeakStream] = set()
        self._streams_lock = threading.Lock()

    @property
    def deterministic(self) -> bool:
        """Whether one text and voice give the same bytes on every call (see the module doc)."""
        return self._backend().deterministic

    @property
    def worker_pid(self) -> int | None:
        """The worker process's id (None in process, or before it started)."""
        lib = self._lib
        return lib.pid if isinstance(lib, _Worker) else None

    def voices(self) -> list[str]:
        return sorted(self._backend().voices)

    def load(self) -> None:
        if self._closed:
            raise EngineError("engine_closed", "espeak engine is closed")
        self._backend()
        try:  # a bad default voice fails at load, not mid-turn
            self._resolve(self.default_voice)
        except EngineError as exc:
            raise EngineError(exc.code, f"{exc.message} ({self._voices_like(self.default_voice)})"
                              ) from None
        warm = self.open(SynthesisRequest(text="ok"))
        try:
            while warm.step() is not None:
                pass
        finally:
            warm.close()

    def open(self, request: SynthesisRequest) -> EspeakStream:
        if self._closed:
            raise EngineError("engine_closed", "espeak engine is closed")
        if self._lib is None:
            self.load()
        voice = self._resolve(request.voice or self.default_voice)
        if not request.speed > 0:
            raise EngineError("bad_request", f"speed must be > 0, got {request.speed}")
        rate = min(RATE_MAX, max(RATE_MIN, round(RATE_NORMAL * request.speed)))
        stream = EspeakStream(self, request.text, voice, rate)
        if request.step_ms is not None and request.step_ms > 0:
            stream._step_samples = max(1, round(request.step_ms / 1000 * OUTPUT_RATE))
        with self._streams_lock:
            self._streams.add(stream)
        return stream

    def close(self) -> None:
        self._closed = True
        with self._streams_lock:
            streams, self._streams = list(self._streams), set()
        for s in streams:
            s.close()
        with self._lib_lock:
            if self._finalizer is not None:
                self._finalizer()  # ends the worker

    def _backend(self) -> _Backend:
        """The library, started if need be: a worker that died is replaced by a new one."""
        with self._lib_lock:
            if self._closed:  # its voices may still be asked: no new worker for that
                if self._lib is None and not self.in_process:
                    raise EngineError("engine_closed", "espeak engine is closed")
                return self._lib or _InProcess()
            if self._lib is None or not self._lib.alive:
                if self._finalizer is not None:
                    self._finalizer()  # the dead worker's pipes
                if self.in_process:
                    self._lib = _InProcess()
                else:
                    worker = _Worker()
                    self._lib = worker
                    # an engine nobody closed ends its worker when it is collected
                    self._finalizer = weakref.finalize(self, worker.close)
            return self._lib

    def _voices_like(self, voice: str) -> str:
        """What to write instead of ``voice``, for the refusal at start (--voice, [tts]
        voice), where no /v1/audio/voices can be asked yet: "espeak has no voice 'en_us'"
        said nothing of what the voices are called."""
        voices = self._backend().voices
        like = difflib.get_close_matches(voice.lower().partition("+")[0].replace("_", "-"),
                                         voices, n=3)
        return (f"like it: {', '.join(like)}; " if like else "") + \
            f"its {len(voices)} voices are language codes such as en-us, en-gb, de or " \
            "fr-fr: /v1/audio/voices lists them on a gateway started without it"

    def _resolve(self, voice: str) -> bytes:
        """``en-us`` or ``en-gb+f3`` → the identifier string espeak_SetVoiceByName wants."""
        base, plus, variant = voice.lower().partition("+")
        lib = self._lib or self._backend()
        ident = lib.voices.get(base)
        if ident is None or (plus and variant not in {v.lower() for v in lib.variants}):
            raise EngineError("unknown_voice", f"espeak has no voice {voice!r}")
        if plus:
            variant = next(v for v in lib.variants if v.lower() == variant)
        return f"{ident}+{variant}".encode() if plus else ident.encode()

    def _forget(self, stream: EspeakStream) -> None:
        with self._streams_lock:
            self._streams.discard(stream)


class EspeakStream(Uninterruptible):
    """One espeak synthesis: synthesised on the first step, handed out ``step_ms`` at a time."""

    def __init__(self, engine: EspeakEngine, text: str, voice: bytes, rate: int) -> None:
        self._engine = engine
        self._text = text
        self._voice = voice
        self._rate = rate
        self._step_samples = engine.step_samples
        self._pending: deque[np.ndarray] = deque()
        self._pending_len = 0
        self._lock = threading.Lock()
        self._synthesised = False
        self._sink: _Synthesis | None = None
        self._lib: _Backend | None = None
        self.closed = False
        self.callbacks = 0
        """How many audio buffers espeak delivered (for tests of the abort path)."""

    def step(self) -> bytes | None:
        if self.closed:
            return None
        if not self._synthesised:
            self._synthesised = True
            self._synthesise()
        with self._lock:
            if self.closed or not self._pending_len:
                self._release()
                return None
            return self._take(self._step_samples)

    def close(self) -> None:
        self.closed = True
        with self._lock:
            self._pending.clear()
            self._pending_len = 0
        sink, lib = self._sink, self._lib
        if sink is not None and lib is not None:
            lib.abort(sink)  # a worker stops at its next buffer; close never waits for it
        self._release()

    def _release(self) -> None:
        self.closed = True
        self._engine._forget(self)

    def _push(self, samples: np.ndarray) -> None:
        if len(samples):
            with self._lock:
                if not self.closed:
                    self._pending.append(samples)
                    self._pending_len += len(samples)

    def _take(self, n: int) -> bytes:
        parts: list[np.ndarray] = []
        while n > 0 and self._pending:
            head = self._pending.popleft()
            if len(head) > n:
                self._pending.appendleft(head[n:])
                head = head[:n]
            parts.append(head)
            n -= len(head)
            self._pending_len -= len(head)
        return np.concatenate(parts).astype("<i2").tobytes()

    def _synthesise(self) -> None:
        language = os.path.basename(self._voice.split(b"+")[0]).decode().lower()
        text = espeak_text(for_language(self._text, language),
                           english=language.startswith("en")).encode("utf-8", "replace")
        if not text.strip():
            return
        sink = _Synthesis(self)
        self._lib = self._engine._backend()
        self._sink = sink
        if self.closed:
            return
        try:
            err, self.callbacks = self._lib.synthesise(text, self._voice, self._rate, sink)
        except EngineError:
            if self.closed:
                return  # closed mid-synthesis: its worker's end is no failure of this stream
            raise
        finally:
            self._sink = None
        if sink.error is not None:
            raise EngineError("engine_failed", f"espeak callback failed: {sink.error}") from (
                sink.error
            )
        if self.closed:
            return
        # espeak_Synth reports EE_INTERNAL_ERROR after an abort; only a real failure counts.
        if err != _EE_OK:
            raise EngineError("engine_failed", f"espeak_Synth returned {err}")
        sink.flush()
