"""The HTTP API against the real gateway on 127.0.0.1:0: the official ``openai`` client,
httpx + httpx-sse, real espeak (and the synthetic engine where a lane must stay busy).

Steps are ordered by awaiting events, never by sleeping.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import io
import logging
import math
import re
import socket
import threading
import wave
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace

import av
import httpx
import numpy as np
import openai
import orjson
import pytest
from httpx_sse import aconnect_sse
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import connect

from engines.base import EngineError, SynthesisRequest
from engines.synthetic import SyntheticEngine
from gateway.config import load_config
from gateway.core.audio_formats import WAV_STREAM_HEADER
from gateway.io import http_api
from gateway.io.http_api import MAX_BODY_BYTES, MAX_INPUT_CHARS
from gateway.io.server import Gateway
from tests.hang_guard import HANG_S, hang_guard, unless_hung
from tests.wsclient import LineSeen, one_turn, raw_answer, raw_exchange, read_turn, recv_event, send

TEXT = "The build finished at nine. Two tests failed, both in the parser."
REPLY = "About two hundred dollars. A bit more."
SHORT = "Done at nine. Two failed."
"""Voice turns are paced in real time: keep what they say short."""


@pytest.fixture
def replies(tmp_path):
    path = tmp_path / "replies.jsonl"
    path.write_text(orjson.dumps({"transcript": "What about hosting?", "reply": REPLY}).decode()
                    + "\n")
    return str(path)


async def start_gateway(replies: str, engine=None) -> Gateway:
    config = load_config(server={"port": 0}, tts={"engine": "espeak"},
                         llm={"replies": replies, "tokens_per_s": 400.0})
    gw = Gateway(config, engine=engine)
    await gw.start()
    return gw


@pytest.fixture
async def gateway(replies):
    gw = await start_gateway(replies)
    try:
        yield gw
    finally:
        await gw.aclose()


def base(gw: Gateway) -> str:
    return f"http://127.0.0.1:{gw.http_port}"


def pcm16(data: bytes) -> np.ndarray:
    assert len(data) % 2 == 0, "PCM16 comes in whole samples"
    return np.frombuffer(data, dtype="<i2")


def is_speech(samples: np.ndarray) -> bool:
    return len(samples) > 0 and float(np.sqrt(np.mean(samples.astype(np.float64) ** 2))) > 300


def metrics(text: str) -> dict[str, float]:
    """``{sample name{labels}: value}`` from the Prometheus text."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


async def read_sse(response) -> list[dict]:
    """``data:`` events of an httpx response or an openai streamed response."""
    lines = response.iter_lines() if hasattr(response, "iter_lines") and \
        not isinstance(response, httpx.Response) else response.aiter_lines()
    return [orjson.loads(line[len("data: "):]) async for line in lines
            if line.startswith("data: ")]


# ---- the official client ----------------------------------------------------------------


async def test_openai_sdk_sse_and_whole_file(gateway):
    client = openai.AsyncOpenAI(base_url=base(gateway) + "/v1", api_key="not-needed")
    async with client.audio.speech.with_streaming_response.create(
            model="espeak", voice="en-us", input=TEXT, response_format="pcm",
            stream_format="sse") as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = await read_sse(response)
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert deltas and events[-1]["type"] == "speech.audio.done"
    streamed = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    usage = events[-1]["usage"]
    assert usage["audio_ms"] == pytest.approx(len(streamed) / 48, abs=1)
    assert usage["segments"] == 2 and usage["engine"] == "espeak" and usage["compute_ms"] > 0

    whole = await client.audio.speech.create(model="espeak", voice="en-us", input=TEXT,
                                             response_format="wav")
    with wave.open(io.BytesIO(whole.content)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24000, 1, 2)
        frames = w.readframes(w.getnframes())
    assert is_speech(pcm16(frames))
    # espeak varies a few samples between runs; the same text gives the same length of speech
    assert len(frames) == pytest.approx(len(streamed), rel=0.02)
    await client.close()


async def test_openai_sdk_sees_openai_style_errors(gateway):
    client = openai.AsyncOpenAI(base_url=base(gateway) + "/v1", api_key="not-needed")
    with pytest.raises(openai.BadRequestError) as info:
        await client.audio.speech.create(model="espeak", voice="klingon", input=TEXT,
                                         response_format="wav")
    assert info.value.code == "unknown_voice" and info.value.param == "voice"
    await client.close()


async def test_the_sdk_given_the_voice_port_is_told_the_http_api_port(gateway):
    """The voice port and the HTTP API's are next to each other (``--port``, ``--http-port``):
    an OpenAI client given the voice port got only "Connection error." (websockets reads
    no request with a body, and closed the connection unanswered; a POST without one got
    405). It gets a 405 naming the HTTP API's port, whatever way the body comes."""
    voice = f"http://127.0.0.1:{gateway.port}"
    client = openai.AsyncOpenAI(base_url=voice + "/v1", api_key="not-needed", max_retries=0)
    with pytest.raises(openai.APIStatusError) as info:
        await client.audio.speech.create(model="tts-1", voice="alloy", input="Hello.")
    assert info.value.status_code == 405
    assert f"port {gateway.http_port} (--http-port)" in info.value.message
    async def body() -> AsyncIterator[bytes]:
        yield b'{"input": "Hello."}'

    async with httpx.AsyncClient(timeout=HANG_S) as http:  # (a body of unknown length: chunked)
        async with http.stream("POST", voice + "/v1/audio/speech", content=body()) as response:
            assert response.status_code == 405
            assert f"port {gateway.http_port}" in (await response.aread()).decode()


@pytest.mark.parametrize(("request_", "why"), [
    (b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n\r\nhello",
     "unsupported request body"),
    ("GET /h\u00e9alth HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode(), "'ascii' codec"),
    (b"GET /health HTTP/2.0\r\nHost: 127.0.0.1\r\n\r\n", "unsupported protocol"),
    (b"\x16\x03\x01\x02\x00\x01\r\n\r\n", "invalid HTTP request line"),
], ids=["get-with-a-body", "not-ascii", "http-2", "not-http"])
async def test_the_voice_port_answers_a_request_it_cannot_read(gateway, caplog, request_, why):
    """websockets reads no request with a body, nor one it cannot parse, and closed the
    connection unanswered, with no log line and no count: a client got an empty reply
    where the HTTP API's port answers 400 ``invalid_http``. The voice port answers the same
    now, saying what it could not read, with one INFO line, counted."""
    caplog.set_level(logging.INFO)
    answer, port = await raw_exchange(gateway.port, request_)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert b"\r\nConnection: close" in head
    error = orjson.loads(body)["error"]
    assert (error["code"], error["type"]) == ("invalid_http", "invalid_request_error")
    assert error["message"].startswith("the request could not be read: ")
    assert why in error["message"]
    assert gateway.health()["errors"] == {"invalid_http": 1}
    assert [r.getMessage() for r in caplog.records if "refused (400" in r.getMessage()] == [
        f"HTTP request from 127.0.0.1:{port} refused (400 invalid_http): {error['message']}"]


@pytest.mark.parametrize("after", [
    b"\r\n", b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
], ids=["a-stray-crlf", "a-pipelined-request"])
async def test_the_voice_port_answers_a_request_whatever_follows_it(gateway, after):
    """websockets reads what follows a request as WebSocket frames before it answers: bytes
    that are none (a stray CRLF after the request, a pipelined request) failed the
    connection, and the plain GET before them was closed unanswered. The request is
    answered; what follows it waits for the answer (a 101's frames), else goes unread."""
    answer = await raw_answer(gateway.port,
                              b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" + after)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), answer[:200]
    assert orjson.loads(body)["status"] == "ok"  # (one answer: the body is the health alone)
    assert gateway.health()["errors"] == {}


UPGRADE = (b"Upgrade: websocket\r\nConnection: Upgrade\r\n"
           b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n")


@pytest.mark.parametrize("before", [b"\r\n", b"\n", b"\r\n" * 3], ids=["crlf", "lf", "three"])
async def test_empty_lines_before_the_request_line_are_ignored_on_both_ports(gateway, before):
    """RFC 9112 2.2: a server SHOULD ignore at least one empty line before the request
    line. Both ports answered 400 ``invalid_http`` (websockets and h11 each took the empty
    line for the request line). Sent apart too (a CR ending one segment, its LF the
    next), and on the voice port for the upgrade as for a plain GET."""
    get = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    upgrade = b"GET /v1/voice HTTP/1.1\r\nHost: 127.0.0.1\r\n" + UPGRADE + b"\r\n"
    for port, request in ((gateway.port, get), (gateway.http_port, get),
                          (gateway.port, upgrade)):
        # whole, then apart: a CR or LF alone, then the rest (the parsers' own test has the
        # pieces read apart for certain: test_an_empty_line_split_between_reads_...)
        for pieces in ((before + request,), (before[:-1], before[-1:] + request)):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            for piece in pieces:
                writer.write(piece)
                await writer.drain()
            async with hang_guard("the answer"):
                head = await reader.readuntil(b"\r\n\r\n")
            writer.close()
            assert head.startswith(b"HTTP/1.1 200 " if request is get else
                                   b"HTTP/1.1 101 "), (port, pieces, head)
    assert gateway.health()["errors"] == {}


@pytest.mark.parametrize("pieces", [[b"\r", b"\nGET"], [b"\r\n\r", b"\n", b"\nGET"],
                                    [b"\n\r", b"\nGET"]], ids=["cr-lf", "crlf-cr-lf-lf", "lf-cr"])
def test_an_empty_line_split_between_reads_is_ignored_by_both_ports_parsers(pieces):
    """The empty line's CR may come in one read and its LF in the next: h11 took a lone CR
    for an illegal request line (400), and the voice port's socket must not pass it on
    to websockets either. Both parsers, fed the pieces one at a time (sans I/O)."""
    import h11

    from gateway.io.connection import VoiceSocket

    rest = b" /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    requests = http_api._Requests(h11.SERVER)
    for piece in pieces[:-1]:
        requests.receive_data(piece)
        assert requests.next_event() is h11.NEED_DATA
    requests.receive_data(pieces[-1] + rest)
    assert requests.next_event().target == b"/health"
    socket_ = SimpleNamespace()  # (what _past_empty_lines keeps between reads)
    passed = b"".join(VoiceSocket._past_empty_lines(socket_, piece)  # type: ignore[arg-type]
                      for piece in pieces)
    assert passed == b"GET"


@pytest.mark.parametrize("buffer", [None, SimpleNamespace(), SimpleNamespace(_data=b"\r\n")],
                         ids=["no-buffer", "no-data", "no-extract"])
def test_an_h11_without_the_buffer_reached_for_empty_lines_leaves_them_to_h11(buffer):
    """Skipping empty lines reaches into h11's receive buffer (no public way): an h11 whose
    buffer is named or built otherwise must leave them to h11 (its 400, as before), not
    fail every request on an AttributeError."""
    assert http_api._past_empty_lines(buffer) is False
    if buffer is not None and hasattr(buffer, "_data"):
        assert buffer._data == b"\r\n"  # (untouched)


@pytest.mark.parametrize(("hosts", "why"), [
    ([b"evil@127.0.0.1"], "holds user info"),
    ([b""], "an empty Host"),
    ([b"127.0.0.1:99999"], "is not a host[:port]"),
    ([b"127.0.0.1/x"], "is not a host[:port]"),
    ([b"127.0.0.1", b"127.0.0.1"], "more than one Host"),
    ([], "no Host"),
], ids=["user-info", "empty", "port-past-65535", "a-path", "two", "none"])
async def test_a_host_that_is_no_host_and_port_is_refused_400_on_both_ports(gateway, hosts,
                                                                            why):
    """RFC 9112 3.2: a server answers 400 a request with no ``Host`` (HTTP/1.1), more than
    one, or one whose value is invalid. ``Host: evil@127.0.0.1`` (user info, RFC 9110
    4.2.4) was answered on both ports, the upgrade included: the check against DNS
    rebinding read its name as the IP address after the ``@``; an empty ``Host`` (a client
    sends one only for a target without an authority, and every target here has one) was
    taken for none. Both ports answer each 400 ``invalid_http`` now, saying why (h11 says
    its own for what it refuses itself: two, or none), on the upgrade as on a plain GET."""
    head = b"".join(b"Host: " + host + b"\r\n" for host in hosts)
    for port, request in ((gateway.port, b"GET /health HTTP/1.1\r\n" + head + b"\r\n"),
                          (gateway.http_port, b"GET /health HTTP/1.1\r\n" + head + b"\r\n"),
                          (gateway.port, b"GET /v1/voice HTTP/1.1\r\n" + head + UPGRADE
                           + b"\r\n")):
        answer = await raw_answer(port, request)
        assert answer.startswith(b"HTTP/1.1 400 "), (port, answer[:300])
        error = orjson.loads(answer.partition(b"\r\n\r\n")[2])["error"]
        assert error["code"] == "invalid_http"
        if port == gateway.port or len(hosts) == 1:
            assert why in error["message"], error
    assert gateway.health()["errors"] == {"invalid_http": 3}


async def test_a_message_sent_with_the_upgrade_is_read_once_the_socket_opens(gateway):
    """A client that sends its first message right behind its upgrade request (before the
    101: RFC 6455 says wait, not every client does) has it read as the socket's first."""
    import base64
    import os
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    key = base64.b64encode(os.urandom(16)).decode()
    ping = b'{"type": "ping", "id": 7}'
    writer.write(f"GET /v1/voice HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                 f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                 "Sec-WebSocket-Version: 13\r\n\r\n".encode()
                 + bytes([0x81, 0x80 | len(ping)]) + bytes(4) + ping)
    await writer.drain()
    async with hang_guard("the handshake and the pong"):
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101 ")
        events = []
        while not events or events[-1]["type"] != "pong":
            first, n = await reader.readexactly(2)
            assert first == 0x81 and n <= 126  # (text frames under 64 KiB)
            if n == 126:
                n = int.from_bytes(await reader.readexactly(2), "big")
            events.append(orjson.loads(await reader.readexactly(n)))
    writer.close()
    assert [e["type"] for e in events] == ["session.created", "pong"]
    assert events[-1] == {"type": "pong", "id": 7}


OPENAI_ERROR_FIELDS = {"message", "type", "param", "code"}


async def test_both_ports_answer_errors_in_openais_whole_shape(gateway):
    """OpenAI's errors are ``{"error": {"message", "type", "param", "code"}}``; the voice
    port's had ``code`` and ``message`` alone, so the SDK read their ``type`` as None. Both
    ports now write them with one helper (``http_api.openai_error``)."""
    voice = f"http://127.0.0.1:{gateway.port}"
    client = openai.AsyncOpenAI(base_url=voice + "/v1", api_key="not-needed", max_retries=0)
    with pytest.raises(openai.APIStatusError) as info:
        await client.audio.speech.create(model="tts-1", voice="alloy", input="Hello.")
    await client.close()
    assert info.value.status_code == 405
    assert (info.value.type, info.value.param, info.value.code) == (
        "invalid_request_error", None, "method_not_allowed")
    async with httpx.AsyncClient(timeout=HANG_S) as http:
        answers = {
            "voice 404": await http.get(voice + "/nowhere"),
            "voice 405": await http.post(voice + "/v1/models"),
            "voice 403": await http.get(voice + "/health", headers={"Host": "evil.example"}),
            "http 404": await http.get(base(gateway) + "/nowhere"),
            "http 405": await http.get(base(gateway) + "/v1/audio/speech"),
            "http 403": await http.get(base(gateway) + "/health",
                                       headers={"Host": "evil.example"}),
        }
    for name, response in answers.items():
        assert response.status_code == int(name[-3:]), name
        error = response.json()["error"]
        assert set(error) == OPENAI_ERROR_FIELDS, name
        assert error["type"] == "invalid_request_error" and error["param"] is None, name


@pytest.mark.parametrize("port", ["http_port", "port"])
async def test_the_sdk_retrieves_the_models_listed_on_either_port(gateway, port):
    """``GET /v1/models/{id}`` is answered wherever ``/v1/models`` is (the voice port had
    only the list, and answered the SDK's ``models.retrieve`` 404 ``not_found``): a model
    the list names, 200 with its entry; any other (``tts-1``, which a speech request's
    ``model`` may say), 404 ``model_not_found``."""
    url = f"http://127.0.0.1:{getattr(gateway, port)}/v1"
    client = openai.AsyncOpenAI(base_url=url, api_key="not-needed", max_retries=0)
    listed = [m async for m in client.models.list()]
    model = await client.models.retrieve("espeak")
    with pytest.raises(openai.NotFoundError) as missing:
        await client.models.retrieve("tts-1")
    await client.close()
    assert [m.id for m in listed] == ["espeak"] and model.object == "model"
    assert model.to_dict() == listed[0].to_dict()  # the list's entry, every field
    assert (missing.value.code, missing.value.type, missing.value.param) == (
        "model_not_found", "invalid_request_error", "model")
    assert "'tts-1'" in missing.value.message


async def test_a_voice_named_in_other_letter_case_is_the_listed_one(gateway):
    """"EN-US" for the listed "en-us" (a model card's "Serena" for a checkpoint's "serena")
    was refused as an unknown voice. It is that voice, spoken, with no note of a default
    standing in."""
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gateway)) as http:
        response = await http.post("/v1/audio/speech", json={
            "input": "Hi.", "voice": "EN-US", "response_format": "pcm"})
    assert response.status_code == 200 and is_speech(pcm16(response.content))
    assert "x-speech-notes" not in response.headers


async def test_an_app_written_for_openai_gets_the_default_voice_not_an_error(gateway):
    # OpenAI's voice names (hard-coded in apps written for it) speak with the gateway's
    # default voice, and say so; OpenAI's {"id": ...} form names a voice too
    client = openai.AsyncOpenAI(base_url=base(gateway) + "/v1", api_key="not-needed")
    alloy = await client.audio.speech.with_raw_response.create(
        model="tts-1", voice="alloy", input="Hello.", response_format="wav")
    default = await client.audio.speech.create(model="tts-1", voice="en-us", input="Hello.",
                                               response_format="wav")
    await client.close()
    assert alloy.headers["x-speech-notes"] == ("voice 'alloy' is OpenAI's; the gateway's "
                                               "default voice 'en-us' spoke")
    assert len(alloy.content) == pytest.approx(len(default.content), rel=0.02)
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gateway)) as http:
        by_id = await http.post("/v1/audio/speech", json={
            "input": "Hello.", "voice": {"id": "en-gb"}, "stream_format": "sse"})
        voices = (await http.get("/v1/audio/voices")).json()
    assert by_id.status_code == 200 and "x-speech-notes" not in by_id.headers
    assert voices["default"] == "en-us"


