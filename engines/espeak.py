"""espeak-ng, the offline default voice: libespeak-ng from the ``espeakng-loader`` wheel.

The library is driven with ctypes in synchronous mode: ``espeak_Synth`` runs on the calling
thread and hands 22,050 Hz int16 audio to a callback every ``buffer_ms``; the callback
returns 1 to abort (espeak stops within about a millisecond). The audio is resampled to
24 kHz with one streaming ``soxr.ResampleStream`` per synthesis, so chunk boundaries carry
no clicks; the stream works in float32 and this module rounds its output to int16.

libespeak-ng keeps global state and is **not thread-safe** (two threads crashed the process
in tests). The gateway calls one engine from one lane thread only; this module guards that
anyway with one process-wide lock around every library call, and initialises the library
once per process (it is never terminated: another engine instance may still use it).

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
the whole segment (a sentence takes ~4 ms) and every step hands out ``step_ms`` of it. The
synthesis checks the stream's ``closed`` flag at every buffer, so a ``close()`` from another
thread aborts a long synthesis within one buffer.
"""

from __future__ import annotations

import ctypes
import difflib
import os
import re
import threading
from collections import deque
from pathlib import Path
from typing import Protocol

import numpy as np
import soxr

from engines.base import OUTPUT_RATE, EngineError, Lane, SynthesisRequest, Uninterruptible
from engines.espeak_languages import for_language
from engines.spell import amounts_in_words, english_readings

ESPEAK_RATE = 22_050
"""What libespeak-ng produces, in Hz."""
DEFAULT_VOICE = "en-us"
DEFAULT_STEP_MS = 200
BUFFER_MS = 50
RATE_NORMAL = 175
"""espeak's default speaking rate, words per minute; ``speed=1.0`` maps to it."""
RATE_MIN, RATE_MAX = 80, 450
"""libespeak-ng's own limits (words per minute): it clamps a rate outside them."""

_AUDIO_OUTPUT_SYNCHRONOUS = 2
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_ENDPAUSE = 0x1000
_RATE = 1  # espeak_PARAMETER espeakRATE
_EE_OK = 0
_N_FLUTTER = 0x170
"""Entries in wavegen.c's flutter table; ``Flutter_ix`` counts 64 per entry and wraps."""
_WAVEGEN_COUNTERS = {
    "flutter": re.compile(r"(?:AdvanceParameters\.)?Flutter_ix(?:\.\d+)?"),
    "cycles": re.compile(r"(?:Wavegen\.)?cycle_count(?:\.\d+)?"),
}
"""wavegen.c's function-local statics that carry over between syntheses, as compilers name
them in the symbol table (gcc: ``Flutter_ix.5965``; clang: ``AdvanceParameters.Flutter_ix``)."""
_KLATT_COUNTERS = {
    "flutter": re.compile(r"(?:flutter\.)?time_count(?:\.\d+)?"),
}
"""klatt.c's function-local statics that carry over (gcc: ``time_count.5765``), reset when
found; a build without the Klatt synthesiser has none, and its other voices need none."""
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


class _Voice(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("languages", ctypes.c_void_p),  # (priority byte, NUL-terminated name)*, then 0
        ("identifier", ctypes.c_char_p),
        ("gender", ctypes.c_ubyte),
        ("age", ctypes.c_ubyte),
        ("variant", ctypes.c_ubyte),
        ("xx1", ctypes.c_ubyte),
        ("score", ctypes.c_int),
        ("spare", ctypes.c_void_p),
    ]


# The samples arrive as a bare address (c_void_p), read with one string_at copy: typed as
# POINTER(c_short) and viewed through numpy.ctypeslib, each call left a ctypes.cast
# keep-alive cycle that only a full garbage collection frees.
_SynthCallback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)


