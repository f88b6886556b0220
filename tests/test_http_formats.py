"""HTTP speech in OpenAI's compressed formats (mp3, opus, aac, flac) against the real gateway
on 127.0.0.1:0, with the official ``openai`` client; every answer is decoded back with PyAV.

Durations are compared in samples with the PCM answer for the same input (what the engine
made), with each codec's own padding as the only slack (measured over 1-100,000 samples):

* FLAC is lossless, and Ogg Opus says in its header how much of the first packet is the
  encoder's look-ahead (pre-skip) and in its last page where the audio ends: both decode
  to the engine's length exactly;
* a whole MP3 file starts with a LAME/Xing frame that says the same, to within 47 samples
  (2 ms; 0 to 47 more);
* a streamed MP3 has no such frame (it is written once the audio is known, at the start of
  the file): a decoder plays the encoder's delay (1152 samples, two MPEG-2 frames) and the
  padding of the last frame (< 576) as sound;
* AAC in ADTS has nowhere to say it either: 1024 samples of priming before the audio and
  < 1024 of padding after it.

Steps are ordered by awaiting events, never by sleeping.
"""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass

import av
import httpx
import numpy as np
import openai
import pytest

from engines.synthetic import SyntheticEngine
from gateway.core.audio_formats import Encoder
from gateway.io import http_api
from tests.hang_guard import HANG_S, unless_hung
from tests.test_http_api import (
    FailingEngine,
    HeldEngine,
    base,
    first_bytes_while_held,
    is_speech,
)

TEXT = "The build finished at nine. Two tests failed, both in the parser."
MS = 24  # samples per millisecond at 24 kHz

CODECS = {"mp3": ("mp3", "mp3"), "opus": ("ogg", "opus"), "aac": ("aac", "aac"),
          "flac": ("flac", "flac")}
"""format → (FFmpeg's demuxer, codec) that must read it."""
CODEC_NAMES = {av.codec.Codec(name, "r").id: name for name in ("mp3", "opus", "aac", "flac")}
"""A decoder's codec by its FFmpeg name, whichever decoder reads it (FFmpeg's for MP3 is
"mp3float"): ``Codec.canonical_name`` says it from PyAV 14.2 on, and av>=12 is allowed."""
MEDIA_TYPES = {"mp3": "audio/mpeg", "opus": "audio/opus", "aac": "audio/aac",
               "flac": "audio/flac"}


def padding(fmt: str, streamed: bool) -> tuple[int, int]:
    """How many samples a decoder may give back beyond the engine's (see the module doc)."""
    if fmt == "aac":
        return 1024, 1024 + 1023
    if fmt == "mp3":
        return (1152, 1152 + 575) if streamed else (0, 47)
    return 0, 0


@dataclass
class Decoded:
    container: str
    codec: str
    rate: int
    """The rate the decoder gives (Opus decoders always give 48 kHz)."""
    input_rate: int
    """The encoder's input rate: ``rate``, or what the Ogg Opus header says."""
    samples: np.ndarray
    """Mono, at ``rate``, scaled like PCM16."""

    @property
    def samples_24k(self) -> int:
        return round(len(self.samples) * 24_000 / self.rate)


def decode(data: bytes, demuxer: str | None = None) -> Decoded:
    """``demuxer``: FFmpeg's, as a client that read the Content-Type would pick it (a file
    of one or two frames is too short for FFmpeg to recognise on its own)."""
    with av.open(io.BytesIO(data), format=demuxer) as container:
        stream = container.streams.audio[0]
        planes = [frame.to_ndarray() for frame in container.decode(stream)]
        ctx = stream.codec_context
        rate = ctx.sample_rate
        input_rate = rate
        extradata = ctx.extradata or b""
        if extradata.startswith(b"OpusHead"):  # RFC 7845: the input rate at bytes 12-15
            input_rate = int.from_bytes(extradata[12:16], "little")
        name = container.format.name
    samples = np.concatenate([p.reshape(-1) for p in planes]) if planes else np.zeros(0)
    if samples.dtype.kind == "f":
        samples = samples * 32768.0
    codec = CODEC_NAMES.get(ctx.codec.id, ctx.codec.name)
    return Decoded(name, codec, rate, input_rate, samples.astype(np.float64))


async def pcm_answer(client: openai.AsyncOpenAI, text: str) -> int:
    """Samples the engine makes for ``text``: the raw PCM answer."""
    pcm = await client.audio.speech.create(model="espeak", voice="en-us", input=text,
                                           response_format="pcm", extra_body={"stream": False})
    return len(pcm.content) // 2