class ClonedVoiceEngine(SyntheticEngine):
    """Test double: one voice cloned from a reference file and named after it, as qwen3 and
    chatterbox name theirs (``Łucja.wav``: a name beyond latin-1)."""

    def __init__(self) -> None:
        super().__init__(rtf=0, ttfa_ms=0)
        self.default_voice = "Łucja"

    def voices(self) -> list[str]:
        return ["Łucja"]

    def open(self, request: SynthesisRequest):
        return super().open(dataclasses.replace(request, voice="mid"))


@pytest.mark.parametrize("mode", [{"stream_format": "sse", "response_format": "pcm"},
                                  {"response_format": "wav"},
                                  {"response_format": "wav", "stream": False}])
async def test_a_note_naming_a_voice_beyond_latin_1_is_sent_escaped(replies, mode):
    """The note for an OpenAI voice name quotes the default voice. Named beyond latin-1, it
    failed the header's encoding: a plain-text 500 for every request of an app written for
    OpenAI, whose synthesis went on for nobody (the stream stayed open on the lane)."""
    gw = await start_gateway(replies, ClonedVoiceEngine())
    try:
        async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gw)) as client:
            response = await client.post("/v1/audio/speech", json={
                "input": "Hello there.", "voice": "alloy", **mode})
        assert response.status_code == 200
        assert response.headers["x-speech-notes"] == (
            "voice 'alloy' is OpenAI's; the gateway's default voice '\\u0141ucja' spoke")
        if mode["response_format"] == "pcm":  # the SSE done event is JSON: as it is
            done = [orjson.loads(line[6:]) for line in response.text.splitlines()
                    if line.startswith("data: ")][-1]
            assert done["notes"] == ["voice 'alloy' is OpenAI's; the gateway's default "
                                     "voice 'Łucja' spoke"]
        await unless_hung(gw.http.idle.wait())
        assert gw.lane.queue_depth == 0
    finally:
        await gw.aclose()


async def test_nothing_to_say_is_an_empty_answer_with_a_note(gateway):
    # an emoji or a code block is a segment with nothing to speak: no engine job for it (an
    # http engine behind the gateway refused the empty input, failing the whole request)
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gateway)) as client:
        mixed = await client.post("/v1/audio/speech", json={
            "input": "\U0001F642 Hello there!", "stream_format": "sse"})
        events = [orjson.loads(line[6:]) for line in mixed.text.splitlines()
                  if line.startswith("data: ")]
        nothing = await client.post("/v1/audio/speech", json={
            "input": "\U0001F600", "response_format": "wav", "stream": False})
        streamed = await client.post("/v1/audio/speech", json={"input": "\U0001F600",
                                                               "response_format": "wav"})
    assert events[-1]["usage"]["segments"] == 1 and events[-1]["usage"]["audio_ms"] > 0
    assert "notes" not in events[-1]
    assert nothing.status_code == 200 and nothing.headers["x-audio-ms"] == "0"
    assert nothing.headers["x-speech-notes"].startswith("nothing was spoken")
    with wave.open(io.BytesIO(nothing.content)) as w:
        assert w.getnframes() == 0
    assert streamed.status_code == 200 and streamed.content == WAV_STREAM_HEADER


async def test_null_means_the_default_for_every_optional_field(gateway):
    body = {"input": "Hi.", "model": None, "voice": None, "response_format": None,
            "stream_format": None, "stream": None, "speed": None, "seed": None,
            "temperature": None, "instructions": None}
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gateway)) as client:
        response = await client.post("/v1/audio/speech", json=body)
        seeded = await client.post("/v1/audio/speech", json={"input": "Hi.", "seed": 7.0})
    # null is the default: OpenAI's mp3
    assert response.status_code == 200 and response.headers["content-type"] == "audio/mpeg"
    assert seeded.status_code == 200  # an integral number is an integer (1.0 from Python)


def decode_mp3(data: bytes) -> int:
    """Samples a decoder gives back from ``data``, which must be MPEG audio at 24 kHz mono."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        ctx = stream.codec_context
        # (by id: FFmpeg's MP3 decoder is "mp3float", and PyAV 12-14.1 have no canonical_name)
        assert container.format.name == "mp3" and ctx.codec.id == av.codec.Codec("mp3", "r").id
        assert ctx.sample_rate == 24_000 and len(ctx.layout.channels) == 1
        return sum(frame.samples for frame in container.decode(stream))


async def test_an_app_that_names_no_format_gets_mp3_as_from_openai(gateway):
    """OpenAI's default is mp3, and apps written for it name no format and take the bytes
    for MP3 (Open WebUI caches them as ``.mp3``, LibreChat forwards them as ``audio/mpeg``;
    the SDK sends no ``response_format`` when the caller names none, and its docs' example
    streams them to ``speech.mp3``). Decoded, the audio is the engine's: the PCM answer's
    length, plus only what docs/http-api.md allows for MP3 (a whole file: within 47 samples,
    2 ms, its LAME frame says where the audio is; streamed, no such frame: the encoder's
    1152-sample delay first and under 576 of padding last)."""
    client = openai.AsyncOpenAI(base_url=base(gateway) + "/v1", api_key="not-needed")
    try:
        pcm = await client.audio.speech.create(model="tts-1", voice="alloy", input=TEXT,
                                               response_format="pcm",
                                               extra_body={"stream": False})
        # the SDK, no response_format: it sends none (and Accept: application/octet-stream)
        async with client.audio.speech.with_streaming_response.create(
                model="tts-1", voice="alloy", input=TEXT) as response:
            assert response.http_request.headers["accept"] == "application/octet-stream"
            assert b"response_format" not in response.http_request.content
            sdk_type = response.headers["content-type"]
            sdk_streamed = b"".join([c async for c in response.iter_bytes()])
    finally:
        await client.close()
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gateway)) as http:
        whole = await http.post("/v1/audio/speech", json={"input": TEXT, "stream": False})
        streamed = await http.post("/v1/audio/speech", json={"input": TEXT})
    expected = len(pcm.content) // 2
    slack = 0 if gateway.engine.deterministic else round(0.02 * expected)
    assert sdk_type == whole.headers["content-type"] == streamed.headers["content-type"] \
        == "audio/mpeg"
    assert streamed.headers["transfer-encoding"] == "chunked"
    assert int(whole.headers["content-length"]) == len(whole.content)
    assert int(whole.headers["x-audio-ms"]) == round(expected / 24)
    assert whole.content[:2] == b"\xff\xf3"  # an MPEG-2 Layer III frame, no ID3 tag first
    assert expected - slack <= decode_mp3(whole.content) <= expected + 47 + slack
    for data in (streamed.content, sdk_streamed):
        assert expected + 1152 - slack <= decode_mp3(data) <= expected + 1152 + 575 + slack
    assert len(whole.content) < 0.2 * len(pcm.content)  # 64 kbit/s against PCM's 384


def test_without_pyav_a_request_naming_no_format_still_gets_wav(monkeypatch):
    """PyAV is a core dependency, but an environment without it (it is refused for the
    compressed formats, 400) answers a request that names none as before mp3 was the
    default, rather than refusing what the app never asked for."""
    monkeypatch.setattr(http_api, "HAS_PYAV", False)
    gateway = SimpleNamespace(voices=(), default_voice=None)
    assert http_api.parse_speech({"input": "Hi."}, gateway).response_format == "wav"
    assert http_api.parse_speech({"input": "Hi.", "stream_format": "sse"},
                                 gateway).response_format == "pcm"
    with pytest.raises(http_api.ApiError) as refused:
        http_api.parse_speech({"input": "Hi.", "response_format": "mp3"}, gateway)
    assert refused.value.code == "unsupported_format"
    monkeypatch.setattr(http_api, "HAS_PYAV", True)
    assert http_api.parse_speech({"input": "Hi."}, gateway).response_format == "mp3"


async def test_a_stopping_gateway_says_so(gateway):
    # not "starting" and "warming_up", as it said while it closed
    gateway.closing = True
    try:
        async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gateway)) as client:
            health = await client.get("/health")
            speech = await client.post("/v1/audio/speech", json={"input": "Hi."})
    finally:
        gateway.closing = False
    assert health.status_code == 503 and health.json()["status"] == "stopping"
    assert speech.status_code == 503 and speech.json()["error"]["code"] == "shutting_down"


async def test_health_asked_as_the_gateway_stops_says_stopping(replies):
    """A /health request on its way to the voice port as the gateway starts stopping: it
    answered 500 (and an ERROR with a traceback in the log), as the health's ``http.port``
    asked the HTTP API's socket, closed by then, for its port; it says 503 "stopping"."""
    gw = await start_gateway(replies)
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    try:
        writer.write(b"GET /health HTTP/1.1\r\n")  # accepted before the ports stop taking any
        await writer.drain()
        closing = asyncio.create_task(gw.aclose())
        await gw.http.stopping.wait()  # the HTTP API's listening socket is closed now
        writer.write(b"Host: 127.0.0.1\r\n\r\n")
        await writer.drain()
        answer = await reader.read()
        writer.close()  # (websockets waits for the client's end of the TCP connection)
        await closing
    finally:
        writer.close()
        await gw.aclose()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 "), answer
    assert orjson.loads(body)["status"] == "stopping"
    assert orjson.loads(body)["http"]["port"] == gw.http_port