class _Library:
    """libespeak-ng, initialised once per process; every call made under ``lock``."""

    lock = threading.Lock()
    _instance: _Library | None = None

    def __init__(self) -> None:
        import espeakng_loader

        data_path = espeakng_loader.get_data_path()
        lib = ctypes.CDLL(espeakng_loader.get_library_path())
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_SetSynthCallback.restype = None
        lib.espeak_SetSynthCallback.argtypes = [_SynthCallback]
        lib.espeak_SetVoiceByName.restype = ctypes.c_int
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetParameter.restype = ctypes.c_int
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_ListVoices.restype = ctypes.POINTER(ctypes.POINTER(_Voice))
        lib.espeak_ListVoices.argtypes = [ctypes.c_void_p]
        lib.espeak_Synth.restype = ctypes.c_int
        lib.espeak_Synth.argtypes = [
            ctypes.c_char_p,
            ctypes.c_size_t,
            ctypes.c_uint,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, BUFFER_MS, data_path.encode(), 0)
        if rate != ESPEAK_RATE:
            raise EngineError("engine_failed", f"espeak_Initialize returned {rate}")
        self.lib = lib
        # One callback for the process, kept alive here; it forwards to the current sink.
        self.sink: _Sink | None = None
        self._callback = _SynthCallback(self._on_audio)
        lib.espeak_SetSynthCallback(self._callback)
        self.voices = self._list_voices(Path(data_path))
        self.variants = frozenset(
            p.name for p in (Path(data_path) / "voices" / "!v").iterdir() if p.is_file()
        )
        self._counters = _find_counters(lib, espeakng_loader.get_library_path())
        self._seed = getattr(lib, "espeak_ng_SetRandSeed", None)
        if self._seed is not None:
            self._seed.restype = ctypes.c_int
            self._seed.argtypes = [ctypes.c_long]
        self._srand = getattr(ctypes.CDLL(None), "srand", None)  # speechPlayer's noise
        if self._srand is not None:
            self._srand.restype = None
            self._srand.argtypes = [ctypes.c_uint]
        self.deterministic = self._counters is not None and self._seed is not None

    def reset(self) -> None:
        """Put the state one synthesis leaves for the next back as it was at start-up."""
        if self._counters is not None:
            for counter in self._counters:
                counter.value = 0
        if self._seed is not None:
            self._seed(0)
        if self._srand is not None:
            self._srand(1)

    @classmethod
    def get(cls) -> _Library:
        """The process's library (call with ``lock`` held)."""
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def _on_audio(self, wav: int | None, n: int, events: int) -> int:
        sink = self.sink
        if sink is None:
            return 1
        try:
            return sink.accept(np.frombuffer(ctypes.string_at(wav, 2 * n), np.int16)
                               if n > 0 and wav else None)
        except BaseException as exc:  # noqa: BLE001 - never unwind through C; re-raised later
            sink.error = exc
            return 1

    def _list_voices(self, data: Path) -> dict[str, str]:
        """Usable voice name → espeak identifier: file names (``en-us``) and languages
        (``en-gb``), lower case; the first voice claiming a name wins. A voice whose
        dictionary the data lacks is left out: the wheel lists ``fo``, ``kaa`` and ``xex``
        without theirs, and they said every word letter by letter, after "Can't read
        dictionary file" on stderr."""
        names: dict[str, str] = {}
        entries = self.lib.espeak_ListVoices(None)
        i = 0
        while entries[i]:
            v = entries[i].contents
            ident = v.identifier.decode()
            if not (data / f"{_dictionary(data / 'lang' / ident)}_dict").is_file():
                i += 1
                continue
            candidates = [os.path.basename(ident).lower()]
            p = v.languages
            while ctypes.c_ubyte.from_address(p).value:
                lang = ctypes.string_at(p + 1)
                candidates.append(lang.decode().lower())
                p += len(lang) + 2
            for c in candidates[:2]:  # file name and primary language; not bare "en" aliases
                names.setdefault(c, ident)
            i += 1
        return names