# ---- the official client, every format, streamed and whole ---------------------------------


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac"])
async def test_openai_sdk_gets_each_format_streamed_and_whole(start_gateway, fmt):
    gw = await start_gateway()
    client = openai.AsyncOpenAI(base_url=base(gw) + "/v1", api_key="not-needed")
    try:
        expected = await pcm_answer(client, TEXT)
        async with client.audio.speech.with_streaming_response.create(
                model="tts-1", voice="alloy", input=TEXT, response_format=fmt) as response:
            assert response.headers["content-type"] == MEDIA_TYPES[fmt]
            assert response.headers["transfer-encoding"] == "chunked"
            streamed = b"".join([c async for c in response.iter_bytes()])
        whole = await client.audio.speech.with_raw_response.create(
            model="tts-1", voice="alloy", input=TEXT, response_format=fmt,
            extra_body={"stream": False})
    finally:
        await client.close()
    assert whole.headers["content-type"] == MEDIA_TYPES[fmt]
    content = whole.content
    assert int(whole.headers["content-length"]) == len(content)
    # X-Audio-Ms: what the engine made, as the PCM answer has it
    assert int(whole.headers["x-audio-ms"]) == round(expected / MS)
    # espeak gives the same samples for the same text on Linux, not everywhere
    slack = 0 if gw.engine.deterministic else round(0.02 * expected)
    for data, is_streamed in ((streamed, True), (content, False)):
        decoded = decode(data)
        assert (decoded.container, decoded.codec) == CODECS[fmt]
        assert decoded.input_rate == 24_000
        assert decoded.rate == (48_000 if fmt == "opus" else 24_000)
        low, high = padding(fmt, is_streamed)
        assert expected + low - slack <= decoded.samples_24k <= expected + high + slack, \
            (is_streamed, decoded.samples_24k - expected)
        assert is_speech(decoded.samples)
    # smaller than the PCM: FLAC about half, the lossy ones a sixth or less
    assert len(content) < expected * 2 * (0.7 if fmt == "flac" else 0.2)


async def test_the_first_mp3_bytes_come_before_the_synthesis_ends(start_gateway):
    # the engine holds its second step until the client has had bytes of the first
    engine = HeldEngine()
    gw = await start_gateway(engine=engine)
    first, rest = await first_bytes_while_held(gw, engine, "mp3")
    assert first[:2] == b"\xff\xf3"  # an MPEG-2 Layer III frame's sync word, no ID3 tag
    decoded = decode(first + rest)
    assert decoded.codec == "mp3" and len(decoded.samples) > 0


async def test_small_chunks_are_not_held_back_by_nagle(start_gateway):
    # a streamed mp3 goes out in chunks of a few hundred bytes: with Nagle's algorithm on, a
    # kept-alive connection held each one until the client's delayed ACK (40 ms on Linux);
    # the loop sets TCP_NODELAY only on sockets that say they are TCP
    import socket

    gw = await start_gateway()
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gw)) as client:
        response = await client.post("/v1/audio/speech", json={"input": "Hi.",
                                                              "response_format": "mp3"})
        assert response.status_code == 200
        (connection,) = gw.http._server.server_state.connections  # the kept-alive one
        sock = connection.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


# ---- what stays as it was: empty answers, refusals, disconnects, failures --------------------


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac"])
async def test_nothing_to_say_is_a_valid_file_with_no_speech(start_gateway, fmt, stream):
    gw = await start_gateway()
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gw)) as client:
        response = await client.post("/v1/audio/speech", json={
            "input": "\U0001F600", "response_format": fmt, "stream": stream})
    assert response.status_code == 200
    assert response.headers["x-speech-notes"].startswith("nothing was spoken")
    assert response.headers["content-type"] == MEDIA_TYPES[fmt]
    decoded = decode(response.content, CODECS[fmt][0])
    assert decoded.codec == CODECS[fmt][1]
    # one sample of silence and the codec's padding (see audio_formats.Encoder.finish)
    assert decoded.samples_24k <= 1 + padding(fmt, stream)[1]
    assert not np.any(np.abs(decoded.samples) > 1)