def body_read_seen(monkeypatch) -> asyncio.Event:
    """Set once the speech handler starts reading a request's body."""
    reading = asyncio.Event()
    read_json = http_api._read_json

    async def read_json_seen(request):
        reading.set()
        return await read_json(request)

    monkeypatch.setattr(http_api, "_read_json", read_json_seen)
    return reading


async def test_a_request_whose_body_came_after_the_shutdown_began_is_refused(gateway,
                                                                             monkeypatch):
    """The gateway was checked to be serving before the body was read (up to 10 s): a
    request still sending its body when the shutdown began was spoken after the shutdown
    had failed every open speech stream (I/O review)."""
    reading = body_read_seen(monkeypatch)
    body = orjson.dumps({"input": "Hello there.", "response_format": "pcm"})
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.http_port)
    writer.write(b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (len(body), body[:5]))
    await reading.wait()  # past the first check, waiting for the rest of its body
    gateway.closing = True
    try:
        writer.write(body[5:])
        status = await reader.readline()
        answer = await reader.readuntil(b"}}")  # to the end of the error's JSON
    finally:
        gateway.closing = False
        writer.close()
    assert status.startswith(b"HTTP/1.1 503 ") and b'"code":"shutting_down"' in answer
    assert gateway.lane.stats.jobs_done == 0


async def test_a_request_still_sending_its_body_when_the_shutdown_begins_is_refused(
        replies, monkeypatch, caplog):
    """uvicorn waited its 2 s grace for the body, then cancelled the request: a bare
    ``500 Internal Server Error`` in plain text and an ERROR traceback, not the 503
    ``shutting_down`` a request already on its way is promised."""
    caplog.set_level(logging.INFO)
    reading = body_read_seen(monkeypatch)
    gw = await start_gateway(replies)
    closing = None
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.http_port)
        writer.write(b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                     b"application/json\r\nContent-Length: 1000\r\n\r\n{\"input\": ")
        await reading.wait()  # the rest of the body never comes
        closing = asyncio.create_task(gw.aclose())
        answer = await reader.read()  # until the server closes
        writer.close()
    finally:
        await (closing or gw.aclose())
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 ")
    assert orjson.loads(body)["error"]["code"] == "shutting_down"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_the_http_port_stops_taking_requests_as_the_shutdown_begins(replies):
    """docs/http-api.md: both ports stop taking connections at once (a new connection is
    refused, a kept-alive one is closed). The HTTP port took them until uvicorn's next
    tick, up to 0.1 s later, and answered each one 503 (``Retry-After: 1``)."""
    gw = await start_gateway(replies)
    port, closing = gw.http_port, None
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)  # the connection is kept alive
        closing = asyncio.create_task(gw.aclose())
        await gw.http.stopping.wait()
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        try:
            answer = await reader.read()
        except ConnectionResetError:  # (closed before the request came)
            answer = b""
        writer.close()
        assert answer == b""
    finally:
        await (closing or gw.aclose())


async def test_a_client_gone_while_sending_its_request_is_no_server_error(gateway, caplog):
    caplog.set_level(logging.INFO)
    line = LineSeen("speech disconnected (499) while sending its request")
    logging.getLogger("gateway.io.http_api").addHandler(line)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.http_port)
        writer.write(b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                     b"application/json\r\nContent-Length: 1000\r\n\r\n{\"input\": ")
        await writer.drain()
        writer.close()
        await writer.wait_closed()
        async with hang_guard("the log line waited for"):
            await line.seen.wait()
    finally:
        logging.getLogger("gateway.io.http_api").removeHandler(line)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("sent", [
    b"",  # connects and says nothing
    b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty",  # headers trickled in
    b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET /heal",  # the next request, kept alive
], ids=["silent", "partial-headers", "after-a-response"])
async def test_headers_that_never_arrive_whole_close_the_connection(gateway, monkeypatch,
                                                                    sent):
    """uvicorn has no header timeout: a slowloris kept 150 sockets open past 60 s, and
    enough of them starve the whole process (the voice port too) of descriptors."""
    from gateway.io import http_api

    monkeypatch.setattr(http_api, "HEADER_TIMEOUT_S", 0.3)
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.http_port)
    writer.write(sent)
    await writer.drain()
    async with hang_guard("the server closing the connection"):
        rest = await reader.read()  # until the server closes
    writer.close()
    assert rest.startswith(b"HTTP/1.1 200") == sent.startswith(b"GET")  # (the first answer)
    assert rest.count(b"HTTP/1.1") <= 1


async def test_headers_that_never_arrive_whole_are_counted(gateway, monkeypatch):
    """The header deadline closed a request begun but never finished without counting it
    anywhere, unlike every other refusal (``invalid_http`` included): a port flooded with
    slow requests showed in no figure. A connection that says nothing (a browser's
    preconnect, a client's idle keep-alive) is no refusal and is not counted."""
    monkeypatch.setattr(http_api, "HEADER_TIMEOUT_S", 0.3)
    for sent in (b"", b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty"):
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.http_port)
        writer.write(sent)
        await writer.drain()
        async with hang_guard("the server closing the connection"):
            assert await reader.read() == b""  # closed by the server, without an answer
        writer.close()
    async with httpx.AsyncClient(timeout=HANG_S,
                                 base_url=f"http://127.0.0.1:{gateway.http_port}") as client:
        m = metrics((await client.get("/metrics")).text)
    assert m["gateway_errors_total{code=request_timeout}"] == 1
    assert gateway.health()["errors"] == {"request_timeout": 1}


async def test_a_pipelined_request_is_not_cut_by_the_header_deadline(replies):
    """The header deadline, armed again after each response, was armed after uvicorn had
    taken up the next request already in (pipelined): 10 s into that request's answer it
    closed the connection, a streamed answer without its final chunk."""
    engine = HeldEngine()
    gw = await start_gateway(replies, engine)
    try:
        first = orjson.dumps({"input": "Hi.", "response_format": "pcm", "stream": False})
        second = orjson.dumps({"input": "One held sentence, long enough for steps.",
                               "response_format": "pcm"})
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.http_port)
        writer.write(b"".join(b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                              b"Content-Length: %d\r\n%s\r\n%s" % (len(body), close, body)
                              for body, close in (
                                  (first, b""), (second, b"Connection: close\r\n"))))
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))
        await reader.readexactly(length)
        head = await reader.readuntil(b"\r\n\r\n")  # the second answer, streamed
        size = int(await reader.readuntil(b"\r\n"), 16)
        await reader.readexactly(size + 2)  # its first chunk: the engine holds the next
        (connection,) = gw.http._server.server_state.connections
        assert connection._deadline is None  # its headers came whole: nothing may close it
        engine.release.set()
        rest = await reader.read()
        writer.close()
        assert head.startswith(b"HTTP/1.1 200 ") and rest.endswith(b"\r\n0\r\n\r\n")
    finally:
        engine.release.set()
        await gw.aclose()


async def test_a_body_that_never_arrives_whole_gets_408(gateway, monkeypatch):
    """A client trickling its body held the request and its socket for ever (a slowloris
    from the hostile-client probe kept 50 of them open past 60 s)."""
    from gateway.io import http_api

    monkeypatch.setattr(http_api, "BODY_TIMEOUT_S", 0.3)
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.http_port)
    writer.write(b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                 b"application/json\r\nContent-Length: 1000\r\n\r\n{\"input\": ")
    await writer.drain()
    async with hang_guard("the 408 answer"):
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))
        body = orjson.loads(await reader.readexactly(length))
    writer.close()
    assert head.startswith(b"HTTP/1.1 408 ")
    assert body["error"]["code"] == "request_timeout"
    assert body["error"]["message"] == "the body did not arrive within 0.3 s"


# ---- SSE with httpx-sse, raw chunks ------------------------------------------------------


async def test_every_sse_delta_is_pcm16_at_24khz(gateway):
    body = {"model": "espeak", "input": TEXT, "voice": "en-gb", "stream_format": "sse",
            "speed": 1.5}
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gateway)) as client, \
            aconnect_sse(client, "POST", "/v1/audio/speech", json=body) as source:
        assert source.response.headers["x-sample-rate"] == "24000"
        events = [orjson.loads(sse.data) async for sse in source.aiter_sse()]
    types = [e["type"] for e in events]
    assert types[-1] == "speech.audio.done" and set(types[:-1]) == {"speech.audio.delta"}
    chunks = [pcm16(base64.b64decode(e["audio"])) for e in events[:-1]]
    assert all(len(c) for c in chunks)
    assert is_speech(np.concatenate(chunks))
    # speed 1.5 says the same text in less audio than speed 1
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gateway)) as client:
        slow = await client.post("/v1/audio/speech", json={**body, "stream_format": "audio",
                                                           "response_format": "pcm",
                                                           "speed": 1.0})
    assert sum(len(c) for c in chunks) * 2 < len(slow.content)


@pytest.mark.parametrize("fmt", ["pcm", "wav"])
async def test_audio_streams_by_default_and_equals_the_whole_file(gateway, fmt):
    # OpenAI's endpoint streams its body (chunked), so an SDK's iter_bytes() gets audio as
    # it is made; "stream": false waits for the whole file (Content-Length, X-Audio-Ms)
    body = {"model": "espeak", "input": TEXT * 4, "response_format": fmt}
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gateway)) as client:
        whole = await client.post("/v1/audio/speech", json={**body, "stream": False})
        async with client.stream("POST", "/v1/audio/speech", json=body) as response:
            assert response.headers.get("transfer-encoding") == "chunked"
            assert response.headers["content-type"] == f"audio/{fmt}"
            streamed = b"".join([c async for c in response.aiter_raw()])
    assert whole.headers["content-type"] == f"audio/{fmt}" and "x-audio-ms" in whole.headers
    if fmt == "wav":
        with wave.open(io.BytesIO(streamed)) as w:  # "length unknown": read to the end
            assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24000, 1, 2)
            streamed = w.readframes(w.getnframes())
        with wave.open(io.BytesIO(whole.content)) as w:
            whole_pcm = w.readframes(w.getnframes())
    else:
        whole_pcm = whole.content
    assert len(streamed) == pytest.approx(len(whole_pcm), rel=0.02)
    assert is_speech(pcm16(streamed)) and is_speech(pcm16(whole_pcm))


class HeldEngine(SyntheticEngine):
    """Test double: a free synthetic engine whose streams of a text with "held" in it stop
    after their first step until the test sets ``release`` (the lane's warm-up runs free)."""

    def __init__(self) -> None:
        super().__init__(rtf=0, ttfa_ms=0)
        self.blocks = True  # on the lane's thread: a held step must not hold the event loop
        self.release = threading.Event()

    def open(self, request: SynthesisRequest):
        stream = super().open(request)
        inner_step, steps = stream.step, [0]

        def step():
            steps[0] += 1
            if steps[0] == 2 and "held" in request.text:
                self.release.wait(30)
            return inner_step()

        stream.step = step
        return stream


async def first_bytes_while_held(gw: Gateway, engine: HeldEngine,
                                  fmt: str) -> tuple[bytes, bytes]:
    """Through the OpenAI SDK's ``iter_bytes()``: the first bytes, taken while ``engine``
    holds its second step, then the rest."""
    client = openai.AsyncOpenAI(base_url=base(gw) + "/v1", api_key="not-needed")
    try:
        async with client.audio.speech.with_streaming_response.create(
                model="tts-1", voice="alloy", input="One held sentence, long enough for steps.",
                response_format=fmt) as response:
            chunks = response.iter_bytes()
            first = await anext(chunks)  # while the engine holds its second step
            engine.release.set()
            return first, b"".join([c async for c in chunks])
    finally:
        engine.release.set()
        await client.close()