def _dictionary(voice_file: Path) -> str:
    """The dictionary a voice file names: its ``dictionary`` line, else its first
    language without the region (``pt-br``: ``pt``), as libespeak-ng picks it."""
    first = None
    try:
        lines = voice_file.read_text("utf-8", "replace").splitlines()
    except OSError:
        return ""
    for line in lines:
        words = line.split()
        if len(words) >= 2 and words[0] == "dictionary":
            return words[1]
        if len(words) >= 2 and words[0] == "language" and first is None:
            first = words[1].split("-")[0]
    return first or ""


def _find_counters(lib: ctypes.CDLL, path: str | os.PathLike[str]) -> list[ctypes.c_int] | None:
    """wavegen.c's carried-over counters as ints in the loaded library, then klatt.c's where
    this build names them; None if it does not name wavegen.c's (stripped, not ELF) or they
    do not look like those counters."""
    try:
        symbols = _elf_symbols(path)
    except (ImportError, OSError, ValueError):  # ImportError: pyelftools (Linux only) absent
        return None
    synth = symbols.get("espeak_Synth")
    if synth is None:
        return None
    address = ctypes.cast(lib.espeak_Synth, ctypes.c_void_p).value
    if address is None:
        return None
    base = address - synth[0]
    if base % 4096:
        return None  # the symbol table is not the one of the mapped file
    counters = []
    for pattern in _WAVEGEN_COUNTERS.values():
        found = [v for name, v in symbols.items() if pattern.fullmatch(name)]
        if len(found) != 1 or found[0][1] != ctypes.sizeof(ctypes.c_int):
            return None
        counters.append(ctypes.c_int.from_address(base + found[0][0]))
    flutter, cycles = counters
    if not (0 <= flutter.value < _N_FLUTTER * 64 and flutter.value % 64 == 0 and cycles.value >= 0):
        return None
    for pattern in _KLATT_COUNTERS.values():
        found = [v for name, v in symbols.items() if pattern.fullmatch(name)]
        if len(found) == 1 and found[0][1] == ctypes.sizeof(ctypes.c_int):
            counter = ctypes.c_int.from_address(base + found[0][0])
            if counter.value >= 0:
                counters.append(counter)
    return counters