@pytest.mark.parametrize("fmt", ["ogg", "m4a", "MP3", "wma"])
async def test_formats_openai_does_not_have_are_refused_in_its_shape(start_gateway, fmt):
    gw = await start_gateway()
    client = openai.AsyncOpenAI(base_url=base(gw) + "/v1", api_key="not-needed")
    try:
        with pytest.raises(openai.BadRequestError) as info:
            await client.audio.speech.create(model="tts-1", voice="alloy", input=TEXT,
                                             response_format=fmt)  # type: ignore[arg-type]
    finally:
        await client.close()
    assert info.value.status_code == 400
    assert info.value.code == "unsupported_format" and info.value.param == "response_format"
    body = info.value.body
    assert isinstance(body, dict) and "mp3, opus, aac, flac" in body["message"]
    assert gw.lane.stats.steps == 0  # nothing reached the engine


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav"])
async def test_sse_stays_pcm(start_gateway, fmt):
    gw = await start_gateway()
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gw)) as client:
        response = await client.post("/v1/audio/speech", json={
            "input": "Hi.", "response_format": fmt, "stream_format": "sse"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "unsupported_format"


async def test_disconnect_mid_mp3_stream_cancels_the_job_and_frees_the_lane(start_gateway):
    gw = await start_gateway(engine=SyntheticEngine(rtf=1.0, ttfa_ms=0, step_ms=100))
    long = "This sentence goes on for a long while without stopping at all " * 8 + "."
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gw)) as client:
        async with client.stream("POST", "/v1/audio/speech",
                                 json={"input": long, "response_format": "mp3"}) as response:
            async for chunk in response.aiter_raw():
                assert chunk
                break
            assert gw.lane.queue_depth == 1
        await unless_hung(gw.http.idle.wait())
        assert gw.lane.queue_depth == 0 and gw.lane.stats.jobs_cancelled == 1
        health = (await client.get("/health")).json()
    assert health["http"]["speech_streams"] == 0


async def test_an_engine_failure_keeps_its_status_and_aborts_a_stream(start_gateway):
    gw = await start_gateway(engine=FailingEngine(rtf=0, ttfa_ms=0))
    body = {"input": "A sentence long enough for two steps of audio.", "response_format": "opus"}
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gw)) as client:
        whole = await client.post("/v1/audio/speech", json={**body, "stream": False})
        with pytest.raises(httpx.RemoteProtocolError):  # the 200 went out with the first bytes
            await client.post("/v1/audio/speech", json=body)
    assert whole.status_code == 502 and whole.json()["error"]["code"] == "engine_failed"


async def test_an_encoder_failure_is_a_server_error_said_once(start_gateway, monkeypatch,
                                                              caplog):
    caplog.set_level(logging.INFO)
    works = {"mp3": 1, "aac": 1, "flac": 0}
    """Chunks each format's broken encoder takes before it fails."""
    real_mux = Encoder._mux

    def broken(self, samples):  # a TEST DOUBLE of what PyAV does for the compressed formats
        self.muxed = getattr(self, "muxed", 0) + 1
        if self.muxed > works[self.format.name]:
            raise RuntimeError("a test double's broken codec")
        real_mux(self, samples)

    monkeypatch.setattr(Encoder, "_mux", broken)
    gw = await start_gateway()
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gw)) as client:
        whole = await client.post("/v1/audio/speech", json={
            "input": TEXT, "response_format": "mp3", "stream": False})
        # before the status (the first chunk is encoded first): an error status
        first = await client.post("/v1/audio/speech", json={"input": TEXT,
                                                              "response_format": "flac"})
        # after it: the stream is aborted
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post("/v1/audio/speech", json={"input": TEXT, "response_format": "aac"})
        wav = await client.post("/v1/audio/speech", json={"input": "Hi.", "response_format": "wav",
                                                           "stream": False})
    for response in (whole, first):
        assert response.status_code == 500
        assert response.json()["error"]["code"] == "encoder_failed"
        assert response.headers["x-engine"] == "espeak"
    assert wav.status_code == 200  # PCM and WAV never go through PyAV
    ended = [r.getMessage() for r in caplog.records if r.getMessage().startswith("speech f")]
    assert len(ended) == 3 and all(": encoder_failed: encoding " in line for line in ended)
    assert gw.metrics.errors["encoder_failed"] == 3
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_an_encoder_thread_that_cannot_start_leaves_no_synthesis_behind(
        start_gateway, monkeypatch):
    """The first compressed answer starts the encoder thread, after its synthesis had
    started: a process out of threads (``can't start new thread``) answered a plain-text 500
    and left the synthesis running for nobody, the stream counted open for ever."""

    def no_thread(name: str):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(http_api, "LaneThread", no_thread)
    gw = await start_gateway(engine=SyntheticEngine(rtf=1.0, ttfa_ms=0, step_ms=100))
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gw)) as client:
        response = await client.post("/v1/audio/speech", json={"input": TEXT,
                                                               "response_format": "mp3"})
    assert response.status_code == 500
    assert response.json()["error"] == {
        "message": "internal error: RuntimeError: can't start new thread",
        "type": "server_error", "param": None, "code": "internal_error"}
    assert not gw.http.streams and gw.lane.queue_depth == 0