async def test_openai_sdk_iter_bytes_gets_audio_before_the_synthesis_ends(replies):
    engine = HeldEngine()
    gw = await start_gateway(replies, engine)
    try:
        first, rest = await first_bytes_while_held(gw, engine, "pcm")
        assert first and rest
    finally:
        await gw.aclose()


async def test_speech_requests_beyond_the_bound_get_503_server_full(replies):
    """Open speech requests are bounded (``[server] max_speech_requests``), as voice sessions
    are: past it a request gets 503 ``server_full`` in OpenAI's shape with ``Retry-After``
    (the SDK waits and retries) instead of joining an unbounded queue on the lane, each
    holding a socket and, for a whole file, all of its audio."""
    engine = HeldEngine()
    config = load_config(server={"port": 0, "max_speech_requests": 2}, tts={"engine": "espeak"},
                         llm={"replies": replies})
    gw = Gateway(config, engine=engine)
    await gw.start()
    body = {"input": "One held sentence, long enough for steps.", "stream_format": "sse"}
    try:
        async with httpx.AsyncClient(timeout=HANG_S,
                                     base_url=base(gw)) as client, contextlib.AsyncExitStack() \
                as held:
            for _ in range(2):  # both hold their stream open: their engine step waits
                response = await held.enter_async_context(
                    client.stream("POST", "/v1/audio/speech", json=body))
                assert response.status_code == 200
            full = await client.post("/v1/audio/speech", json=body)
            health = (await client.get("/health")).json()
            engine.release.set()
        assert full.status_code == 503 and full.headers["retry-after"] == "1"
        assert full.json()["error"]["code"] == "server_full"
        assert full.json()["error"]["type"] == "server_error"
        assert "x-engine" not in full.headers  # a refusal, before any synthesis
        assert health["limits"]["max_speech_requests"] == 2
        await unless_hung(gw.http.idle.wait())
        async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gw)) as client:  # room again
            again = await client.post("/v1/audio/speech", json={"input": "Hi.",
                                                                "response_format": "pcm"})
            m = metrics((await client.get("/metrics")).text)
        assert again.status_code == 200 and again.content
        # refused after its body was read: counted with what it asked for
        assert m["gateway_http_speech_requests_total{format=pcm,status=rejected,stream=sse}"] == 1
    finally:
        engine.release.set()
        await gw.aclose()


async def test_instructions_are_ignored_with_a_note(gateway):
    body = {"input": "Hello.", "stream_format": "sse", "instructions": "whisper"}
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gateway)) as client, \
            client.stream("POST", "/v1/audio/speech", json=body) as response:
        events = await read_sse(response)
    assert "instructions ignored" in response.headers["x-speech-notes"]
    assert events[-1]["type"] == "speech.audio.done"
    assert "instructions ignored" in events[-1]["notes"][0]


async def test_background_speech_runs_in_small_steps_voice_turns_in_the_engines(replies):
    """The lane's step-size rule: an HTTP request is background work and asks the engine for
    80 ms steps (``step_ms``), so a voice turn arriving meanwhile waits less; a voice turn
    keeps the engine's own 320 ms step."""
    gw = await start_gateway(replies, SyntheticEngine(rtf=0, ttfa_ms=0, step_ms=320))
    try:
        async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gw)) as client:
            async with client.stream("POST", "/v1/audio/speech",
                                     json={"input": "One sentence that lasts a while.",
                                           "stream_format": "sse"}) as response:
                events = await read_sse(response)
        sizes = [len(base64.b64decode(e["audio"])) // 2 for e in events[:-1]]
        assert len(sizes) > 2 and set(sizes[:-1]) == {1920}  # 80 ms at 24 kHz
        text = "One sentence that lasts a while."
        before = gw.lane.stats.steps
        async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws:
            await recv_event(ws, "session.created")
            await send(ws, type="say", text=text)
            turn = await read_turn(ws)
        assert turn.done["status"] == "completed"
        # the pacer re-frames audio for the socket: count the lane's steps instead
        chunks = math.ceil(gw.engine.audio_seconds(text) / 0.320)
        assert gw.lane.stats.steps - before == chunks + 1  # + the step that ends the stream
    finally:
        await gw.aclose()


# ---- cancellation, failure, shutdown ------------------------------------------------------


async def test_disconnect_mid_stream_cancels_the_job_and_frees_the_lane(replies):
    # a real-time synthetic engine keeps the job on the lane long after the first delta
    gw = await start_gateway(replies, SyntheticEngine(rtf=1.0, ttfa_ms=0, step_ms=100))
    try:
        long = "This sentence goes on for a long while without stopping at all " * 8 + "."
        async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gw)) as client:
            async with client.stream("POST", "/v1/audio/speech",
                                     json={"input": long, "stream_format": "sse"}) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        assert orjson.loads(line[6:])["type"] == "speech.audio.delta"
                        break
                assert gw.lane.queue_depth == 1
            # leaving the block closed the connection mid-stream
            await unless_hung(gw.http.idle.wait())
            assert gw.lane.queue_depth == 0 and gw.lane.stats.jobs_cancelled == 1
            health = (await client.get("/health")).json()
            assert health["lanes"]["gpu"]["queue_depth"] == 0
            assert health["http"]["speech_streams"] == 0
            m = metrics((await client.get("/metrics")).text)
        key = "gateway_http_speech_requests_total{format=pcm,status=disconnected,stream=sse}"
        assert m[key] == 1
        assert m["gateway_lane_cancels_total{lane=gpu}"] == 1
    finally:
        await gw.aclose()


async def stalled_client(gw: Gateway, monkeypatch, **fields) -> socket.socket:
    """A client that asks for a long answer (streamed, unless ``fields`` say otherwise) and
    reads none of it; returns once the server's writes to it are paused (its socket is
    full)."""
    paused, full = http_api._H11.pause_writing, asyncio.Event()

    def pause_writing(self) -> None:
        paused(self)
        full.set()

    monkeypatch.setattr(http_api._H11, "pause_writing", pause_writing)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", gw.http_port))
    # 4000 characters: 230 s of audio, 11 MB, more than a loopback socket takes
    body = orjson.dumps({"input": (TEXT + " ") * 60 + ".", "response_format": "pcm",
                         **fields})
    await loop.sock_sendall(sock, b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                            b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    await unless_hung(full.wait())
    return sock


async def read_to_the_end(sock: socket.socket) -> bytes:
    """What the server sent, until it closed or reset the connection."""
    loop, data = asyncio.get_running_loop(), bytearray()
    try:
        while chunk := await loop.sock_recv(sock, 1 << 20):
            data += chunk
    except ConnectionResetError:
        pass
    sock.close()
    return bytes(data)


async def test_a_whole_file_its_client_left_half_way_is_a_disconnect(gateway, caplog):
    """The whole file went to the server in one write and the request was counted
    ``completed`` before a byte of it was sent: a client that read a part of it and left
    was counted, and logged, as served."""
    caplog.set_level(logging.INFO)
    line = LineSeen("speech ")
    logging.getLogger("gateway.io.http_api").addHandler(line)
    try:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await loop.sock_connect(sock, ("127.0.0.1", gateway.http_port))
        # 230 s of audio, 11 MB: more than the loopback socket's buffers hold
        body = orjson.dumps({"input": (TEXT + " ") * 60 + ".", "response_format": "wav",
                             "stream": False})
        await loop.sock_sendall(sock, b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        got = bytearray()
        while len(got) < 100_000:  # the headers and a part of the file
            got += await loop.sock_recv(sock, 1 << 16)
        sock.close()
        async with hang_guard("the log line waited for"):
            await line.seen.wait()
    finally:
        logging.getLogger("gateway.io.http_api").removeHandler(line)
    assert got.startswith(b"HTTP/1.1 200 ")
    length = int(bytes(got).lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    assert length > 10_000_000
    ended = [r.getMessage() for r in caplog.records if r.getMessage().startswith("speech ")]
    assert len(ended) == 1 and ended[0].startswith("speech disconnected (499) (wav, whole,"), \
        ended
    m = metrics(gateway.telemetry.exposition().decode())
    assert m["gateway_http_speech_requests_total{format=wav,status=disconnected,"
             "stream=whole}"] == 1
    assert "gateway_http_speech_requests_total{format=wav,status=completed,stream=whole}" \
        not in m
    await unless_hung(gateway.http.idle.wait())
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_client_that_takes_nothing_is_dropped(replies, monkeypatch):
    """No write deadline: a client that stopped reading held its answer, its socket and the
    audio queued for it for ever (the voice socket drops such a client)."""
    monkeypatch.setattr(http_api, "SEND_TIMEOUT_S", 0.3, raising=False)
    gw = await start_gateway(replies)
    try:
        sock = await stalled_client(gw, monkeypatch)
        await unless_hung(gw.http.idle.wait())  # its answer is over
        assert gw.lane.queue_depth == 0
        data = await read_to_the_end(sock)
        assert data.startswith(b"HTTP/1.1 200 ") and not data.endswith(b"\r\n0\r\n\r\n")
        m = metrics(gw.telemetry.exposition().decode())
        assert m["gateway_http_speech_requests_total{format=pcm,status=disconnected,"
                 "stream=chunked}"] == 1
    finally:
        await gw.aclose()


async def test_a_shutdown_drops_a_client_that_takes_nothing_when_its_grace_ends(
        replies, monkeypatch, caplog):
    """The shutdown failed the stream, but its answer waited on the full socket: uvicorn
    waited out its grace, cancelled it with an ERROR traceback, and closed the socket,
    which a close keeps open until the client takes what is buffered: never. (The grace is
    made 0 here: the client takes nothing however long it lasts.)"""
    caplog.set_level(logging.INFO)
    gw = await start_gateway(replies)
    closed = False
    try:
        sock = await stalled_client(gw, monkeypatch)
        monkeypatch.setattr(http_api, "SHUTDOWN_GRACE_S", 0)
        await gw.aclose()
        closed = True
        data = await read_to_the_end(sock)  # reset: nothing more is kept for it
    finally:
        if not closed:
            await gw.aclose()
    assert data.startswith(b"HTTP/1.1 200 ") and not data.endswith(b"\r\n0\r\n\r\n")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_whole_file_being_taken_when_the_shutdown_begins_goes_out_whole(
        replies, monkeypatch, caplog):
    """A whole file already made, its client's socket full as the shutdown began: its
    connection was aborted at once ("takes nothing of its answer"), though its client was
    reading, which got 2.8 MB of 12 MB. Its client now has the grace to take the rest (made
    long here: the client reads as fast as it can once the shutdown has begun)."""
    caplog.set_level(logging.INFO)
    gw = await start_gateway(replies)
    closing = None
    try:
        sock = await stalled_client(gw, monkeypatch, response_format="wav", stream=False)
        monkeypatch.setattr(http_api, "SHUTDOWN_GRACE_S", 60)
        closing = asyncio.create_task(gw.aclose())
        await gw.http.stopping.wait()
        data = await read_to_the_end(sock)
        await closing
    finally:
        await (closing or gw.aclose())
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    assert length > 10_000_000 and len(body) == length
    with wave.open(io.BytesIO(body)) as w:
        assert w.getnframes() * 2 == length - 44
    ended = [r.getMessage() for r in caplog.records if r.getMessage().startswith("speech ")]
    assert len(ended) == 1 and ended[0].startswith("speech completed (wav, whole,"), ended
    assert not [r for r in caplog.records if "connection aborted" in r.getMessage()]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_whole_file_not_taken_within_the_grace_ends_without_an_error(
        replies, monkeypatch, caplog):
    """What uvicorn does when its grace ends (an ERROR, a cancelled request with its
    traceback) is not how the gateway ends an answer on purpose: the gateway aborts the
    connection itself, says so at INFO, and counts the request a disconnect."""
    caplog.set_level(logging.INFO)
    gw = await start_gateway(replies)
    closed = False
    try:
        sock = await stalled_client(gw, monkeypatch, response_format="wav", stream=False)
        monkeypatch.setattr(http_api, "SHUTDOWN_GRACE_S", 0)  # over before the client reads
        await gw.aclose()
        closed = True
        data = await read_to_the_end(sock)
    finally:
        if not closed:
            await gw.aclose()
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    assert head.startswith(b"HTTP/1.1 200 ") and len(body) < length
    messages = [r.getMessage() for r in caplog.records]
    assert [m for m in messages if m.endswith("had not taken its answer when the shutdown's "
                                              "0 s grace ended: connection aborted")]
    ended = [m for m in messages if m.startswith("speech ")]
    assert len(ended) == 1 and ended[0].startswith("speech disconnected (499) (wav, whole,")
    m = metrics(gw.telemetry.exposition().decode())
    assert m["gateway_http_speech_requests_total{format=wav,status=disconnected,"
             "stream=whole}"] == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


class FailingEngine(SyntheticEngine):
    """Test double: a synthetic engine whose streams fail on their second step."""

    def open(self, request: SynthesisRequest):
        stream = super().open(request)
        inner_step, steps = stream.step, [0]

        def step():
            steps[0] += 1
            if steps[0] == 2:
                raise EngineError("engine_failed", "the model fell over")
            return inner_step()

        stream.step = step
        return stream


class FloodingEngine(SyntheticEngine):
    """Test double: a free engine whose streams give 100 s of audio at once (more than a
    loopback socket takes: the server must wait for its client), wait until
    ``flood`` is set, then give 71 s more in 1 s steps (one long segment)."""

    def __init__(self) -> None:
        super().__init__(rtf=0, ttfa_ms=0)
        self.blocks = True  # on the lane's thread: a held step must not hold the event loop
        self.flood = threading.Event()

    def open(self, request: SynthesisRequest):
        engine, steps = self, [0]

        class Stream:
            def step(self) -> bytes | None:
                steps[0] += 1
                if steps[0] == 1:
                    return bytes(100 * 48_000)
                engine.flood.wait(30)
                return b"\x01\x00" * 24_000 if steps[0] <= 72 else None

            def close(self) -> None:
                pass

        return Stream()


async def test_a_client_that_holds_up_a_long_segment_is_a_slow_consumer(replies, monkeypatch):
    """The other side of audio waiting for the encoder (test_http_formats): a client whose
    socket is full while more than 60 s of a segment piles up fails the request, and its
    job is cancelled: the lane is never held for it."""
    engine = FloodingEngine()
    paused, failed = http_api._H11.pause_writing, asyncio.Event()

    def pause_writing(self) -> None:  # the client's socket is full: the engine goes on
        paused(self)
        engine.flood.set()

    fail = http_api.SpeechStream.fail

    def fail_seen(self, code: str, message: str) -> None:
        fail(self, code, message)
        if code == "slow_consumer":
            failed.set()

    monkeypatch.setattr(http_api._H11, "pause_writing", pause_writing)
    monkeypatch.setattr(http_api.SpeechStream, "fail", fail_seen)
    gw = await start_gateway(replies, engine)
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", gw.http_port))
        body = orjson.dumps({"input": "One long segment.", "response_format": "pcm"})
        await asyncio.get_running_loop().sock_sendall(sock, (
            b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n"
            % len(body)) + body)  # and read nothing
        await unless_hung(failed.wait())
        assert gw.lane.queue_depth == 0 and gw.lane.stats.jobs_cancelled == 1
        sock.close()
        await unless_hung(gw.http.idle.wait())
    finally:
        engine.flood.set()
        await gw.aclose()


async def test_engine_failure_mid_stream_sends_speech_audio_error(replies, caplog):
    caplog.set_level(logging.INFO)
    gw = await start_gateway(replies, FailingEngine(rtf=0, ttfa_ms=0))
    try:
        body = {"input": "A sentence long enough for two steps of audio.",
                "stream_format": "sse"}
        async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gw)) as client:
            async with client.stream("POST", "/v1/audio/speech", json=body) as response:
                events = await read_sse(response)
            assert [e["type"] for e in events] == ["speech.audio.delta", "speech.audio.error"]
            assert events[-1]["error"]["code"] == "engine_failed"
            whole = await client.post("/v1/audio/speech", json={
                **body, "stream_format": "audio", "stream": False})
            # streamed: the 200 went out with the first audio; the failure aborts the body
            with pytest.raises(httpx.RemoteProtocolError):
                await client.post("/v1/audio/speech", json={**body, "stream_format": "audio"})
        assert whole.status_code == 502 and whole.json()["error"]["code"] == "engine_failed"
        # accepted, then failed: the headers of an accepted request are there
        assert whole.headers["x-engine"] and whole.headers["x-sample-rate"] == "24000"
        assert gw.metrics.errors["engine_failed"] == 3
        # one line per request says how it ended; the aborted stream is no ASGI traceback
        ended = [r.getMessage() for r in caplog.records if r.getMessage().startswith("speech ")]
        assert len(ended) == 3 and all(line.startswith("speech failed (") and
                                       line.endswith(": engine_failed: the model fell over")
                                       for line in ended), ended
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    finally:
        await gw.aclose()


def test_an_aborted_stream_is_no_traceback_inside_an_exception_group_either():
    """Starlette before 0.42 (starlette>=0.40 is allowed) raises a streamed body's failure
    inside its task group's ExceptionGroup: uvicorn logged that as "Exception in ASGI
    application" with a traceback for every stream an engine failure or a shutdown ended.
    A group holding anything else is still logged."""
    def logged(exc: BaseException) -> bool:
        record = logging.LogRecord("uvicorn.error", logging.ERROR, __file__, 0,
                                   "Exception in ASGI application\n", None,
                                   (type(exc), exc, None))
        return http_api._not_an_aborted_stream(record)

    failed = http_api.SpeechFailed("engine_failed", "the model fell over")
    assert not logged(failed)
    assert not logged(ExceptionGroup("unhandled errors in a TaskGroup", [failed]))
    assert not logged(BaseExceptionGroup("", [ExceptionGroup("", [failed])]))
    assert logged(ExceptionGroup("unhandled errors in a TaskGroup", [failed, ValueError()]))
    assert logged(ValueError())


async def test_shutdown_ends_open_streams_with_an_error(replies):
    gw = await start_gateway(replies, SyntheticEngine(rtf=1.0, ttfa_ms=0, step_ms=100))
    closed = False
    try:
        long = "Still talking and talking for quite some time " * 8 + "."
        async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gw)) as client, \
                client.stream("POST", "/v1/audio/speech",
                              json={"input": long, "stream_format": "sse"}) as response:
            lines = response.aiter_lines()
            async for line in lines:
                if line.startswith("data: "):
                    break
            closing = asyncio.create_task(gw.aclose())
            closed = True
            rest = [orjson.loads(line[6:]) async for line in lines if line.startswith("data: ")]
            await closing
        assert rest[-1]["type"] == "speech.audio.error"
        assert rest[-1]["error"]["code"] == "shutting_down"
    finally:
        if not closed:
            await gw.aclose()


