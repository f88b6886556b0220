"""The speech encoder without a server: however an engine cuts its audio into chunks, the
file is the same bytes, and a stream is the whole file's audio.

Engines step at their own sizes (80 ms for HTTP speech, a whole sentence for chatterbox, an
upstream server's chunks for ``http``), and the encoder is fed each chunk as it comes: if a
chunk boundary changed the output (a frame cut short, an Ogg page closed early), the same
text would give a different file depending on the engine and the lane's step size.
"""

from __future__ import annotations

import io
import os
import threading
import wave

import av
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.audio_formats import FORMATS, WAV_STREAM_HEADER, Encoder

RATE = 24_000
PCM = (np.sin(2 * np.pi * 220 * np.arange(RATE // 2) / RATE) * 8000).astype("<i2").tobytes()
"""0.5 s of a 220 Hz tone."""


def encode(fmt: str, chunks: list[bytes], *, streamed: bool) -> bytes:
    encoder = Encoder(fmt, streamed=streamed)
    out = b"".join(encoder.encode(c) for c in chunks)
    return out + encoder.finish()


def cut(pcm: bytes, sizes: list[int]) -> list[bytes]:
    """``pcm`` cut after each of ``sizes`` samples (the rest in one last chunk)."""
    chunks, at = [], 0
    for n in sizes:
        chunks.append(pcm[at:at + 2 * n])
        at += 2 * n
    return [*chunks, pcm[at:]]


@settings(max_examples=25, deadline=None)
@given(fmt=st.sampled_from(sorted(FORMATS)), streamed=st.booleans(),
       sizes=st.lists(st.integers(0, 5000), max_size=12))
def test_chunk_boundaries_do_not_change_the_file(fmt, streamed, sizes):
    chunked = encode(fmt, cut(PCM, sizes), streamed=streamed)
    whole = encode(fmt, [PCM], streamed=streamed)
    if fmt == "opus":  # each Ogg stream has a random serial number: compare what it holds
        assert packets(chunked) == packets(whole)
    else:
        assert chunked == whole


def packets(data: bytes) -> list[bytes]:
    with av.open(io.BytesIO(data)) as container:
        return [bytes(p) for p in container.demux(audio=0) if p.size]


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac"])
def test_streamed_bytes_come_with_the_chunks_and_decode_like_the_whole_file(fmt):
    encoder = Encoder(fmt, streamed=True)
    parts = [encoder.encode(c) for c in cut(PCM, [1920] * 6)]  # 80 ms chunks
    streamed = b"".join(parts) + encoder.finish()
    # bytes leave with the chunks, not all at the end (the first may wait for a whole frame)
    assert sum(1 for p in parts if p) >= len(parts) - 2
    whole = encode(fmt, [PCM], streamed=False)
    with av.open(io.BytesIO(streamed)) as a, av.open(io.BytesIO(whole)) as b:
        assert a.format.name == b.format.name == {"mp3": "mp3", "opus": "ogg", "aac": "aac",
                                                  "flac": "flac"}[fmt]
        heard = [sum(f.samples for f in c.decode(audio=0)) for c in (a, b)]
    assert heard[0] >= heard[1] > 0  # (a stream's MP3 keeps its delay; see test_http_formats)


def test_pcm_and_wav_are_the_samples_themselves():
    assert encode("pcm", cut(PCM, [100]), streamed=True) == PCM
    assert encode("pcm", cut(PCM, [100]), streamed=False) == PCM
    assert encode("wav", cut(PCM, [100]), streamed=True) == WAV_STREAM_HEADER + PCM
    whole = encode("wav", cut(PCM, [100]), streamed=False)
    with wave.open(io.BytesIO(whole)) as w:  # the header's lengths are the real ones
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 24_000)
        assert w.getnframes() == len(PCM) // 2 and w.readframes(w.getnframes()) == PCM
    assert len(whole) == 44 + len(PCM)
    with wave.open(io.BytesIO(encode("wav", [], streamed=False))) as w:
        assert w.getnframes() == 0
    assert encode("wav", [], streamed=True) == WAV_STREAM_HEADER


def test_a_closed_encoder_frees_what_it_held_without_finishing():
    encoder = Encoder("opus", streamed=True)
    assert encoder.encode(PCM[:3840]).startswith(b"OggS")  # the header pages, then audio
    encoder.close()
    encoder.close()


def native_threads() -> set[int]:
    """The ids of this process's OS threads that Python did not start (FFmpeg's)."""
    return ({int(tid) for tid in os.listdir("/proc/self/task")}
            - {t.native_id for t in threading.enumerate()})


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"),
                    reason="counts the process's OS threads in /proc/self/task (Linux)")
def test_a_live_encoder_starts_no_threads():
    """PyAV's ``encode`` pushed each frame through a resampler whose FFmpeg filter graph
    kept a pool of threads (one per core, on more than one) for as long as the encoder
    lived: 200 for 100 MP3 streams on 2 cores. Python's own threads (pytest's timeout timer)
    are left out of the count, so nothing else running here can fail it."""
    before = native_threads()
    encoders = [Encoder(fmt, streamed=streamed) for fmt in ("mp3", "opus", "aac", "flac")
                for streamed in (True, False)]
    for encoder in encoders:
        encoder.encode(PCM[:2 * 5000])  # a few frames of each codec, and some left over
    assert native_threads() - before == set()
    for encoder in encoders:
        encoder.finish()
    assert native_threads() - before == set()
