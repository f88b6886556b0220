"""libespeak-ng through ctypes: the library calls alone, numpy-free, so that the espeak
worker process (``engines.espeak_worker``) loads this and libespeak-ng, nothing else.

``engines.espeak`` (its module doc says how the determinism reset works and why) uses
``_Library`` in the process that runs it: the worker's, or the gateway's own with the
engine's ``in_process`` option. The callback hands each 22,050 Hz buffer to the current
sink as the bytes of int16 samples.
"""

from __future__ import annotations

import ctypes
import os
import re
import threading
from pathlib import Path
from typing import Protocol

from engines.base import EngineError

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

    def __init__(self, library_path: str | None = None, data_path: str | None = None) -> None:
        import espeakng_loader

        data_path = data_path or espeakng_loader.get_data_path()
        library_path = library_path or espeakng_loader.get_library_path()
        lib = ctypes.CDLL(library_path)
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
        self._counters = _find_counters(lib, library_path)
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

    def synthesise(self, text: bytes, voice: bytes, rate: int, sink: _Sink) -> int:
        """Speak ``text`` (UTF-8) in ``voice`` at ``rate`` words a minute into ``sink``, from
        the state of start-up (``reset``); espeak_Synth's result (``_EE_OK``; after an abort
        by the sink, EE_INTERNAL_ERROR). A voice espeak refuses raises ``unknown_voice``.
        Call with ``lock`` held."""
        if self.lib.espeak_SetVoiceByName(voice) != _EE_OK:
            raise EngineError("unknown_voice", f"espeak refused voice {voice!r}")
        self.lib.espeak_SetParameter(_RATE, rate, 0)
        self.reset()
        self.sink = sink
        try:
            return int(
                self.lib.espeak_Synth(
                    text, len(text) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8 | _ENDPAUSE, None, None
                )
            )
        finally:
            self.sink = None

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
            return sink.accept(ctypes.string_at(wav, 2 * n) if n > 0 and wav else None)
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
            return {
                sym.name: (sym["st_value"], sym["st_size"])
                for sym in symtab.iter_symbols()
                if sym["st_info"]["type"] in ("STT_OBJECT", "STT_FUNC")
            }
    except ELFError as exc:  # not ELF (macOS), or damaged: no reset
        raise ValueError(str(exc)) from exc


class _Sink(Protocol):
    """What the callback forwards a call's audio to (the bytes of int16 samples, native
    order): ``engines.espeak``'s ``_Synthesis`` in process, the worker's frame writer in the
    worker (the raw baseline of bench/engines_offline.py keeps the buffers instead).
    ``accept`` returns 1 to stop."""

    error: BaseException | None

    def accept(self, samples: bytes | None) -> int: ...