async def test_a_speech_request_failed_by_a_bug_is_counted(start_gateway, monkeypatch):
    """A speech request that a bug (here a process out of threads) ends in a 500 was in no
    figure: neither ``gateway_http_speech_requests_total`` (which counts every speech
    request by how it ended) nor ``gateway_errors_total{code="internal_error"}`` (which the
    voice port's own bugs move) said anything happened."""
    from tests.test_http_api import metrics

    def no_thread(name: str):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(http_api, "LaneThread", no_thread)
    gw = await start_gateway()
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gw)) as client:
        response = await client.post("/v1/audio/speech", json={
            "input": TEXT, "response_format": "mp3", "stream": False})
        assert response.status_code == 500
        m = metrics((await client.get("/metrics")).text)
    assert m["gateway_http_speech_requests_total{format=mp3,status=failed,stream=whole}"] == 1
    assert m["gateway_errors_total{code=internal_error}"] == 1
    assert gw.health()["errors"] == {"internal_error": 1}


def test_the_encoder_thread_keeps_nothing_of_a_call_once_it_is_done():
    """The worker's loop kept its last call's arguments while it waited for the next: the
    last compressed response's encoder, its whole file and PyAV's resampler threads stayed
    alive until the next compressed request (formats soak)."""
    import gc
    import time
    import weakref

    from gateway.io.lanes import LaneThread

    class Payload:  # stands for an encoder and its file
        pass

    thread = LaneThread("test-worker")
    try:
        payload = Payload()
        gone = weakref.ref(payload)
        assert thread.submit(lambda p: None, payload).result(HANG_S) is None
        del payload
        deadline = time.monotonic() + HANG_S  # the worker lets go as it returns to waiting
        while gone() is not None and time.monotonic() < deadline:
            gc.collect()
            time.sleep(0.01)
        assert gone() is None
    finally:
        thread.shutdown()


# ---- a fast engine ahead of the encoder ------------------------------------------------------

DIGITS = " ".join(["123456789"] * 40)
"""399 characters, one segment, read out as numbers: 71 s of espeak audio."""


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
async def test_audio_waiting_for_the_encoder_is_not_a_slow_consumer(start_gateway, monkeypatch,
                                                                     stream):
    """espeak makes a segment of 71 s in a fraction of a second; mp3 encodes at ~100x real
    time. The audio waiting for the gateway's own encoder counted as the client's unread
    audio: a client reading as fast as it could got 502 ``slow_consumer`` for the whole
    file, or a streamed answer aborted. Here the encoder is held until the engine has made
    the whole segment: the worst such lag, with no client behind it."""
    import threading

    from gateway.io import http_api

    made = threading.Event()
    finish = http_api.SpeechStream._finish

    def finished(self, item):
        finish(self, item)
        made.set()

    encode = http_api._encode

    def held(opened, pcm):  # TEST DOUBLE: an encoder the engine is far ahead of
        made.wait(30)
        return encode(opened, pcm)

    gw = await start_gateway()
    client = openai.AsyncOpenAI(base_url=base(gw) + "/v1", api_key="not-needed")
    try:
        expected = await pcm_answer(client, DIGITS)
        assert expected > 61 * 24_000  # one segment of more than the 60 s bound
        monkeypatch.setattr(http_api.SpeechStream, "_finish", finished)
        monkeypatch.setattr(http_api, "_encode", held)
        async with client.audio.speech.with_streaming_response.create(
                model="tts-1", voice="alloy", input=DIGITS, response_format="mp3",
                extra_body={"stream": stream}) as response:
            assert response.status_code == 200
            data = b"".join([c async for c in response.iter_bytes()])
    finally:
        await client.close()
    low, high = padding("mp3", stream)
    assert expected + low <= decode(data).samples_24k <= expected + high
    assert gw.metrics.errors.get("slow_consumer", 0) == 0
