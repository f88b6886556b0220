"""The audio formats of HTTP speech (OpenAI's ``response_format``), and an encoder that turns
the engines' PCM16 24 kHz mono chunks into the bytes of one file of that format, a chunk at
a time.

======  ==============  ===========================================  ====================
format  media type      what it is                                   bytes per audio s
======  ==============  ===========================================  ====================
pcm     ``audio/pcm``   raw PCM16 little-endian samples              48,000
wav     ``audio/wav``   the same in a RIFF/WAVE file                 48,000
mp3     ``audio/mpeg``  MPEG-2 Layer III (LAME), 64 kbit/s CBR       8,000
opus    ``audio/opus``  Opus (libopus) in Ogg, 32 kbit/s             3,900; 4,600 streamed
aac     ``audio/aac``   AAC-LC (FFmpeg's) in ADTS frames, 64 kbit/s  8,800
flac    ``audio/flac``  FLAC, lossless                               24,000 (espeak)
======  ==============  ===========================================  ====================

Every format keeps the engines' 24 kHz mono: each codec here takes 24 kHz as it is, so
nothing is resampled (Opus decoders play it at 48 kHz, as they play every Opus stream; the
Ogg header records 24 kHz as the input rate).

``Encoder`` is sans-I/O: PCM in (``encode``), bytes out, ``finish`` ends the file. Two
shapes of output:

* **streamed**: ``encode`` returns what the muxer has written so far, so each engine chunk
  becomes bytes at once (what a codec holds back to fill its frame comes with a later chunk).
  The output is append-only, so a header that must give the length says it is unknown
  (WAV: 0xFFFFFFFF; FLAC: 0 samples) or is left out (MP3's Xing/LAME frame, which also tells
  a decoder how much of the first and last frames is padding);
* **whole**: the file is written to ``out``, a seekable binary file the caller gives (the
  HTTP port's ``gateway.io.spool.Spool``, which goes to disk past 1 MiB), its headers
  rewritten with the real lengths by ``finish``, as a file saved to disk should be; without
  ``out``, to memory, and ``finish`` returns it.

The compressed formats are FFmpeg's encoders and muxers through PyAV (libmp3lame, libopus,
its native aac and flac), imported on first use (``import av`` takes ~40 ms and ~20 MB: a
gateway that never encodes does not pay it; ``gateway.io.http_api`` imports it off the
event loop).

Each of these codecs takes frames of exactly its ``frame_size`` (576 samples for MP3 at
24 kHz, 480 Opus, 1024 AAC, 2304 FLAC), but for the last, which each takes short as it is.
The encoder cuts the chunks into such frames itself (PyAV's ``AudioFifo`` holds the rest for
the next chunk; ``finish`` sends it as the short last frame) and sends them to the codec
with PyAV's ``_send_frame_and_recv``, not through ``AudioCodecContext.encode``: that one
pushes every frame for a codec with a fixed frame size through an ``AudioResampler`` that
re-cuts it (even one already cut), whose FFmpeg filter graph starts a pool of threads (one
per core) per encoder, kept until the codec is freed: 200 threads for 100 MP3 streams on
2 cores (PyAV issue #1468; nothing public sets that graph's thread count or makes it a
passthrough). The same frames reach the codec either way: the same bytes, without threads.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from engines.base import OUTPUT_RATE

if TYPE_CHECKING:
    from av.audio.fifo import AudioFifo
    from av.audio.frame import AudioFrame
    from av.audio.stream import AudioStream
    from av.container import OutputContainer
    from av.packet import Packet


@dataclass(frozen=True, slots=True)
class AudioFormat:
    """One ``response_format``: its media type and, for the compressed ones, what FFmpeg
    writes it with."""

    name: str
    media_type: str
    container: str | None = None
    """FFmpeg's muxer; None: PCM or WAV, written here without PyAV."""
    codec: str | None = None
    sample_format: str = "s16"
    """The sample layout the codec takes (``fltp``: planar float, AAC)."""
    bit_rate: int | None = None
    muxer_options: tuple[tuple[str, str], ...] = ()
    stream_options: tuple[tuple[str, str], ...] = ()
    """Muxer options added when streamed."""
    empty_needs_a_sample: bool = False
    """Whether a file with no audio at all is unreadable (no frame, or an Ogg stream with no
    audio page): an empty answer then holds one sample of silence (see ``Encoder.finish``)."""


