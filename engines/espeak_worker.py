"""The espeak worker: libespeak-ng in a process of its own, so that a crash of the C library
(a memory bug reached by some text: two such took the whole gateway down) costs the
sentence it was speaking, not every session. ``engines.espeak`` starts one per engine at
``load()`` (``python -m engines.espeak_worker LIBRARY DATA``) and talks to it over its
stdin and stdout in frames: a kind byte, a little-endian uint32 length, the payload.

Parent → worker:

* ``S``: synthesise: ``<IH`` rate (words a minute) and the voice's length, the voice
  identifier, then the text (UTF-8, guarded by the parent's ``espeak_text`` already);
* ``A``: abort the synthesis in flight (one that comes after its end is ignored).

Worker → parent:

* ``H`` (first, once): JSON ``{"voices", "variants", "deterministic"}``; or ``X``: the
  library could not be loaded (the reason, UTF-8), and the worker exits 1;
* ``P``: one buffer of 22,050 Hz int16 samples (native order), as espeak delivered it;
* ``E``: the synthesis ended: JSON ``{"err": espeak_Synth's result, "callbacks": buffers}``
  or ``{"refused": message}`` for a voice espeak refused.

The worker checks its stdin at every buffer (a ``select`` of no wait), so an abort stops
espeak within one buffer of its arrival; EOF on stdin (the engine closed, or the gateway
gone) aborts too and ends the worker. Its stdout is the frames alone: what the library
prints goes to stderr. Ctrl-C in the gateway's terminal is left to the gateway, which ends
the worker as it closes.
"""

from __future__ import annotations

import json
import os
import select
import signal
import struct
import sys

from engines.base import EngineError
from engines.espeak_library import _Library

HEADER = struct.Struct("<cI")
SYNTH = struct.Struct("<IH")


def write_frame(fd: int, kind: bytes, payload: bytes = b"") -> None:
    """One frame, whole, on ``fd`` (a blocking pipe)."""
    data = memoryview(HEADER.pack(kind, len(payload)) + payload)
    while data:
        data = data[os.write(fd, data) :]


def read_exact(fd: int, n: int) -> bytes | None:
    """``n`` bytes from ``fd``; None at EOF (before or inside them)."""
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def read_frame(fd: int) -> tuple[bytes, bytes] | None:
    """The next frame's kind and payload; None at EOF."""
    header = read_exact(fd, HEADER.size)
    if header is None:
        return None
    kind, n = HEADER.unpack(header)
    payload = read_exact(fd, n) if n else b""
    return None if payload is None else (kind, payload)


class _FrameSink:
    """The library's sink in the worker: each buffer goes out as a ``P`` frame; an abort
    (or EOF) waiting on stdin stops the synthesis."""

    def __init__(self, out: int) -> None:
        self.out = out
        self.error: BaseException | None = None
        self.calls = 0
        self.ended = False
        """stdin reached EOF: the parent is gone or closed the engine."""

    def accept(self, samples: bytes | None) -> int:
        self.calls += 1
        if select.select([0], [], [], 0)[0]:
            # only an abort (or EOF) can come during a synthesis: the parent sends the next
            # request after this one's end
            if read_frame(0) is None:
                self.ended = True
            return 1
        if samples:
            write_frame(self.out, b"P", samples)
        return 0


def serve(library_path: str, data_path: str) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out = os.dup(1)
    os.dup2(2, 1)  # the library's prints go to stderr; stdout carries frames alone
    try:
        lib = _Library(library_path, data_path)
    except (OSError, EngineError) as exc:
        write_frame(out, b"X", str(getattr(exc, "message", exc)).encode())
        return 1
    write_frame(
        out,
        b"H",
        json.dumps(
            {
                "voices": lib.voices,
                "variants": sorted(lib.variants),
                "deterministic": lib.deterministic,
            }
        ).encode(),
    )
    while (frame := read_frame(0)) is not None:
        kind, payload = frame
        if kind != b"S":
            continue  # an abort that came after its synthesis ended
        rate, n = SYNTH.unpack_from(payload)
        voice = payload[SYNTH.size : SYNTH.size + n]
        text = payload[SYNTH.size + n :]
        sink = _FrameSink(out)
        try:
            err = lib.synthesise(text, voice, rate, sink)
        except EngineError as exc:
            write_frame(out, b"E", json.dumps({"refused": exc.message}).encode())
            continue
        if sink.error is not None and not isinstance(sink.error, BrokenPipeError):
            raise sink.error
        write_frame(out, b"E", json.dumps({"err": err, "callbacks": sink.calls}).encode())
        if sink.ended:
            break
    return 0


def main() -> int:
    try:
        return serve(*sys.argv[1:3])
    except BrokenPipeError:  # the parent went away mid-frame
        return 0


if __name__ == "__main__":
    sys.exit(main())
