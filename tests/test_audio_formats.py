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
import struct
import threading
import wave

import av
import numpy as np
import pytest
from hypothesis import example, given, settings
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


@settings(max_examples=25)
@given(fmt=st.sampled_from(sorted(FORMATS)), streamed=st.booleans(),
       sizes=st.lists(st.integers(0, 5000), max_size=12))
@example(fmt="mp3", streamed=False, sizes=[RATE // 2])  # the last chunk empty: the end
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


def test_a_wav_header_says_what_strict_readers_check():
    """Python's ``wave`` reads neither the RIFF size nor the byte rate and block align;
    players that seek or show a duration do (the byte rate is what one second takes). A
    stream's header says "length unknown" in both sizes (0xFFFFFFFF), as readers expect."""
    whole = encode("wav", cut(PCM, [100]), streamed=False)
    streamed = encode("wav", [PCM], streamed=True)
    for data, riff, size in ((whole, len(whole) - 8, len(PCM)),
                             (streamed, 0xFFFFFFFF, 0xFFFFFFFF)):
        fields = struct.unpack("<4sI4s4sIHHIIHH4sI", data[:44])
        assert fields == (b"RIFF", riff, b"WAVE", b"fmt ", 16, 1, 1, RATE, RATE * 2, 2, 16,
                          b"data", size)


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac"])
def test_each_format_decodes_to_the_tone_at_its_loudness(fmt):
    """The tone comes back at its level (AAC takes floats: PCM16 scaled to [-1, 1)); the
    lossy codecs lose a little to their priming silence, FLAC nothing."""
    with av.open(io.BytesIO(encode(fmt, [PCM], streamed=False))) as container:
        heard = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(audio=0)])
    if heard.dtype.kind == "f":
        heard = heard * 32768.0
    rms = float(np.sqrt(np.mean(heard.astype(np.float64) ** 2)))
    sent = float(np.sqrt(np.mean(np.frombuffer(PCM, "<i2").astype(np.float64) ** 2)))
    assert 0.9 * sent <= rms <= 1.02 * sent


def test_a_whole_file_has_the_headers_of_a_saved_file():
    """A whole answer is a file to save: FLAC's STREAMINFO gives its length (a stream's
    says 0, unknown), and Ogg Opus keeps its 1 s pages (a stream's come every 40 ms, which
    costs ~5 kbit/s more)."""
    for streamed, frames in ((False, len(PCM) // 2), (True, None)):
        data = encode("flac", [PCM], streamed=streamed)
        with av.open(io.BytesIO(data)) as container:
            assert container.streams.audio[0].duration == frames
    whole, streamed_opus = (encode("opus", [PCM], streamed=s) for s in (False, True))
    assert whole.count(b"OggS") == 3  # the two header pages, then 0.5 s in one page
    assert streamed_opus.count(b"OggS") > 10 and len(whole) < len(streamed_opus)


def test_a_closed_encoder_frees_what_it_held_without_finishing():
    encoder = Encoder("opus", streamed=True)
    assert encoder.encode(PCM[:3840]).startswith(b"OggS")  # the header pages, then audio
    encoder.close()
    encoder.close()
    for fmt in ("pcm", "wav"):  # a client gone mid-answer: nothing to free, nothing fails
        Encoder(fmt, streamed=True).close()


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac"])
def test_an_answer_with_no_audio_is_a_file_a_decoder_reads(fmt, streamed):
    """Nothing to say (an emoji-only input) still answers a file of the format asked:
    MP3, AAC and Ogg Opus then hold one sample of silence (FFmpeg reads none of them
    without an audio frame), FLAC its header alone."""
    demuxer = {"mp3": "mp3", "opus": "ogg", "aac": "aac", "flac": "flac"}[fmt]
    with av.open(io.BytesIO(encode(fmt, [], streamed=streamed)), format=demuxer) as c:
        heard = [f.to_ndarray() for f in c.decode(audio=0)]
    assert not any(np.any(f) for f in heard)  # silence only
    assert bool(heard) == FORMATS[fmt].empty_needs_a_sample


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac"])
def test_without_pyavs_private_send_the_bytes_are_the_same(fmt):
    """A PyAV without ``_send_frame_and_recv`` encodes through ``encode()`` (the module's
    docstring): the same frames reach the codec, so the same file comes out."""
    fallback = Encoder(fmt, streamed=False)
    fallback._send = None
    via_encode = fallback.encode(PCM) + fallback.finish()
    direct = encode(fmt, [PCM], streamed=False)
    if fmt == "opus":
        assert packets(via_encode) == packets(direct)
    else:
        assert via_encode == direct


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
