"""Where a whole-file speech answer (``"stream": false``) is held from its first byte until
its last is sent: in memory up to ``SPOOL_MEMORY_BYTES``, in a temporary file past that.

A whole answer can be a hundred MB (a 4 KB input of "a\n" × 2,000 at speed 0.25 is 3,096 s
of espeak audio: a 149 MB WAV, a 25 MB MP3) and the HTTP port serves up to ``[server]
max_speech_requests`` at once: held in RAM, 8 such WAVs at once took the gateway's RSS to
1,197 MiB, 32 to 4,620 MiB (spooled: 78 and 111 MiB; ``bench/whole_speech_memory.py``).
Spooled, each holds at most
``SPOOL_MEMORY_BYTES`` of its own (the file is in the OS's page cache, which the OS may
drop or write out under pressure, not in the process).

The file is ``tempfile.TemporaryFile``'s: in the platform's temporary directory (``TMPDIR``,
else ``/tmp``), removed from the directory as soon as it is made, so its disk space is
given back when it is closed, or when the process ends however it ends. A directory where
no file can be made (missing, not writable, full) does not fail the answer: it stays in
memory, with one WARNING line per answer. The file is buffered ``WRITE_BYTES`` at a time
(the writes come as 4-15 KB PCM chunks, or PyAV's 32 KiB blocks), and ``flush()`` sends the
rest: the encoder's last call, so that a disk that fills up fails the answer there
(``gateway.io.http_api.Encoding``), not while it is sent.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
from typing import IO

log = logging.getLogger(__name__)

SPOOL_MEMORY_BYTES = 1 << 20
"""How much of one answer stays in memory before it goes to a temporary file: 1 MiB is
21 s of PCM (or WAV), 2 min of MP3, so most answers (a sentence or a paragraph) never touch
the disk, while 64 answers at once hold at most 64 MiB of their files in the process."""
WRITE_BYTES = 64 * 1024
"""The temporary file's buffer, so that it is written this much at a time: a 149 MB WAV
written in its 3,840-byte chunks (80 ms) took 0.18 s of the event loop in 39,000 system
calls, gathered to 64 KiB 0.07 s (appending them to a bytearray in memory, as before the
spool: 0.06 s). Gathered by hand or by this buffer: 0.053 against 0.052 s (38,800 writes of
3,840 bytes, best of three, in one run)."""


class Spool:
    """A seekable binary file written once (by an ``Encoder``, or PyAV's muxer through it),
    then read back a slice at a time (``read_at``). In memory until it grows past
    ``memory_bytes``, then in a temporary file. ``close()`` frees it (idempotent); it is
    then gone from memory and disk.

    Not thread-safe for writes; ``read_at`` moves no file position, so reading once the
    writing is over may happen on any thread."""

    def __init__(self, memory_bytes: int | None = None) -> None:
        """``memory_bytes``: None, ``SPOOL_MEMORY_BYTES`` (read at each spool's making)."""
        self._file: IO[bytes] = io.BytesIO()
        self._limit: int | None = SPOOL_MEMORY_BYTES if memory_bytes is None else memory_bytes
        self.on_disk = False
        """Whether it went to a temporary file."""

    # the file PyAV and the encoder write to
    def write(self, data: bytes | memoryview) -> int:
        self._file.write(data)
        if self._limit is not None and self._file.tell() > self._limit:
            self._roll()
        return len(data)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def flush(self) -> None:
        """Send what is buffered to the file; raises what the disk says (``OSError``)."""
        self._file.flush()

    @property
    def closed(self) -> bool:
        return self._file.closed

    # reading it back
    def size(self) -> int:
        """Its length in bytes (the furthest byte written)."""
        if isinstance(self._file, io.BytesIO):
            return self._file.getbuffer().nbytes
        self.flush()
        return os.fstat(self._file.fileno()).st_size

    def read_at(self, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes from ``offset`` (fewer only at the end)."""
        if isinstance(self._file, io.BytesIO):
            with self._file.getbuffer() as buffer:
                return bytes(buffer[offset : offset + size])
        self.flush()
        return os.pread(self._file.fileno(), size, offset)

    def close(self) -> None:
        with contextlib.suppress(OSError):  # (what a full disk left in the buffer: dropped)
            self._file.close()

    def _roll(self) -> None:
        """Move what is held to a temporary file, where the rest goes too."""
        self._limit = None  # (once, whatever happens)
        memory = self._file
        assert isinstance(memory, io.BytesIO)
        disk: IO[bytes] | None = None
        try:
            disk = tempfile.TemporaryFile(buffering=WRITE_BYTES)
            with memory.getbuffer() as held:
                disk.write(held)
            disk.seek(memory.tell())
        except OSError as exc:
            if disk is not None:
                disk.close()
            log.warning(
                "a whole speech answer stays in memory past %d bytes: no temporary "
                "file could be written in %s (%s: %s)",
                memory.tell(),
                tempfile.gettempdir(),
                type(exc).__name__,
                exc,
            )
            return
        self._file = disk
        self.on_disk = True
        memory.close()