# ---- warm-up, health, metrics ------------------------------------------------------------


async def test_health_and_speech_answer_503_while_warming_up(replies):
    from tests.test_faults import SlowLoadingEngine

    engine = SlowLoadingEngine()
    config = load_config(server={"port": 0}, llm={"replies": replies})
    gw = Gateway(config, engine=engine)
    starting = asyncio.create_task(gw.start())
    try:
        await asyncio.to_thread(engine.loading.wait, 30)  # HTTP is up before the engine loads
        async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gw)) as client:
            health = await client.get("/health")
            assert health.status_code == 503 and health.json()["status"] == "starting"
            assert health.json()["engines"]["synthetic"]["loaded"] is False
            speech = await client.post("/v1/audio/speech", json={"input": "Hi."})
            assert speech.status_code == 503 and speech.headers["retry-after"] == "1"
            assert speech.json()["error"]["code"] == "warming_up"
            engine.release.set()
            await starting
            health = await client.get("/health")
            assert health.status_code == 200 and health.json()["status"] == "ok"
    finally:
        engine.release.set()
        await starting
        await gw.aclose()


async def test_a_start_cancelled_before_the_http_api_serves_leaves_it_closed(replies,
                                                                            monkeypatch):
    """A ^C while uvicorn was starting (``started_unless_stopped``) cancelled the start, but
    uvicorn's task went on to serve the port, owned by nobody."""
    entered, go_on = asyncio.Event(), asyncio.Event()
    startup = http_api._Uvicorn.startup

    async def held(self, sockets=None):
        entered.set()
        await go_on.wait()
        await startup(self, sockets)

    monkeypatch.setattr(http_api._Uvicorn, "startup", held)
    gw = Gateway(load_config(server={"port": 0}, llm={"replies": replies}))
    starting = asyncio.create_task(gw.start())
    await entered.wait()
    port = gw.http_port
    starting.cancel()
    go_on.set()
    with pytest.raises(asyncio.CancelledError):
        await starting
    async with httpx.AsyncClient(timeout=5) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(f"http://127.0.0.1:{port}/health")


async def test_health_follows_sessions_and_compute(gateway):
    gone = asyncio.Event()
    connections = gateway.connections

    class Watched(set):
        def discard(self, item):
            super().discard(item)
            gone.set()

    gateway.connections = Watched(connections)
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gateway)) as client:
        before = (await client.get("/health")).json()
        assert before["sessions"] == 0 and before["engines"]["espeak"]["warm"] is False
        assert before["lanes"]["cpu"]["compute_s"] == 0
        async with connect(f"ws://127.0.0.1:{gateway.port}/v1/voice") as ws:
            await recv_event(ws, "session.created")
            during = (await client.get("/health")).json()
            assert during["sessions"] == 1
            await send(ws, type="say", text=SHORT)
            assert (await read_turn(ws)).done["status"] == "completed"
        await unless_hung(gone.wait())
        after = (await client.get("/health")).json()
        # the voice port answers the same JSON
        voice_port = (await client.get(f"http://127.0.0.1:{gateway.port}/health")).json()
    assert after["sessions"] == 0 and after["turns"] == {"completed": 1}
    assert after["engines"]["espeak"]["warm"] is True
    lane = after["lanes"]["cpu"]
    assert lane["compute_s"] > 0 and lane["compute_s_1m"] > 0 and 0 < lane["busy_share_1m"] <= 1
    assert lane["queue_depth"] == 0 and lane["jobs"]["done"] == 2
    assert after["llm"]["reachable"] is True and after["llm"]["backend"] == "replay"
    assert 0 <= after["loop"]["lag_max_ms_1m"] < 60_000
    assert after["loop"]["gc_pause_max_ms_1m"] >= 0 and after["loop"]["gc_frozen_objects"] >= 0
    assert voice_port.keys() == after.keys() and voice_port["sessions"] == 0


HTTP_API_MD = Path(__file__).resolve().parents[1] / "docs" / "http-api.md"
DATA_KEYS = frozenset({"engines", "lanes", "turns", "errors"})
"""/health objects keyed by data (engine and lane names, turn statuses, error codes)."""


def health_fields(body: dict, data: bool = False) -> Iterator[str]:
    """Every field name of a /health body, nested ones too; not the keys of ``DATA_KEYS``."""
    for key, value in body.items():
        if not data:
            yield key
        if isinstance(value, dict):
            yield from health_fields(value, data=not data and key in DATA_KEYS)


