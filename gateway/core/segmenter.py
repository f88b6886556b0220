"""Incremental speech segmenter: LLM text in (any chunking), speakable segments out.

Pure and synchronous. ``feed`` returns the segments that became certain with that chunk;
``finish`` flushes the rest at end of stream. A sentence is emitted only once a whole word
of the next one has arrived (or at the end), so "8." followed later by "4 seconds" is
never split.

PLACEHOLDER: minimal first version so the end-to-end turn works; the segmentation issue
replaces the boundary rules (same interface).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SegmenterConfig:
    first_min_words: int = 5
    """The first segment of a turn may end at a clause boundary once it has this many words."""
    min_chars: int = 0
    max_chars: int = 400


@dataclass(frozen=True, slots=True)
class Segment:
    index: int
    text: str
    """Exact substring of the reply (``reply[start:start+len(text)]``), stripped."""
    start: int
    spoken: str
    """What the engine receives."""


_BOUNDARY = re.compile(r"(?<=[.!?])\s+(?=\S+\s)")


class Segmenter:
    def __init__(self, config: SegmenterConfig | None = None, *, reads_digits: bool = True):
        self.config = config or SegmenterConfig()
        self.reads_digits = reads_digits
        self._buf = ""
        self._offset = 0  # offset of _buf[0] in the reply
        self._index = 0

    def feed(self, text: str) -> list[Segment]:
        self._buf += text
        out: list[Segment] = []
        while True:
            m = _BOUNDARY.search(self._buf)
            if m is None:
                break
            out.extend(self._emit(m.start(), m.end()))
        return out

    def finish(self) -> list[Segment]:
        out = self._emit(len(self._buf), len(self._buf))
        return out

    def _emit(self, end: int, resume: int) -> list[Segment]:
        raw = self._buf[:end]
        stripped = raw.strip()
        lead = len(raw) - len(raw.lstrip())
        start = self._offset + lead
        self._buf = self._buf[resume:]
        self._offset += resume
        if not stripped:
            return []
        seg = Segment(self._index, stripped, start, speakable(stripped))
        self._index += 1
        return [seg]


def speakable(text: str) -> str:
    return text