FORMATS: dict[str, AudioFormat] = {f.name: f for f in (
    AudioFormat("pcm", "audio/pcm"),
    AudioFormat("wav", "audio/wav"),
    # no ID3v2 tag (FFmpeg writes one by default): a stream starts with an MPEG frame, as
    # players of MP3 streams expect
    AudioFormat("mp3", "audio/mpeg", "mp3", "libmp3lame", "s16p", 64_000,
                muxer_options=(("id3v2_version", "0"),), empty_needs_a_sample=True),
    # Ogg's muxer holds packets until a page has 1 s of audio; streamed, a page every 40 ms
    # (two Opus packets), so each 80 ms engine chunk goes out with the chunk (the page
    # headers cost ~5 kbit/s more than 1 s pages)
    AudioFormat("opus", "audio/opus", "ogg", "libopus", "s16", 32_000,
                stream_options=(("page_duration", "40000"),), empty_needs_a_sample=True),
    AudioFormat("aac", "audio/aac", "adts", "aac", "fltp", 64_000, empty_needs_a_sample=True),
    # no 8 KiB PADDING block (FFmpeg's default, room for tags written later)
    AudioFormat("flac", "audio/flac", "flac", "flac", "s16",
                muxer_options=(("metadata_header_padding", "0"),)),
)}
"""Every ``response_format`` HTTP speech serves, in OpenAI's order after the two PCM ones."""


def wav_header(data_bytes: int | None) -> bytes:
    """The 44-byte header of a PCM16 mono 24 kHz WAV holding ``data_bytes`` of samples;
    None: a stream whose length is not known yet, whose RIFF and data sizes say 0xFFFFFFFF,
    which readers take as "until the end" (Python's ``wave``, ffmpeg, browsers)."""
    riff, data = (0xFFFFFFFF, 0xFFFFFFFF) if data_bytes is None else \
        (36 + data_bytes, data_bytes)
    return (struct.pack("<4sI4s4sIHHIIHH4sI", b"RIFF", riff, b"WAVE", b"fmt ", 16, 1, 1,
                        OUTPUT_RATE, OUTPUT_RATE * 2, 2, 16, b"data", data))


WAV_STREAM_HEADER = wav_header(None)


class WholeOutput(Protocol):
    """Where a whole file is written: a seekable binary file (``io.BytesIO``,
    ``gateway.io.spool.Spool``); PyAV's muxers use these three."""

    def write(self, data: bytes, /) -> int: ...
    def seek(self, offset: int, whence: int = 0, /) -> int: ...
    def tell(self) -> int: ...