async def test_every_health_field_and_metric_the_gateway_emits_is_documented(refused_port):
    """docs/http-api.md names every field /health gives and every family /metrics does, on
    a gateway showing them all: an ``http`` voice whose server is down behind a fallback, a
    second lane, a bound on open streams, an OpenAI-compatible LLM that cannot be reached
    (and a turn it failed). ``engine.fallback``'s breaker figures, ``limits`` and
    ``listeners_lost`` were given to operators without a word of what they are."""
    down = f"http://127.0.0.1:{refused_port}/v1"
    gw = Gateway(load_config(
        server={"port": 0}, llm={"url": down},
        tts={"engine": "http", "url": down, "fallback": "espeak", "max_open_streams": 4,
             "also": "synthetic", "also_options": {"rtf": 0.0, "ttfa_ms": 0.0},
             "profiles": {"remote": {"first_s": 0.1, "rtf": 0.1}}}))
    await gw.start()
    try:
        failed = await one_turn(gw.port, type="transcript", text="Hello?")
        async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gw)) as client:
            health = (await client.get("/health")).json()
            metrics = (await client.get("/metrics")).text
    finally:
        await gw.aclose()
    assert failed.done["status"] == "failed" and health["llm"]["failing"] is not None
    assert {"fallback", "server", "timing", "thinking"} <= set(health_fields(health))
    doc = re.sub(r"```.*?```", "", HTTP_API_MD.read_text(), flags=re.S)  # (examples)
    named = {word for span in re.findall(r"`([^`]+)`", doc)
             for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", span)}
    undocumented = sorted(set(health_fields(health)) - named)
    assert undocumented == [], " ".join(undocumented)
    families = {f.name for f in text_string_to_metric_families(metrics)}
    assert len(families) > 30
    assert sorted(f for f in families
                  if not f.startswith("process_") and f not in named
                  and f"{f}_total" not in named) == []


async def test_llm_reachability_is_probed_and_cached(replies, scripted_llm_server):
    config = load_config(server={"port": 0}, llm={"url": scripted_llm_server.url})
    gw = Gateway(config)
    await gw.start()
    try:
        probe = gw.telemetry.llm_probe
        assert probe._task is not None  # started with the gateway, not at the first /health
        await probe._task
        first = gw.health()["llm"]
        assert first["reachable"] is True and first["detail"].startswith("HTTP ")
        assert [r.path for r in scripted_llm_server.requests] == ["/v1/models"]
        gw.health()
        assert probe._task.done()  # cached: no new probe within the interval
        client = probe._client
        probe.checked_at -= probe.interval_s  # stale: the next /health probes again
        gw.health()
        await probe._task
        assert [r.path for r in scripted_llm_server.requests] == ["/v1/models"] * 2
        # with the same client: building one loads the CA bundle, ~18 ms on the loop
        assert probe._client is client is not None
    finally:
        await gw.aclose()
    assert client.is_closed


async def test_an_llm_down_at_start_is_logged_once_and_so_is_its_return(
        caplog, scripted_llm_server, refused_port):
    """A gateway started before its LLM said nothing until a turn failed: the probe at start
    warns, later probes that find it still down say nothing, and its return is said."""
    url = f"http://127.0.0.1:{refused_port}/v1"
    gw = Gateway(load_config(server={"port": 0}, llm={"url": url}))
    caplog.set_level(logging.INFO, logger="gateway.io.telemetry")
    await gw.start()
    try:
        probe = gw.telemetry.llm_probe
        await probe._task
        await probe.probe()  # still down: no second line
        (warning,) = [r for r in caplog.records if r.name == "gateway.io.telemetry"]
        assert warning.levelname == "WARNING" and warning.getMessage().startswith(
            f"the LLM server at {url} does not answer (ConnectError: ")
        assert warning.getMessage().endswith("turns fail with llm_unavailable until it does")
        caplog.clear()
        probe.url = scripted_llm_server.url  # (the server is up now: another port here)
        await probe.probe()
        assert [(r.levelname, r.getMessage()) for r in caplog.records
                if r.name == "gateway.io.telemetry"] == [
            ("INFO", f"the LLM server at {scripted_llm_server.url} answers again (HTTP 200)")]
    finally:
        await gw.aclose()


@pytest.mark.parametrize("model", ["gemma", "scripted", None])
async def test_a_model_the_llm_server_does_not_list_is_said_at_start_once(
        model, caplog, scripted_llm_server):
    """A misspelt [llm] model started a gateway without a word, and every turn then failed
    (mlx_lm.server answered 404 about the model hub). The probe's /models answer (here it
    lists "scripted") now tells it at start: a WARNING, once, naming what it lists."""
    gw = Gateway(load_config(server={"port": 0},
                             llm={"url": scripted_llm_server.url, "model": model}))
    caplog.set_level(logging.INFO, logger="gateway.io.telemetry")
    await gw.start()
    try:
        await gw.telemetry.llm_probe._task  # the probe at start
        await gw.telemetry.llm_probe.probe()  # and a later one: nothing more
    finally:
        await gw.aclose()
    said = [(r.levelname, r.getMessage()) for r in caplog.records
            if r.name == "gateway.io.telemetry"]
    assert said == ([("WARNING", f"the LLM server at {scripted_llm_server.url} lists no model "
                                 "'gemma' (it lists scripted): turns that ask for it may fail; "
                                 "set [llm] model (--llm-model) to one it lists")]
                    if model == "gemma" else [])


async def test_a_scrape_alone_tells_the_llm_server_down_and_the_status_health_would_give(
        scripted_llm_server, refused_port):
    """A hub watched by Prometheus alone saw nothing of an LLM server that stopped
    answering: /metrics had no reachability nor the /health status, and only /health ran
    the probe; gateway_llm_failing waited for a turn to fail. A scrape now probes as
    /health does, and says gateway_llm_reachable and gateway_status."""
    gw = Gateway(load_config(server={"port": 0}, llm={"url": scripted_llm_server.url}))
    await gw.start()
    probe = gw.telemetry.llm_probe
    watched = ("gateway_llm_reachable", "gateway_status{", "gateway_llm_failing")

    async def scrape(http: httpx.AsyncClient) -> dict[str, str]:
        text = (await http.get(f"http://127.0.0.1:{gw.http_port}/metrics")).text
        return dict(line.split() for line in text.splitlines() if line.startswith(watched))

    try:
        await probe._task  # the probe at start
        async with httpx.AsyncClient(timeout=HANG_S) as http:
            up = await scrape(http)
            probe.url = f"http://127.0.0.1:{refused_port}/v1"  # the server went away
            probe.checked_at -= probe.interval_s  # and the last check is stale
            await scrape(http)  # a scrape, no /health: it probes
            await probe._task
            down = await scrape(http)
    finally:
        await gw.aclose()
    assert up == {"gateway_llm_failing": "0.0", "gateway_llm_reachable": "1.0",
                  **{f'gateway_status{{gateway_status="{s}"}}': "1.0" if s == "ok" else "0.0"
                     for s in ("starting", "ok", "degraded", "unhealthy", "stopping")}}
    assert down["gateway_llm_reachable"] == "0.0" and down["gateway_llm_failing"] == "0.0"
    assert down['gateway_status{gateway_status="degraded"}'] == "1.0"
    assert down['gateway_status{gateway_status="ok"}'] == "0.0"


async def test_turns_tell_the_llm_reachability_without_waiting_for_a_probe(replies,
                                                                           refused_port):
    """/health answered with the previous probe's result: the LLM down for seconds read
    reachable, back up for turns read unreachable. A turn's outcome now counts as a probe."""
    gw = Gateway(load_config(server={"port": 0},
                             llm={"url": f"http://127.0.0.1:{refused_port}/v1"}))
    await gw.start()
    try:
        await gw.telemetry.llm_probe._task
        gw.telemetry.llm_probe.reachable = True  # as a probe taken before it went down said
        async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws:
            await recv_event(ws, "session.created")
            await send(ws, type="transcript", text="Anyone there?")
            assert (await read_turn(ws)).done["status"] == "failed"
        llm = gw.health()["llm"]
        assert llm["reachable"] is False and llm["detail"].startswith("cannot reach")
        assert llm["checked_s_ago"] is not None and llm["checked_s_ago"] < 5
    finally:
        await gw.aclose()


async def test_an_llm_found_down_by_the_probe_and_back_by_a_turn_is_said_back(
        caplog, scripted_llm_server, monkeypatch):
    """README (Logs): the probe finding the LLM server not answering is a WARNING, "an INFO
    when it answers again". The server came back and a turn found it first: the turn set
    ``reachable`` without a word, the probe found nothing changed, and the WARNING stood
    in the log for good."""
    from tests.wsclient import read_turn

    answer = scripted_llm_server.__class__.__call__

    async def models_down(self, scope, receive, send):  # its /models fails, as it loads
        if scope.get("path") == "/v1/models":
            await send({"type": "http.response.start", "status": 503, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await answer(self, scope, receive, send)

    monkeypatch.setattr(scripted_llm_server.__class__, "__call__", models_down)
    url = scripted_llm_server.url
    gw = Gateway(load_config(server={"port": 0}, llm={"url": url}))
    caplog.set_level(logging.INFO, logger="gateway")
    await gw.start()
    try:
        await gw.telemetry.llm_probe._task
        monkeypatch.setattr(scripted_llm_server.__class__, "__call__", answer)  # it is up
        async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws:
            await recv_event(ws, "session.created")
            await send(ws, type="transcript", text="Are you there?")
            done = (await read_turn(ws)).done
        assert done["status"] == "completed"
        assert gw.health()["llm"]["reachable"] is True
    finally:
        await gw.aclose()
    said = [(r.levelname, r.getMessage()) for r in caplog.records
            if r.name == "gateway.io.telemetry"]
    assert said == [
        ("WARNING", f"the LLM server at {url} does not answer (HTTP 503): turns fail with "
                    "llm_unavailable until it does"),
        ("INFO", f"the LLM server at {url} answers again (answered a turn)")]


@pytest.mark.parametrize("down", ["out of reach", "answering 500", "stalled"])
async def test_an_idle_hub_is_ok_again_once_its_probe_reaches_an_llm_that_was_out_of_reach(
        down, caplog, scripted_llm_server, refused_port):
    """Kill the LLM, run one turn (failed, llm_unavailable), start the LLM again: the probe
    said "answers again" and llm.reachable was true, but llm.failing and the status stayed
    degraded until three whole replies in a row, i.e. for good on a hub nobody talks to.
    A failing spell of an LLM out of reach now ends when a probe reaches it again; one of
    an LLM that answered wrongly (500: llm_failed) still waits for whole replies, and so
    does one of an LLM that took the request and then stalled (llm_unavailable too, but a
    stuck model answers ``/models`` all the same: the probe said ok at once)."""
    from tests.servers import Hang, Status, health_after_a_probe

    llm: dict[str, float] = {}
    if down == "out of reach":
        url = f"http://127.0.0.1:{refused_port}/v1"
    else:
        url = scripted_llm_server.url
        scripted_llm_server.script([Status(500)] if down == "answering 500" else [Hang()])
        llm["stall_timeout_s"] = 0.2
    gw = Gateway(load_config(server={"port": 0}, llm={"url": url, **llm}))
    caplog.set_level(logging.INFO, logger="gateway")
    await gw.start()
    try:
        probe = gw.telemetry.llm_probe
        await probe._task  # the probe at start
        turn = await one_turn(gw.port, type="transcript", text="Anyone there?")
        assert turn.done["status"] == "failed"
        failed = gw.health()
        probe.url = scripted_llm_server.url  # it is back (here: on another port)
        after = await health_after_a_probe(gw, probe)
    finally:
        await gw.aclose()
    code = "llm_failed" if down == "answering 500" else "llm_unavailable"
    assert failed["status"] == "degraded" and failed["llm"]["failing"]["code"] == code
    # only a server out of reach reads unreachable: one that answered, if wrongly or too
    # slowly, answers its probe (a stall read false beside it, docs/http-api.md)
    assert failed["llm"]["reachable"] is (down != "out of reach"), failed["llm"]
    assert after["llm"]["reachable"] is True
    said = [r.getMessage() for r in caplog.records
            if r.getMessage().startswith("the LLM answers again")]
    if down == "out of reach":
        assert after["status"] == "ok" and after["llm"]["failing"] is None
        assert len(said) == 1 and said[0].startswith(
            "the LLM answers again (its server answers the probe): 1 turn(s) failed, 0 came "
            "whole, since "), said
    else:
        assert after["status"] == "degraded" and after["llm"]["failing"]["turns"] == 1
        assert said == []


@pytest.mark.slow
async def test_metrics_move_after_turns_and_speech(gateway):
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gateway)) as client:
        m0 = metrics((await client.get("/metrics")).text)
        assert not any(k.startswith("gateway_turn_ttfa_seconds_count") for k in m0)
        async with connect(f"ws://127.0.0.1:{gateway.port}/v1/voice") as ws:
            await recv_event(ws, "session.created")
            await send(ws, type="say", text=SHORT)
            await read_turn(ws)
            await send(ws, type="transcript", text="What about hosting?")
            await read_turn(ws)
        speech = await client.post("/v1/audio/speech", json={"input": TEXT, "stream": False,
                                                             "response_format": "pcm"})
        assert speech.status_code == 200
        await client.post("/v1/audio/speech", json={"input": ""})
        text = (await client.get("/metrics")).text
        voice_port = (await client.get(f"http://127.0.0.1:{gateway.port}/metrics")).text
    m = metrics(text)
    assert m["gateway_turn_ttfa_seconds_count{status=completed}"] == 2
    assert m["gateway_turn_ttft_seconds_count{status=completed}"] == 1  # `say` has no LLM
    assert m["gateway_turn_first_segment_seconds_count{status=completed}"] == 2
    assert m["gateway_turns_total{status=completed}"] == 2
    assert m["gateway_frames_total{}"] == gateway.metrics.frames > 0
    jobs = 2 + 2 + 2  # two segments per turn and per speech request
    assert m["gateway_lane_queue_wait_seconds_count{lane=cpu}"] == jobs
    assert m["gateway_synthesis_rtf_count{lane=cpu}"] == jobs
    assert m["gateway_lane_step_seconds_count{lane=cpu}"] == gateway.lane.stats.steps
    assert m["gateway_lane_step_seconds_sum{lane=cpu}"] == pytest.approx(
        gateway.lane.stats.busy_s)
    assert m["gateway_http_speech_requests_total{format=pcm,status=completed,stream=whole}"] == 1
    # refused after its body was read: counted with what it asked for (mp3, the default)
    assert m["gateway_http_speech_requests_total{format=mp3,status=rejected,stream=chunked}"] == 1
    assert m["gateway_llm_tokens_per_second{}"] > 0
    assert m["gateway_connections_opened_total{}"] == m["gateway_sessions_opened_total{}"] == 1
    assert m["gateway_sessions_resumed_total{}"] == 0
    assert 0 < m["gateway_lane_busy_ratio{lane=cpu}"] < 1
    assert m["gateway_sessions{}"] == 0 and m["gateway_lane_queue_depth{lane=cpu}"] == 0
    assert m["gateway_loop_lag_seconds_count{}"] >= 1  # the probe wakes every 100 ms
    assert "gateway_gc_pause_seconds_count{generation=2}" in m
    assert "gateway_turn_ttfa_seconds_count" in voice_port
    assert "_created" not in text  # a timestamp per series doubled the scrape for nothing


async def test_a_refused_request_is_counted_with_the_format_it_asked_for(gateway):
    """A request refused after its body was read is counted with its format and mode (it
    was ``-`` and ``-``, as for one refused before); a format or mode this gateway does not
    serve stays ``-``, so no client string ever becomes a label."""
    refused = [
        ({"input": "", "response_format": "wav", "stream": False}, ("wav", "whole")),
        ({"input": "Hi.", "voice": "klingon", "response_format": "flac"}, ("flac", "chunked")),
        ({"input": "Hi.", "stream_format": "sse", "speed": 9}, ("pcm", "sse")),
        ({"input": "Hi.", "response_format": "ogg"}, ("-", "-")),
        ({"input": "Hi.", "stream_format": "sse", "response_format": "mp3"}, ("-", "-")),
        ({"input": "Hi.", "stream": "yes"}, ("-", "-")),
        (["not", "an", "object"], ("-", "-")),
    ]
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gateway)) as client:
        for body, _ in refused:
            assert (await client.post("/v1/audio/speech", json=body)).status_code == 400
        m = metrics((await client.get("/metrics")).text)
    counted = {k: v for k, v in m.items()
               if k.startswith("gateway_http_speech_requests_total{") and v}
    expected: dict[str, float] = {}
    for _, (fmt, mode) in refused:
        key = f"gateway_http_speech_requests_total{{format={fmt},status=rejected,stream={mode}}}"
        expected[key] = expected.get(key, 0) + 1
    assert counted == expected


