"""What a session has sent or will send, kept for writing and for resume. Pure.

Every outbound message (event text or binary frame) gets an absolute position. A writer
keeps a cursor and sends ``get(cursor)`` until it reaches ``end``. Messages already written
stay for a while (up to ``max_bytes`` in all) so a client that reconnects can ask for
everything after the last frame it received (``position_after_frame(last_seq)``).

Bounds, and what happens at them:
* written messages the client is known to have (``release_through``: its ``playback`` marks
  prove it received them) are dropped at once, so a client that sends marks keeps about
  ``max_lead_ms`` of audio here instead of ``max_bytes``;
* written messages are dropped oldest first to stay under ``max_bytes``;
* if the messages *not yet written* alone exceed ``max_bytes`` (a client that stopped
  reading, or a detached session whose client never comes back), ``append`` returns False
  and the caller ends the session (``slow_consumer``).
"""

from __future__ import annotations

import struct
from collections import deque

_SEQ = struct.Struct("<I")
_SEQ_OFFSET = 8  # see codec.FRAME_HEADER


class Outbox:
    def __init__(self, max_bytes: int = 1024 * 1024) -> None:
        self.max_bytes = max_bytes
        self._items: deque[str | bytes] = deque()
        self._sizes: deque[int] = deque()
        self._start = 0  # absolute position of _items[0]
        self._bytes = 0
        self.cursor = 0
        """Position of the next message to write (owned by the writer)."""
        self._replay_end = 0  # ``rewind``: messages before this are a replay...
        self._replay_bytes = 0  # ...of which these bytes are not written yet
        self._released: tuple[int, int] | None = None
        """(seq, position after it) of the last frame dropped by ``release_through``."""

    @property
    def start(self) -> int:
        return self._start

    @property
    def end(self) -> int:
        return self._start + len(self._items)

    @property
    def pending(self) -> int:
        """Messages appended but not yet written."""
        return self.end - self.cursor

    @property
    def nbytes(self) -> int:
        return self._bytes

    def append(self, item: str | bytes) -> bool:
        """Queue ``item``. False when the unwritten backlog exceeds ``max_bytes``."""
        size = _size(item)
        self._items.append(item)
        self._sizes.append(size)
        self._bytes += size
        self._trim()
        return self._within()

    def extend(self, items: list[bytes]) -> bool:
        """``append`` each of ``items``, in order (the same bound, checked once)."""
        sizes = [len(item) for item in items]
        self._items.extend(items)
        self._sizes.extend(sizes)
        self._bytes += sum(sizes)
        self._trim()
        return self._within()

    def rewind(self, position: int) -> list[bytes]:
        """Write again from ``position`` (a resume): the writer's cursor goes back there.
        The messages replayed do not count against ``max_bytes`` until written: they were
        within it when first sent, and a resumed client must not be closed as a slow
        consumer for the replay it asked for plus the output that follows it. Returns the
        binary frames replayed."""
        first = position - self._start
        self.cursor = position
        self._replay_end = self.end
        self._replay_bytes = sum(self._sizes[i] for i in range(first, len(self._items)))
        return [item for i in range(first, len(self._items))
                if isinstance(item := self._items[i], bytes)]

    def _within(self) -> bool:
        return self._bytes - self._replay_bytes <= self.max_bytes

    def _trim(self) -> None:
        """Drop written messages, oldest first, while over ``max_bytes`` (a replay aside)."""
        while not self._within() and self._start < self.cursor:
            self._bytes -= self._sizes.popleft()
            self._items.popleft()
            self._start += 1

    def get(self, position: int) -> str | bytes:
        return self._items[position - self._start]

    def take(self, limit: int | None = None) -> list[str | bytes]:
        """The messages from the cursor on (at most ``limit``), for the writer; the cursor
        moves past them."""
        items, first = self._items, self.cursor - self._start
        last = len(items) if limit is None else min(len(items), first + limit)
        self.cursor = self._start + last
        if self._replay_bytes:
            sizes = self._sizes
            upto = min(last, self._replay_end - self._start)
            self._replay_bytes -= sum(sizes[i] for i in range(first, upto))
        return [items[offset] for offset in range(first, last)]

    def release_through(self, seq: int) -> int:
        """The client has every message up to and including frame ``seq``: drop them (only
        written ones, and only when that frame is still here). Returns how many went."""
        for offset in range(min(len(self._items), self.cursor - self._start)):
            if _frame_seq(self._items[offset]) == seq:
                for _ in range(offset + 1):
                    self._bytes -= self._sizes.popleft()
                    self._items.popleft()
                self._start += offset + 1
                self._released = (seq, self._start)
                return offset + 1
        return 0

    def position_after_frame(self, seq: int | None) -> int | None:
        """Where to resume for a client whose last received frame is ``seq`` (None: it
        received no frame): the position right after that frame, or None when the buffer
        no longer reaches back that far."""
        if seq is None:
            return 0 if self._start == 0 else None
        for offset in range(len(self._items) - 1, -1, -1):
            if _frame_seq(self._items[offset]) == seq:
                return self._start + offset + 1
        if self._released is not None and self._released[0] == seq \
                and self._released[1] == self._start:
            return self._start  # the frame itself was released: everything after it is here
        return None


def _size(item: str | bytes) -> int:
    """Bytes ``item`` takes on the wire: an event's UTF-8, not its characters (a Chinese
    character is three bytes). ``isascii`` is a flag lookup, so ASCII costs no encode."""
    if isinstance(item, bytes) or item.isascii():
        return len(item)
    return len(item.encode())


def _frame_seq(item: str | bytes) -> int | None:
    """The seq of an audio frame (None for an event). Every binary message is a frame
    with its whole header (``codec.frame_header``; a turn's closing frame is the header
    alone)."""
    if isinstance(item, bytes):
        return _SEQ.unpack_from(item, _SEQ_OFFSET)[0]
    return None