class _Appended:
    """A write-only file for PyAV: no ``seek``, so FFmpeg writes strictly in order and
    never goes back to a header (the bytes already went to the client)."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> int:
        self.data += data
        return len(data)

    def take(self) -> bytes:
        out = bytes(self.data)
        self.data.clear()
        return out


class Encoder:
    """PCM16 24 kHz mono chunks in, the bytes of one file of ``fmt`` out, in order.

    ``encode(pcm)`` returns the bytes now ready (streamed; always ``b""`` for a whole file);
    ``finish()`` flushes the codec and returns the rest (for a whole file: nothing, the file
    being in ``out``, or the whole file when no ``out`` was given);
    ``close()`` frees an encoder that will not be finished. Not thread-safe: one call at a
    time, from any one thread at a time (``gateway.io.http_api`` runs the compressed ones on
    a worker thread). ``samples`` counts the samples fed.
    """

    def __init__(self, fmt: str, *, streamed: bool, out: WholeOutput | None = None) -> None:
        """``out``: where a whole file is written (a seekable binary file, empty, left open:
        the caller closes it); None: an ``io.BytesIO`` of its own, which ``finish`` returns.
        Unused when ``streamed``."""
        self.format = FORMATS[fmt]
        self.streamed = streamed
        self.samples = 0
        self._whole: WholeOutput | None = None if streamed else out
        self._returns_whole = out is None and not streamed
        if self._returns_whole:
            self._whole = io.BytesIO()
        self._header_sent = False
        if fmt == "wav" and self._whole is not None:  # its header, filled in by finish()
            self._whole.write(bytes(len(WAV_STREAM_HEADER)))
        self._container: OutputContainer | None = None
        self._stream: AudioStream | None = None
        self._out: _Appended | WholeOutput | None = None
        self._frame_size = 0
        self._fifo: AudioFifo | None = None
        """The samples fed since the last whole frame went to the codec."""
        self._send: Callable[[Any], Iterable[Packet]] | None = None
        if self.format.container is not None:
            self._open()

    def _open(self) -> None:
        import av
        from av.audio.stream import AudioStream

        spec = self.format
        assert spec.container is not None and spec.codec is not None
        self._out = _Appended() if self._whole is None else self._whole
        options = dict(spec.muxer_options + (spec.stream_options if self.streamed else ()))
        self._container = av.open(self._out, "w", format=spec.container, options=options)
        stream = self._container.add_stream(spec.codec, rate=OUTPUT_RATE, layout="mono")
        assert isinstance(stream, AudioStream)
        stream.format = spec.sample_format
        if spec.bit_rate is not None:
            stream.bit_rate = spec.bit_rate
        self._stream = stream
        # the header now (Ogg's OpusHead/OpusTags pages, FLAC's STREAMINFO): ready before
        # any audio, and written even if none comes; this opens the codec too
        self._container.start_encoding()
        context = stream.codec_context
        self._frame_size = context.frame_size
        self._fifo = av.AudioFifo()
        # avcodec_send_frame and the packets it gives, without encode()'s resampler (see
        # the module's docstring); not public PyAV, so a PyAV without it encodes through
        # encode(): the same bytes, with the resampler's threads
        self._send = getattr(context, "_send_frame_and_recv", None)

    def encode(self, pcm: bytes) -> bytes:
        """The bytes ready after ``pcm`` (whole samples), in order after those before."""
        self.samples += len(pcm) // 2
        spec = self.format
        if spec.container is None:
            if self._whole is not None:
                self._whole.write(pcm)
                return b""
            if spec.name == "wav" and not self._header_sent:
                self._header_sent = True
                return WAV_STREAM_HEADER + pcm
            return pcm
        if pcm:
            self._mux(np.frombuffer(pcm, dtype="<i2"))
        return self._take()

    def finish(self) -> bytes:
        """End the file: the codec's last frames and the trailer (streamed), or the whole
        file (not streamed). An empty answer is a valid file: WAV and FLAC headers say 0
        samples; MP3, AAC and Ogg Opus cannot hold nothing (FFmpeg refuses to read a file
        without an audio frame), so they hold one sample of silence. Decoders give that
        back as nothing (Ogg Opus), 2 ms (a whole MP3: its LAME frame says what is padding)
        or a frame or two of silence (a streamed MP3 72 ms, AAC 85 ms)."""
        spec = self.format
        if spec.container is None:
            if self.streamed:
                if spec.name == "wav" and not self._header_sent:
                    self._header_sent = True
                    return WAV_STREAM_HEADER
                return b""
            # the samples where they were written, the header filled in ahead of them
            assert self._whole is not None
            if spec.name == "wav":
                end = self._whole.tell()
                self._whole.seek(0)
                self._whole.write(wav_header(end - len(WAV_STREAM_HEADER)))
                self._whole.seek(end)
            return self._whole_file()
        assert self._container is not None and self._stream is not None
        if self.samples == 0 and spec.empty_needs_a_sample:
            self._mux(np.zeros(1, dtype="<i2"))
        assert self._fifo is not None
        if (last := self._fifo.read()) is not None:  # what is left: the short last frame
            self._send_frame(last)
        self._send_frame(None)
        self._container.close()
        if self._whole is not None:
            return self._whole_file()
        return self._take()

    def close(self) -> None:
        """Free the codec and muxer without finishing the file (idempotent). Dropped too,
        not only closed: were PyAV's ``encode`` used (a PyAV without the send used here),
        its resampler would keep a pool of threads (one per core) until its codec context
        is freed."""
        if self._container is not None:
            self._container.close()
        self._container = self._stream = self._out = self._send = self._fifo = None

    def _mux(self, samples: np.ndarray[Any, np.dtype[np.int16]]) -> None:
        """Encode ``samples`` (the next ones) in whole frames of the codec's size; the rest
        waits in the FIFO for the next call."""
        import av

        assert self._fifo is not None and self._stream is not None
        spec = self.format
        planes: np.ndarray[Any, Any] = samples.reshape(1, -1)
        if spec.sample_format == "fltp":
            planes = planes.astype(np.float32) / 32768.0
        frame = av.AudioFrame.from_ndarray(planes, format=spec.sample_format, layout="mono")
        frame.sample_rate = OUTPUT_RATE
        frame.time_base = self._stream.codec_context.time_base  # 1/24000: pts in samples
        frame.pts = self._fifo.samples_written  # (an empty answer's sample: 0)
        self._fifo.write(frame)
        for whole in self._fifo.read_many(self._frame_size):
            self._send_frame(whole)

    def _send_frame(self, frame: AudioFrame | None) -> None:
        """Send ``frame`` to the codec (None: flush it) and mux the packets it gives."""
        assert self._container is not None and self._stream is not None
        stream = self._stream
        if self._send is None:
            self._container.mux(stream.encode(frame))
            return
        # what encode() does around the send (the frames are in the codec's time base
        # already): the packets in that time base, marked as the stream's
        time_base = stream.codec_context.time_base
        for packet in self._send(frame):
            packet.time_base = time_base
            packet.stream = stream
            self._container.mux_one(packet)

    def _whole_file(self) -> bytes:
        """A whole file's ``finish``: the file, when it is the encoder's own (a copy: only
        where no ``out`` was given, not on the HTTP port), else nothing."""
        if self._returns_whole:
            assert isinstance(self._whole, io.BytesIO)
            return self._whole.getvalue()
        return b""

    def _take(self) -> bytes:
        return self._out.take() if isinstance(self._out, _Appended) else b""