async def test_models_and_voices(gateway):
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gateway)) as client:
        models = (await client.get("/v1/models")).json()
        voices = (await client.get("/v1/audio/voices")).json()
        on_voice_port = (await client.get(f"http://127.0.0.1:{gateway.port}/v1/models")).json()
    (model,) = models["data"]
    assert model["id"] == "espeak" and model["loaded"] is True and model["lane"] == "cpu"
    assert on_voice_port == models
    ids = [v["id"] for v in voices["data"]]
    assert "en-us" in ids and len(ids) == model["voices"] == len(gateway.voices)


# ---- bad requests ---------------------------------------------------------------------------


BAD = [
    ({"model": "espeak"}, 400, "missing_input", "input"),
    ({"input": "   "}, 400, "missing_input", "input"),
    # invisible characters only (zero-width space, direction marks): nothing to speak
    ({"input": "\u200b \u200e\u2067\u2069\ufeff"}, 400, "missing_input", "input"),
    ({"input": 42}, 400, "invalid_type", "input"),
    ({"input": "x" * (MAX_INPUT_CHARS + 1)}, 400, "string_above_max_length", "input"),
    ({"input": "Hi.", "voice": "klingon"}, 400, "unknown_voice", "voice"),
    ({"input": "Hi.", "voice": {"name": "en-us"}}, 400, "invalid_type", "voice"),
    ({"input": "Hi.", "response_format": "ogg"}, 400, "unsupported_format", "response_format"),
    ({"input": "Hi.", "response_format": ["mp3"]}, 400, "unsupported_format",
     "response_format"),
    ({"input": "Hi.", "response_format": ""}, 400, "unsupported_format", "response_format"),
    ({"input": "Hi.", "response_format": False}, 400, "unsupported_format", "response_format"),
    ({"input": "Hi.", "stream_format": "sse", "response_format": "wav"}, 400,
     "unsupported_format", "response_format"),
    ({"input": "Hi.", "stream_format": "websocket"}, 400, "unsupported_stream_format",
     "stream_format"),
    ({"input": "Hi.", "speed": 10}, 400, "invalid_value", "speed"),
    # a speed of 0 or less never reaches an engine (espeak and synthetic would refuse it)
    ({"input": "Hi.", "speed": 0}, 400, "invalid_value", "speed"),
    ({"input": "Hi.", "speed": -1.5}, 400, "invalid_value", "speed"),
    ({"input": "Hi.", "seed": "lucky"}, 400, "invalid_type", "seed"),
    ({"input": "Hi.", "temperature": 7}, 400, "invalid_value", "temperature"),
    # mistyped is invalid_type, as for every other field; out of range invalid_value
    ({"input": "Hi.", "speed": "1"}, 400, "invalid_type", "speed"),
    ({"input": "Hi.", "speed": True}, 400, "invalid_type", "speed"),
    ({"input": "Hi.", "temperature": "hot"}, 400, "invalid_type", "temperature"),
    # OpenAI's "stream" is a boolean; "false" (a string) would otherwise be true
    ({"input": "Hi.", "stream": "false"}, 400, "invalid_type", "stream"),
    ({"input": "Hi.", "voice": {"id": 5}}, 400, "invalid_type", "voice"),
    ({"input": "Hi.", "model": 5}, 400, "invalid_type", "model"),
    ({"input": "Hi.", "instructions": ["whisper"]}, 400, "invalid_type", "instructions"),
    (["input", "Hi."], 400, "invalid_json", None),
]


@pytest.mark.parametrize(("body", "status", "code", "param"), BAD,
                         ids=[c for _, _, c, _ in BAD[:1]] + [str(i) for i in range(1, len(BAD))])
async def test_bad_requests_get_openai_style_errors(gateway, body, status, code, param):
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gateway)) as client:
        response = await client.post("/v1/audio/speech", json=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code and error["param"] == param
    assert error["type"] == "invalid_request_error" and error["message"]
    assert gateway.lane.stats.steps == 0  # nothing reached the engine


@pytest.mark.parametrize(("value", "said"), [("1", "a string"), (True, "a boolean"),
                                            ([1], "an array"), ({"x": 1}, "an object")])
async def test_a_number_of_the_wrong_type_is_refused_in_jsons_words(gateway, value, said):
    """A client sends JSON: "'speed' must be a number, not str" named Python's type."""
    async with httpx.AsyncClient(base_url=base(gateway)) as client:
        response = await client.post("/v1/audio/speech", json={"input": "Hi.", "speed": value})
    error = response.json()["error"]
    assert (response.status_code, error["code"]) == (400, "invalid_type")
    assert error["message"] == f"'speed' must be a number, not {said}"


@pytest.mark.parametrize("field", ["voice", "response_format", "stream_format"])
async def test_a_refused_value_is_quoted_cut_short_in_the_error_and_the_log(gateway, caplog,
                                                                           field):
    """A refusal names the value refused, cut as the unknown model and route are: a client
    sending a 60,000-character voice got all of it back, and wrote a 60 kB INFO line."""
    caplog.set_level(logging.INFO, logger="gateway.io.http_api")
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gateway)) as client:
        response = await client.post("/v1/audio/speech",
                                     json={"input": "Hi.", field: "x" * 60_000})
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == field
    assert "'xxxxxxxx" in error["message"] and "60000 characters" in error["message"]
    assert len(error["message"]) < 300
    (line,) = [r.getMessage() for r in caplog.records if "speech rejected" in r.getMessage()]
    assert len(line) < 400


@pytest.mark.parametrize("field", ["response_format", "stream_format"])
async def test_a_refused_value_nested_deeply_is_a_400_not_a_500(gateway, field):
    """orjson reads a body nested up to 1,024 levels; quoting such a value in the refusal
    (``repr``) raised RecursionError, and the client got a 500 ``internal_error`` for a bad
    parameter (found writing a fuzz harness for ``parse_speech``)."""
    body = f'{{"input": "Hi.", "{field}": {"[" * 1000}{"]" * 1000}}}'
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gateway)) as client:
        response = await client.post("/v1/audio/speech", content=body,
                                     headers={"content-type": "application/json"})
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == field, error
    assert "[[[[...]]]]" in error["message"]
    assert gateway.metrics.errors["internal_error"] == 0


@pytest.mark.parametrize(("speed", "note"), [
    (1.5, None),
    (0.25, "speed 0.25 is beyond engine espeak's 0.46-2.57: spoken at 0.46"),
    (4.0, "speed 4 is beyond engine espeak's 0.46-2.57: spoken at 2.57"),
])
async def test_a_speed_the_engine_cannot_honour_is_told_not_hidden(gateway, speed, note):
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gateway)) as client:
        response = await client.post("/v1/audio/speech", json={"input": "Hi.", "speed": speed})
    assert response.status_code == 200
    assert response.headers.get("x-speech-notes") == note


async def test_a_speed_asked_of_an_engine_that_speaks_at_its_own_pace_is_said_ignored(
        replies):
    """qwen3, chatterbox and ane take no speed (``speed_range = None``): a client asking
    one of them for another speed is told it was ignored, in ``X-Speech-Notes`` and in the
    SSE ``done`` event, not given audio at the usual pace without a word. No test spoke
    to such an engine over HTTP, so here real espeak declares what they declare."""
    from engines.espeak import EspeakEngine

    class OwnPaceEspeak(EspeakEngine):  # (real espeak; only its declaration changed)
        speed_range = None

    gw = await start_gateway(replies, engine=OwnPaceEspeak())
    body = {"input": "Hi.", "stream_format": "sse"}
    try:
        async with httpx.AsyncClient(base_url=base(gw)) as client:
            usual = await client.post("/v1/audio/speech", json={"input": "Hi."})
            async with client.stream("POST", "/v1/audio/speech",
                                     json={**body, "speed": 1.5}) as response:
                events = await read_sse(response)
    finally:
        await gw.aclose()
    note = "speed ignored: engine espeak speaks at its own pace"
    assert usual.status_code == 200 and "x-speech-notes" not in usual.headers
    assert response.status_code == 200 and response.headers["x-speech-notes"] == note
    assert events[-1]["type"] == "speech.audio.done" and events[-1]["notes"] == [note]


async def test_unknown_routes_and_methods_answer_in_openais_shape(gateway):
    client = openai.AsyncOpenAI(base_url=base(gateway) + "/v1", api_key="not-needed")
    model = await client.models.retrieve("espeak")
    with pytest.raises(openai.NotFoundError) as missing:
        await client.models.retrieve("tts-1")
    await client.close()
    assert model.id == "espeak"
    assert missing.value.code == "model_not_found"
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gateway)) as http:
        nowhere = await http.get("/v1/nowhere")
        wrong = await http.get("/v1/audio/speech")
        slash = await http.post("/v1/audio/speech/", json={"input": "Hi."})
    assert nowhere.status_code == 404 and nowhere.json()["error"]["code"] == "not_found"
    assert slash.status_code == 404 and slash.json()["error"]["code"] == "not_found"  # no 307
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    assert wrong.json()["error"] == {
        "message": "GET is not allowed on /v1/audio/speech (allowed: POST)",
        "type": "invalid_request_error", "param": None, "code": "method_not_allowed"}


async def test_malformed_and_oversized_bodies(gateway):
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gateway)) as client:
        broken = await client.post("/v1/audio/speech", content=b"{not json",
                                   headers={"content-type": "application/json"})
        huge = await client.post("/v1/audio/speech", content=b" " * (MAX_BODY_BYTES + 1),
                                 headers={"content-type": "application/json"})
    assert broken.status_code == 400 and broken.json()["error"]["code"] == "invalid_json"
    assert huge.status_code == 413 and huge.json()["error"]["code"] == "body_too_large"


async def test_a_chunked_body_past_the_limit_is_refused_as_one_declared_so(gateway):
    """A body sent in chunks declares no length: it is counted as it arrives and refused
    (413) once past ``MAX_BODY_BYTES``, as one whose Content-Length says so, not gathered
    whole and then acted on. (No test sent a chunked body: the limit was only ever checked
    on a declared length.)"""
    text = "Hi. " * (MAX_BODY_BYTES // 4)  # (valid JSON: without the limit, a 400 at most)
    whole = orjson.dumps({"input": text, "response_format": "pcm"})
    assert len(whole) > MAX_BODY_BYTES

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(whole), 4096):
            yield whole[start:start + 4096]

    async with httpx.AsyncClient(base_url=base(gateway)) as client:
        huge = await client.post("/v1/audio/speech", content=chunks(),
                                 headers={"content-type": "application/json"})
    assert huge.request.headers["transfer-encoding"] == "chunked"
    assert "content-length" not in huge.request.headers
    assert huge.status_code == 413
    assert huge.json()["error"]["code"] == "body_too_large"


async def test_a_segment_cut_short_by_a_failing_primary_is_reported_not_hidden(replies):
    """Behind a fallback, a primary failing mid-sentence ends that segment where it stopped
    (a live listener must not hear words twice). An HTTP client gets the rest of the file,
    but must be told a segment is short: it used to get a plain 200."""
    from engines.fallback import FallbackEngine
    from tests.test_fallback_engine import FakeClock, ScriptedEngine, fail

    clock = FakeClock()
    chunk = b"\x01\x00" * 480
    cut = [chunk, fail()]
    primary = ScriptedEngine("qwen3", clock, scripts=[cut, cut, cut])  # each request's first
    fallback = ScriptedEngine("espeak", clock, default=[b"\x02\x00" * 8])
    engine = FallbackEngine(primary, fallback, breaker_failures=5, clock=clock)
    gw = await start_gateway(replies, engine=engine)
    text = "The first one is cut. The second is whole. So is the third."
    try:
        async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gw)) as client:
            whole = await client.post("/v1/audio/speech", json={
                "input": text, "response_format": "pcm", "stream": False})
            clock.now += engine.breaker_reset_s  # the next request's first segment probes
            sse = await client.post("/v1/audio/speech", json={"input": text,
                                                              "stream_format": "sse"})
            clock.now += engine.breaker_reset_s
            alone = await client.post("/v1/audio/speech", json={
                "input": "Only this one.", "response_format": "pcm", "stream": False})
    finally:
        await gw.aclose()
    # nothing came after it: no fallback to speak of
    assert alone.headers["x-speech-notes"] == ("segment 1 of 1 was cut short: the engine "
                                               "failed mid-sentence, so the rest of that "
                                               "segment is missing")
    note = ("segment 1 of 3 was cut short: the engine failed mid-sentence, so the rest of "
            "that segment is missing (the fallback engine spoke the segments after it)")
    assert whole.status_code == 200 and whole.headers["x-speech-notes"] == note
    assert whole.headers["x-engine"] == "qwen3"  # the voice, not the wrapper's name
    # the first segment's one chunk, then the fallback's (the cut opened the breaker)
    assert whole.content == chunk + b"\x02\x00" * 16
    events = [orjson.loads(line[6:]) for line in sse.text.splitlines()
              if line.startswith("data: ")]
    assert events[-1]["type"] == "speech.audio.done" and events[-1]["notes"] == [note]