def _elf_symbols(path: str | os.PathLike[str]) -> dict[str, tuple[int, int]]:
    """Data objects and functions of an ELF file's ``.symtab``: name → (value, size)."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    try:
        with open(path, "rb") as f:
            symtab = ELFFile(f).get_section_by_name(".symtab")
            if not isinstance(symtab, SymbolTableSection):
                return {}
            return {sym.name: (sym["st_value"], sym["st_size"])
                    for sym in symtab.iter_symbols()
                    if sym["st_info"]["type"] in ("STT_OBJECT", "STT_FUNC")}
    except ELFError as exc:  # not ELF (macOS), or damaged: no reset
        raise ValueError(str(exc)) from exc


class _Sink(Protocol):
    """What the callback forwards a call's audio to: ``_Synthesis`` (the raw baseline of
    bench/engines_offline.py keeps the buffers instead). ``accept`` returns 1 to stop."""

    error: BaseException | None

    def accept(self, samples: np.ndarray | None) -> int: ...


class _Synthesis:
    """The callback's sink for one ``espeak_Synth`` call: resamples into ``out``.

    The resampler works in float32 and this class rounds to int16 itself: soxr's own int16
    output dithers, and in the soxr wheel that dither read heap memory soxr never
    initialised, so the same samples came out differently from call to call (see the
    module doc)."""

    def __init__(self, stream: EspeakStream) -> None:
        self.stream = stream
        self.resampler = soxr.ResampleStream(ESPEAK_RATE, OUTPUT_RATE, 1, dtype="float32")
        self.error: BaseException | None = None
        self.calls = 0

    def accept(self, samples: np.ndarray | None) -> int:
        self.calls += 1
        if self.stream.closed:
            return 1
        if samples is not None and len(samples):
            self.stream._push(_pcm16(self.resampler.resample_chunk(samples.astype(np.float32))))
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


class EspeakEngine(Uninterruptible):
    """libespeak-ng on the cpu lane; reads digits itself; ~700x faster than real time."""

    name = "espeak"
    lane: Lane = "cpu"
    streams = True
    reads_digits = True
    thread_safe = True
    """Every library call is made under one lock (``engines.base``)."""
    speed_range = (RATE_MIN / RATE_NORMAL, RATE_MAX / RATE_NORMAL)
    """0.46-2.57: the rates espeak speaks at (``RATE_MIN``, ``RATE_MAX``)."""
    timing = {"first_s": 0.001, "rtf": 0.0013}
    """For placing turns between lanes (``engines.base``): measured on a 2-core Linux box."""

    def __init__(self, *, voice: str = DEFAULT_VOICE, step_ms: int = DEFAULT_STEP_MS) -> None:
        if step_ms <= 0:
            raise ValueError(f"step_ms must be an integer above 0, not {step_ms!r}")
        self.default_voice = voice
        self.step_samples = round(step_ms / 1000 * OUTPUT_RATE)
        self._lib: _Library | None = None
        self._closed = False
        self._streams: set[EspeakStream] = set()
        self._streams_lock = threading.Lock()

    @property
    def deterministic(self) -> bool:
        """Whether one text and voice give the same bytes on every call (see the module doc)."""
        with _Library.lock:
            return _Library.get().deterministic

    def voices(self) -> list[str]:
        with _Library.lock:
            return sorted(_Library.get().voices)

    def load(self) -> None:
        if self._closed:
            raise EngineError("engine_closed", "espeak engine is closed")
        with _Library.lock:
            try:
                self._lib = _Library.get()
            except OSError as exc:
                raise EngineError("engine_failed", f"cannot load libespeak-ng: {exc}") from exc
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

    def _voices_like(self, voice: str) -> str:
        """What to write instead of ``voice``, for the refusal at start (--voice, [tts]
        voice), where no /v1/audio/voices can be asked yet: "espeak has no voice 'en_us'"
        said nothing of what the voices are called."""
        voices = (self._lib or _Library.get()).voices
        like = difflib.get_close_matches(voice.lower().partition("+")[0].replace("_", "-"),
                                         voices, n=3)
        return (f"like it: {', '.join(like)}; " if like else "") + \
            f"its {len(voices)} voices are language codes such as en-us, en-gb, de or " \
            "fr-fr: /v1/audio/voices lists them on a gateway started without it"

    def _resolve(self, voice: str) -> bytes:
        """``en-us`` or ``en-gb+f3`` → the identifier string espeak_SetVoiceByName wants."""
        base, plus, variant = voice.lower().partition("+")
        lib = self._lib or _Library.get()
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
        self.closed = False
        self.callbacks = 0
        """How many audio buffers espeak delivered (for tests of the abort path)."""

    def step(self) -> bytes | None:
        if self.closed:
            return None
        if not self._synthesised:
            self._synthesise()
            self._synthesised = True
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
        with _Library.lock:
            lib = _Library.get()
            if lib.lib.espeak_SetVoiceByName(self._voice) != _EE_OK:
                raise EngineError("unknown_voice", f"espeak refused voice {self._voice!r}")
            lib.lib.espeak_SetParameter(_RATE, self._rate, 0)
            lib.reset()
            lib.sink = sink
            try:
                err = lib.lib.espeak_Synth(
                    text,
                    len(text) + 1,
                    0,
                    _POS_CHARACTER,
                    0,
                    _CHARS_UTF8 | _ENDPAUSE,
                    None,
                    None,
                )
            finally:
                lib.sink = None
        self.callbacks = sink.calls
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