@pytest.mark.parametrize("wrapped", [False, True], ids=["engine", "behind-a-fallback"])
async def test_instructions_reach_an_engine_that_takes_them(replies, wrapped):
    from engines.fallback import FallbackEngine
    from tests.test_fallback_engine import FakeClock, ScriptedEngine

    class Styled(ScriptedEngine):  # a TEST DOUBLE that takes style instructions
        instructions = True

    clock = FakeClock()
    voice = Styled("qwen3", clock)
    engine = FallbackEngine(voice, ScriptedEngine("espeak", clock), clock=clock) \
        if wrapped else voice
    gw = await start_gateway(replies, engine=engine)
    try:
        async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gw)) as client:
            response = await client.post("/v1/audio/speech", json={
                "input": "Hello there.", "instructions": "whisper", "response_format": "pcm"})
            models = (await client.get("/v1/models")).json()["data"]
    finally:
        await gw.aclose()
    # a wrapped voice is listed as itself and what stands behind it, not as "fallback"
    assert [m["id"] for m in models] == ["qwen3+espeak" if wrapped else "qwen3"]
    assert response.status_code == 200 and "x-speech-notes" not in response.headers
    assert [r.options.get("instructions") for r in voice.opened] == ["whisper"]


@pytest.mark.parametrize(("fallback_streams", "longest"), [(False, 150), (True, 400)])
async def test_a_voice_that_may_speak_whole_segments_gets_short_ones(
        replies, fallback_streams, longest):
    """Behind chatterbox, which makes a segment in one step, a live turn waited for a whole
    400-character HTTP segment (live TTFA 5.3 -> 9.1 s on tiny models)."""
    from engines.fallback import FallbackEngine
    from tests.test_fallback_engine import FakeClock, ScriptedEngine

    clock = FakeClock()
    voice, behind = ScriptedEngine("qwen3", clock), ScriptedEngine("chatterbox", clock)
    behind.streams = fallback_streams
    gw = await start_gateway(replies, engine=FallbackEngine(voice, behind, clock=clock))
    clause = "this clause goes on for a while, "
    text = "One very long sentence, " + clause * 30 + "and then it ends."
    try:
        async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gw)) as client:
            response = await client.post("/v1/audio/speech", json={
                "input": text, "response_format": "pcm", "stream": False})
    finally:
        await gw.aclose()
    assert response.status_code == 200
    lengths = [len(r.text) for r in voice.opened]
    assert max(lengths) <= longest < max(lengths) + len(clause) + 1  # cut near the bound
    assert sum(lengths) + len(lengths) - 1 == len(text)  # all of it, once


async def test_the_voice_port_says_it_closes_so_a_pooled_client_never_reuses_its_socket(gateway):
    """websockets closes the connection after a plain GET's answer; without "Connection:
    close" httpx's pool sent the next request into that socket and got "Server
    disconnected" when it lost the race with the close."""
    url = f"http://127.0.0.1:{gateway.port}"
    async with httpx.AsyncClient(timeout=HANG_S, base_url=url) as client:
        for path in ("/health", "/metrics", "/v1/models", "/", "/nowhere") * 5:
            response = await client.get(path)
            assert response.headers["connection"] == "close"
            assert response.status_code in (200, 404)


async def test_a_chunk_not_ended_by_crlf_is_refused_not_read_past(gateway):
    """A chunk's data must be followed by CRLF. h11 before 0.16 took any two bytes for it
    (CVE-2025-43859): a proxy in front that reads the chunk's end otherwise sees a
    different request boundary than the gateway, the way requests are smuggled past it."""
    body = b'{"input":"Hi."}'
    answer = await raw_answer(gateway.http_port, (
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"%x\r\n" % len(body) + body + b"XX0\r\n\r\n"))
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b'"invalid_http"' in answer


async def test_a_request_with_both_a_length_and_chunks_is_refused_and_closed(gateway):
    """A request with both ``Content-Length`` and ``Transfer-Encoding: chunked`` is how
    requests are smuggled past a proxy that reads the length (RFC 9112 6.1: a server may
    refuse it, and must close the connection after answering it either way). h11 read it by
    its chunks and the connection went on: the request a proxy took for part of the body
    was answered as one of its own. It is refused now (400 ``invalid_http``, saying why),
    and the connection closes with nothing after it read."""
    body = b'{"input":"Hi."}'
    answer = await raw_answer(gateway.http_port, (
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" % (len(body) + 10)
        + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
        + b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"))
    head, _, rest = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), answer[:300]
    assert orjson.loads(rest)["error"] == {
        "message": "a request may not have both Content-Length and Transfer-Encoding",
        "type": "invalid_request_error", "param": None, "code": "invalid_http"}
    assert answer.count(b"HTTP/1.1 ") == 1  # (the request after it was not answered)
    assert gateway.health()["errors"] == {"invalid_http": 1}


@pytest.mark.parametrize("port", ["port", "http_port"])
async def test_a_target_in_absolute_form_is_served_with_its_own_host(gateway, port):
    """RFC 9112 3.2.2: a server must accept a request target in absolute form (``GET
    http://host/path``, as a client configured to go through a proxy sends it) and take the
    host from it, not from ``Host``. Both ports answered 404 "no route
    '/http://127.0.0.1/health'"; the path is served now, and the target's host is the one
    the Host check reads (a name it does not allow is refused as in ``Host``)."""
    number = getattr(gateway, port)
    for target, status in [(f"http://127.0.0.1:{number}/health?x=1", 200),
                           ("HTTP://localhost/health", 200),
                           ("http://evil.example/health", 403)]:
        answer = await raw_answer(number, f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                          "Connection: close\r\n\r\n".encode())
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 %d " % status), (target, answer[:300])
        if status == 200:
            assert orjson.loads(body)["status"] == "ok"
        else:
            assert orjson.loads(body)["error"]["code"] == "forbidden_host"


async def test_a_malformed_request_is_counted_with_the_other_refusals(gateway):
    """Every other refusal, on either port, moves ``gateway_errors_total``; a malformed
    request (answered by uvicorn's protocol, below the app) moved nothing, so a client
    flooding the port with them showed only in the log, whose lines are limited."""
    for request in (b"NOT HTTP AT ALL\r\n\r\n",
                    b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: abc\r\n\r\n"):
        answer = await raw_answer(gateway.http_port, request)
        assert answer.startswith(b"HTTP/1.1 400") and b'"invalid_http"' in answer
    async with httpx.AsyncClient(timeout=HANG_S,
                                 base_url=f"http://127.0.0.1:{gateway.http_port}") as client:
        m = metrics((await client.get("/metrics")).text)
    assert m["gateway_errors_total{code=invalid_http}"] == 2
    assert gateway.health()["errors"] == {"invalid_http": 2}


async def test_a_malformed_request_is_an_info_line_with_its_peer(gateway, caplog):
    # uvicorn said it as a WARNING (kept for what needs the operator) with no peer
    caplog.set_level(logging.INFO)
    answer, port = await raw_exchange(gateway.http_port, b"NOT HTTP AT ALL\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400")
    # in OpenAI's shape, as every other refusal (it was uvicorn's plain text)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower()
    assert orjson.loads(body) == {"error": {"message": "Invalid HTTP request received.",
                                            "type": "invalid_request_error", "param": None,
                                            "code": "invalid_http"}}
    said = [(r.levelname, r.getMessage()) for r in caplog.records if "400" in r.getMessage()
            or "Invalid HTTP" in r.getMessage()]
    assert said == [("INFO", f"HTTP request from 127.0.0.1:{port} refused (400): Invalid "
                             "HTTP request received.")]


async def test_the_http_port_answers_on_every_address_the_voice_port_does(replies):
    """``--host ""`` (every interface) had the voice port listen on IPv4 and IPv6 and the
    HTTP API on IPv4 only: a client reaching the hub over IPv6 got "connection refused" on
    the HTTP port alone (so did one trying ``::1`` first for ``localhost``, where the
    system maps it to both families: macOS). Wherever the voice port answers, /health and
    speech now answer on the one HTTP port read back."""
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("this machine has no IPv6 loopback")
    token = "n6-listen-token"
    gw = Gateway(load_config(server={"host": "", "port": 0, "tokens": [token]},
                             tts={"engine": "espeak"}, llm={"replies": replies}))
    await gw.start()
    try:
        assert gw._server is not None
        voice = {sock.family: sock.getsockname()[1] for sock in gw._server.sockets}
        assert set(voice) == {socket.AF_INET, socket.AF_INET6}
        async with httpx.AsyncClient(timeout=30,
                                     headers={"Authorization": f"Bearer {token}"}) as client:
            for family, loopback in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "[::1]")):
                async with connect(f"ws://{loopback}:{voice[family]}/v1/voice?token={token}") \
                        as ws:
                    assert orjson.loads(await ws.recv())["type"] == "session.created"
                base = f"http://{loopback}:{gw.http_port}"
                assert (await client.get(f"{base}/health")).status_code == 200
                speech = await client.post(f"{base}/v1/audio/speech", json={
                    "input": "Hello there.", "response_format": "wav", "stream": False})
                assert speech.status_code == 200 and speech.content[:4] == b"RIFF"
    finally:
        await gw.aclose()


class GatedSleep:
    """The synthetic engine's ``sleep`` (a fake: it spends no time): the first step waits
    on the lane's thread until ``release`` is set, so a synthesis stays in flight for as
    long as a test needs; every call is counted."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self.calls = 0

    def __call__(self, seconds: float) -> None:
        self.calls += 1
        self.entered.set()
        assert self.release.wait(HANG_S), "the gate was never released"


async def leave_a_whole_wav_while_it_is_made(gw: Gateway, begun: threading.Event) -> None:
    """Ask ``gw`` for a long whole WAV (``"stream": false``; about 48 s of audio: 150 steps
    of 320 ms) and leave once ``begun`` is set, before a byte of the answer; back once the
    request's log line is written (how it ended)."""
    line = LineSeen("speech ")
    logging.getLogger("gateway.io.http_api").addHandler(line)
    try:
        loop = asyncio.get_running_loop()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setblocking(False)
            await loop.sock_connect(sock, ("127.0.0.1", gw.http_port))
            body = orjson.dumps({"input": (TEXT + " ") * 10, "response_format": "wav",
                                 "stream": False})
            await loop.sock_sendall(sock, b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1"
                                    b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            assert await asyncio.to_thread(begun.wait, HANG_S)
        async with hang_guard("the request's log line"):
            await line.seen.wait()
    finally:
        logging.getLogger("gateway.io.http_api").removeHandler(line)


async def test_a_client_leaving_while_its_whole_file_is_made_is_a_disconnect(replies, caplog):
    """A whole (``"stream": false``) answer is made before its status goes out: a client
    that leaves while it is made must be counted disconnected (499), its synthesis
    cancelled at its next step, and the lane freed for the next request. The whole suite
    only ever left a whole file once it was made (the branch that cancels one being made
    was never run)."""
    caplog.set_level(logging.INFO)
    gate = GatedSleep()
    gw = await start_gateway(replies, engine=SyntheticEngine(sleep=gate))
    try:
        await leave_a_whole_wav_while_it_is_made(gw, gate.entered)  # its first step runs
        ended = [r.getMessage() for r in caplog.records if r.getMessage().startswith("speech ")]
        assert len(ended) == 1 and ended[0].startswith("speech disconnected (499) (wav, whole,"),\
            ended
        m = metrics(gw.telemetry.exposition().decode())
        assert m["gateway_http_speech_requests_total{format=wav,status=disconnected,"
                 "stream=whole}"] == 1
        gate.release.set()  # the step in flight returns: the job is not given another
        async with httpx.AsyncClient(base_url=base(gw), timeout=HANG_S) as client:
            answers, calls = [], []
            for _ in range(2):  # the lane serves the next; the second counts its steps
                r = await client.post("/v1/audio/speech", json={
                    "input": SHORT, "response_format": "wav", "stream": False})
                answers.append(r)
                calls.append(gate.calls)
        assert [r.status_code for r in answers] == [200, 200] and \
            answers[0].content == answers[1].content
        await unless_hung(gw.http.idle.wait())
        assert gw.lane.queue_depth == 0 and gw.lane.stats.jobs_cancelled == 1
        # the steps that ran: the first's one in flight, then the next request's (as many
        # as the one after it took), none more of the 150 it would have taken
        assert calls[0] - (calls[1] - calls[0]) == 1, calls
        m = metrics(gw.telemetry.exposition().decode())
        assert m["gateway_http_speech_requests_total{format=wav,status=completed,"
                 "stream=whole}"] == 2
    finally:
        gate.release.set()  # (a failed check must not hold the lane's thread)
        await gw.aclose()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
